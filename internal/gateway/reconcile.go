package gateway

import (
	"context"
	"time"

	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// Defaults of the orphan reconciler.
const (
	DefaultOrphanGrace       = 10 * time.Minute
	DefaultReconcileInterval = time.Minute
)

// sandboxLister is a runner.Handle that can list its sandboxes (both runner kinds can).
type sandboxLister interface {
	List(ctx context.Context) ([]runner.Sandbox, error)
}

// Reconcile compares each runner's sandboxes with the index and deletes live ones no
// gateway knows (created by a gateway that crashed before recording them, or left behind
// by a lost index) once they are older than the grace period, so nothing runs unaccounted
// for; and the stale copies of sandboxes that moved to another runner (on a runner the
// record no longer names, there longer than the grace period since they started). It returns how many it deleted. It only runs with a store-backed index: an index in
// memory forgets everything on restart, and would take every sandbox for an orphan.
func (s *Server) Reconcile(ctx context.Context) int {
	if s.index.st == nil || s.orphanGrace < 0 {
		return 0
	}
	deleted := 0
	for _, r := range s.runners {
		l, ok := r.(sandboxLister)
		if !ok {
			continue
		}
		sbs, err := l.List(ctx)
		if err != nil {
			s.log.Warn("reconcile: list sandboxes", "runner", r.ID(), "err", err)
			continue
		}
		for _, sb := range sbs {
			if sb.State.Terminal() {
				// Ended unobserved: recorded ended, so it stops counting against its
				// organization's quota (quota.go) without waiting for someone to look.
				if rec, known := s.index.get(ctx, sb.Spec.Meta[runtime.MetaOrg], sb.ID); known && s.index.runnerOf(rec) == r.ID() && !s.index.lastOf(rec).State.Terminal() {
					s.index.setLast(ctx, rec, sb)
				}
				continue
			}
			if sb.State == runner.StateTerminating {
				continue
			}
			if rec, known := s.index.get(ctx, sb.Spec.Meta[runtime.MetaOrg], sb.ID); known && s.index.runnerOf(rec) == r.ID() &&
				deletedWithoutRunner(s.index.lastOf(rec)) && s.serves(r, rec.org) {
				// Deleted while its runner was gone (gone.go), and the runner serves its
				// organization again: what the caller asked for is done now.
				s.log.Warn("reconcile: deleting a sandbox deleted while its runner was gone", "sandbox", sb.ID, "runner", r.ID(), "org", rec.org)
				if _, err := r.Delete(ctx, sb.ID, 0); err != nil {
					s.log.Warn("reconcile: delete", "sandbox", sb.ID, "err", err)
				} else {
					deleted++
				}
				continue
			}
			if time.Since(sb.CreatedAt) < s.orphanGrace {
				continue
			}
			if rec, known := s.index.get(ctx, sb.Spec.Meta[runtime.MetaOrg], sb.ID); known {
				// A sandbox that moved to another runner (ResumeSandbox elsewhere) whose old
				// runner was not told (Moved failed): its copy here is deleted. Its age here
				// counts from its start on this runner, not its creation (which a move
				// keeps): a copy just moved here, before its record names this runner, is
				// no stale one.
				on := s.index.runnerOf(rec)
				if on == "" || on == r.ID() || sb.StartedAt.IsZero() || time.Since(sb.StartedAt) < s.orphanGrace {
					continue
				}
				s.log.Warn("reconcile: deleting the stale copy of a sandbox that moved to another runner", "sandbox", sb.ID,
					"runner", r.ID(), "now_on", on, "org", rec.org, "started", time.Since(sb.StartedAt).Round(time.Second))
			} else {
				s.log.Warn("reconcile: deleting a sandbox no gateway knows", "sandbox", sb.ID, "runner", r.ID(),
					"org", sb.Spec.Meta[runtime.MetaOrg], "age", time.Since(sb.CreatedAt).Round(time.Second))
			}
			if _, err := r.Delete(ctx, sb.ID, 0); err != nil {
				s.log.Warn("reconcile: delete", "sandbox", sb.ID, "err", err)
				continue
			}
			deleted++
		}
	}
	return deleted
}

func (s *Server) reconcileLoop(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.Reconcile(ctx)
			s.ReconcileSnapshots(ctx)
		}
	}
}
