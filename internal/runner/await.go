package runner

import (
	"context"
	"fmt"
	"time"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// MaxAwaitStart bounds how long one AwaitStart waits, whatever the caller asks for.
const MaxAwaitStart = 2 * time.Second

// AwaitHandle is implemented by Handles whose runner can answer a Get once a starting
// sandbox has changed state (the local Handle and runnerapi.Client). The gateway uses it
// to let a status poll of a young sandbox see RUNNING without another round of polling;
// on other Handles it answers at once (Get).
type AwaitHandle interface {
	Handle
	// AwaitStart is Get, except that while the sandbox is CREATING or PENDING it first
	// waits, at most wait (capped at MaxAwaitStart) and never past ctx, for the state to
	// change. It wakes on the runner's change notification, not by polling.
	AwaitStart(ctx context.Context, id string, wait time.Duration) (Sandbox, error)
}

// starting is the states AwaitStart waits through.
func starting(s State) bool { return s == StateCreating || s == StatePending }

// AwaitStart implements AwaitHandle for the runner. A cancelled ctx or the end of the
// wait answers as Get does then (the current state, no error).
func (r *Runner) AwaitStart(ctx context.Context, id string, wait time.Duration) (Sandbox, error) {
	wait = min(wait, MaxAwaitStart)
	if wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
	loop:
		for {
			r.mu.Lock()
			e, ok := r.sandboxes[id]
			if !ok {
				r.mu.Unlock()
				return Sandbox{}, fmt.Errorf("%w: %s", runtime.ErrNotFound, id)
			}
			st, changed := e.sb.State, e.changed
			r.mu.Unlock()
			if !starting(st) {
				break
			}
			select {
			case <-changed: // look again: another field may have changed
			case <-e.done:
				break loop
			case <-t.C:
				break loop
			case <-ctx.Done():
				break loop
			}
		}
	}
	return r.Get(id)
}
