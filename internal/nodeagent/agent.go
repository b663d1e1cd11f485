// Package nodeagent is the node agent: a service on each gVisor node of a Kubernetes
// runner that checkpoints the runner's gVisor Pod sandboxes through the patched
// containerd shim's hibernate server and keeps the images for restore-on-start (pause,
// resume and fork of gvisor sandboxes on Kubernetes).
//
// Trust: the caller is authenticated by its client certificate (tls.go): it must chain to
// the runner's node-agent CA and name the agent's runner ID; that ID is the owner of every
// checkpoint the call makes or sees, never a request field. The Pod sandbox to checkpoint
// is resolved through the node's CRI (cri.Resolver) and must be the caller's (its
// sandboxd.io/runner-id label), of the gVisor runtime handler, in a served namespace and
// carry the sandbox ID asked for; checkpoint IDs are the agent's own (store.NewID), so no
// path comes from the caller.
package nodeagent

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	nodeagentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/nodeagent/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/nodeagent/v1/nodeagentv1connect"
	"github.com/sandboxd/sandboxd/internal/nodeagent/cri"
	"github.com/sandboxd/sandboxd/internal/nodeagent/hibernate"
	"github.com/sandboxd/sandboxd/internal/nodeagent/store"
	"github.com/sandboxd/sandboxd/internal/pki"
	"github.com/sandboxd/sandboxd/internal/textclip"
)

// Resolver finds the caller's Pod sandbox (cri.Resolver).
type Resolver interface {
	Sandbox(ctx context.Context, q cri.Query) (cri.Sandbox, error)
	Running(ctx context.Context, sandboxID string) (bool, error)
}

// Checkpointer checkpoints a Pod sandbox into an image directory (ShimCheckpointer).
type Checkpointer interface {
	Checkpoint(ctx context.Context, sandboxID, imageDir string, leaveRunning bool) error
}

// ShimCheckpointer checkpoints through the shim's hibernate server under ShimRoot.
type ShimCheckpointer struct{ ShimRoot string }

func (s ShimCheckpointer) Checkpoint(ctx context.Context, sandboxID, imageDir string, leaveRunning bool) error {
	sock, err := hibernate.SocketPath(s.ShimRoot, sandboxID)
	if err != nil {
		return err
	}
	c, err := hibernate.Dial(ctx, sock)
	if err != nil {
		return err
	}
	defer func() { _ = c.Close() }()
	return c.Checkpoint(ctx, hibernate.CheckpointRequest{ContainerID: sandboxID, ImagePath: imageDir, LeaveRunning: leaveRunning})
}

// Config configures a Server.
type Config struct {
	// Node is the node's name (returned to callers: restore Pods are pinned to it).
	Node string
	// RunnerID is the one runner this agent serves (its client certificate must name it).
	RunnerID     string
	Resolver     Resolver
	Checkpointer Checkpointer
	Store        *store.Store
	// DefaultEstimate is reserved against the quotas for a Pod whose memory limits are
	// unknown (default 1 GiB).
	DefaultEstimate int64
	// CheckpointTimeout bounds one checkpoint (default 10 min). A checkpoint runs to its
	// end even when the caller goes away (its image is then the caller's to delete).
	CheckpointTimeout time.Duration
	// MaxConcurrent bounds the checkpoints in progress (default 2).
	MaxConcurrent int
	// TimeoutHold: after a checkpoint timed out (the shim's runsc may still be writing the
	// image), the sandbox's claim is held this long before another checkpoint of it may
	// start (default 10 min); the image is left to the store's aged GC.
	TimeoutHold time.Duration
	Log         *slog.Logger
}

// DefaultCheckpointTimeout is Config.CheckpointTimeout's default: the agent's own bound
// on one checkpoint (a runner's client waits this long plus a margin).
const DefaultCheckpointTimeout = 10 * time.Minute

// Server implements NodeAgentService.
type Server struct {
	cfg  Config
	log  *slog.Logger
	sem  chan struct{}
	mu   sync.Mutex
	busy map[string]bool // Pod sandbox IDs being checkpointed
}

var _ nodeagentv1connect.NodeAgentServiceHandler = (*Server)(nil)

