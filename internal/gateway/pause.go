package gateway

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	statev1 "github.com/sandboxd/sandboxd/gen/sandboxd/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/edge"
	"github.com/sandboxd/sandboxd/internal/placement"
	"github.com/sandboxd/sandboxd/internal/policy"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/span"
	"github.com/sandboxd/sandboxd/internal/store"
)

// MaxForks is the most sandboxes one ForkSandbox makes.
const MaxForks = 100

// PauseSandbox implements sandboxd.sandbox.v1.SandboxStateService: it pauses the
// caller's RUNNING sandbox on its runner (runner.PauseHandle.Pause). auto_resume unset
// is the sandbox's own setting (runtime.MetaAutoResume, from its runner policy's
// base.pause at create; default on).
func (s *Server) PauseSandbox(ctx context.Context, req *connect.Request[statev1.PauseSandboxRequest]) (*connect.Response[statev1.PauseSandboxResponse], error) {
	m := req.Msg
	rec, r, err := s.lookup(ctx, m.GetSandboxId())
	if err != nil {
		return nil, err
	}
	ph, err := pauseHandle(r, "pause sandboxes")
	if err != nil {
		return nil, err
	}
	if m.GetReleaseResources() {
		if err := s.refuseGlobal(ctx, rec, "it can be paused, but not releasing its resources (its volume copy does not move with a checkpoint)"); err != nil {
			return nil, err
		}
	}
	opts := runner.PauseOptions{Release: m.ReleaseResources, AutoResume: true}
	if m.AutoResume != nil {
		opts.AutoResume = m.GetAutoResume()
	} else {
		sb, err := r.Get(ctx, rec.id)
		if err != nil {
			return nil, runner.APIError(rec.id, err, "")
		}
		s.index.setLast(ctx, rec, sb)
		opts.AutoResume = sb.Spec.Meta[runtime.MetaAutoResume] != "false"
	}
	got, err := ph.Pause(ctx, rec.id, opts)
	if err != nil {
		return nil, runner.APIError(rec.id, err, "")
	}
	s.index.setLast(ctx, rec, got)
	s.views.poke() // a checkpointed sandbox's CPU and memory are free again
	st := &statev1.PauseStatus{SandboxId: rec.id, AutoResume: opts.AutoResume}
	if p := got.Pause; p != nil {
		st.ResourcesReleased, st.AutoResume, st.LifetimeHeld = p.Released, p.AutoResume, p.LifetimeHeld
		st.PausedAt, st.CheckpointBytes = ts(p.PausedAt), p.CheckpointBytes
	}
	s.log.Info("sandbox paused", "sandbox", rec.id, "org", rec.org, "runner", r.ID(), "released", st.ResourcesReleased)
	return connect.NewResponse(&statev1.PauseSandboxResponse{Status: st}), nil
}

