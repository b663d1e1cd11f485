// Package placement decides which runner a new sandbox goes to. It is pure: the caller
// gives the request and its view of every runner (readiness, cached policy, capacity,
// usage), and gets back the runners that accept the sandbox and have room, best first,
// or the error that tells the user what to change or what to ask an administrator for.
//
// A runner is a candidate when it serves the sandbox's organization (Runner.Owner: a
// platform runner, or one of the organization's own), is connected and ready, inside
// runner_ids when given, its policy (resolved with the same code the runner uses, and
// the runner's default requests and limits) accepts the spec, and the resolved requests fit its room (Room:
// allocatable − the requests of its live sandboxes − outstanding reservations, CPU
// overcommitted by the runner's factor, and a free sandbox slot). A request above a
// runner's whole capacity never fits it, which is not the same as no room now.
// Candidates are ordered by health (Runner.HealthRank: degraded runners last), then by
// load after placement (the larger of CPU and memory utilisation), least loaded first;
// ties are broken randomly. A quarantined runner (Runner.Quarantined) is no candidate:
// when it is the only one that would accept the sandbox, the answer is
// CWSANDBOX_NO_SUITABLE_RUNNER with a violation naming the quarantine.
//
// Its arithmetic (Room, Misfit, Never, NoSuitableRunner) is shared: a runner admits a
// sandbox by the same rules (runner.Local.Create), so it lives below both the gateway
// and the runner and imports neither.
package placement

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/metrics/counters"
	"github.com/sandboxd/sandboxd/internal/policy"
	"github.com/sandboxd/sandboxd/internal/quantity"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// MaxRunnerIDs bounds runner_ids in a request.
const MaxRunnerIDs = 100

// RetryAfter is the delay RetryInfo suggests when runners are full or down.
const RetryAfter = 5 * time.Second

// Resources is an amount of CPU, memory and GPUs.
type Resources struct {
	MilliCPU    int64
	MemoryBytes int64
	GPUs        int64
}

func (r Resources) add(o Resources) Resources {
	return Resources{r.MilliCPU + o.MilliCPU, r.MemoryBytes + o.MemoryBytes, r.GPUs + o.GPUs}
}

func (r Resources) sub(o Resources) Resources {
	return Resources{r.MilliCPU - o.MilliCPU, r.MemoryBytes - o.MemoryBytes, r.GPUs - o.GPUs}
}

// Room is what a runner offers and what its live sandboxes hold of it: what a sandbox is
// admitted against, by its requests (as Kubernetes schedules). The runner checks its own
// creates with it too, so gateways and runner decide alike.
type Room struct {
	// Allocatable is what the runner offers. A zero MilliCPU or MemoryBytes means the
	// runner did not report it: that dimension is not checked. GPUs are checked always
	// (zero means none).
	Allocatable Resources
	// CPUOvercommit: the CPU requests of live sandboxes may add up to this many times
	// Allocatable.MilliCPU (memory and GPUs are never overcommitted); below 1 means 1,
	// above MaxCPUOvercommit MaxCPUOvercommit.
	CPUOvercommit float64
	// MaxSandboxes limits the live sandboxes on the runner; 0 = no limit.
	MaxSandboxes int
	// Used is the requests of the runner's live sandboxes, Sandboxes how many there are.
	Used      Resources
	Sandboxes int
}

// Runner is the caller's view of one runner.
type Runner struct {
	ID    string
	Group string
	// Ready: connected and ready to take sandboxes. NotReady says why not (for messages).
	Ready    bool
	NotReady string
	// Policy is the runner's policy as last seen (nil = the empty policy) and
	// PolicyRevision its revision.
	Policy         *policy.Policy
	PolicyRevision string
	Room
	// Defaults are the runner's default requests and limits, below its policy's base
	// (zero: none).
	Defaults policy.ResourceDefaults
	// RuntimeClasses the runner can run, its default first; empty: Request.Platform's.
	RuntimeClasses []string
	// Support is what the runner cannot do (its capacity's), whatever its policy says.
	runtime.Support
	// EngineImage and EngineRuntimeClass are what it runs container-engine sandboxes
	// with (its capacity's; "" without Support.NoContainerEngine: none).
	EngineImage, EngineRuntimeClass string
	// EngineUnavailable says why it runs none (its capacity's; for messages).
	EngineUnavailable string
	// CachedSnapshots are the digests of the snapshot archives the runner has cached
	// (its capacity's): PreferCached puts it first for a sandbox that restores them.
	CachedSnapshots []string
	// HealthRank orders candidates before their load: 0 (healthy) first, then higher
	// (degraded, probing; internal/health). Quarantined, when not empty, says why the
	// runner takes no sandbox now (its creates kept failing): it is no candidate;
	// QuarantineRetry is how long until its quarantine may end (0: unknown).
	HealthRank      int
	Quarantined     string
	QuarantineRetry time.Duration
	// Owner is the organization the runner belongs to (a tenant's runner: its cluster,
	// its host): it takes that organization's sandboxes only (Serves). "" is a
	// platform runner, which takes every organization's. The caller takes it from what
	// vouches for the runner (its certificate from registration), never from the
	// runner's own report.
	Owner string
	// OwnerUnknown: the caller has not verified the runner's owner yet (a remote runner
	// before its first handshake). It takes nothing and is not named, but a sandbox that
	// no other runner takes is told to retry (UNAVAILABLE CWSANDBOX_RUNNER_UNAVAILABLE).
	OwnerUnknown bool
}

