// Package runnerapi puts the network between the gateway and a runner: Server serves a
// *runner.Runner as sandboxd.runner.v1.RunnerService and relays sandboxd.agent.v1
// AgentService calls to its sandboxes' agents; Client implements runner.Handle over
// that API. Both ends authenticate with certificates from the platform CA (mTLS).
package runnerapi

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"time"

	"connectrpc.com/connect"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1/agentv1connect"
	runnerv1 "github.com/sandboxd/sandboxd/gen/sandboxd/runner/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/runner/v1/runnerv1connect"
	"github.com/sandboxd/sandboxd/internal/agent"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/policy"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/tracing"
)

// SandboxIDHeader names the sandbox whose agent a relayed AgentService call is for.
const SandboxIDHeader = "Sandboxd-Sandbox-Id"

// ContainerHeader names the container of the sandbox a relayed agent call is for; absent
// or empty means the primary. A name the sandbox does not have is NOT_FOUND naming it.
const ContainerHeader = "Sandboxd-Container"

// MaxMessageBytes bounds a message in either direction: what an agent may send or take.
const MaxMessageBytes = agent.MaxMessageBytes

// backend is what Server needs of *runner.Runner.
type backend interface {
	Create(ctx context.Context, req runner.CreateRequest) (runner.Sandbox, error)
	Get(id string) (runner.Sandbox, error)
	AwaitStart(ctx context.Context, id string, wait time.Duration) (runner.Sandbox, error)
	List() []runner.Sandbox
	Delete(id string, grace time.Duration) (runner.Sandbox, error)
	DeleteWithSnapshots(id string, grace time.Duration, targets []runner.SnapshotTarget) (runner.Sandbox, []runner.SnapshotJob, error)
	SnapshotVolume(ctx context.Context, id string, t runner.SnapshotTarget) (runner.SnapshotJob, error)
	GetSnapshotJob(snapshotID string) runner.SnapshotJob
	UpdateLifetime(ctx context.Context, id string, lifetime time.Duration) (runner.Sandbox, error)
	Pause(ctx context.Context, id string, opts runner.PauseOptions) (runner.Sandbox, error)
	Resume(ctx context.Context, id string) (runner.Sandbox, error)
	Fork(ctx context.Context, id string, targets []runner.ForkTarget) ([]runner.ForkResult, error)
	ExportCheckpoint(ctx context.Context, id string) (runner.CheckpointRef, runner.Sandbox, error)
	ImportFork(ctx context.Context, req runner.ImportRequest) ([]runner.ForkResult, error)
	DeleteCheckpoint(ctx context.Context, key string) error
	EnsureVolume(ctx context.Context, v runner.RegisteredVolume) (runner.VolumeState, error)
	DeleteVolume(ctx context.Context, v runner.RegisteredVolume, force bool) error
	Moved(ctx context.Context, id, to string) error
	Agent(ctx context.Context, id, container string) (agentv1connect.AgentServiceClient, error)
	Logs(ctx context.Context, id, container string, req *agentv1.LogsRequest, send func(*agentv1.LogsResponse) error) error
}

// Server serves one runner to gateways.
type Server struct {
	runnerv1connect.UnimplementedRunnerServiceHandler

	r        backend
	capacity func(context.Context) (runner.Capacity, error)
	log      *slog.Logger
	relay    relay

	runnerID string
	policies policy.Source          // nil: no check of its own (WithPolicy)
	platform func() policy.Platform // what policies resolve against; nil: policy.RunnerPlatform(nil)
}

// NewServer serves r, the runner runnerID, with the host's capacity. A nil logger is
// slog.Default().
func NewServer(runnerID string, r *runner.Runner, logger *slog.Logger) *Server {
	return NewServerFor(runner.NewLocal(runnerID, r), logger)
}

// NewServerFor serves l: its capacity, and creates only when they fit in it.
func NewServerFor(l *runner.Local, logger *slog.Logger) *Server {
	s := newServer(admitting{l.R, l}, l.Capacity, logger)
	s.platform = l.Platform
	return s
}