// ResumeSandbox implements sandboxd.sandbox.v1.SandboxStateService: it resumes the
// caller's PAUSED sandbox on its runner (a RUNNING one is returned as it is). A
// checkpointed sandbox (paused releasing its resources) whose runner has no room for it,
// or is not among runner_ids, moves to another runner that can take its checkpoint
// (moveSandbox); a frozen one never moves.
func (s *Server) ResumeSandbox(ctx context.Context, req *connect.Request[statev1.ResumeSandboxRequest]) (*connect.Response[statev1.ResumeSandboxResponse], error) {
	m := req.Msg
	ids := m.GetRunnerIds()
	if vs := runnerIDViolations("runner_ids", ids); len(vs) > 0 {
		return nil, apierr.Invalid(apierr.InvalidRequest, "invalid runner_ids: "+apierr.Describe(vs), vs)
	}
	ctx, steps := span.New(ctx)
	t := time.Now()
	rec, _, err := s.lookup(ctx, m.GetSandboxId())
	if err != nil {
		return nil, err
	}
	unlock, err := s.sandboxOps.lock(ctx, rec.id)
	if err != nil {
		return nil, err
	}
	defer unlock()
	// Looked up again under the lock: a concurrent resume may have moved it (this
	// gateway's, or another replica's).
	rec, r, err := s.lookup(ctx, rec.id)
	if err != nil {
		return nil, err
	}
	r = s.followMove(ctx, rec, r)
	ph, err := pauseHandle(r, "resume sandboxes")
	if err != nil {
		return nil, err
	}
	span.Mark(ctx, "gateway: lookup, lock", &t)
	resumed := func(got runner.Sandbox, on runner.Handle, from string) (*connect.Response[statev1.ResumeSandboxResponse], error) {
		span.Mark(ctx, "gateway: runner resume", &t)
		s.index.setLast(ctx, rec, got)
		s.views.poke()
		span.Mark(ctx, "gateway: index", &t)
		s.log.Info("sandbox resumed", "sandbox", rec.id, "org", rec.org, "runner", on.ID(), "moved_from", from, "steps", steps.String())
		return connect.NewResponse(&statev1.ResumeSandboxResponse{SandboxId: rec.id, Deadline: ts(got.Deadline), RunnerId: on.ID(), MovedFrom: from}), nil
	}
	var (
		own     portRefusal
		ownErr  error // the own runner's refusal
		allowed = len(ids) == 0 || slices.Contains(ids, r.ID())
	)
	if allowed {
		got, err := ph.Resume(ctx, rec.id)
		if err == nil {
			return resumed(got, r, "")
		}
		ownErr = runner.APIError(rec.id, err, "")
		if connect.CodeOf(ownErr) != connect.CodeResourceExhausted {
			return nil, ownErr
		}
		msg := ownErr.Error()
		var ce *connect.Error
		if errors.As(ownErr, &ce) {
			msg = ce.Message()
		}
		msg = strings.TrimPrefix(msg, fmt.Sprintf("runner %s has no room to resume sandbox %s: ", r.ID(), rec.id))
		own = portRefusal{runner: r.ID(), why: "its runner has no room to resume it: " + msg, kind: refusedRoom}
	} else {
		own = portRefusal{runner: r.ID(), why: "its runner, not allowed by runner_ids"}
	}
	src, err := r.Get(ctx, rec.id)
	if err != nil {
		return nil, runner.APIError(rec.id, err, "")
	}
	s.index.setLast(ctx, rec, src)
	if src.State != runner.StatePaused || src.Pause == nil || !src.Pause.Released {
		if ownErr != nil {
			return nil, ownErr
		}
		return nil, cannotMove(rec.id, r.ID(), ids, src)
	}
	got, to, err := s.moveSandbox(ctx, rec, r, src, ids, own)
	if err != nil {
		return nil, err
	}
	if to.ID() == r.ID() {
		return resumed(got, r, "") // resumed there meanwhile: the move was abandoned
	}
	return resumed(got, to, r.ID())
}

// cannotMove is the refusal to resume sandbox id (src) of runner from elsewhere than on
// from (runner_ids excludes it): only a checkpointed sandbox moves.
func cannotMove(id, from string, ids []string, src runner.Sandbox) error {
	md := map[string]string{"sandbox_id": id, "runner_id": from, "state": src.State.String()}
	switch {
	case src.State == runner.StatePaused:
		return apierr.New(apierr.CheckpointNotSupported, fmt.Sprintf(
			"sandbox %s is paused frozen on runner %s (its memory kept there, not checkpointed): a frozen sandbox never moves to another runner, and runner_ids %v excludes %s; resume it without runner_ids, or pause it releasing resources",
			id, from, ids, from), md)
	case src.State == runner.StateRunning:
		return apierr.New(apierr.CheckpointNotSupported, fmt.Sprintf(
			"sandbox %s runs on runner %s, which runner_ids %v excludes: only a sandbox paused releasing its resources moves to another runner",
			id, from, ids), md)
	}
	return apierr.New(apierr.SandboxNotRunning, fmt.Sprintf("sandbox %s is %s: only a PAUSED sandbox is resumed", id, src.State), md)
}

// runnerIDViolations are runner_ids' violations (placement.RunnerIDViolations) under
// field, as a request other than a create names it.
func runnerIDViolations(field string, ids []string) []apierr.Violation {
	vs := placement.RunnerIDViolations(ids)
	for i := range vs {
		vs[i].Field = field + strings.TrimPrefix(vs[i].Field, "sandbox.spec.runner_ids")
	}
	return vs
}

// pauseHandle is r as a runner.PauseHandle, or the refusal naming r.
func pauseHandle(r runner.Handle, what string) (runner.PauseHandle, error) {
	ph, ok := r.(runner.PauseHandle)
	if !ok {
		return nil, apierr.New(apierr.CheckpointNotSupported,
			fmt.Sprintf("runner %s cannot %s (it has no pause, resume or fork)", r.ID(), what),
			map[string]string{"runner_id": r.ID()})
	}
	return ph, nil
}

