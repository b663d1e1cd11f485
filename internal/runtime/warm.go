package runtime

import "context"

// WarmPooler is an optional interface of a Backend: it keeps sandboxes pre-started for
// the specs it is given (templates' warm pools, issue 22), so a Create of such a spec is
// a claim, not a start. The local backend implements it (runc only); the Kubernetes
// backend implements it to pre-pull the targets' images onto its nodes only (no pool);
// for other backends the runner does nothing with warm targets.
type WarmPooler interface {
	// SetWarmPools replaces the whole set of warm targets (idempotent): for each target
	// the backend keeps at least Size ready containers that a Create of Spec can claim,
	// within its own bounds; targets no longer in the set return to the backend's
	// normal rules. Targets it cannot pre-start (a runtime class or a spec shape its
	// pool does not serve; pull credentials without Meta[MetaOrg]) are left out, not an
	// error. Containers pulled with a target's credentials serve Creates of the same
	// organization (MetaOrg) only.
	SetWarmPools(ctx context.Context, targets []WarmTarget) error
}

// WarmTarget asks for Size pre-started sandboxes of Spec (a resolved runtime spec, as
// Create's, without ID).
type WarmTarget struct {
	// Key names the target: "<org>/<template id>". The part before the first "/" is
	// the organization a backend shares its bound among fairly.
	Key  string
	Spec Spec
	Size int
}

// MaxWarmSize bounds one target's Size (a template's sandboxd.warmPool.size).
const MaxWarmSize = 16
