package gateway

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/health"
	"github.com/sandboxd/sandboxd/internal/placement"
	"github.com/sandboxd/sandboxd/internal/policy"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/spec"
	"github.com/sandboxd/sandboxd/internal/tracing"
)

// viewTimeout bounds how long a probe waits for one runner's capacity and policy.
const viewTimeout = 2 * time.Second

// place returns the runners that accept spec and have room for it, best first (see
// package placement for the errors). secretRefs are the fields of spec's references to
// KUBERNETES secret stores (byReference): only runners that read them are candidates;
// globals the fields of its GLOBAL volumes: only runners that mount them are.
func (s *Server) place(ctx context.Context, spec *sandboxv1.SandboxSpec, engine *runtime.Engine, secretRefs, globals, globalWriters []string) ([]placement.Candidate, error) {
	return s.placeRestoring(ctx, spec, engine, nil, secretRefs, globals, globalWriters)
}

// byReference wraps resolve to note the fields (store_name) of the references it
// answers spec.ErrByReference for: a KUBERNETES secret store's, which the runner resolves.
// nil resolve stays nil.
func byReference(resolve spec.SecretResolver) (spec.SecretResolver, func() []string) {
	var fields []string
	if resolve == nil {
		return nil, func() []string { return nil }
	}
	return func(field string, ref spec.SecretRef) (string, error) {
		v, err := resolve(field, ref)
		if errors.Is(err, spec.ErrByReference) {
			if f := storeNameField(field); !slices.Contains(fields, f) {
				fields = append(fields, f)
			}
		}
		return v, err
	}, func() []string { return fields }
}

// secretRefFieldsOf are the fields of rec's references to KUBERNETES secret stores, as a
// create's placement gets them (byReference): for the placement of a fork or a move of
// src, rec as its runner holds it, whose containers' SecretRefs name those stores (a
// store's kind is the same wherever the spec names it). Bounded by the spec (at most
// one per secret_stores entry).
func secretRefFieldsOf(rec *record, src runner.Sandbox) []string {
	stores := map[string]bool{}
	for _, c := range src.Spec.AllContainers() {
		for _, r := range c.SecretRefs {
			stores[r.Store] = true
		}
	}
	if len(stores) == 0 {
		return nil
	}
	var fields []string
	for i, c := range rec.spec.GetContainers() {
		for j, st := range c.GetSecretStores() {
			if stores[st.GetStoreName()] {
				fields = append(fields, fmt.Sprintf("sandbox.spec.containers[%d].secret_stores[%d].store_name", i, j))
			}
		}
	}
	return fields
}

// recordedNetwork is rec's network as the gateway recorded it at create (rec.spec: its
// sandboxd_secret references as asked for), never as its runner reports it: a runner is
// not trusted to name which of the organization's secrets a fork is given.
func recordedNetwork(rec *record) *runtime.Network {
	n, _, _ := spec.ToNetwork(rec.spec.GetNetwork())
	return n
}

// forkEgressSecretValues resolves, in org, the values of the egress secrets of rec (as
// recorded: recordedNetwork), as a create resolves them: a fork is given them
// fresh, never from its source. nil when it has none. A source whose runner reports
// egress secrets the record does not have is not forked (its runner would refuse the
// fork without their values anyway; none is resolved for it).
func (s *Server) forkEgressSecretValues(ctx context.Context, org string, rec *record, src runner.Sandbox) (map[string]string, error) {
	n := recordedNetwork(rec)
	rules := n.EgressSecrets()
	recorded := map[string]bool{}
	for _, r := range rules {
		recorded[r.Secret.Key()] = true
	}
	for _, r := range src.Spec.Network.EgressSecrets() {
		if !recorded[r.Secret.Key()] {
			s.log.Warn("fork refused: the runner reports an egress secret the sandbox was not created with", "sandbox", rec.id, "runner", rec.runnerID, "secret", r.Secret.Key())
			return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("sandbox %s: its runner reports egress secrets it was not created with: not forked", rec.id))
		}
	}
	if len(rules) == 0 {
		return nil, nil
	}
	resolve := s.secretResolver(ctx, org)
	if resolve == nil {
		return nil, apierr.Newf(apierr.NotImplemented, "sandbox %s has egress secrets, and this gateway has no secret stores to resolve them for its forks", rec.id)
	}
	sp := runtime.Spec{Network: n} // its violations name the recorded rules' fields
	if err := spec.ResolveEgressSecrets(&sp, resolve); err != nil {
		return nil, err
	}
	return sp.EgressSecretValues, nil
}