// ForkSandbox implements sandboxd.sandbox.v1.SandboxStateService: count new sandboxes
// from the caller's RUNNING or PAUSED sandbox, each with an ID the gateway chooses,
// recorded in the index like a created sandbox (organization, caller, a share token of
// its own when the source has HTTPS SHARE_TOKEN endpoints).
//
// Forks go to the source's runner when runner_ids allows it, its current policy accepts
// the source's spec and it has room for all count forks now. Otherwise the source's
// checkpoint is exported to the blob store once and the forks the source's runner has
// no room for are made on other allowed runners that can take it (placeForks), each
// recorded with its runner. When they do not all find room, none is made (the errors of
// refusedError: RESOURCE_EXHAUSTED CWSANDBOX_RUNNER_CAPACITY_EXHAUSTED with RetryInfo,
// …; with only the source's runner to consider, its placement's error as a create's).
// request_id makes it idempotent: the forks of a request are recorded under it, a
// repeated request returns them and makes again only those that failed; the same
// request_id with another source, another count or another RPC is CWSANDBOX_REQUEST_ID_
// CONFLICT.
func (s *Server) ForkSandbox(ctx context.Context, req *connect.Request[statev1.ForkSandboxRequest]) (*connect.Response[statev1.ForkSandboxResponse], error) {
	m := req.Msg
	p := principal(ctx)
	count := int(m.GetCount())
	var vs []apierr.Violation
	if m.GetSandboxId() == "" {
		vs = append(vs, apierr.Violation{Field: "sandbox_id", Description: "is required"})
	}
	if count < 0 || count > MaxForks {
		vs = append(vs, apierr.Violation{Field: "count", Description: fmt.Sprintf("must be within 1..%d (0 means 1), got %d", MaxForks, count)})
	}
	vs = append(vs, requestIDViolations("request_id", m.GetRequestId())...)
	vs = append(vs, runnerIDViolations("runner_ids", m.GetRunnerIds())...)
	if len(vs) > 0 {
		return nil, apierr.Invalid(apierr.InvalidRequest, "invalid ForkSandbox request: "+apierr.Describe(vs), vs)
	}
	count = max(count, 1)
	ctx, steps := span.New(ctx)
	t := time.Now()
	rec, _, err := s.lookup(ctx, m.GetSandboxId())
	if err != nil {
		return nil, err
	}
	if err := s.refuseGlobal(ctx, rec, "a fork would be a second copy of it, and GLOBAL volumes are not forked"); err != nil {
		return nil, err
	}
	digest := forkDigest(rec.id, count)

	// A repeated request: the forks recorded under its request_id are its answer; only
	// the ones missing (failed the first time) are made again.
	out := make([]*statev1.Fork, count)
	var todo []int
	for k := range count {
		if f, ok := s.index.byRequestID(ctx, p.Org, forkRequestKey(m.GetRequestId(), k)); ok {
			if f.requestDigest != digest {
				return nil, requestIDConflict()
			}
			out[k] = s.forkReplayed(ctx, f)
			continue
		}
		todo = append(todo, k)
	}
	if len(todo) == 0 {
		return connect.NewResponse(&statev1.ForkSandboxResponse{Forks: out}), nil
	}

	unlock, err := s.sandboxOps.lock(ctx, rec.id) // not moved meanwhile
	if err != nil {
		return nil, err
	}
	defer unlock()
	rec, r, err := s.lookup(ctx, rec.id)
	if err != nil {
		return nil, err
	}
	r = s.followMove(ctx, rec, r)
	ph, err := pauseHandle(r, "fork sandboxes")
	if err != nil {
		return nil, err
	}
	src, err := r.Get(ctx, rec.id)
	if err != nil {
		return nil, runner.APIError(rec.id, err, "")
	}
	span.Mark(ctx, "gateway: lookup, lock, get source", &t)
	s.index.setLast(ctx, rec, src)
	span.Mark(ctx, "gateway: index source", &t)
	if src.State != runner.StateRunning && src.State != runner.StatePaused {
		return nil, apierr.New(apierr.SandboxNotRunning,
			fmt.Sprintf("sandbox %s is %s: only a RUNNING or PAUSED sandbox is forked", rec.id, src.State),
			map[string]string{"sandbox_id": rec.id, "state": src.State.String()})
	}
	// Egress secrets' values, resolved again for the forks (on any runner: one that
	// imports the source's checkpoint gets its egress CA and placeholders with it).
	egressValues, err := s.forkEgressSecretValues(ctx, p.Org, rec, src)
	if err != nil {
		return nil, err
	}
	groups, release, err := s.placeForks(ctx, rec, r, src, m.GetRunnerIds(), len(todo))
	if err != nil {
		return nil, err
	}
	defer release()
	// The organization's quota, for every fork at once (N forks take N sandboxes): the
	// forks recorded take their share, what is left (forks that failed) is released.
	var need placement.Resources
	for _, g := range groups {
		need.MilliCPU += g.c.Need.MilliCPU * int64(g.n)
		need.MemoryBytes += g.c.Need.MemoryBytes * int64(g.n)
	}
	reservation, err := s.reserveQuotaTotal(ctx, p.Org, int64(len(todo)), need)
	if err != nil {
		return nil, err
	}
	defer s.releaseQuota(ctx, p.Org, reservation)
	span.Mark(ctx, "gateway: place", &t)

	// The targets, in todo's order, group after group.
	targets := make([]runner.ForkTarget, len(todo))
	groupOf := make([]int, len(todo))
	j := 0
	for g := range groups {
		for range groups[g].n {
			t := runner.ForkTarget{ID: runner.NewID(), Meta: forkMeta(src.Spec.Meta, p.Org, p.KeyID, groups[g].c.Result.PolicyRevision),
				EgressSecretValues: egressValues}
			if runner.NeedsShareTokens(src.Spec) {
				t.ShareTokenHash = edge.ShareTokenHash(s.shareTokens.token(t.ID))
			}
			targets[j], groupOf[j] = t, g
			j++
		}
	}
	results, err := s.runForks(ctx, rec, ph, src, groups, targets)
	if err != nil {
		return nil, err
	}
	span.Mark(ctx, "gateway: runner fork", &t)
	s.views.poke()
	made := 0
	for j, k := range todo {
		t, g := targets[j], groups[groupOf[j]]
		res := results[j]
		if res.Err != nil {
			out[k] = forkFailed(t.ID, runner.APIError(t.ID, res.Err, ""))
			continue
		}
		sb := res.Sandbox
		if sb.ID == "" {
			sb.ID = t.ID
		}
		s.views.confirmed(g.c.Index, g.c.Need) // counted until the runner's usage shows it
		policyRevision, _ := strconv.ParseInt(g.c.Result.PolicyRevision, 10, 64)
		f := &record{id: sb.ID, org: p.Org, runnerID: g.h.ID(), spec: proto.CloneOf(rec.spec), createdAt: sb.CreatedAt, last: sb,
			policyRevision: policyRevision, requestDigest: digest,
			sourceTemplateID: rec.sourceTemplateID, sourceTemplateRevision: rec.sourceTemplateRevision, displayName: rec.displayName, builds: rec.builds,
			need: g.c.Need, reservation: reservation}
		if f.createdAt.IsZero() {
			f.createdAt = time.Now()
		}
		out[k] = s.recordFork(ctx, f, g.h, forkRequestKey(m.GetRequestId(), k), digest)
		if out[k].GetError() == nil {
			made++
		}
	}
	runners := make([]string, len(groups))
	for g := range groups {
		runners[g] = fmt.Sprintf("%s=%d", groups[g].h.ID(), groups[g].n)
	}
	span.Mark(ctx, "gateway: record forks", &t)
	s.log.Info("sandbox forked", "sandbox", rec.id, "org", p.Org, "runner", r.ID(), "asked", len(todo), "made", made, "on", strings.Join(runners, ","), "steps", steps.String())
	return connect.NewResponse(&statev1.ForkSandboxResponse{Forks: out}), nil
}

