// Package gatewaytest has stand-ins for tests outside internal/gateway that need a
// gateway (its API port, authentication, routing, errors) but no sandboxes. (The
// gateway's own tests cannot import it: it imports the gateway.)
package gatewaytest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1/agentv1connect"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// IdleRunner is a runner.Handle without sandboxes that creates none: a create is an
// error, every other call about a sandbox runtime.ErrNotFound, and Capacity reports Cap.
type IdleRunner struct {
	RunnerID, GroupID string
	Cap               runner.Capacity
}

var _ runner.Handle = IdleRunner{}

func (r IdleRunner) ID() string    { return r.RunnerID }
func (r IdleRunner) Group() string { return r.GroupID }
func (IdleRunner) Create(context.Context, runner.CreateRequest) (runner.Sandbox, error) {
	return runner.Sandbox{}, errors.New("an idle runner creates no sandbox")
}
func (IdleRunner) Get(context.Context, string) (runner.Sandbox, error) {
	return runner.Sandbox{}, runtime.ErrNotFound
}
func (IdleRunner) Delete(context.Context, string, time.Duration) (runner.Sandbox, error) {
	return runner.Sandbox{}, runtime.ErrNotFound
}
func (IdleRunner) Agent(context.Context, string, string) (agentv1connect.AgentServiceClient, error) {
	return nil, runtime.ErrNotFound
}
func (IdleRunner) Logs(context.Context, string, string, *agentv1.LogsRequest, func(*agentv1.LogsResponse) error) error {
	return runtime.ErrNotFound
}
func (r IdleRunner) Capacity(context.Context) (runner.Capacity, error) { return r.Cap, nil }

// StartingRunner is a runner.AwaitHandle whose sandboxes never start: a create is
// accepted in CREATING, and an AwaitStart holds until Release or the caller's end,
// counting the calls held at once (Held, MaxHeld).
type StartingRunner struct {
	IdleRunner
	mu       sync.Mutex
	created  map[string]runner.Sandbox
	held     int
	maxHeld  int
	released chan struct{}
}

var _ runner.AwaitHandle = (*StartingRunner)(nil)

// NewStartingRunner is a StartingRunner with Capacity cap.
func NewStartingRunner(id string, cap runner.Capacity) *StartingRunner {
	return &StartingRunner{IdleRunner: IdleRunner{RunnerID: id, GroupID: "default", Cap: cap}, created: map[string]runner.Sandbox{}, released: make(chan struct{})}
}

func (r *StartingRunner) Create(_ context.Context, req runner.CreateRequest) (runner.Sandbox, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if req.Spec.ID == "" {
		req.Spec.ID = fmt.Sprintf("starting%d", len(r.created))
	}
	sb := runner.Sandbox{ID: req.Spec.ID, Spec: req.Spec, State: runner.StateCreating, CreatedAt: time.Now(), Lifetime: req.Lifetime}
	r.created[sb.ID] = sb
	return sb, nil
}

func (r *StartingRunner) Get(_ context.Context, id string) (runner.Sandbox, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	sb, ok := r.created[id]
	if !ok {
		return runner.Sandbox{}, runtime.ErrNotFound
	}
	return sb, nil
}

func (r *StartingRunner) AwaitStart(ctx context.Context, id string, _ time.Duration) (runner.Sandbox, error) {
	r.mu.Lock()
	r.held++
	r.maxHeld = max(r.maxHeld, r.held)
	r.mu.Unlock()
	select {
	case <-ctx.Done():
	case <-r.released:
	}
	r.mu.Lock()
	r.held--
	r.mu.Unlock()
	return r.Get(ctx, id)
}

// Held and MaxHeld are the AwaitStart calls held now and at most at once.
func (r *StartingRunner) Held() (now, most int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.held, r.maxHeld
}

// Release ends every AwaitStart held, and every later one at once.
func (r *StartingRunner) Release() { close(r.released) }