// ConstraintRunnerOwner: a runner that belongs to an organization (Runner.Owner) takes
// only that organization's sandboxes, templates and builds. Another organization's
// runner is no candidate, and is not named to the caller (it is as unknown as another
// organization's sandbox).
const ConstraintRunnerOwner = "platform.runner_owner"

// Serves reports whether a runner owned by owner ("" = the platform) may take work of
// organization org: a platform runner serves everyone, a tenant's runner its own
// organization only (and no work without an organization).
func Serves(owner, org string) bool {
	return owner == "" || owner == org
}

// Serves reports whether r may take work of organization org (placement.Serves).
func (r Runner) Serves(org string) bool { return !r.OwnerUnknown && Serves(r.Owner, org) }

// Request is one placement decision.
type Request struct {
	Spec *sandboxv1.SandboxSpec
	// Org is the organization whose sandbox this is: runners owned by another one
	// (Runner.Owner) are left out as if unknown (ConstraintRunnerOwner).
	Org string
	// Engine, when set, is a container-engine sandbox's (runtime.Spec.Engine): only
	// runners that run them are candidates (policy.ResolveEngine).
	Engine   *runtime.Engine
	Runners  []Runner
	Platform policy.Platform
	// Reservations of placements in flight; nil = none.
	Reservations *Reservations
	// Default is what a container counts for a quantity it neither limits nor requests
	// (zero: it counts nothing).
	Default Resources
	// Rand breaks ties; nil uses the global source.
	Rand *rand.Rand
	// CheckSource: the request is a caller's (from Source; invalid = unknown), and a
	// runner whose policy's control_plane_access.source_ip_allowlist excludes it is no
	// candidate. False for the platform's own placements.
	CheckSource bool
	Source      netip.Addr
	// SecretRefFields are the fields of the spec's references to KUBERNETES secret
	// stores (e.g. sandbox.spec.containers[0].secret_stores[0].store_name): the runner
	// resolves them from Kubernetes Secrets, so only runners that can (no
	// Support.NoSecretRefs: Kubernetes runners) are candidates.
	SecretRefFields []string
	// GlobalVolumeFields are the fields of the spec's GLOBAL registered volumes (e.g.
	// sandbox.spec.volumes[0].volume_id): their copies are restored from and committed to
	// the blob store, so only runners that can (no Support.NoGlobalVolumes: a blob store
	// and a backend that fills and commits them) are candidates.
	GlobalVolumeFields []string
	// GlobalWriterFields are those of GlobalVolumeFields the spec mounts read-write: the
	// sandbox commits their copy when it ends, so only runners that can (no
	// Support.NoGlobalVolumeWriters either) are candidates.
	GlobalWriterFields []string
}

// ConstraintSecretRefs: a sandbox that references a KUBERNETES secret store runs only on
// a runner that reads Kubernetes Secrets (a Kubernetes runner).
const ConstraintSecretRefs = "platform.secret_refs"

// secretRefViolations are runner r's refusals of the spec's KUBERNETES secret store
// references (none when it reads them or there are none).
func secretRefViolations(r Runner, fields []string) []apierr.Violation {
	return fieldViolations(r, r.NoSecretRefs, fields, "references a KUBERNETES secret store, which only a Kubernetes runner reads ("+ConstraintSecretRefs+"); this runner's backend is not Kubernetes")
}

// ConstraintGlobalVolumes: a sandbox that mounts a GLOBAL volume runs only on a runner
// that mounts them (one with a blob store whose backend fills and commits their copies).
const ConstraintGlobalVolumes = "platform.global_volumes"