// NewServer checks cfg and returns the server.
func NewServer(cfg Config) (*Server, error) {
	if cfg.Node == "" || cfg.Resolver == nil || cfg.Checkpointer == nil || cfg.Store == nil {
		return nil, errors.New("nodeagent: node, resolver, checkpointer and store are required")
	}
	if err := cri.ValidRunnerID(cfg.RunnerID); err != nil {
		return nil, fmt.Errorf("nodeagent: %w", err)
	}
	if cfg.DefaultEstimate <= 0 {
		cfg.DefaultEstimate = 1 << 30
	}
	if cfg.CheckpointTimeout <= 0 {
		cfg.CheckpointTimeout = DefaultCheckpointTimeout
	}
	if cfg.MaxConcurrent <= 0 {
		cfg.MaxConcurrent = 2
	}
	if cfg.TimeoutHold <= 0 {
		cfg.TimeoutHold = 10 * time.Minute
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	return &Server{cfg: cfg, log: cfg.Log, sem: make(chan struct{}, cfg.MaxConcurrent), busy: map[string]bool{}}, nil
}

// MaxRequestBytes bounds a request message (they are a few hundred bytes).
const MaxRequestBytes = 16 << 10

// Handler is the HTTP handler: the caller is authenticated (its verified client
// certificate names the agent's runner) before any body is read.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle(nodeagentv1connect.NewNodeAgentServiceHandler(s, connect.WithReadMaxBytes(MaxRequestBytes)))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		owner, err := s.authenticate(r)
		if err != nil {
			writeUnauthenticated(w, err)
			return
		}
		mux.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), ownerKey{}, owner)))
	})
}

