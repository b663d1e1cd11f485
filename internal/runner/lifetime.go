package runner

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// LifetimeHandle is implemented by Handles whose runner can change a running sandbox's
// lifetime (the local Handle and runnerapi.Client); the gateway refuses
// UpdateSandboxLifetime on others.
type LifetimeHandle interface {
	Handle
	// UpdateLifetime sets the sandbox's lifetime (counted from its creation) and returns
	// the sandbox with its new Lifetime and Deadline. A deadline already past stops the
	// sandbox as its expiry does (reason LifetimeExceeded). A terminating or terminal
	// sandbox is ErrNotRunning.
	UpdateLifetime(ctx context.Context, id string, lifetime time.Duration) (Sandbox, error)
}

// lifetimesDir (in DataDir) holds one file per sandbox whose lifetime was changed after
// its create: the new lifetime as a time.Duration string. The backend's copy of the spec
// (runtime.MetaLifetime) keeps the lifetime of the create; recover prefers this one.
const lifetimesDir = "lifetimes"

func (r *Runner) lifetimePath(id string) string {
	return filepath.Join(r.cfg.DataDir, lifetimesDir, id)
}

// UpdateLifetime implements LifetimeHandle for the runner: it re-arms the expiry timer
// and persists the lifetime, so a restarted runner keeps the new deadline.
func (r *Runner) UpdateLifetime(_ context.Context, id string, lifetime time.Duration) (Sandbox, error) {
	if lifetime <= 0 || lifetime > MaxLifetime {
		var vs violations
		vs.add("max_lifetime_seconds", "must be between 1 and %d (30 days), got %d", int64(MaxLifetime/time.Second), int64(lifetime/time.Second))
		return Sandbox{}, vs.err()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.sandboxes[id]
	if !ok {
		return Sandbox{}, fmt.Errorf("%w: %s", runtime.ErrNotFound, id)
	}
	if e.sb.State.Terminal() || e.sb.State == StateTerminating || stopRequested(e) {
		return Sandbox{}, fmt.Errorf("%w: %s is %s", ErrNotRunning, id, e.sb.State)
	}
	if err := writeFileAtomic(r.lifetimePath(id), []byte(lifetime.String())); err != nil {
		return Sandbox{}, fmt.Errorf("runner: persist lifetime: %w", err)
	}
	if e.expiry != nil {
		e.expiry.Stop()
	}
	e.sb.Lifetime = lifetime
	e.sb.Deadline = e.sb.CreatedAt.Add(lifetime)
	r.log.Info("sandbox lifetime updated", "sandbox", id, "lifetime", lifetime, "deadline", e.sb.Deadline)
	r.armExpiry(e) // a deadline already past fires at once
	r.notifyLocked(e)
	return e.snapshot(), nil
}

func stopRequested(e *entry) bool {
	select {
	case <-e.stopCh:
		return true
	default:
		return false
	}
}

// persistedLifetime is the lifetime UpdateLifetime recorded for id, if any.
func (r *Runner) persistedLifetime(id string) (time.Duration, bool) {
	b, err := os.ReadFile(r.lifetimePath(id))
	if err != nil || len(b) > 64 {
		return 0, false
	}
	d, err := time.ParseDuration(strings.TrimSpace(string(b)))
	// Beyond MaxLifetime when a held lifetime moved on by the time paused (Resume).
	if err != nil || d <= 0 || d > maxPersistedLifetime {
		return 0, false
	}
	return d, true
}

// maxPersistedLifetime bounds a lifetime read back: MaxLifetime plus what time paused
// added to a held lifetime.
const maxPersistedLifetime = 10 * 365 * 24 * time.Hour
