package sandbox

import (
	"context"
	"fmt"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	statev1 "github.com/sandboxd/sandboxd/gen/sandboxd/sandbox/v1"
)

// MaxForks is the most forks one ForkSandbox call makes.
const MaxForks = 100

// PauseOptions choose how Pause pauses a sandbox. Nil leaves the choice to the server.
type PauseOptions struct {
	// ReleaseResources: nil checkpoints where the sandbox's runtime class can (gvisor:
	// CPU and memory released) and freezes it in place otherwise (runc: memory kept and
	// still counted); true checkpoints or fails with ErrCheckpointNotSupported; false
	// freezes.
	ReleaseResources *bool
	// AutoResume: whether exec, file calls and endpoint traffic resume the paused
	// sandbox first (nil: the runner policy's setting, default on). Off, they fail with
	// ErrNotRunning until Resume.
	AutoResume *bool
}

// PauseStatus says how a sandbox is paused.
type PauseStatus struct {
	ID string
	// ResourcesReleased: checkpointed, CPU and memory released; false: frozen, memory
	// kept and counted.
	ResourcesReleased bool
	AutoResume        bool
	// LifetimeHeld: the lifetime does not count while paused (the policy's setting).
	LifetimeHeld bool
	PausedAt     time.Time
	// CheckpointBytes is the checkpoint's size on the runner's disk (0 when frozen).
	CheckpointBytes int64
}

// Pause pauses the running sandbox id (sandboxd.sandbox.v1.SandboxStateService,
// sandboxd's own API beside the wire protocol): GetSandbox then reports StatePaused
// until Resume, or until auto-resume resumes it. A sandbox not running (already paused
// included) is ErrNotRunning; a release the runtime class cannot do is
// ErrCheckpointNotSupported. Pause is not retried: a repeated pause of a paused sandbox
// fails.
func (c *Client) Pause(ctx context.Context, id string, opts PauseOptions) (PauseStatus, error) {
	cctx, cancel := withTimeout(ctx, createTimeout)
	defer cancel()
	res, err := c.state.PauseSandbox(cctx, connect.NewRequest(&statev1.PauseSandboxRequest{
		SandboxId: id, ReleaseResources: opts.ReleaseResources, AutoResume: opts.AutoResume}))
	if err != nil {
		return PauseStatus{}, fromRPC(err)
	}
	st := res.Msg.GetStatus()
	ps := PauseStatus{ID: st.GetSandboxId(), ResourcesReleased: st.GetResourcesReleased(), AutoResume: st.GetAutoResume(),
		LifetimeHeld: st.GetLifetimeHeld(), CheckpointBytes: st.GetCheckpointBytes()}
	if ps.ID == "" {
		ps.ID = id
	}
	if t := st.GetPausedAt(); t != nil {
		ps.PausedAt = t.AsTime()
	}
	return ps, nil
}

// Resume continues the paused sandbox id under the same ID, address and endpoints and
// returns when its lifetime now ends. A running sandbox is left as it is; an ended one
// is ErrNotRunning. Transient failures are retried (resuming twice is harmless). It may
// resume on another runner when its own has no room (see ResumeWith).
func (c *Client) Resume(ctx context.Context, id string) (deadline time.Time, err error) {
	res, err := c.ResumeWith(ctx, id, ResumeOptions{})
	return res.Deadline, err
}

// ResumeOptions tune ResumeWith.
type ResumeOptions struct {
	// RunnerIDs are the runners the sandbox may resume on (empty: any). A checkpointed
	// sandbox resumes on its own runner when that is listed (or none is) and has room;
	// otherwise it moves, through the blob store, to a listed runner able to restore its
	// checkpoint (same runtime class, runsc version and architecture). A frozen sandbox
	// (runc) cannot move.
	RunnerIDs []string
}

// ResumeResult is what ResumeWith did.
type ResumeResult struct {
	ID string
	// Deadline is when the sandbox's lifetime now ends (zero: unknown).
	Deadline time.Time
	// RunnerID is the runner it runs on now ("" from a server that does not say).
	RunnerID string
	// MovedFrom is the runner it ran on before, when it moved to RunnerID; "" when it
	// resumed where it was. A moved sandbox keeps its ID, files, memory and processes;
	// its address and endpoint host names are its new runner's.
	MovedFrom string
}