// HTTPServer serves Handler over HTTP/2 with cfg (ServerTLSConfig); start it with
// ServeTLS(ln, "", "").
func (s *Server) HTTPServer(tlsCfg *tls.Config) *http.Server {
	srv := &http.Server{
		Handler:           s.Handler(),
		TLSConfig:         tlsCfg,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       5 * time.Minute,
		Protocols:         new(http.Protocols),
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
	srv.Protocols.SetHTTP2(true)
	return srv
}

type ownerKey struct{}

func (s *Server) authenticate(r *http.Request) (string, error) {
	if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 || len(r.TLS.PeerCertificates) == 0 {
		return "", errors.New("a verified client certificate is required")
	}
	id, ok := pki.NodeAgentRunner(r.TLS.PeerCertificates[0])
	if !ok || id != s.cfg.RunnerID {
		return "", errors.New("the client certificate does not name this agent's runner")
	}
	return id, nil
}

func writeUnauthenticated(w http.ResponseWriter, err error) {
	// A gRPC-shaped answer: HTTP 200 with grpc-status 16 (UNAUTHENTICATED) in the headers.
	w.Header().Set("Content-Type", "application/grpc")
	w.Header().Set("Grpc-Status", strconv.Itoa(int(connect.CodeUnauthenticated)))
	w.Header().Set("Grpc-Message", err.Error())
	w.WriteHeader(http.StatusOK)
}

func ownerOf(ctx context.Context) (string, error) {
	if o, ok := ctx.Value(ownerKey{}).(string); ok && o != "" {
		return o, nil
	}
	return "", connect.NewError(connect.CodeUnauthenticated, errors.New("no runner identity"))
}

// ValidateCheckpointRequest checks every field of a Checkpoint request.
func ValidateCheckpointRequest(m *nodeagentv1.CheckpointRequest) error {
	if m.GetPod() == nil {
		return fmt.Errorf("%w pod: required", cri.ErrInvalid)
	}
	ref := cri.PodRef{Namespace: m.GetPod().GetNamespace(), Name: m.GetPod().GetName(), UID: m.GetPod().GetUid()}
	if err := ref.Validate(); err != nil {
		return err
	}
	return cri.ValidSandboxID(m.GetSandboxId())
}

// SandboxRunningMeta is the error metadata key of a failed Checkpoint saying whether the
// Pod sandbox still runs: "true", "false" or "unknown" (the CRI could not tell); absent:
// the sandbox was never touched (refused before checkpointing).
const SandboxRunningMeta = "Sandboxd-Sandbox-Running"

// runningMeta is the SandboxRunningMeta value of r.
func runningMeta(r *bool) string {
	if r == nil {
		return "unknown"
	}
	return strconv.FormatBool(*r)
}

func (s *Server) Checkpoint(ctx context.Context, req *connect.Request[nodeagentv1.CheckpointRequest]) (*connect.Response[nodeagentv1.CheckpointResponse], error) {
	owner, err := ownerOf(ctx)
	if err != nil {
		return nil, err
	}
	m := req.Msg
	if err := ValidateCheckpointRequest(m); err != nil {
		return nil, toConnect(err)
	}
	ref := cri.PodRef{Namespace: m.Pod.Namespace, Name: m.Pod.Name, UID: m.Pod.Uid}
	sb, err := s.cfg.Resolver.Sandbox(ctx, cri.Query{Pod: ref, RunnerID: owner, SandboxID: m.SandboxId})
	if err != nil {
		return nil, toConnect(err)
	}
	if !s.claim(sb.ID) {
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("a checkpoint of sandbox %s is in progress", m.SandboxId))
	}
	holdClaim := false
	defer func() {
		if holdClaim {
			time.AfterFunc(s.cfg.TimeoutHold, func() { s.release(sb.ID) })
			return
		}
		s.release(sb.ID)
	}()
	select {
	case s.sem <- struct{}{}:
		defer func() { <-s.sem }()
	case <-ctx.Done():
		return nil, connect.NewError(connect.CodeCanceled, ctx.Err())
	}
	estimate := sb.MemoryBytes
	if estimate <= 0 {
		estimate = s.cfg.DefaultEstimate
	}
	id, dir, err := s.cfg.Store.Begin(store.Entry{
		Owner: owner, SandboxID: m.SandboxId, LeaveRunning: m.LeaveRunning,
		Pod: store.PodRef{Namespace: ref.Namespace, Name: ref.Name, UID: ref.UID},
	}, estimate)
	if err != nil {
		return nil, toConnect(err)
	}
	// The checkpoint runs to its end even if the caller goes away: an image cut short is
	// worth nothing, and a sandbox left half checkpointed worse.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.CheckpointTimeout)
	defer cancel()
	start := time.Now()
	ckptErr := s.cfg.Checkpointer.Checkpoint(cctx, sb.ID, dir, m.LeaveRunning)
	err = ckptErr
	took := time.Since(start)
	var entry store.Entry
	if err == nil {
		entry, err = s.cfg.Store.Complete(id)
	} else if cctx.Err() != nil {
		// Timed out: the shim's runsc may still write into dir. Remove nothing now; the
		// incomplete entry goes with GC, and no other checkpoint of the sandbox starts
		// for TimeoutHold.
		holdClaim = true
		if aerr := s.cfg.Store.Abandon(id); aerr != nil {
			s.log.Warn("node agent: abandoning a timed-out image", "id", id, "err", aerr)
		}
		s.log.Warn("node agent: checkpoint timed out; image left to GC, sandbox held", "id", id, "sandbox", m.SandboxId, "hold", s.cfg.TimeoutHold)
		err = connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("checkpoint of sandbox %s timed out", m.SandboxId))
	} else {
		if aerr := s.cfg.Store.Abort(id); aerr != nil {
			s.log.Warn("node agent: removing a failed image", "id", id, "err", aerr)
		}
		// The shim's and runsc's own text (host paths, shim internals) stays in this
		// agent's log (below): the caller gets one fixed sentence per kind of failure.
		err = connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("checkpoint of sandbox %s failed: %s", m.SandboxId, checkpointFailure(err)))
	}
	// A successful checkpoint without leave_running ends the sandbox (runsc), whatever
	// becomes of its image; otherwise ask the runtime whether a container of it still runs
	// (nil: it could not tell).
	var running *bool
	if ckptErr == nil && !m.LeaveRunning {
		running = new(bool)
	} else if r, rerr := s.cfg.Resolver.Running(cctx, sb.ID); rerr == nil {
		running = &r
	} else {
		s.log.Warn("node agent: whether the sandbox runs", "sandbox", m.SandboxId, "err", rerr)
	}
	if err != nil {
		s.log.Warn("node agent: checkpoint failed", "sandbox", m.SandboxId, "pod", ref.Namespace+"/"+ref.Name, "err", err, "cause", ckptErr)
		ce := toConnect(err)
		ce.Meta().Set(SandboxRunningMeta, runningMeta(running))
		return nil, ce
	}
	s.log.Info("node agent: checkpoint", "id", id, "sandbox", m.SandboxId, "bytes", entry.Bytes, "took", took, "leave_running", m.LeaveRunning)
	return connect.NewResponse(&nodeagentv1.CheckpointResponse{
		CheckpointId:   id,
		Bytes:          entry.Bytes,
		Took:           durationpb.New(took),
		Node:           s.cfg.Node,
		SandboxRunning: running,
	}), nil
}

func (s *Server) claim(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.busy[id] {
		return false
	}
	s.busy[id] = true
	return true
}

func (s *Server) release(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.busy, id)
}

func (s *Server) DeleteCheckpoint(ctx context.Context, req *connect.Request[nodeagentv1.DeleteCheckpointRequest]) (*connect.Response[nodeagentv1.DeleteCheckpointResponse], error) {
	owner, err := ownerOf(ctx)
	if err != nil {
		return nil, err
	}
	if err := s.cfg.Store.Delete(owner, req.Msg.GetCheckpointId()); err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&nodeagentv1.DeleteCheckpointResponse{}), nil
}