// globalVolumeViolations are runner r's refusals of the spec's GLOBAL volumes (none when
// it mounts them or there are none).
func globalVolumeViolations(r Runner, fields []string) []apierr.Violation {
	return fieldViolations(r, r.NoGlobalVolumes, fields, "is a GLOBAL volume, which this runner cannot mount ("+ConstraintGlobalVolumes+"): it has no blob store, or its backend cannot fill and commit the volume's copy")
}

// ConstraintGlobalVolumeWriters: a sandbox that mounts a GLOBAL volume read-write runs
// only on a runner that commits a writer's copy when the sandbox ends.
const ConstraintGlobalVolumeWriters = "platform.global_volume_writers"

// globalWriterViolations are runner r's refusals of the spec's read-write GLOBAL mounts
// (none when it commits them or there are none).
func globalWriterViolations(r Runner, fields []string) []apierr.Violation {
	return fieldViolations(r, r.NoGlobalVolumeWriters, fields, "is a GLOBAL volume mounted read-write, which this runner mounts read-only only ("+ConstraintGlobalVolumeWriters+"): its backend cannot commit a writer's copy; mount it read-only")
}

// fieldViolations are runner r's refusals of each of the spec's fields when refused (a
// capability it lacks), each described by desc; none when not refused.
func fieldViolations(r Runner, refused bool, fields []string, desc string) []apierr.Violation {
	if !refused {
		return nil
	}
	vs := make([]apierr.Violation, len(fields))
	for i, f := range fields {
		vs[i] = apierr.Violation{Field: "runner[" + r.ID + "]." + f, Description: desc}
	}
	return vs
}

// Candidate is a runner that accepts the sandbox and has room for it.
type Candidate struct {
	// Index of the runner in Request.Runners, and its ID.
	Index    int
	RunnerID string
	// Result is the runner's resolution of the spec (accepted): create Result.Spec and
	// record Result.PolicyRevision.
	Result policy.Result
	// Need is what the resolved sandbox takes.
	Need Resources
	// Load is the runner's utilisation after placement, 0..1 (or more if overcommitted).
	Load float64

	// room is the runner's room before reservations; for Reservations.Claim.
	room Room
	// healthRank is the runner's Runner.HealthRank.
	healthRank int
}

// Place returns the candidates, best first, or the error for the user:
//   - runner_ids invalid: INVALID_ARGUMENT CWSANDBOX_INVALID_REQUEST;
//   - runner_ids names no known runner: FAILED_PRECONDITION CWSANDBOX_NO_SUITABLE_RUNNER;
//   - a single runner considered whose policy rejects the spec: INVALID_ARGUMENT with the
//     policy's reason and its violations (as a single-runner gateway always answered);
//   - several runners considered, none whose policy accepts: FAILED_PRECONDITION
//     CWSANDBOX_NO_SUITABLE_RUNNER with every runner's violations, fields prefixed with
//     runner[ID].;
//   - runners rejected only because their edge cannot check endpoint share tokens:
//     FAILED_PRECONDITION CWSANDBOX_HTTPS_SHARE_TOKEN_NOT_SUPPORTED with their violations;
//   - some policy accepts but no runner has room now: RESOURCE_EXHAUSTED
//     CWSANDBOX_RUNNER_CAPACITY_EXHAUSTED with RetryInfo;
//   - the sandbox requests more than the whole capacity of every runner whose policy
//     accepts it: FAILED_PRECONDITION CWSANDBOX_NO_SUITABLE_RUNNER, no RetryInfo, with a
//     violation per runner naming the request and the runner's capacity;
//   - every runner considered refuses the caller's address (Request.CheckSource):
//     PERMISSION_DENIED CWSANDBOX_SOURCE_IP_NOT_ALLOWED naming it; when only some do, their
//     violations (field runner[ID].control_plane_access.source_ip_allowlist) are among
//     the others';
//   - every runner considered is down: UNAVAILABLE CWSANDBOX_RUNNER_UNAVAILABLE with
//     RetryInfo;
//   - the spec references a KUBERNETES secret store (Request.SecretRefFields) and no
//     runner considered reads them: FAILED_PRECONDITION CWSANDBOX_NO_SUITABLE_RUNNER
//     with a violation per runner and field naming ConstraintSecretRefs;
//   - the spec mounts GLOBAL volumes (Request.GlobalVolumeFields) and no runner
//     considered mounts them: FAILED_PRECONDITION CWSANDBOX_NO_SUITABLE_RUNNER with a
//     violation per runner and field naming ConstraintGlobalVolumes;
//   - runners owned by another organization than Request.Org (Runner.Owner) are left
//     out before anything else and never named (runner_ids naming one is answered as
//     naming an unknown runner); when no runner is left: FAILED_PRECONDITION
//     CWSANDBOX_NO_SUITABLE_RUNNER with a violation naming ConstraintRunnerOwner, or,
//     when some runner's owner is not known yet (Runner.OwnerUnknown), UNAVAILABLE
//     CWSANDBOX_RUNNER_UNAVAILABLE with RetryInfo.
//
// Each call counts in cwsandbox_placement_decisions_total (ok or the error's reason) and
// every runner left out in cwsandbox_placement_rejections_total by constraint
// (internal/metrics/counters).
func Place(req Request) ([]Candidate, error) {
	var rej []string
	cands, err := place(req, &rej)
	result := counters.ResultOK
	if err != nil {
		result = apierr.Reason(err)
	}
	counters.Placement(result, rej)
	return cands, err
}

