package runner

import (
	"cmp"
	"context"
	"fmt"
	"reflect"
	"time"

	"github.com/sandboxd/sandboxd/internal/progress"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// ProgressInterval is the least time between two progress updates of one watch: at
// most four a second per watcher, whatever the pull does. A change of the sandbox's
// state is sent at once.
const ProgressInterval = 250 * time.Millisecond

// MaxProgressWatch bounds one watch; a watcher still interested watches again.
const MaxProgressWatch = 15 * time.Minute

// StartProgress is what a sandbox's start is doing: its state, its phase (what it
// waits for) and its image pulls (progress.Snapshot, bounded).
type StartProgress struct {
	State State
	progress.Snapshot
}

// ProgressHandle is implemented by Handles whose runner reports start progress (the
// local Handle and runnerapi.Client).
type ProgressHandle interface {
	Handle
	// WatchProgress sends the sandbox's start progress: at once, then at each change
	// (at most every ProgressInterval), until the sandbox no longer starts (the last
	// update has its new state) or ctx ends. An unknown sandbox is runtime.ErrNotFound.
	WatchProgress(ctx context.Context, id string, send func(StartProgress) error) error
}

var _ ProgressHandle = (*Local)(nil)

// WatchProgress implements ProgressHandle.
func (l *Local) WatchProgress(ctx context.Context, id string, send func(StartProgress) error) error {
	return l.R.WatchProgress(ctx, id, send)
}

// WatchProgress implements ProgressHandle's WatchProgress for the runner.
func (r *Runner) WatchProgress(ctx context.Context, id string, send func(StartProgress) error) error {
	ctx, cancel := context.WithTimeout(ctx, MaxProgressWatch)
	defer cancel()
	tick := time.NewTicker(cmp.Or(r.progressInterval, ProgressInterval))
	defer tick.Stop()
	var last *StartProgress
	for {
		p, changed, err := r.startProgress(id)
		if err != nil {
			return err
		}
		if last == nil || !reflect.DeepEqual(p, *last) {
			if err := send(p); err != nil {
				return err
			}
			last = &p
		}
		if p.State != StateCreating && p.State != StatePending {
			return nil
		}
		select {
		case <-ctx.Done():
			if ctx.Err() == context.DeadlineExceeded {
				return nil // the watch's bound, not the caller's
			}
			return ctx.Err()
		case <-tick.C:
		case <-changed: // a new state is sent at once: the watch ends as the sandbox runs
		}
	}
}

// startProgress is the sandbox's start progress now, and a channel closed at the next
// change of its record (its state; pull progress does not close it).
func (r *Runner) startProgress(id string) (StartProgress, <-chan struct{}, error) {
	r.mu.Lock()
	e, ok := r.sandboxes[id]
	if !ok {
		r.mu.Unlock()
		return StartProgress{}, nil, fmt.Errorf("%w: %s", runtime.ErrNotFound, id)
	}
	st, tr, changed := e.sb.State, e.start, e.changed
	r.mu.Unlock()
	p := StartProgress{State: st}
	if tr != nil {
		p.Snapshot = tr.Snapshot()
	}
	switch {
	case st == StatePending:
		p.Phase = progress.PhaseWaitingForRunner
	case st == StateCreating:
		if p.Phase == progress.PhaseUnspecified {
			p.Phase = progress.PhaseStartingContainer
		}
	case st == StateRunning || st == StatePaused:
		p.Phase = progress.PhaseRunning
	default:
		p.Phase = progress.PhaseEnded
	}
	return p, changed, nil
}
