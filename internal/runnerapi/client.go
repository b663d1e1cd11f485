package runnerapi

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1/agentv1connect"
	runnerv1 "github.com/sandboxd/sandboxd/gen/sandboxd/runner/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/runner/v1/runnerv1connect"
	"github.com/sandboxd/sandboxd/internal/agent"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/pki"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/tracing"
)

// ClientConfig configures a Client.
type ClientConfig struct {
	ID    string // the runner's ID, also the name its certificate must carry
	Group string // default "default"
	Addr  string // host:port the runner listens on
	// TLS verifies the runner and presents the gateway's certificate (ClientTLSConfig).
	TLS *tls.Config
}

// Client is a runner in another process, seen by the gateway: it implements
// runner.Handle over RunnerService and the runner's AgentService relay. Its errors are
// those of *runner.Runner (errors.Is runtime.ErrNotFound, runner.ErrNotRunning;
// errors.As *runner.ValidationError); failing to reach the runner is UNAVAILABLE
// CWSANDBOX_RUNNER_UNAVAILABLE.
type Client struct {
	id, group string
	owner     *ownerPin
	hc        *http.Client
	runner    runnerv1connect.RunnerServiceClient
	agents    agentv1connect.AgentServiceClient
}

var (
	_ runner.SnapshotHandle = (*Client)(nil)
	_ runner.LifetimeHandle = (*Client)(nil)
	_ runner.PauseHandle    = (*Client)(nil)
	_ runner.PortHandle     = (*Client)(nil)
	_ runner.OwnedHandle    = (*Client)(nil)
)

// NewClient returns a client of the runner at cfg.Addr. It connects on first use.
func NewClient(cfg ClientConfig) (*Client, error) {
	if cfg.ID == "" || cfg.Addr == "" {
		return nil, errors.New("runnerapi: runner ID and address are required")
	}
	if cfg.TLS == nil {
		return nil, errors.New("runnerapi: a TLS configuration is required")
	}
	if cfg.Group == "" {
		cfg.Group = "default"
	}
	tc := cfg.TLS.Clone()
	if tc.ServerName == "" {
		tc.ServerName = cfg.ID
	}
	pin := &ownerPin{runnerID: cfg.ID}
	next := tc.VerifyConnection
	tc.VerifyConnection = func(cs tls.ConnectionState) error {
		if next != nil {
			if err := next(cs); err != nil {
				return err
			}
		}
		return pin.verify(cs)
	}
	hc := agent.NewTLSHTTPClient(tc)
	base := "https://" + cfg.Addr
	opts := []connect.ClientOption{
		connect.WithGRPC(),
		// Like the runner's own agent clients: no gzip (CPU on every file and output chunk).
		connect.WithAcceptCompression("gzip", nil, nil),
		connect.WithReadMaxBytes(MaxMessageBytes),
		connect.WithSendMaxBytes(MaxMessageBytes),
		connect.WithCodec(boundedCodec{}),          // and at most MaxReplyElements in a message
		connect.WithInterceptors(tracing.Client()), // the trace goes on in the runner
	}
	c := &Client{id: cfg.ID, group: cfg.Group, owner: pin, hc: hc}
	c.runner = runnerv1connect.NewRunnerServiceClient(hc, base, opts...)
	c.agents = agentv1connect.NewAgentServiceClient(hc, base, append(opts, connect.WithInterceptors(sandboxHeader{runnerID: cfg.ID}))...)
	return c, nil
}

// Close drops idle connections to the runner.
func (c *Client) Close() { c.hc.CloseIdleConnections() }

// Owner is the organization the runner's certificate names (pki.RunnerOwner: "" for a
// certificate marked as a platform runner's), known once a connection to it was
// verified. The first verified owner is kept: a later certificate naming another owner
// is refused at the handshake, and so is any naming no runner (it belongs to nobody).
func (c *Client) Owner() (string, bool) { return c.owner.get() }

func (c *Client) ID() string    { return c.id }
func (c *Client) Group() string { return c.group }

