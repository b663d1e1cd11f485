package metrics

import (
	"context"

	"github.com/sandboxd/sandboxd/internal/metrics/counters"
	"github.com/sandboxd/sandboxd/internal/store"
)

// Index wraps a gateway's sandbox index: records it creates start their time-to-RUNNING
// clock, status updates stop it, and every write marks the store collectors stale so the
// next scrape re-reads (sandbox_info "on change").
func (m *Metrics) Index(st store.Sandboxes) store.Sandboxes {
	if st == nil {
		return nil
	}
	return index{Sandboxes: st, m: m}
}

type index struct {
	store.Sandboxes
	m *Metrics
}

func (x index) Create(ctx context.Context, s store.Sandbox) (store.Sandbox, error) {
	out, err := x.Sandboxes.Create(ctx, s)
	if err == nil && counters.Recording() {
		x.m.Created(out.ID, out.CreatedAt)
		x.m.StateChanged(out.ID, out.State, out.EndedAt != nil)
		x.m.markStale()
	}
	return out, err
}

func (x index) UpdateStatus(ctx context.Context, org, id string, u store.SandboxStatusUpdate) (store.Sandbox, error) {
	out, err := x.Sandboxes.UpdateStatus(ctx, org, id, u)
	if err == nil && counters.Recording() {
		x.m.StateChanged(id, out.State, out.EndedAt != nil)
		x.m.markStale()
	}
	return out, err
}