// placeFork is placement's answer for one more sandbox of rec's spec on its runner r:
// the runner must be ready, its current policy must accept the spec (a fork is a new
// sandbox: policy changes since the source's creation apply to it), and it must have
// room for one (ClaimN checks all of them).
func (s *Server) placeFork(ctx context.Context, rec *record, r runner.Handle, src runner.Sandbox) (placement.Candidate, error) {
	sp := proto.CloneOf(rec.spec)
	sp.RunnerIds = []string{r.ID()}
	addr, public := callerOf(ctx)
	cands, err := placement.Place(placement.Request{
		Spec:         sp,
		Org:          rec.org,
		Engine:       src.Spec.Engine,
		Runners:      s.placementRunners(ctx),
		Platform:     policy.RunnerPlatform(nil),
		Reservations: &s.reserved,
		CheckSource:  public,
		Source:       addr,
		// A fork takes the source's KUBERNETES secret references, as a create does.
		SecretRefFields: secretRefFieldsOf(rec, src),
	})
	if err != nil {
		return placement.Candidate{}, err
	}
	return cands[0], nil
}

// recordFork puts fork f into the index under key (its request's), or deletes it when
// it cannot be recorded (an unrecorded sandbox is not reachable through the API).
func (s *Server) recordFork(ctx context.Context, f *record, r runner.Handle, key, digest string) *statev1.Fork {
	err := s.index.put(ctx, f, key)
	if err == nil {
		return &statev1.Fork{SandboxId: f.id, EndpointShareToken: s.forkShareToken(f.id, f.last), RunnerId: f.runnerID}
	}
	_, _ = r.Delete(context.WithoutCancel(ctx), f.id, 0)
	var dup *store.AlreadyExistsError
	if errors.As(err, &dup) && dup.Key == store.KeyRequestID {
		// The same request on another gateway replica recorded this fork meanwhile.
		if first, ok := s.index.byRequestID(ctx, f.org, key); ok && first.requestDigest == digest {
			return s.forkReplayed(ctx, first)
		}
		return forkFailed(f.id, requestIDConflict())
	}
	return forkFailed(f.id, connect.NewError(connect.CodeUnavailable, fmt.Errorf("record fork %s: %w", f.id, err)))
}