// Rejection constraints of runners left out for another reason than their policy's.
const (
	RejectUnavailable = "unavailable" // not connected or not ready
	RejectQuarantined = "quarantined" // runner health
	RejectCapacity    = "capacity"    // the sandbox needs more than the runner's whole capacity
	RejectRoom        = "room"        // no room now
)

// place is Place; it appends to rej the constraint of each runner left out (one per
// runner and constraint).
func place(req Request, rej *[]string) ([]Candidate, error) {
	pins := req.Spec.GetRunnerIds()
	if err := ValidateRunnerIDs(pins); err != nil {
		return nil, err
	}
	considered := make([]int, 0, len(req.Runners))
	known := make([]string, 0, len(req.Runners)) // the runners the organization sees
	unverified := 0                              // of those considered
	for i, r := range req.Runners {
		if r.OwnerUnknown {
			// Whose it is is not known yet: not connected yet, for all that matters.
			if len(pins) == 0 || slices.Contains(pins, r.ID) {
				unverified++
			}
			*rej = append(*rej, RejectUnavailable)
			continue
		}
		if !r.Serves(req.Org) {
			// Another organization's runner: never a candidate, never named.
			*rej = append(*rej, ConstraintRunnerOwner)
			continue
		}
		known = append(known, r.ID)
		if len(pins) == 0 || slices.Contains(pins, r.ID) {
			considered = append(considered, i)
		}
	}
	if len(considered) == 0 {
		if unverified > 0 {
			return nil, apierr.WithRetry(apierr.New(apierr.RunnerUnavailable,
				fmt.Sprintf("no runner available for this sandbox yet: %d runners not connected yet", unverified), nil), RetryAfter)
		}
		if len(pins) == 0 {
			vs := []apierr.Violation{{Field: "sandbox.spec.runner_ids", Description: "no runner here serves this organization (" + ConstraintRunnerOwner + "): the runners here belong to other organizations, whose runners take only their own sandboxes"}}
			return nil, apierr.WithViolations(apierr.New(apierr.NoSuitableRunner,
				"no runner can take this sandbox: "+apierr.Describe(vs), nil), vs)
		}
		return nil, apierr.New(apierr.NoSuitableRunner,
			fmt.Sprintf("no runner among %v: available runners are %v", pins, known), nil)
	}

	var (
		cands    []Candidate
		down     []string           // runner IDs
		full     []string           // "r1: needs …, free …"
		rejected []apierr.Violation // prefixed
		// quarantined: runners that would take it but for their quarantine; retry: the
		// earliest end of one.
		quarantined []string
		retry       time.Duration
		single      policy.Result // the one rejection when one runner is considered
		// bySource: runners rejected by their source-IP allowlists.
		bySource int
		// shareOnly: every rejection is only a runner that cannot check share tokens.
		shareOnly = true
		resolved  = map[resolution]policy.Result{}
	)
	for _, i := range considered {
		r := req.Runners[i]
		if !r.Ready {
			down = append(down, r.ID)
			why := r.NotReady
			if why == "" {
				why = "not connected"
			}
			rejected = append(rejected, apierr.Violation{Field: "runner[" + r.ID + "]", Description: "runner is unavailable: " + why})
			*rej = append(*rej, RejectUnavailable)
			continue
		}
		if req.CheckSource && !policy.SourceAllowed(r.Policy, req.Source) {
			bySource++
			shareOnly = false
			rejected = append(rejected, policy.SourceViolation(r.ID, req.Source))
			*rej = append(*rej, policy.ConstraintSourceIPAllowlist)
			continue
		}
		if vs := secretRefViolations(r, req.SecretRefFields); len(vs) > 0 {
			shareOnly = false
			rejected = append(rejected, vs...)
			*rej = append(*rej, ConstraintSecretRefs)
			continue
		}
		if vs := globalVolumeViolations(r, req.GlobalVolumeFields); len(vs) > 0 {
			shareOnly = false
			rejected = append(rejected, vs...)
			*rej = append(*rej, ConstraintGlobalVolumes)
			continue
		}
		if vs := globalWriterViolations(r, req.GlobalWriterFields); len(vs) > 0 {
			shareOnly = false
			rejected = append(rejected, vs...)
			*rej = append(*rej, ConstraintGlobalVolumeWriters)
			continue
		}
		// Runners sharing a policy (a group) share its resolution.
		key := resolution{r.Policy, strings.Join(r.RuntimeClasses, ","), r.Support, r.Defaults, r.EngineImage, r.EngineRuntimeClass, r.EngineUnavailable}
		res, ok := resolved[key]
		if !ok {
			res = policy.ResolveEngine(r.Policy, r.PolicyRevision, req.Spec, req.Engine, platformOf(req.Platform, r))
			resolved[key] = res
		}
		res.PolicyRevision = r.PolicyRevision
		if !res.OK() {
			single = res
			shareOnly = shareOnly && onlyShareTokens(res.Violations)
			for _, v := range policy.ToAPI(res.Violations) {
				v.Field = "runner[" + r.ID + "]." + v.Field
				rejected = append(rejected, v)
			}
			*rej = appendConstraints(*rej, res.Violations)
			continue
		}
		c := Candidate{Index: i, RunnerID: r.ID, Result: res, Need: Need(res.Spec, req.Default), room: r.Room}
		if never := r.Never(c.Need); len(never) > 0 {
			shareOnly = false
			for _, sf := range never {
				rejected = append(rejected, sf.Violation(r.ID, RequestField(res.Spec, sf.Quantity)))
			}
			*rej = append(*rej, RejectCapacity)
			continue
		}
		if r.Quarantined != "" {
			shareOnly = false
			quarantined = append(quarantined, r.ID)
			retry = minRetry(retry, r.QuarantineRetry)
			rejected = append(rejected, apierr.Violation{Field: "runner[" + r.ID + "]", Description: "runner is " + r.Quarantined})
			*rej = append(*rej, RejectQuarantined)
			continue
		}
		reserved, n := req.Reservations.Held(r.ID)
		if why := c.misfit(reserved, n); why != "" {
			full = append(full, r.ID+": "+why)
			*rej = append(*rej, RejectRoom)
			continue
		}
		c.Load = load(r.Room, c.Need.add(reserved), n+1)
		c.healthRank = r.HealthRank
		cands = append(cands, c)
	}
	if len(cands) > 0 {
		shuffle := rand.Shuffle
		if req.Rand != nil {
			shuffle = req.Rand.Shuffle
		}
		shuffle(len(cands), func(i, j int) { cands[i], cands[j] = cands[j], cands[i] })
		slices.SortStableFunc(cands, func(a, b Candidate) int {
			switch {
			case a.healthRank != b.healthRank:
				return a.healthRank - b.healthRank
			case a.Load < b.Load:
				return -1
			case a.Load > b.Load:
				return 1
			}
			return 0
		})
		return cands, nil
	}
	switch {
	case len(full) > 0:
		return nil, CapacityExhausted(full)
	case len(quarantined) > 0: // the others never would; these will after the cooldown
		return nil, Quarantined(quarantined, rejected, retry)
	case bySource > 0 && bySource == len(considered):
		return nil, SourceNotAllowed(considered, req)
	case len(down) == 0 && shareOnly:
		return nil, apierr.WithViolations(apierr.New(apierr.HTTPSShareTokenNotSupported,
			"no runner here can check endpoint share tokens (HTTPS SHARE_TOKEN endpoints): use auth OPEN: "+apierr.Describe(rejected),
			nil), rejected)
	case len(down) == len(considered):
		return nil, apierr.WithRetry(apierr.New(apierr.RunnerUnavailable,
			fmt.Sprintf("runner %s unavailable: %s", strings.Join(down, ", "), apierr.Describe(rejected)),
			map[string]string{"runner_ids": strings.Join(down, ",")}), RetryAfter)
	case len(considered) == 1 && !single.OK():
		vs := policy.ToAPI(single.Violations)
		reason, why := policy.Reason(single.Violations), "'s policy rejects this sandbox"
		if reason == apierr.NoSuitableRunner {
			why = " cannot run this sandbox" // the runner's lack, not its policy
		}
		return nil, apierr.Invalid(reason, fmt.Sprintf("runner %s%s: %s", req.Runners[considered[0]].ID, why, apierr.Describe(vs)), vs)
	}
	ids := make([]string, len(considered))
	for k, i := range considered {
		ids[k] = req.Runners[i].ID
	}
	return nil, NoSuitableRunner(ids, rejected)
}