func (c *Client) Create(ctx context.Context, req runner.CreateRequest) (runner.Sandbox, error) {
	for name := range req.Restores {
		// The wire carries a restore in the volume it fills: one naming no volume would
		// be lost on the way, so it is refused here as the runner would.
		if !slices.ContainsFunc(req.Spec.Volumes, func(v runtime.Volume) bool { return v.Name == name }) {
			return runner.Sandbox{}, &runner.ValidationError{Violations: []apierr.Violation{{Field: "spec.volumes",
				Description: fmt.Sprintf("no scratch volume %q to restore from snapshot %s", name, req.Restores[name].SnapshotID)}}}
		}
	}
	res, err := c.runner.Create(ctx, connect.NewRequest(createToProto(req)))
	if err != nil {
		return runner.Sandbox{}, fromStatus(ctx, c.id, err)
	}
	// Any valid ID: the gateway decides whether the runner may take another than it
	// asked for (gateway answeredID), and deletes what it may not.
	return c.sandbox("", res.Msg.GetSandbox())
}

func (c *Client) Get(ctx context.Context, id string) (runner.Sandbox, error) {
	res, err := c.runner.Get(ctx, connect.NewRequest(&runnerv1.GetRequest{Id: id}))
	if err != nil {
		return runner.Sandbox{}, fromStatus(ctx, c.id, err)
	}
	return c.sandbox(id, res.Msg.GetSandbox())
}

// AwaitStart implements runner.AwaitHandle: the runner waits (runner.Runner.AwaitStart).
// A runner that predates the field answers at once, as Get.
func (c *Client) AwaitStart(ctx context.Context, id string, wait time.Duration) (runner.Sandbox, error) {
	res, err := c.runner.Get(ctx, connect.NewRequest(&runnerv1.GetRequest{Id: id, AwaitStart: durationpb.New(wait)}))
	if err != nil {
		return runner.Sandbox{}, fromStatus(ctx, c.id, err)
	}
	return c.sandbox(id, res.Msg.GetSandbox())
}