// forkReplayed is the answer for a fork recorded by an earlier request.
func (s *Server) forkReplayed(ctx context.Context, f *record) *statev1.Fork {
	out := &statev1.Fork{SandboxId: f.id, RunnerId: s.index.runnerOf(f)}
	if r := s.runnerByID(out.RunnerId); r != nil {
		out.EndpointShareToken = s.forkShareToken(f.id, s.current(ctx, f, r))
	}
	return out
}

// forkShareToken is fork id's share token when its runner holds its hash (as
// withShareToken: a token is handed out only if it works).
func (s *Server) forkShareToken(id string, sb runner.Sandbox) string {
	if sb.Spec.ShareTokenHash == "" {
		return ""
	}
	if t := s.shareTokens.token(id); edge.ShareTokenHash(t) == sb.Spec.ShareTokenHash {
		return t
	}
	return ""
}

// forkFailed is the answer for a fork that met err (an API error).
func forkFailed(id string, err error) *statev1.Fork {
	fe := &statev1.ForkError{Code: strings.ToUpper(connect.CodeOf(err).String()), Reason: apierr.Reason(err), Message: err.Error()}
	var ce *connect.Error
	if errors.As(err, &ce) {
		fe.Message = ce.Message()
	}
	return &statev1.Fork{SandboxId: id, Error: fe}
}

// forkMeta is a fork's runtime.Spec.Meta: the source's settings (its pause settings
// among them), in the caller's organization under the caller's key and the revision of
// the policy that admitted it; the runner writes its own bookkeeping (creation time,
// lifetime, runtime.MetaForkedFrom).
func forkMeta(src map[string]string, org, caller, policyRevision string) map[string]string {
	m := maps.Clone(src)
	if m == nil {
		m = map[string]string{}
	}
	for _, k := range []string{runtime.MetaCreatedAt, runtime.MetaLifetime, runtime.MetaForkedFrom, runtime.MetaGatewayPolicyRevision} {
		delete(m, k)
	}
	m[runtime.MetaOrg], m[runtime.MetaCaller], m[runtime.MetaPolicyRevision] = org, caller, policyRevision
	return m
}

// forkDigest identifies a ForkSandbox request in its forks' records (record.requestDigest):
// a request_id repeated with another source or count is a conflict.
func forkDigest(source string, count int) string {
	return fmt.Sprintf("fork:%s:%d", source, count)
}

// forkRequestKey is the request_id fork k of a request is recorded under: the first
// under the request_id itself (so a create with the same request_id conflicts), the
// others under request_id#fork-k; "" without a request_id.
func forkRequestKey(requestID string, k int) string {
	if requestID == "" || k == 0 {
		return requestID
	}
	return requestID + "#fork-" + strconv.Itoa(k)
}