// appendConstraints appends the distinct constraints of vs (a violation without one
// counts as "spec").
func appendConstraints(rej []string, vs []policy.Violation) []string {
	seen := map[string]bool{}
	for _, v := range vs {
		c := v.Constraint
		if c == "" {
			c = policy.ConstraintSpec
		}
		if !seen[c] {
			seen[c] = true
			rej = append(rej, c)
		}
	}
	return rej
}

// Quarantined is the error when the only runners that would take a sandbox (runnerIDs)
// are quarantined by runner health (internal/health): UNAVAILABLE
// CWSANDBOX_RUNNER_UNAVAILABLE, which clients retry, with RetryInfo until the earliest
// cooldown ends (RetryAfter when unknown) and vs naming the quarantines (and why any other
// runner would not take it).
func Quarantined(runnerIDs []string, vs []apierr.Violation, retry time.Duration) *connect.Error {
	if retry <= 0 {
		retry = RetryAfter
	}
	return apierr.WithRetry(apierr.WithViolations(apierr.New(apierr.RunnerUnavailable,
		fmt.Sprintf("no runner can take this sandbox now (retry after the quarantine): %s", apierr.Describe(vs)),
		map[string]string{"runner_ids": strings.Join(runnerIDs, ",")}), vs), retry)
}