// ResumeWith is Resume with options, returning where the sandbox runs now.
func (c *Client) ResumeWith(ctx context.Context, id string, opts ResumeOptions) (ResumeResult, error) {
	out := ResumeResult{ID: id}
	req := &statev1.ResumeSandboxRequest{SandboxId: id, RunnerIds: opts.RunnerIDs}
	err := retry(ctx, retryBudget, func(ctx context.Context) error {
		cctx, cancel := withTimeout(ctx, createTimeout)
		defer cancel()
		res, err := c.state.ResumeSandbox(cctx, connect.NewRequest(req))
		if err != nil {
			return fromRPC(err)
		}
		if t := res.Msg.GetDeadline(); t != nil {
			out.Deadline = t.AsTime()
		}
		out.RunnerID, out.MovedFrom = res.Msg.GetRunnerId(), res.Msg.GetMovedFrom()
		return nil
	})
	return out, err
}

// ForkOptions tune Fork.
type ForkOptions struct {
	// RequestID makes the fork idempotent: a repeated request with the same ID returns
	// the same forks. Empty: Fork makes one, so that its own retries are safe.
	RequestID string
	// RunnerIDs are the runners the forks may be placed on (empty: any). Forks go to the
	// source's runner when it is allowed and has room; otherwise the source's checkpoint
	// is exported to the blob store and the forks are made on other allowed runners able
	// to restore it. Each fork's Info().RunnerID says where it runs.
	RunnerIDs []string
}

// ForkError is one fork that failed: the ID it would have had and the API error it met
// (errors.Is matches the sentinels Err does, e.g. ErrUnavailable).
type ForkError struct {
	ID  string
	Err *Error
}

func (e *ForkError) Error() string {
	if e.ID == "" {
		return "fork: " + e.Err.Error()
	}
	return "fork " + e.ID + ": " + e.Err.Error()
}

// Unwrap returns the API error.
func (e *ForkError) Unwrap() error { return e.Err }

// PartialForkError is a Fork of which some forks failed; Fork returns the others.
type PartialForkError struct {
	Failed []*ForkError
}

func (e *PartialForkError) Error() string {
	msgs := make([]string, len(e.Failed))
	for i, f := range e.Failed {
		msgs[i] = f.Error()
	}
	return fmt.Sprintf("%d fork(s) failed: %s", len(e.Failed), strings.Join(msgs, "; "))
}

// Unwrap returns each failed fork's *ForkError, for errors.Is and errors.As.
func (e *PartialForkError) Unwrap() []error {
	out := make([]error, len(e.Failed))
	for i, f := range e.Failed {
		out[i] = f
	}
	return out
}

// Fork makes n (1..MaxForks) new sandboxes from the running or paused sandbox id, each
// a copy of its memory, processes and files with its own ID, address and endpoints.
// The handles it returns know only their IDs until Refresh or Wait. A runtime class
// that cannot checkpoint is ErrCheckpointNotSupported. When only some forks failed,
// Fork returns the others with a *PartialForkError listing each failure.
func (c *Client) Fork(ctx context.Context, id string, n int, opts ForkOptions) ([]*Sandbox, error) {
	if n < 1 || n > MaxForks {
		return nil, fmt.Errorf("%w: fork count %d: want 1..%d", ErrInvalidArgument, n, MaxForks)
	}
	req := &statev1.ForkSandboxRequest{SandboxId: id, Count: int32(n), RequestId: opts.RequestID, RunnerIds: opts.RunnerIDs}
	if req.RequestId == "" {
		req.RequestId = newUUID()
	}
	var forks []*statev1.Fork
	err := retry(ctx, retryBudget, func(ctx context.Context) error {
		cctx, cancel := withTimeout(ctx, createTimeout)
		defer cancel()
		res, err := c.state.ForkSandbox(cctx, connect.NewRequest(req))
		if err != nil {
			return fromRPC(err)
		}
		forks = res.Msg.GetForks()
		return nil
	})
	if err != nil {
		return nil, err
	}
	var out []*Sandbox
	var failed []*ForkError
	for _, f := range forks {
		if fe := f.GetError(); fe != nil {
			failed = append(failed, &ForkError{ID: f.GetSandboxId(), Err: forkAPIError(fe)})
			continue
		}
		if f.GetSandboxId() == "" {
			failed = append(failed, &ForkError{Err: &Error{Code: connect.CodeInternal, Message: "the server returned a fork without an ID"}})
			continue
		}
		out = append(out, c.forkHandle(f))
	}
	if len(out)+len(failed) != n {
		failed = append(failed, &ForkError{Err: &Error{Code: connect.CodeInternal,
			Message: fmt.Sprintf("asked for %d forks, the server answered %d", n, len(out)+len(failed))}})
	}
	if len(failed) > 0 {
		return out, &PartialForkError{Failed: failed}
	}
	return out, nil
}