// placeRestoring is place for a sandbox that restores snapshots: digests are the sha256
// of their archives (one per restored volume), and a runner that has them cached comes
// first among those that accept the sandbox (placement.PreferCached).
func (s *Server) placeRestoring(ctx context.Context, spec *sandboxv1.SandboxSpec, engine *runtime.Engine, digests, secretRefs, globals, globalWriters []string) (_ []placement.Candidate, err error) {
	ctx, sp := tracing.Child(ctx, "gateway.place")
	defer func() { tracing.End(sp, err) }()
	runners := s.placementRunners(ctx)
	addr, public := callerOf(ctx)
	cands, err := placement.Place(placement.Request{
		Spec:         spec,
		Org:          principal(ctx).Org,
		Engine:       engine,
		Runners:      runners,
		Platform:     policy.RunnerPlatform(nil),
		Reservations: &s.reserved,
		CheckSource:  public,
		Source:       addr,
		// One per secret_stores entry (or credentials) at most: bounded with the spec.
		SecretRefFields: secretRefs,
		// The fields of its GLOBAL volumes (one per spec volume at most).
		GlobalVolumeFields: globals,
		// Those mounted read-write: only runners that commit a writer's copy.
		GlobalWriterFields: globalWriters,
	})
	if err != nil {
		return nil, err
	}
	placement.PreferCached(cands, runners, digests)
	return cands, nil
}

// quotaHold is what a created sandbox holds of its organization's quota: need, taken
// from reservation id (quota.go; "" none) when the sandbox is recorded.
type quotaHold struct {
	id   string
	need placement.Resources
}

// createOn creates the sandbox on the first candidate that takes it: capacity is
// reserved while the runner's Create is in flight, and a runner that rejects the sandbox
// (its policy changed, it filled up, it went away) passes it to the next candidate.
// adjust, when not nil, adds to each runtime spec what the public wire cannot carry.
// restore looks up the snapshots the spec's volumes restore (Server.restorer). The
// organization's quota is reserved for the candidate's need before its runner is asked
// (released when the runner fails it); the caller records the sandbox with the hold, or
// releases it.
func (s *Server) createOn(ctx context.Context, cands []placement.Candidate, org, caller string, adjust func(*runtime.Spec) error, restore spec.Restorer, secrets spec.SecretResolver) (runner.Handle, policy.Result, runner.Sandbox, quotaHold, error) {
	var (
		last error
		full []string
		// quarantined: candidates the health tracker refused since placement (their
		// violations); retry the earliest end of their quarantines.
		quarantined []string
		qviolations []apierr.Violation
		retry       time.Duration
	)
	for k, c := range cands {
		release, ok := s.reserved.Claim(c)
		if !ok {
			full = append(full, c.RunnerID+": its room is taken by creates in flight")
			continue
		}
		ticket, ok := s.health.Begin(c.RunnerID, org)
		if !ok { // quarantined since placement, or another create probes it
			release()
			v := s.health.View(c.RunnerID, org)
			quarantined = append(quarantined, c.RunnerID)
			qviolations = append(qviolations, apierr.Violation{Field: "runner[" + c.RunnerID + "]", Description: "runner is " + v.Reason})
			if d := quarantineRetry(v); d > 0 && (retry == 0 || d < retry) {
				retry = d
			}
			continue
		}
		r := s.runners[c.Index]
		cr, err := toCreateRequest(c.Result.Spec, restore, secrets, s.registeredResolver(ctx, org))
		if err == nil && adjust != nil {
			if err = adjust(&cr.Spec); err != nil {
				err = connect.NewError(connect.CodeInternal, err)
			}
		}
		if err != nil {
			release()
			s.health.Report(ticket, health.Ignored, "")
			return nil, policy.Result{}, runner.Sandbox{}, quotaHold{}, err
		}
		held := quotaHold{need: c.Need}
		if held.id, err = s.reserveQuotaTotal(ctx, org, 1, c.Need); err != nil {
			release()
			s.health.Report(ticket, health.Ignored, "")
			return nil, policy.Result{}, runner.Sandbox{}, quotaHold{}, err
		}
		s.addRegistryCredentials(&cr.Spec, org)
		s.nameSandbox(&cr)
		meta := map[string]string{runtime.MetaOrg: org, runtime.MetaCaller: caller, runtime.MetaPolicyRevision: c.Result.PolicyRevision}
		anyID := s.platformRunner(r)
		if anyID {
			// A platform runner may answer under another ID: a warm sandbox's
			// (runtime.WarmReserver); checked by answeredID. A tenant's runner is not
			// asked: an ID is the one name every organization's sandboxes share.
			meta[runtime.MetaAnyID] = "true"
		}
		cr.Spec.Meta = c.Result.SetMeta(meta)
		// The policy's Pod settings travel with the spec (also over the runner wire); a
		// remote runner that checks its own policy (runnerapi.Server.WithPolicy) replaces
		// them with its policy's rather than adding to them.
		cr.Spec.Pod = c.Result.Pod
		sb, err := s.runnerCreate(ctx, r, ticket, cr) // judged there when it fails
		if err == nil {
			if err = s.answeredID(ctx, r, cr.Spec.ID, anyID, &sb); err != nil {
				s.health.Report(ticket, health.Ignored, "")
			}
		}
		if err == nil {
			s.views.confirmed(c.Index, c.Need) // counted until the runner's usage shows it
			s.createAccepted(r, ticket, sb)
			release()
			return r, c.Result, sb, held, nil
		}
		if apierr.Reason(err) == apierr.RunnerUnavailable && !errors.Is(err, runner.ErrBadReply) && ctx.Err() == nil {
			s.views.markDown(c.Index, err)
		}
		// An abandoned attempt keeps its room and quota until the runner has answered.
		afterSettled(err, func() {
			release()
			s.releaseQuota(context.WithoutCancel(ctx), org, held.id)
		})
		if ab := (*abandonedError)(nil); errors.As(err, &ab) {
			return nil, policy.Result{}, runner.Sandbox{}, quotaHold{}, err // the caller's leases wait for it too
		}
		last = runner.APIError("", err, runner.SpecField)
		if ctx.Err() != nil || !rejectedByRunner(err) || k == len(cands)-1 {
			return nil, policy.Result{}, runner.Sandbox{}, quotaHold{}, last
		}
		s.log.Info("runner rejected a placement; trying the next candidate", "runner", c.RunnerID, "err", err)
	}
	if last != nil {
		return nil, policy.Result{}, runner.Sandbox{}, quotaHold{}, last
	}
	if len(full) == 0 && len(quarantined) > 0 { // answered as Place answers it
		return nil, policy.Result{}, runner.Sandbox{}, quotaHold{}, placement.Quarantined(quarantined, qviolations, retry)
	}
	for i, v := range qviolations {
		full = append(full, quarantined[i]+": "+v.Description)
	}
	return nil, policy.Result{}, runner.Sandbox{}, quotaHold{}, placement.CapacityExhausted(full)
}