// minRetry is the shorter of two known (positive) delays.
func minRetry(a, b time.Duration) time.Duration {
	switch {
	case b <= 0:
		return a
	case a <= 0:
		return b
	}
	return min(a, b)
}

// NoSuitableRunner is the error for a sandbox none of runnerIDs can ever take (their
// policies reject it, it exceeds their capacity, they are down): vs say, per runner, why.
// It is no "try again later": nothing will change by itself.
func NoSuitableRunner(runnerIDs []string, vs []apierr.Violation) *connect.Error {
	return apierr.WithViolations(apierr.New(apierr.NoSuitableRunner,
		fmt.Sprintf("no runner can take this sandbox: %s", apierr.Describe(vs)),
		map[string]string{"runner_ids": strings.Join(runnerIDs, ",")}), vs)
}

// SourceNotAllowed is the error when every runner considered refuses the caller's
// address: PERMISSION_DENIED CWSANDBOX_SOURCE_IP_NOT_ALLOWED naming the address, with a
// violation per runner.
func SourceNotAllowed(considered []int, req Request) *connect.Error {
	ids := make([]string, len(considered))
	vs := make([]apierr.Violation, len(considered))
	for k, i := range considered {
		ids[k] = req.Runners[i].ID
		vs[k] = policy.SourceViolation(ids[k], req.Source)
	}
	a := policy.AddrString(req.Source)
	return apierr.WithViolations(apierr.New(apierr.SourceIPNotAllowed,
		fmt.Sprintf("no runner here allows Sandbox API calls from %s (%s of runner %s)", a, policy.ConstraintSourceIPAllowlist, strings.Join(ids, ", ")),
		map[string]string{"source_ip": a, "runner_ids": strings.Join(ids, ",")}), vs)
}

// onlyShareTokens reports whether vs are all a runner's lack of share-token support.
func onlyShareTokens(vs []policy.Violation) bool {
	for _, v := range vs {
		if v.Constraint != policy.ConstraintPlatformShareTokens {
			return false
		}
	}
	return true
}

// CapacityExhausted is the error for policies that accept a sandbox on runners without
// room for it; why says, per runner, what was missing.
func CapacityExhausted(why []string) *connect.Error {
	return apierr.WithRetry(apierr.New(apierr.RunnerCapacityExhausted,
		"no runner has room for this sandbox now: "+strings.Join(why, "; "), nil), RetryAfter)
}

// ValidateRunnerIDs checks runner_ids: at most MaxRunnerIDs, none blank, no duplicate.
func ValidateRunnerIDs(ids []string) error {
	if vs := RunnerIDViolations(ids); len(vs) > 0 {
		return apierr.Invalid(apierr.InvalidRequest, "invalid runner_ids: "+apierr.Describe(vs), vs)
	}
	return nil
}

