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
// is ErrNotRunning. Transient failures are retried (resuming twice is harmless).
func (c *Client) Resume(ctx context.Context, id string) (deadline time.Time, err error) {
	err = retry(ctx, retryBudget, func(ctx context.Context) error {
		cctx, cancel := withTimeout(ctx, createTimeout)
		defer cancel()
		res, err := c.state.ResumeSandbox(cctx, connect.NewRequest(&statev1.ResumeSandboxRequest{SandboxId: id}))
		if err != nil {
			return fromRPC(err)
		}
		if t := res.Msg.GetDeadline(); t != nil {
			deadline = t.AsTime()
		}
		return nil
	})
	return deadline, err
}

// ForkOptions tune Fork.
type ForkOptions struct {
	// RequestID makes the fork idempotent: a repeated request with the same ID returns
	// the same forks. Empty: Fork makes one, so that its own retries are safe.
	RequestID string
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
	req := &statev1.ForkSandboxRequest{SandboxId: id, Count: int32(n), RequestId: opts.RequestID}
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
		out = append(out, c.Sandbox(f.GetSandboxId()))
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
	deadline, err := s.c.Resume(ctx, s.id)
	if err == nil {
		s.setState(StateRunning)
	}
	return deadline, err
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

// setState records a state change the caller caused, on a copy of the last status (a
// message Proto returned earlier is not changed under its reader).
func (s *Sandbox) setState(st State) {
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
	s.proto = p
}