// platformRunner reports whether r is known to be a platform runner (serves every
// organization): only such a runner may name a sandbox it creates (runtime.MetaAnyID).
func (s *Server) platformRunner(r runner.Handle) bool {
	owner, known := s.runnerOwner(r)
	return known && owner == ""
}

// errForeignID: a runner answered a create under an ID it may not take.
var errForeignID = errors.New("runner answered the create under another sandbox ID")

// answeredID checks the ID runner r answered a create of sandbox want with (sb.ID): the
// sandbox is indexed under it, so a runner must not name a sandbox it was not asked to,
// nor one the gateway knows (another organization's: its record would be overwritten,
// and the reconciler would later delete the live one). Another ID than want is taken only
// when the runner was asked to choose (anyID: a platform runner), the ID is valid and no
// record of any organization has it in the index (the store's insert refuses one
// another replica recorded: persistNew). Otherwise the answered sandbox is deleted on r
// (unless r runs a sandbox the index knows under that ID) and the attempt fails.
func (s *Server) answeredID(ctx context.Context, r runner.Handle, want string, anyID bool, sb *runner.Sandbox) error {
	if sb.ID == "" {
		sb.ID = want
	}
	if sb.ID == want {
		return nil
	}
	known, onR := s.index.known(sb.ID, r.ID())
	if anyID && runtime.ValidID(sb.ID, 63) && !known {
		return nil
	}
	s.log.Warn("runner answered a create under an ID it may not take; deleting it", "runner", r.ID(), "asked", want, "answered", sb.ID, "known", known)
	if !onR {
		if _, err := r.Delete(context.WithoutCancel(ctx), sb.ID, 0); err != nil {
			s.log.Warn("delete a sandbox answered under a foreign ID", "runner", r.ID(), "sandbox", sb.ID, "err", err)
		}
	}
	// The runner's fault, not the request's: as any wrong answer of a runner
	// (runnerapi's checks of its replies).
	return runner.BadReply(r.ID(), fmt.Sprintf("%v (asked %s, answered %.63q)", errForeignID, want, sb.ID))
}

// rejectedByRunner reports whether a runner's Create error means "not here" rather than
// "not like this": another runner may take the sandbox.
func rejectedByRunner(err error) bool {
	var verr *runner.ValidationError
	if errors.As(err, &verr) {
		return true // e.g. its policy changed since the gateway's copy
	}
	switch apierr.Reason(err) {
	case apierr.PlacementRejected, apierr.ResourceCeilingExceeded, apierr.RunnerCapacityExhausted, apierr.RunnerUnavailable,
		apierr.HTTPSShareTokenNotSupported,
		// A volume this runner's backend cannot mount (e.g. a GLOBAL one read-write, or
		// with a sub_path on a Kubernetes runner of an earlier release): a stale view, a
		// newer runner, or what placement does not see (Support.NoGlobalVolumeSubPaths).
		apierr.VolumeTypeNotSupported,
		apierr.NoSuitableRunner: // more than this runner's capacity: a bigger one may take it
		return true
	}
	switch connect.CodeOf(err) {
	case connect.CodeResourceExhausted, connect.CodeUnavailable:
		return true
	}
	return false
}