// RunnerIDViolations lists what is wrong with runner_ids, for a caller collecting every
// problem of a request at once.
func RunnerIDViolations(ids []string) []apierr.Violation {
	var vs []apierr.Violation
	if len(ids) > MaxRunnerIDs {
		vs = append(vs, apierr.Violation{Field: "sandbox.spec.runner_ids", Description: fmt.Sprintf("at most %d runner IDs, got %d", MaxRunnerIDs, len(ids))})
	}
	seen := make(map[string]bool, len(ids))
	for i, id := range ids {
		f := fmt.Sprintf("sandbox.spec.runner_ids[%d]", i)
		switch {
		case strings.TrimSpace(id) == "":
			vs = append(vs, apierr.Violation{Field: f, Description: "must not be blank"})
		case seen[id]:
			vs = append(vs, apierr.Violation{Field: f, Description: fmt.Sprintf("duplicate runner ID %q", id)})
		}
		seen[id] = true
	}
	return vs
}

// Need is what a resolved spec is admitted by: per container its request, else its limit
// (a lone limit is also the request), else def, summed; GPUs are the largest count a
// container states.
func Need(spec *sandboxv1.SandboxSpec, def Resources) Resources {
	var n Resources
	for _, c := range spec.GetContainers() {
		legacy, lim, req := c.GetResources(), c.GetResourceRequirements().GetLimits(), c.GetResourceRequirements().GetRequests()
		cpu := first(legacy.GetCpu(), req.GetCpu(), lim.GetCpu())
		if v, err := quantity.ParseCPU(cpu); cpu != "" && err == nil {
			n.MilliCPU += v
		} else if cpu == "" {
			n.MilliCPU += def.MilliCPU
		}
		mem := first(legacy.GetMemory(), req.GetMemory(), lim.GetMemory())
		if v, err := quantity.ParseMemory(mem); mem != "" && err == nil {
			n.MemoryBytes += v
		} else if mem == "" {
			n.MemoryBytes += def.MemoryBytes
		}
		n.GPUs += max(legacy.GetGpu().GetCount(), lim.GetGpu().GetCount(), req.GetGpu().GetCount())
	}
	return n
}

func first(ss ...string) string {
	for _, s := range ss {
		if s != "" {
			return s
		}
	}
	return ""
}

// MaxCPUOvercommit bounds Room.CPUOvercommit: a runner that reports more admits that.
const MaxCPUOvercommit = 100

// cpuAdmitted is the CPU requests r admits in all (0 = not checked).
func (r Room) cpuAdmitted() int64 {
	f := r.CPUOvercommit
	switch {
	case !(f >= 1): // also NaN
		f = 1
	case f > MaxCPUOvercommit:
		f = MaxCPUOvercommit
	}
	return int64(float64(r.Allocatable.MilliCPU) * f)
}

// Shortfall is one quantity a sandbox requests beyond a runner's whole capacity.
type Shortfall struct {
	Quantity    string // "cpu", "memory" or "gpu"
	Need, Total string // formatted quantities
}

// Violation names the shortfall on runner id, field being the request's field.
func (sf Shortfall) Violation(id, field string) apierr.Violation {
	return apierr.Violation{Field: "runner[" + id + "]." + field, Description: fmt.Sprintf(
		"requests %s %s, but runner %s has %s in all: it can never run this sandbox (this is its capacity, not what is free now); ask for %s or less",
		sf.Need, sf.Quantity, id, sf.Total, sf.Total)}
}

// Never lists what of need exceeds r's whole capacity, which no wait makes room for: a
// request is a guarantee, so a single sandbox's is held to the real capacity, without
// the overcommit. Empty when need could fit once r has room.
func (r Room) Never(need Resources) []Shortfall {
	var out []Shortfall
	if a := r.Allocatable.MilliCPU; a > 0 && need.MilliCPU > a {
		out = append(out, Shortfall{"cpu", quantity.FormatCPU(need.MilliCPU), quantity.FormatCPU(a)})
	}
	if a := r.Allocatable.MemoryBytes; a > 0 && need.MemoryBytes > a {
		out = append(out, Shortfall{"memory", quantity.FormatMemory(need.MemoryBytes), quantity.FormatMemory(a)})
	}
	if need.GPUs > r.Allocatable.GPUs {
		out = append(out, Shortfall{"gpu", fmt.Sprint(need.GPUs), fmt.Sprint(r.Allocatable.GPUs)})
	}
	return out
}

