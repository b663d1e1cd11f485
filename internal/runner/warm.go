package runner

import (
	"context"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// WarmHandle is a runner that keeps sandboxes pre-started for the specs a gateway sends
// it (templates' warm pools): SetWarmPools replaces the whole desired set, so it is
// idempotent and several gateways may send the same set. Both Local and
// runnerapi.Client implement it.
type WarmHandle interface {
	SetWarmPools(ctx context.Context, targets []runtime.WarmTarget) error
}

var _ WarmHandle = (*Local)(nil)

// SetWarmPools hands the warm targets to the backend when it keeps warm pools
// (runtime.WarmPooler: the local backend; the Kubernetes backend pre-pulls their images
// onto its nodes); another backend keeps nothing. The specs
// are completed with defaults as Create completes a spec, so a Create of the same spec
// matches what was pre-started.
func (r *Runner) SetWarmPools(ctx context.Context, targets []runtime.WarmTarget) error {
	wp, ok := r.backend.(runtime.WarmPooler)
	if !ok {
		return nil
	}
	return wp.SetWarmPools(ctx, targets)
}

// SetWarmPools implements WarmHandle: each target's spec gets the runner's default
// resources, as Create's does.
func (l *Local) SetWarmPools(ctx context.Context, targets []runtime.WarmTarget) error {
	out := make([]runtime.WarmTarget, len(targets))
	for i, t := range targets {
		t.Spec = withDefaults(t.Spec, l.Defaults)
		out[i] = t
	}
	return l.R.SetWarmPools(ctx, out)
}

// PrepullReport is how the backend's image pre-pull of the warm targets stands
// (runtime.PrepullReporter: the local and Kubernetes backends); ok false when the
// backend does not pre-pull.
func (r *Runner) PrepullReport() (rep runtime.PrepullReport, ok bool) {
	pr, ok := r.backend.(runtime.PrepullReporter)
	if !ok {
		return runtime.PrepullReport{}, false
	}
	return pr.PrepullReport(), true
}

// PrepullReport is the backend's (Runner.PrepullReport).
func (l *Local) PrepullReport() (runtime.PrepullReport, bool) { return l.R.PrepullReport() }