// List returns every sandbox of the runner, oldest first.
func (c *Client) List(ctx context.Context) ([]runner.Sandbox, error) {
	res, err := c.runner.List(ctx, connect.NewRequest(&runnerv1.ListRequest{}))
	if err != nil {
		return nil, fromStatus(ctx, c.id, err)
	}
	if n := len(res.Msg.GetSandboxes()); n > MaxListedSandboxes {
		return nil, badReply(c.id, "list: %d sandboxes, at most %d", n, MaxListedSandboxes)
	}
	out := make([]runner.Sandbox, len(res.Msg.GetSandboxes()))
	seen := make(map[string]bool, len(out))
	for i, sb := range res.Msg.GetSandboxes() {
		if sb.GetId() == "" || seen[sb.GetId()] {
			return nil, badReply(c.id, "list: sandbox %d has no ID or one listed before (%q)", i, clipID(sb.GetId()))
		}
		seen[sb.GetId()] = true
		if out[i], err = c.sandbox("", sb); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func (c *Client) Delete(ctx context.Context, id string, grace time.Duration) (runner.Sandbox, error) {
	res, err := c.runner.Delete(ctx, connect.NewRequest(&runnerv1.DeleteRequest{Id: id, Grace: durationpb.New(grace)}))
	if err != nil {
		return runner.Sandbox{}, fromStatus(ctx, c.id, err)
	}
	return c.sandbox(id, res.Msg.GetSandbox())
}

// DeleteWithSnapshots is Delete with DeleteRequest.snapshots (none: Delete).
func (c *Client) DeleteWithSnapshots(ctx context.Context, id string, grace time.Duration, targets []runner.SnapshotTarget) (runner.Sandbox, []runner.SnapshotJob, error) {
	res, err := c.runner.Delete(ctx, connect.NewRequest(&runnerv1.DeleteRequest{Id: id, Grace: durationpb.New(grace), Snapshots: targetsToProto(targets)}))
	if err != nil {
		return runner.Sandbox{}, nil, fromStatus(ctx, c.id, err)
	}
	if n := len(res.Msg.GetSnapshots()); n != len(targets) {
		return runner.Sandbox{}, nil, badReply(c.id, "%d snapshot jobs for %d snapshots", n, len(targets))
	}
	for i, j := range res.Msg.GetSnapshots() {
		if err := checkJob(c.id, targets[i].SnapshotID, j); err != nil {
			return runner.Sandbox{}, nil, err
		}
	}
	sb, err := c.sandbox(id, res.Msg.GetSandbox())
	if err != nil {
		return runner.Sandbox{}, nil, err
	}
	return sb, jobsFromProto(res.Msg.GetSnapshots()), nil
}

func (c *Client) SnapshotVolume(ctx context.Context, sandboxID string, t runner.SnapshotTarget) (runner.SnapshotJob, error) {
	res, err := c.runner.SnapshotVolume(ctx, connect.NewRequest(&runnerv1.SnapshotVolumeRequest{SandboxId: sandboxID, Target: targetToProto(t)}))
	if err != nil {
		return runner.SnapshotJob{}, fromStatus(ctx, c.id, err)
	}
	if err := checkJob(c.id, t.SnapshotID, res.Msg); err != nil {
		return runner.SnapshotJob{}, err
	}
	return jobFromProto(res.Msg), nil
}

func (c *Client) GetSnapshotJob(ctx context.Context, snapshotID string) (runner.SnapshotJob, error) {
	res, err := c.runner.GetSnapshotJob(ctx, connect.NewRequest(&runnerv1.GetSnapshotJobRequest{SnapshotId: snapshotID}))
	if err != nil {
		return runner.SnapshotJob{}, fromStatus(ctx, c.id, err)
	}
	if err := checkJob(c.id, snapshotID, res.Msg); err != nil {
		return runner.SnapshotJob{}, err
	}
	return jobFromProto(res.Msg), nil
}

// UpdateLifetime implements runner.LifetimeHandle.
func (c *Client) UpdateLifetime(ctx context.Context, id string, lifetime time.Duration) (runner.Sandbox, error) {
	res, err := c.runner.UpdateLifetime(ctx, connect.NewRequest(&runnerv1.UpdateLifetimeRequest{Id: id, Lifetime: durationpb.New(lifetime)}))
	if err != nil {
		return runner.Sandbox{}, fromStatus(ctx, c.id, err)
	}
	return c.sandbox(id, res.Msg.GetSandbox())
}

// Pause implements runner.PauseHandle.
func (c *Client) Pause(ctx context.Context, id string, opts runner.PauseOptions) (runner.Sandbox, error) {
	res, err := c.runner.Pause(ctx, connect.NewRequest(&runnerv1.PauseRequest{Id: id, Release: opts.Release, AutoResume: opts.AutoResume}))
	if err != nil {
		err = fromStatus(ctx, c.id, err)
		if re := (*remoteError)(nil); errors.As(err, &re) && errors.Is(re.sentinel, runner.ErrPaused) {
			re.sentinel = runner.ErrAlreadyPaused // what a paused sandbox's Pause is
		}
		return runner.Sandbox{}, err
	}
	return c.sandbox(id, res.Msg.GetSandbox())
}

// Resume implements runner.PauseHandle.
func (c *Client) Resume(ctx context.Context, id string) (runner.Sandbox, error) {
	res, err := c.runner.Resume(ctx, connect.NewRequest(&runnerv1.ResumeRequest{Id: id}))
	if err != nil {
		return runner.Sandbox{}, fromStatus(ctx, c.id, err)
	}
	return c.sandbox(id, res.Msg.GetSandbox())
}

// Fork implements runner.PauseHandle.
func (c *Client) Fork(ctx context.Context, id string, targets []runner.ForkTarget) ([]runner.ForkResult, error) {
	res, err := c.runner.Fork(ctx, connect.NewRequest(&runnerv1.ForkRequest{Id: id, Targets: forkTargetsToProto(targets)}))
	if err != nil {
		return nil, fromStatus(ctx, c.id, err)
	}
	return c.forkResults(res.Msg, targets)
}

// forkResults is a Fork's or ImportFork's answer, one result per target.
func (c *Client) forkResults(res *runnerv1.ForkResponse, targets []runner.ForkTarget) ([]runner.ForkResult, error) {
	if len(res.GetResults()) != len(targets) {
		return nil, badReply(c.id, "%d forks for %d targets", len(res.GetResults()), len(targets))
	}
	out := make([]runner.ForkResult, len(targets))
	for i, r := range res.GetResults() {
		var err error
		if out[i].Sandbox, err = c.sandbox(targets[i].ID, r.GetSandbox()); err != nil {
			return nil, err
		}
		if r.GetError() != nil {
			if err := checkForkError(c.id, targets[i].ID, r.GetError()); err != nil {
				return nil, err
			}
			out[i].Err = forkErrorFromProto(targets[i].ID, r.GetError())
		}
	}
	return out, nil
}

// ExportCheckpoint implements runner.PortHandle.
func (c *Client) ExportCheckpoint(ctx context.Context, id string) (runner.CheckpointRef, runner.Sandbox, error) {
	res, err := c.runner.ExportCheckpoint(ctx, connect.NewRequest(&runnerv1.ExportCheckpointRequest{Id: id}))
	if err != nil {
		return runner.CheckpointRef{}, runner.Sandbox{}, fromStatus(ctx, c.id, err)
	}
	sb, err := c.sandbox(id, res.Msg.GetSandbox())
	if err != nil {
		return runner.CheckpointRef{}, runner.Sandbox{}, err
	}
	if res.Msg.GetRef().GetBytes() < 0 {
		return runner.CheckpointRef{}, runner.Sandbox{}, badReply(c.id, "checkpoint of %d bytes", res.Msg.GetRef().GetBytes())
	}
	return refFromProto(res.Msg.GetRef()), sb, nil
}

// ImportFork implements runner.PortHandle.
func (c *Client) ImportFork(ctx context.Context, req runner.ImportRequest) ([]runner.ForkResult, error) {
	res, err := c.runner.ImportFork(ctx, connect.NewRequest(&runnerv1.ImportForkRequest{Ref: refToProto(req.Ref),
		Source: sandboxToProto(req.Source), Targets: forkTargetsToProto(req.Targets), Move: req.Move}))
	if err != nil {
		return nil, fromStatus(ctx, c.id, err)
	}
	return c.forkResults(res.Msg, req.Targets)
}

// DeleteCheckpoint implements runner.PortHandle.
func (c *Client) DeleteCheckpoint(ctx context.Context, key string) error {
	_, err := c.runner.DeleteCheckpoint(ctx, connect.NewRequest(&runnerv1.DeleteCheckpointRequest{Key: key}))
	return fromStatus(ctx, c.id, err)
}

// EnsureVolume implements runner.VolumeHandle.
func (c *Client) EnsureVolume(ctx context.Context, v runner.RegisteredVolume) (runner.VolumeState, error) {
	resp, err := c.runner.EnsureVolume(ctx, connect.NewRequest(&runnerv1.EnsureVolumeRequest{Volume: registeredToProto(v)}))
	if err != nil {
		return runner.VolumeState{}, fromStatus(ctx, c.id, err)
	}
	if resp.Msg.GetCapacityBytes() < 0 {
		return runner.VolumeState{}, badReply(c.id, "volume capacity %d bytes", resp.Msg.GetCapacityBytes())
	}
	return runner.VolumeState{CapacityBytes: resp.Msg.GetCapacityBytes(), AccessModes: resp.Msg.GetAccessModes()}, nil
}

// DeleteVolume implements runner.VolumeHandle.
func (c *Client) DeleteVolume(ctx context.Context, v runner.RegisteredVolume, force bool) error {
	_, err := c.runner.DeleteVolume(ctx, connect.NewRequest(&runnerv1.DeleteVolumeRequest{Volume: registeredToProto(v), Force: force}))
	return fromStatus(ctx, c.id, err)
}

func registeredToProto(v runner.RegisteredVolume) *runnerv1.RegisteredVolume {
	return &runnerv1.RegisteredVolume{OrganizationId: v.Org, ClaimName: v.ClaimName, Namespace: v.Namespace, SizeBytes: v.SizeBytes}
}

func registeredFromProto(p *runnerv1.RegisteredVolume) runner.RegisteredVolume {
	return runner.RegisteredVolume{Org: p.GetOrganizationId(), ClaimName: p.GetClaimName(), Namespace: p.GetNamespace(), SizeBytes: p.GetSizeBytes()}
}

// Moved implements runner.PortHandle.
func (c *Client) Moved(ctx context.Context, id, to string) error {
	_, err := c.runner.Moved(ctx, connect.NewRequest(&runnerv1.MovedRequest{Id: id, ToRunner: to}))
	return fromStatus(ctx, c.id, err)
}

func (c *Client) Capacity(ctx context.Context) (runner.Capacity, error) {
	res, err := c.runner.Capacity(ctx, connect.NewRequest(&runnerv1.CapacityRequest{}))
	if err != nil {
		return runner.Capacity{}, fromStatus(ctx, c.id, err)
	}
	if err := checkCapacity(c.id, res.Msg); err != nil {
		return runner.Capacity{}, err
	}
	return capacityFromProto(res.Msg), nil
}

// sandbox is p, a sandbox the runner answered about want ("" = any), once checked
// (checkSandbox). An answer without an ID (taken as about want) keeps none: callers
// fill it in (or take what they had).
func (c *Client) sandbox(want string, p *runnerv1.Sandbox) (runner.Sandbox, error) {
	if err := checkSandbox(c.id, want, p); err != nil {
		return runner.Sandbox{}, err
	}
	return sandboxFromProto(p), nil
}

// Agent returns the sandbox's agent behind the runner's relay. It answers at once: the
// runner waits for the sandbox to run when a call arrives, and a call on a sandbox that
// is unknown or no longer running fails with CWSANDBOX_SANDBOX_NOT_FOUND or
// CWSANDBOX_SANDBOX_NOT_RUNNING, as the gateway would report them. Saving the round trip
// keeps an exec to one call.
func (c *Client) Agent(_ context.Context, id, container string) (agentv1connect.AgentServiceClient, error) {
	return sandboxAgent{id: id, container: container, c: c.agents}, nil
}

// Logs reads the sandbox's log through the runner's relay, which serves it also once the
// sandbox has ended (runner.Runner.Logs).
func (c *Client) Logs(ctx context.Context, id, container string, req *agentv1.LogsRequest, send func(*agentv1.LogsResponse) error) error {
	return agent.ForwardLogs(ctx, sandboxAgent{id: id, container: container, c: c.agents}, req, send)
}

// sandboxAgent is the agent of one container of a sandbox ("" = the primary): every call
// carries the sandbox's ID and the container's name, which the sandboxHeader interceptor
// turns into the relay's headers.
type sandboxAgent struct {
	id, container string
	c             agentv1connect.AgentServiceClient
}

type sandboxKey struct{}

// target is what a relayed call is for.
type target struct{ id, container string }

func (a sandboxAgent) ctx(ctx context.Context) context.Context {
	return context.WithValue(ctx, sandboxKey{}, target{a.id, a.container})
}

// setTarget sets the relay's headers from the call's context.
func setTarget(ctx context.Context, h http.Header) {
	if t, ok := ctx.Value(sandboxKey{}).(target); ok {
		h.Set(SandboxIDHeader, t.id)
		if t.container != "" {
			h.Set(ContainerHeader, t.container)
		}
	}
}

func (a sandboxAgent) Exec(ctx context.Context, req *connect.Request[agentv1.ExecRequest]) (*connect.Response[agentv1.ExecResponse], error) {
	return a.c.Exec(a.ctx(ctx), req)
}

func (a sandboxAgent) StreamExec(ctx context.Context) *connect.BidiStreamForClient[agentv1.StreamExecRequest, agentv1.StreamExecResponse] {
	return a.c.StreamExec(a.ctx(ctx))
}

func (a sandboxAgent) ReadFile(ctx context.Context, req *connect.Request[agentv1.ReadFileRequest]) (*connect.Response[agentv1.ReadFileResponse], error) {
	return a.c.ReadFile(a.ctx(ctx), req)
}

func (a sandboxAgent) WriteFile(ctx context.Context, req *connect.Request[agentv1.WriteFileRequest]) (*connect.Response[agentv1.WriteFileResponse], error) {
	return a.c.WriteFile(a.ctx(ctx), req)
}

func (a sandboxAgent) ReadFileStream(ctx context.Context, req *connect.Request[agentv1.ReadFileRequest]) (*connect.ServerStreamForClient[agentv1.ReadFileChunk], error) {
	return a.c.ReadFileStream(a.ctx(ctx), req)
}

func (a sandboxAgent) WriteFileStream(ctx context.Context) *connect.ClientStreamForClient[agentv1.WriteFileChunk, agentv1.WriteFileResponse] {
	return a.c.WriteFileStream(a.ctx(ctx))
}

func (a sandboxAgent) Logs(ctx context.Context, req *connect.Request[agentv1.LogsRequest]) (*connect.ServerStreamForClient[agentv1.LogsResponse], error) {
	return a.c.Logs(a.ctx(ctx), req)
}

func (a sandboxAgent) Status(ctx context.Context, req *connect.Request[agentv1.StatusRequest]) (*connect.Response[agentv1.StatusResponse], error) {
	return a.c.Status(a.ctx(ctx), req)
}

func (a sandboxAgent) Watch(ctx context.Context, req *connect.Request[agentv1.WatchRequest]) (*connect.ServerStreamForClient[agentv1.StatusResponse], error) {
	return a.c.Watch(a.ctx(ctx), req)
}

// sandboxHeader sets SandboxIDHeader and ContainerHeader from the call's context, and reports failures to
// reach the runner as such (not as an agent that went away).
type sandboxHeader struct{ runnerID string }

func (i sandboxHeader) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		setTarget(ctx, req.Header())
		res, err := next(ctx, req)
		if err != nil && ctx.Err() == nil {
			err = transportError(i.runnerID, err)
		}
		return res, err
	}
}