func (s *Server) ListCheckpoints(ctx context.Context, _ *connect.Request[nodeagentv1.ListCheckpointsRequest]) (*connect.Response[nodeagentv1.ListCheckpointsResponse], error) {
	owner, err := ownerOf(ctx)
	if err != nil {
		return nil, err
	}
	resp := &nodeagentv1.ListCheckpointsResponse{}
	for _, e := range s.cfg.Store.List(owner) {
		resp.Checkpoints = append(resp.Checkpoints, &nodeagentv1.CheckpointInfo{
			CheckpointId: e.ID,
			SandboxId:    e.SandboxID,
			Pod:          &nodeagentv1.PodRef{Namespace: e.Pod.Namespace, Name: e.Pod.Name, Uid: e.Pod.UID},
			Bytes:        e.Bytes,
			Created:      timestamppb.New(e.Created),
			LeaveRunning: e.LeaveRunning,
		})
	}
	return connect.NewResponse(resp), nil
}

func (s *Server) Info(ctx context.Context, _ *connect.Request[nodeagentv1.InfoRequest]) (*connect.Response[nodeagentv1.InfoResponse], error) {
	owner, err := ownerOf(ctx)
	if err != nil {
		return nil, err
	}
	_ = owner // one owner per agent: its store is the caller's
	quota, _ := s.cfg.Store.Quota()
	free, err := s.cfg.Store.Free()
	if err != nil {
		s.log.Error("node agent: free space", "err", err)
		return nil, connect.NewError(connect.CodeInternal, errors.New("the checkpoint file system's free space is unknown"))
	}
	return connect.NewResponse(&nodeagentv1.InfoResponse{
		Node: s.cfg.Node, QuotaBytes: quota, UsedBytes: s.cfg.Store.Usage(), FreeBytes: free,
	}), nil
}

// RunGC collects orphan and incomplete images now and then every interval until ctx ends.
func (s *Server) RunGC(ctx context.Context, interval time.Duration) {
	for {
		removed, err := s.cfg.Store.GC(time.Now())
		if len(removed) > 0 {
			s.log.Info("node agent: collected checkpoint images", "ids", removed)
		}
		if err != nil {
			s.log.Warn("node agent: gc", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(interval):
		}
	}
}

// checkpointFailure is what the caller learns of a failed checkpoint (err, the
// Checkpointer's error): a fixed sentence per kind of failure, never err's text, which
// carries the shim's and runsc's output and host paths (it is logged instead).
func checkpointFailure(err error) string {
	var call *hibernate.CallError
	switch {
	case errors.As(err, &call) && call.Code == hibernate.CodeUnimplemented: // a ttrpc (gRPC) code
		return "the node's gVisor shim cannot checkpoint (it is not sandboxd's patched shim)"
	case errors.As(err, &call):
		return "the gVisor runtime could not checkpoint the sandbox (its output is in the node agent's log)"
	case errors.Is(err, hibernate.ErrDial):
		return "the sandbox's gVisor shim does not answer (the sandbox ended, or the shim has no hibernate server)"
	case errors.Is(err, hibernate.ErrInvalid):
		return "the node agent cannot address the sandbox's shim (a node configuration problem: see the node agent's log)"
	}
	return "the checkpoint failed on the node (see the node agent's log)"
}

// maxErrorText bounds the message of an error the agent answers.
const maxErrorText = 512

// toConnect maps the packages' errors to connect codes.
func toConnect(err error) *connect.Error {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce
	}
	code := connect.CodeInternal
	switch {
	case errors.Is(err, cri.ErrInvalid), errors.Is(err, store.ErrInvalid), errors.Is(err, hibernate.ErrInvalid):
		code = connect.CodeInvalidArgument
	case errors.Is(err, cri.ErrNotFound), errors.Is(err, store.ErrNotFound):
		code = connect.CodeNotFound
	case errors.Is(err, cri.ErrDenied):
		code = connect.CodePermissionDenied
	case errors.Is(err, cri.ErrNotReady), errors.Is(err, cri.ErrAmbiguous):
		code = connect.CodeFailedPrecondition
	case errors.Is(err, store.ErrQuota):
		code = connect.CodeResourceExhausted
	case errors.Is(err, cri.ErrCRI):
		code = connect.CodeUnavailable
	}
	// The node's own failures carry host paths and details: logged, not returned.
	switch code {
	case connect.CodeInternal:
		slog.Error("node agent: internal error", "err", err)
		msg := "node agent internal error (see its log)"
		if errors.Is(err, store.ErrNotMarked) {
			msg = "the checkpoint image exists but could not be marked complete: the shim will not restore it"
		}
		return connect.NewError(code, errors.New(msg))
	case connect.CodeUnavailable:
		slog.Warn("node agent: CRI runtime", "err", err)
		return connect.NewError(code, errors.New("the node's CRI runtime does not answer"))
	}
	// The rest are about the caller's request (its Pod, its IDs, its quota): their text
	// says what is wrong, bounded.
	return connect.NewError(code, errors.New(textclip.Clip(err.Error(), maxErrorText)))
}
