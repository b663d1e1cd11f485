package runtime

import (
	"context"
	"strings"
	"time"
)

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

// PrepullReporter is an optional interface of a WarmPooler backend that pre-pulls the
// warm targets' images (local: into the image store; Kubernetes: onto the nodes): how
// far that is, per image, for the runner's heartbeat (the control plane's
// ManagedRunnerStatus.prepull).
type PrepullReporter interface {
	PrepullReport() PrepullReport
}

// PrepullState is where one pre-pulled image stands.
type PrepullState string

const (
	// PrepullPending: wanted, not tried yet.
	PrepullPending PrepullState = "PENDING"
	// PrepullPulling: a pull (local) or a pre-pull Pod (Kubernetes) is under way.
	PrepullPulling PrepullState = "PULLING"
	// PrepullPresent: pulled (local), or on every node it is wanted on (Kubernetes).
	// A later refresh that fails keeps it PRESENT with LastError set.
	PrepullPresent PrepullState = "PRESENT"
	// PrepullFailed: the last attempt failed (LastError) and it is not present; retried
	// at NextAttempt.
	PrepullFailed PrepullState = "FAILED"
)

// Bounds of a PrepullReport: the images it lists (the backends' default pre-pull bound)
// and the bytes of one LastError.
const (
	MaxPrepullReportImages = 64
	MaxPrepullErrorLen     = 512
)

// PrepullReport is the pre-pull's state, per image, in the order the images are wanted.
type PrepullReport struct {
	// Images: at most MaxPrepullReportImages.
	Images []PrepullImage
	// LeftOut counts the images wanted but not listed: beyond the backend's pre-pull
	// bound (not pre-pulled) or beyond MaxPrepullReportImages.
	LeftOut int
}

// PrepullImage is one pre-pulled image.
type PrepullImage struct {
	Image string
	// Target is the first warm target that wants it ("<org>/<template id>").
	Target string
	State  PrepullState
	// NodesPresent and NodesTotal (Kubernetes only): the nodes the image is on, of those
	// it is wanted on (ready nodes the targets' Pod settings allow).
	NodesPresent, NodesTotal int
	// LastError of the last failed attempt (at most MaxPrepullErrorLen bytes, valid
	// UTF-8); "" after a success.
	LastError string
	// LastAttempt started the last pull; zero before one. NextAttempt is when it is
	// pulled (or checked) again; zero while one is under way.
	LastAttempt, NextAttempt time.Time
}

// Org is the organization of the image's target (the part of Target before the "/").
func (i *PrepullImage) Org() string {
	org, _, _ := strings.Cut(i.Target, "/")
	return org
}

// WarmReserver is an optional interface of a WarmPooler backend whose warm sandboxes are
// made ahead under their own sandbox IDs (the Kubernetes backend: a warm Pod is a whole
// sandbox, named, certified and with its hostname set for that ID). The runner asks it
// for an ID before it mints one: ReserveWarm takes a ready warm sandbox whose target
// matches spec (a resolved spec without ID, as Create's) out of the pool and returns its
// ID; the Create of spec under that ID then claims it (and falls back to a cold start
// when the warm sandbox is gone by then or spec does not match it after all). ok false:
// no ready warm sandbox for spec; the runner mints an ID as usual. A reservation no
// Create comes for within a minute is destroyed.
type WarmReserver interface {
	ReserveWarm(spec *Spec) (id string, ok bool)
	// ReleaseWarm gives a reservation back when no Create comes for it (the runner's
	// Create returned before the backend's): the warm sandbox is ready again.
	ReleaseWarm(id string)
}

// WarmHolder is an optional interface of a WarmPooler backend whose warm sandboxes hold
// their resource requests where the sandboxes run (the Kubernetes backend: a warm Pod is
// scheduled on a node): WarmHeld returns the spec of each warm sandbox kept (ready,
// being made or reserved), so the runner counts them as used capacity.
type WarmHolder interface {
	WarmHeld() []Spec
}