// forkHandle is the handle of a fork made: it knows its ID, its runner (Info().RunnerID)
// and its endpoint share token, until Refresh or Wait.
func (c *Client) forkHandle(f *statev1.Fork) *Sandbox {
	sb := c.Sandbox(f.GetSandboxId())
	sb.shareToken = f.GetEndpointShareToken()
	if r := f.GetRunnerId(); r != "" {
		sb.proto = &sandboxv1.Sandbox{SandboxId: f.GetSandboxId(), Status: &sandboxv1.SandboxStatus{RunnerId: r}}
	}
	return sb
}

// forkAPIError is one fork's error as an *Error: its gRPC code by name.
func forkAPIError(fe *statev1.ForkError) *Error {
	e := &Error{Code: connect.CodeUnknown, Reason: fe.GetReason(), Message: fe.GetMessage()}
	if e.Reason != "" {
		e.Domain = ErrorDomain
	}
	var code connect.Code
	// connect.Code parses the lower-case names ("unavailable"); the proto carries the
	// gRPC names ("UNAVAILABLE").
	name := strings.ToLower(fe.GetCode())
	if name == "cancelled" {
		name = "canceled"
	}
	if err := code.UnmarshalText([]byte(name)); err == nil {
		e.Code = code
	}
	return e
}

// Pause pauses the sandbox (see Client.Pause); its state is StatePaused afterwards.
func (s *Sandbox) Pause(ctx context.Context, opts PauseOptions) (PauseStatus, error) {
	ps, err := s.c.Pause(ctx, s.id, opts)
	if err == nil {
		s.setState(StatePaused)
	}
	return ps, err
}

// Resume resumes the paused sandbox (see Client.Resume); its state is StateRunning
// afterwards.
func (s *Sandbox) Resume(ctx context.Context) (time.Time, error) {
	res, err := s.ResumeWith(ctx, ResumeOptions{})
	return res.Deadline, err
}

// ResumeWith resumes the paused sandbox (see Client.ResumeWith); its state is
// StateRunning afterwards, on the runner it now runs on.
func (s *Sandbox) ResumeWith(ctx context.Context, opts ResumeOptions) (ResumeResult, error) {
	res, err := s.c.ResumeWith(ctx, s.id, opts)
	if err == nil {
		s.setRunning(res.RunnerID)
	}
	return res, err
}

// Fork makes n copies of the sandbox (see Client.Fork).
func (s *Sandbox) Fork(ctx context.Context, n int, opts ForkOptions) ([]*Sandbox, error) {
	return s.c.Fork(ctx, s.id, n, opts)
}

// SetLifetime is Client.SetLifetime for this sandbox.
func (s *Sandbox) SetLifetime(ctx context.Context, total time.Duration) (Lifetime, error) {
	return s.c.SetLifetime(ctx, s.id, total)
}

// ExtendLifetime is Client.ExtendLifetime for this sandbox.
func (s *Sandbox) ExtendLifetime(ctx context.Context, by time.Duration) (Lifetime, error) {
	return s.c.ExtendLifetime(ctx, s.id, by)
}

// setRunning records a resume: StateRunning, on runner (when known).
func (s *Sandbox) setRunning(runner string) { s.setStatus(StateRunning, runner) }

// setState records a state change the caller caused (see setStatus).
func (s *Sandbox) setState(st State) { s.setStatus(st, "") }

// setStatus records a state change the caller caused, and the runner when not "", on a
// copy of the last status (a message Proto returned earlier is not changed under its
// reader).
func (s *Sandbox) setStatus(st State, runner string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, _ := proto.Clone(s.proto).(*sandboxv1.Sandbox)
	if p == nil {
		p = &sandboxv1.Sandbox{SandboxId: s.id}
	}
	if p.Status == nil {
		p.Status = &sandboxv1.SandboxStatus{}
	}
	p.Status.State = sandboxv1.State(st)
	if runner != "" {
		p.Status.RunnerId = runner
	}
	s.proto = p
}