// admitting is a runner whose creates go through runner.Local's capacity check.
type admitting struct {
	*runner.Runner
	l *runner.Local
}

func (a admitting) Create(ctx context.Context, req runner.CreateRequest) (runner.Sandbox, error) {
	return a.l.Create(ctx, req)
}

func (a admitting) ImportFork(ctx context.Context, req runner.ImportRequest) ([]runner.ForkResult, error) {
	return a.l.ImportFork(ctx, req)
}

func newServer(r backend, capacity func(context.Context) (runner.Capacity, error), logger *slog.Logger) *Server {
	if logger == nil {
		logger = slog.Default()
	}
	return &Server{r: r, capacity: capacity, log: logger, relay: relay{r: r}}
}

// Handler serves RunnerService and the AgentService relay (gRPC over HTTP/2; serve it
// with a TLS configuration from ServerTLSConfig).
func (s *Server) Handler() http.Handler {
	opts := []connect.HandlerOption{
		connect.WithReadMaxBytes(MaxMessageBytes),
		connect.WithSendMaxBytes(MaxMessageBytes),
		connect.WithInterceptors(tracing.Server()), // gateways (mTLS) carry their trace over
	}
	mux := http.NewServeMux()
	mux.Handle(runnerv1connect.NewRunnerServiceHandler(s, opts...))
	mux.Handle(agentv1connect.NewAgentServiceHandler(&s.relay, opts...))
	return mux
}