func (i sandboxHeader) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		conn := next(ctx, spec)
		setTarget(ctx, conn.RequestHeader())
		return transportConn{StreamingClientConn: conn, ctx: ctx, runnerID: i.runnerID}
	}
}

func (i sandboxHeader) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// transportConn maps a stream's failure to reach the runner like WrapUnary does.
type transportConn struct {
	connect.StreamingClientConn
	ctx      context.Context
	runnerID string
}

func (c transportConn) Receive(m any) error {
	err := c.StreamingClientConn.Receive(m)
	if err != nil && c.ctx.Err() == nil && !errors.Is(err, io.EOF) {
		err = transportError(c.runnerID, err)
	}
	return err
}

// ownerPin is the owner of a runner's certificate, verified at each TLS handshake and
// pinned at the first.
type ownerPin struct {
	runnerID string
	mu       sync.Mutex
	org      string
	known    bool
}

func (p *ownerPin) get() (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.org, p.known
}

// verify runs after the runner's chain and name are verified: its one runner URI SAN
// (pki.RunnerOwner: an organization's runner, or explicitly the platform's) must name
// this runner, and its owner be the one seen first. A certificate naming no runner
// belongs to nobody: refused, so the runner takes nothing.
func (p *ownerPin) verify(cs tls.ConnectionState) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("runnerapi: the runner presented no certificate")
	}
	org, id, platform, err := pki.RunnerOwner(cs.PeerCertificates[0])
	if err != nil {
		return fmt.Errorf("runnerapi: runner %s: %w", p.runnerID, err)
	}
	if id != p.runnerID {
		if platform {
			return fmt.Errorf("runnerapi: the certificate of runner %s names platform runner %s", p.runnerID, id)
		}
		return fmt.Errorf("runnerapi: the certificate of runner %s names runner %s of organization %s", p.runnerID, id, org)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.known && org != p.org {
		return fmt.Errorf("runnerapi: runner %s's certificate names %s, earlier %s: refused (restart the gateway after moving a runner between organizations)", p.runnerID, ownerName(org), ownerName(p.org))
	}
	p.org, p.known = org, true
	return nil
}

func ownerName(org string) string {
	if org == "" {
		return "the platform"
	}
	return fmt.Sprintf("organization %q", org)
}