// Misfit says why need has no room on r now, with held resources and n sandboxes
// reserved on top of what r reports, or "" when it fits.
func (r Room) Misfit(need, held Resources, n int) string {
	used := r.Used.add(held)
	var why []string
	if a := r.cpuAdmitted(); a > 0 && need.MilliCPU > 0 && used.MilliCPU+need.MilliCPU > a {
		why = append(why, fmt.Sprintf("needs %s CPU, %s free", quantity.FormatCPU(need.MilliCPU), quantity.FormatCPU(max(a-used.MilliCPU, 0))))
	}
	if a := r.Allocatable.MemoryBytes; a > 0 && need.MemoryBytes > 0 && used.MemoryBytes+need.MemoryBytes > a {
		why = append(why, fmt.Sprintf("needs %s memory, %s free", quantity.FormatMemory(need.MemoryBytes), quantity.FormatMemory(max(a-used.MemoryBytes, 0))))
	}
	if need.GPUs > 0 && used.GPUs+need.GPUs > r.Allocatable.GPUs {
		why = append(why, fmt.Sprintf("needs %d GPUs, %d free", need.GPUs, max(r.Allocatable.GPUs-used.GPUs, 0)))
	}
	if r.MaxSandboxes > 0 && r.Sandboxes+n >= r.MaxSandboxes {
		why = append(why, fmt.Sprintf("runs its maximum of %d sandboxes", r.MaxSandboxes))
	}
	return strings.Join(why, ", ")
}

// Free is what r admits beyond its live sandboxes and held, never negative: CPU by its
// overcommitted total.
func (r Room) Free(held Resources) Resources {
	used := r.Used.add(held)
	return Resources{
		MilliCPU:    max(r.cpuAdmitted()-used.MilliCPU, 0),
		MemoryBytes: max(r.Allocatable.MemoryBytes-used.MemoryBytes, 0),
		GPUs:        max(r.Allocatable.GPUs-used.GPUs, 0),
	}
}

// misfit says why the candidate has no room given reserved resources and n reserved
// sandboxes, or "" when it fits.
func (c Candidate) misfit(reserved Resources, n int) string {
	return c.room.Misfit(c.Need, reserved, n)
}

// RequestField is the field of spec's request of quantity ("cpu", "memory", "gpu") for
// messages: its one container's, else the containers'. A nil spec is one container
// with resource_requirements.
func RequestField(spec *sandboxv1.SandboxSpec, quantity string) string {
	cs := spec.GetContainers()
	if spec != nil && len(cs) != 1 {
		return "sandbox.spec.containers"
	}
	f := "sandbox.spec.containers[0].resource_requirements.requests." + quantity
	if len(cs) == 1 && cs[0].GetResources() != nil {
		f = "sandbox.spec.containers[0].resources." + quantity
	}
	if quantity == "gpu" {
		f += ".count"
	}
	return f
}

// load is the largest of CPU, memory and sandbox-slot utilisation once extra resources
// and n more sandboxes are placed on r (slots count so that sandboxes without requests
// spread too); CPU is measured against what r admits with its overcommit.
func load(r Room, extra Resources, n int) float64 {
	var l float64
	if r.MaxSandboxes > 0 {
		l = float64(r.Sandboxes+n) / float64(r.MaxSandboxes)
	}
	if a := r.cpuAdmitted(); a > 0 {
		l = max(l, float64(r.Used.MilliCPU+extra.MilliCPU)/float64(a))
	}
	if a := r.Allocatable.MemoryBytes; a > 0 {
		l = max(l, float64(r.Used.MemoryBytes+extra.MemoryBytes)/float64(a))
	}
	return l
}

// resolution identifies a policy resolution: runners sharing a policy and runtime
// classes (a group) share it.
type resolution struct {
	policy   *policy.Policy
	classes  string
	support  runtime.Support
	defaults policy.ResourceDefaults
	engine   string
	engineRC string
	noEngine string
}

// platformOf is the platform runner r resolves specs against: p with r's runtime
// classes, support and defaults.
func platformOf(p policy.Platform, r Runner) policy.Platform {
	if len(r.RuntimeClasses) > 0 {
		p.RuntimeClasses = r.RuntimeClasses
		p.DefaultCPURuntimeClass = r.RuntimeClasses[0]
	}
	p.Support = r.Support
	p.EngineImage, p.EngineRuntimeClass, p.EngineUnavailable = r.EngineImage, r.EngineRuntimeClass, r.EngineUnavailable
	if r.Defaults != (policy.ResourceDefaults{}) {
		d := r.Defaults
		p.DefaultResources = &d
	}
	return p
}

// Resolve is runner r's resolution of spec as Place judges it (r's policy, runtime
// classes, support and defaults on platform), without capacity or readiness: for what a
// runner may be asked to keep ready (templates' warm pools).
func Resolve(spec *sandboxv1.SandboxSpec, engine *runtime.Engine, r Runner, platform policy.Platform) policy.Result {
	res := policy.ResolveEngine(r.Policy, r.PolicyRevision, spec, engine, platformOf(platform, r))
	res.PolicyRevision = r.PolicyRevision
	return res
}