// HTTPServer returns an HTTP/2 server of Handler with the TLS configuration cfg (from
// ServerTLSConfig); start it with ServeTLS(ln, "", "").
func (s *Server) HTTPServer(cfg *tls.Config) *http.Server {
	srv := &http.Server{
		Handler:           s.Handler(),
		TLSConfig:         cfg,
		ReadHeaderTimeout: 10 * time.Second,
		Protocols:         new(http.Protocols),
		HTTP2:             agent.HTTP2Config(),
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
	srv.Protocols.SetHTTP2(true)
	return srv
}

func (s *Server) Create(ctx context.Context, req *connect.Request[runnerv1.CreateRequest]) (*connect.Response[runnerv1.CreateResponse], error) {
	cr := createFromProto(req.Msg)
	if err := s.admit(ctx, &cr); err != nil {
		return nil, err
	}
	sb, err := s.r.Create(ctx, cr)
	if err != nil {
		return nil, toStatus(req.Msg.GetSpec().GetId(), err)
	}
	return connect.NewResponse(&runnerv1.CreateResponse{Sandbox: sandboxToProto(sb)}), nil
}

func (s *Server) Get(ctx context.Context, req *connect.Request[runnerv1.GetRequest]) (*connect.Response[runnerv1.GetResponse], error) {
	var sb runner.Sandbox
	var err error
	if w := req.Msg.GetAwaitStart(); w != nil && w.AsDuration() > 0 {
		sb, err = s.r.AwaitStart(ctx, req.Msg.GetId(), w.AsDuration()) // capped by the runner
	} else {
		sb, err = s.r.Get(req.Msg.GetId())
	}
	if err != nil {
		return nil, toStatus(req.Msg.GetId(), err)
	}
	return connect.NewResponse(&runnerv1.GetResponse{Sandbox: sandboxToProto(sb)}), nil
}

func (s *Server) List(context.Context, *connect.Request[runnerv1.ListRequest]) (*connect.Response[runnerv1.ListResponse], error) {
	all := s.r.List()
	out := &runnerv1.ListResponse{Sandboxes: make([]*runnerv1.Sandbox, len(all))}
	for i, sb := range all {
		out.Sandboxes[i] = sandboxToProto(sb)
	}
	return connect.NewResponse(out), nil
}

// Delete stops the sandbox; with snapshots, it snapshots them once the containers have
// stopped and before the sandbox is destroyed (runner.Runner.DeleteWithSnapshots).
func (s *Server) Delete(_ context.Context, req *connect.Request[runnerv1.DeleteRequest]) (*connect.Response[runnerv1.DeleteResponse], error) {
	if len(req.Msg.GetSnapshots()) > 0 {
		if n := len(req.Msg.GetSnapshots()); n > maxDeleteSnapshots {
			return nil, apierr.Invalid(apierr.InvalidRequest, fmt.Sprintf("%d snapshots asked of one delete, at most %d", n, maxDeleteSnapshots),
				[]apierr.Violation{{Field: "snapshots", Description: fmt.Sprintf("at most %d", maxDeleteSnapshots)}})
		}
		sb, jobs, err := s.r.DeleteWithSnapshots(req.Msg.GetId(), req.Msg.GetGrace().AsDuration(), targetsFromProto(req.Msg.GetSnapshots()))
		if err != nil {
			return nil, toStatus(req.Msg.GetId(), err)
		}
		return connect.NewResponse(&runnerv1.DeleteResponse{Sandbox: sandboxToProto(sb), Snapshots: jobsToProto(jobs)}), nil
	}
	sb, err := s.r.Delete(req.Msg.GetId(), req.Msg.GetGrace().AsDuration())
	if err != nil {
		return nil, toStatus(req.Msg.GetId(), err)
	}
	return connect.NewResponse(&runnerv1.DeleteResponse{Sandbox: sandboxToProto(sb)}), nil
}

// maxDeleteSnapshots bounds the targets of one delete (a sandbox has a few volumes).
const maxDeleteSnapshots = 64

func (s *Server) SnapshotVolume(ctx context.Context, req *connect.Request[runnerv1.SnapshotVolumeRequest]) (*connect.Response[runnerv1.SnapshotJob], error) {
	job, err := s.r.SnapshotVolume(ctx, req.Msg.GetSandboxId(), targetFromProto(req.Msg.GetTarget()))
	if err != nil {
		return nil, toStatus(req.Msg.GetSandboxId(), err)
	}
	return connect.NewResponse(jobToProto(job)), nil
}

func (s *Server) GetSnapshotJob(_ context.Context, req *connect.Request[runnerv1.GetSnapshotJobRequest]) (*connect.Response[runnerv1.SnapshotJob], error) {
	return connect.NewResponse(jobToProto(s.r.GetSnapshotJob(req.Msg.GetSnapshotId()))), nil
}

// UpdateLifetime sets a sandbox's lifetime (runner.Runner.UpdateLifetime).
func (s *Server) UpdateLifetime(ctx context.Context, req *connect.Request[runnerv1.UpdateLifetimeRequest]) (*connect.Response[runnerv1.UpdateLifetimeResponse], error) {
	sb, err := s.r.UpdateLifetime(ctx, req.Msg.GetId(), req.Msg.GetLifetime().AsDuration())
	if err != nil {
		return nil, toStatus(req.Msg.GetId(), err)
	}
	return connect.NewResponse(&runnerv1.UpdateLifetimeResponse{Sandbox: sandboxToProto(sb)}), nil
}

// Pause pauses a running sandbox (runner.Runner.Pause).
func (s *Server) Pause(ctx context.Context, req *connect.Request[runnerv1.PauseRequest]) (*connect.Response[runnerv1.PauseResponse], error) {
	sb, err := s.r.Pause(ctx, req.Msg.GetId(), runner.PauseOptions{Release: req.Msg.Release, AutoResume: req.Msg.GetAutoResume()})
	if err != nil {
		return nil, toStatus(req.Msg.GetId(), err)
	}
	return connect.NewResponse(&runnerv1.PauseResponse{Sandbox: sandboxToProto(sb)}), nil
}

// Resume continues a paused sandbox (runner.Runner.Resume).
func (s *Server) Resume(ctx context.Context, req *connect.Request[runnerv1.ResumeRequest]) (*connect.Response[runnerv1.ResumeResponse], error) {
	sb, err := s.r.Resume(ctx, req.Msg.GetId())
	if err != nil {
		return nil, toStatus(req.Msg.GetId(), err)
	}
	return connect.NewResponse(&runnerv1.ResumeResponse{Sandbox: sandboxToProto(sb)}), nil
}

// Fork forks a sandbox (runner.Runner.Fork): one result per target, in order.
func (s *Server) Fork(ctx context.Context, req *connect.Request[runnerv1.ForkRequest]) (*connect.Response[runnerv1.ForkResponse], error) {
	results, err := s.r.Fork(ctx, req.Msg.GetId(), forkTargetsFromProto(req.Msg.GetTargets()))
	if err != nil {
		return nil, toStatus(req.Msg.GetId(), err)
	}
	return connect.NewResponse(forkResponse(results)), nil
}

func forkResponse(results []runner.ForkResult) *runnerv1.ForkResponse {
	out := &runnerv1.ForkResponse{Results: make([]*runnerv1.ForkResult, len(results))}
	for i, res := range results {
		out.Results[i] = &runnerv1.ForkResult{Sandbox: sandboxToProto(res.Sandbox)}
		if res.Err != nil {
			out.Results[i].Error = forkErrorToProto(res.Sandbox.ID, res.Err)
		}
	}
	return out
}

// ExportCheckpoint writes a sandbox's checkpoint to the blob store
// (runner.Runner.ExportCheckpoint).
func (s *Server) ExportCheckpoint(ctx context.Context, req *connect.Request[runnerv1.ExportCheckpointRequest]) (*connect.Response[runnerv1.ExportCheckpointResponse], error) {
	ref, sb, err := s.r.ExportCheckpoint(ctx, req.Msg.GetId())
	if err != nil {
		return nil, toStatus(req.Msg.GetId(), err)
	}
	return connect.NewResponse(&runnerv1.ExportCheckpointResponse{Ref: refToProto(ref), Sandbox: sandboxToProto(sb)}), nil
}

// ImportFork makes sandboxes from an exported checkpoint (runner.Runner.ImportFork),
// each checked against the runner's own policy as a Create is (WithPolicy): a fork's
// Meta takes the runner's policy revision and pause settings; a move keeps its own.
func (s *Server) ImportFork(ctx context.Context, req *connect.Request[runnerv1.ImportForkRequest]) (*connect.Response[runnerv1.ForkResponse], error) {
	ir := runner.ImportRequest{Ref: refFromProto(req.Msg.GetRef()), Source: sandboxFromProto(req.Msg.GetSource()),
		Targets: forkTargetsFromProto(req.Msg.GetTargets()), Move: req.Msg.GetMove()}
	id := ir.Source.ID
	if len(ir.Targets) <= runner.MaxForks { // more: the runner refuses them
		for i, t := range ir.Targets {
			cr := runner.CreateRequest{Spec: ir.Source.Spec, Lifetime: t.Lifetime}
			cr.Spec.ID = t.ID
			if cr.Lifetime <= 0 || ir.Move {
				cr.Lifetime = min(ir.Source.Lifetime, runner.MaxLifetime)
			}
			if !ir.Move {
				cr.Spec.Meta = maps.Clone(t.Meta)
			} else {
				cr.Spec.Meta = maps.Clone(cr.Spec.Meta)
			}
			if err := s.admit(ctx, &cr); err != nil {
				return nil, err
			}
			if !ir.Move {
				ir.Targets[i].Meta = cr.Spec.Meta
			}
		}
	}
	results, err := s.r.ImportFork(ctx, ir)
	if err != nil {
		return nil, toStatus(id, err)
	}
	return connect.NewResponse(forkResponse(results)), nil
}

// EnsureVolume makes and checks a registered volume (runner.Runner.EnsureVolume).
func (s *Server) EnsureVolume(ctx context.Context, req *connect.Request[runnerv1.EnsureVolumeRequest]) (*connect.Response[runnerv1.EnsureVolumeResponse], error) {
	v := registeredFromProto(req.Msg.GetVolume())
	if err := s.volumeClasses(ctx, &v); err != nil {
		return nil, err
	}
	vs, err := s.r.EnsureVolume(ctx, v)
	if err != nil {
		return nil, toStatus("", err)
	}
	return connect.NewResponse(&runnerv1.EnsureVolumeResponse{CapacityBytes: vs.CapacityBytes, AccessModes: vs.AccessModes}), nil
}

// DeleteVolume removes a registered volume (runner.Runner.DeleteVolume).
func (s *Server) DeleteVolume(ctx context.Context, req *connect.Request[runnerv1.DeleteVolumeRequest]) (*connect.Response[runnerv1.DeleteVolumeResponse], error) {
	if err := s.r.DeleteVolume(ctx, registeredFromProto(req.Msg.GetVolume()), req.Msg.GetForce()); err != nil {
		return nil, toStatus("", err)
	}
	return connect.NewResponse(&runnerv1.DeleteVolumeResponse{}), nil
}

// DeleteCheckpoint removes an exported checkpoint (runner.Runner.DeleteCheckpoint).
func (s *Server) DeleteCheckpoint(ctx context.Context, req *connect.Request[runnerv1.DeleteCheckpointRequest]) (*connect.Response[runnerv1.DeleteCheckpointResponse], error) {
	if err := s.r.DeleteCheckpoint(ctx, req.Msg.GetKey()); err != nil {
		return nil, toStatus("", err)
	}
	return connect.NewResponse(&runnerv1.DeleteCheckpointResponse{}), nil
}

// Moved ends and forgets a paused sandbox that moved to another runner
// (runner.Runner.Moved).
func (s *Server) Moved(ctx context.Context, req *connect.Request[runnerv1.MovedRequest]) (*connect.Response[runnerv1.MovedResponse], error) {
	if err := s.r.Moved(ctx, req.Msg.GetId(), req.Msg.GetToRunner()); err != nil {
		return nil, toStatus(req.Msg.GetId(), err)
	}
	return connect.NewResponse(&runnerv1.MovedResponse{}), nil
}

func (s *Server) Capacity(ctx context.Context, _ *connect.Request[runnerv1.CapacityRequest]) (*connect.Response[runnerv1.CapacityResponse], error) {
	c, err := s.capacity(ctx)
	if err != nil {
		return nil, toStatus("", err)
	}
	return connect.NewResponse(capacityToProto(c)), nil
}

// relay forwards AgentService calls to the agent of the sandbox named in SandboxIDHeader
// (of its container named in ContainerHeader; none: the primary), message by message.
// Agent errors pass through unchanged.
type relay struct{ r backend }

var _ agentv1connect.AgentServiceHandler = (*relay)(nil)

// agent waits for the sandbox to run and returns its container's agent. A container the
// sandbox does not have is NOT_FOUND CWSANDBOX_CONTAINER_NOT_FOUND (metadata container).
func (s *relay) agent(ctx context.Context, h http.Header) (agentv1connect.AgentServiceClient, error) {
	id := h.Get(SandboxIDHeader)
	if id == "" {
		return nil, missingSandboxID()
	}
	a, err := s.r.Agent(ctx, id, h.Get(ContainerHeader))
	if err != nil {
		return nil, toStatus(id, err)
	}
	return a, nil
}

func missingSandboxID() error {
	return apierr.Invalid(apierr.InvalidRequest, "the "+SandboxIDHeader+" header is required",
		[]apierr.Violation{{Field: SandboxIDHeader, Description: "is required"}})
}

func (s *relay) Exec(ctx context.Context, req *connect.Request[agentv1.ExecRequest]) (*connect.Response[agentv1.ExecResponse], error) {
	return unary(ctx, s, req, agentv1connect.AgentServiceClient.Exec)
}

func (s *relay) ReadFile(ctx context.Context, req *connect.Request[agentv1.ReadFileRequest]) (*connect.Response[agentv1.ReadFileResponse], error) {
	return unary(ctx, s, req, agentv1connect.AgentServiceClient.ReadFile)
}

func (s *relay) WriteFile(ctx context.Context, req *connect.Request[agentv1.WriteFileRequest]) (*connect.Response[agentv1.WriteFileResponse], error) {
	return unary(ctx, s, req, agentv1connect.AgentServiceClient.WriteFile)
}

func (s *relay) ReadFileStream(ctx context.Context, req *connect.Request[agentv1.ReadFileRequest], stream *connect.ServerStream[agentv1.ReadFileChunk]) error {
	return serverStream(ctx, s, req, stream, agentv1connect.AgentServiceClient.ReadFileStream)
}

// WriteFileStream relays the chunks of a file to the agent one message at a time.
func (s *relay) WriteFileStream(ctx context.Context, in *connect.ClientStream[agentv1.WriteFileChunk]) (*connect.Response[agentv1.WriteFileResponse], error) {
	a, err := s.agent(ctx, in.RequestHeader())
	if err != nil {
		return nil, err
	}
	out := a.WriteFileStream(ctx)
	var sendErr error
	for sendErr == nil && in.Receive() {
		sendErr = out.Send(in.Msg())
	}
	if err := in.Err(); err != nil {
		// The caller went away: returning cancels ctx, which resets the agent's stream,
		// so the agent keeps no file (a half-close would too: fewer bytes than size).
		return nil, err
	}
	res, err := out.CloseAndReceive()
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(res.Msg), nil
}

func (s *relay) Status(ctx context.Context, req *connect.Request[agentv1.StatusRequest]) (*connect.Response[agentv1.StatusResponse], error) {
	return unary(ctx, s, req, agentv1connect.AgentServiceClient.Status)
}

func unary[Req, Res any](ctx context.Context, s *relay, req *connect.Request[Req],
	call func(agentv1connect.AgentServiceClient, context.Context, *connect.Request[Req]) (*connect.Response[Res], error),
) (*connect.Response[Res], error) {
	a, err := s.agent(ctx, req.Header())
	if err != nil {
		return nil, err
	}
	res, err := call(a, ctx, connect.NewRequest(req.Msg))
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(res.Msg), nil
}

// Logs is served by the runner rather than relayed to the agent: the runner also serves
// the log of a sandbox that has ended.
func (s *relay) Logs(ctx context.Context, req *connect.Request[agentv1.LogsRequest], stream *connect.ServerStream[agentv1.LogsResponse]) error {
	id := req.Header().Get(SandboxIDHeader)
	if id == "" {
		return missingSandboxID()
	}
	var sendErr error
	err := s.r.Logs(ctx, id, req.Header().Get(ContainerHeader), req.Msg, func(m *agentv1.LogsResponse) error {
		sendErr = stream.Send(m)
		return sendErr
	})
	if err != nil && sendErr == nil {
		return toStatus(id, err)
	}
	return err
}

func (s *relay) Watch(ctx context.Context, req *connect.Request[agentv1.WatchRequest], stream *connect.ServerStream[agentv1.StatusResponse]) error {
	return serverStream(ctx, s, req, stream, agentv1connect.AgentServiceClient.Watch)
}

func serverStream[Req, Res any](ctx context.Context, s *relay, req *connect.Request[Req], stream *connect.ServerStream[Res],
	call func(agentv1connect.AgentServiceClient, context.Context, *connect.Request[Req]) (*connect.ServerStreamForClient[Res], error),
) error {
	a, err := s.agent(ctx, req.Header())
	if err != nil {
		return err
	}
	up, err := call(a, ctx, connect.NewRequest(req.Msg))
	if err != nil {
		return err
	}
	defer func() { _ = up.Close() }()
	for up.Receive() {
		if err := stream.Send(up.Msg()); err != nil {
			return err
		}
	}
	return up.Err()
}

// StreamExec relays both directions one message at a time, so a slow reader on either
// side slows the other down (HTTP/2 flow control) instead of filling memory. The caller's
// half-close is forwarded as a half-close; its going away cancels the agent's call.
func (s *relay) StreamExec(ctx context.Context, stream *connect.BidiStream[agentv1.StreamExecRequest, agentv1.StreamExecResponse]) error {
	a, err := s.agent(ctx, stream.RequestHeader())
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	up := a.StreamExec(ctx)
	defer func() { _ = up.CloseResponse() }()
	go func() {
		for {
			m, err := stream.Receive()
			if err != nil {
				if errors.Is(err, io.EOF) {
					_ = up.CloseRequest()
				} else {
					cancel()
				}
				return
			}
			if err := up.Send(m); err != nil {
				return // the agent's side ended; its Receive reports why
			}
		}
	}()
	for {
		m, err := up.Receive()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := stream.Send(m); err != nil {
			return err
		}
	}
}
