package gateway

import (
	"context"
	"errors"
	"fmt"
	"maps"
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
// caller's PAUSED sandbox on its runner (a RUNNING one is returned as it is).
func (s *Server) ResumeSandbox(ctx context.Context, req *connect.Request[statev1.ResumeSandboxRequest]) (*connect.Response[statev1.ResumeSandboxResponse], error) {
	rec, r, err := s.lookup(ctx, req.Msg.GetSandboxId())
	if err != nil {
		return nil, err
	}
	ph, err := pauseHandle(r, "resume sandboxes")
	if err != nil {
		return nil, err
	}
	got, err := ph.Resume(ctx, rec.id)
	if err != nil {
		return nil, runner.APIError(rec.id, err, "")
	}
	s.index.setLast(ctx, rec, got)
	s.views.poke()
	s.log.Info("sandbox resumed", "sandbox", rec.id, "org", rec.org, "runner", r.ID())
	return connect.NewResponse(&statev1.ResumeSandboxResponse{SandboxId: rec.id, Deadline: ts(got.Deadline)}), nil
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
// from the caller's RUNNING or PAUSED sandbox, on its runner, each with an ID the
// gateway chooses, recorded in the index like a created sandbox (organization, caller,
// a share token of its own when the source has HTTPS SHARE_TOKEN endpoints).
//
// The source's runner must accept the source's spec under its current policy and have
// room for all count forks now (else the errors of a create's placement: RESOURCE_
// EXHAUSTED CWSANDBOX_RUNNER_CAPACITY_EXHAUSTED with RetryInfo, …). request_id makes it
// idempotent: the forks of a request are recorded under it, a repeated request returns
// them and makes again only those that failed; the same request_id with another source,
// another count or another RPC is CWSANDBOX_REQUEST_ID_CONFLICT.
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
	if len(vs) > 0 {
		return nil, apierr.Invalid(apierr.InvalidRequest, "invalid ForkSandbox request: "+apierr.Describe(vs), vs)
	}
	count = max(count, 1)
	rec, r, err := s.lookup(ctx, m.GetSandboxId())
	if err != nil {
		return nil, err
	}
	ph, err := pauseHandle(r, "fork sandboxes")
	if err != nil {
		return nil, err
	}
	digest := forkDigest(rec.id, count)

	// A repeated request: the forks recorded under its request_id are its answer; only
	// the ones missing (failed the first time) are made again.
	out := make([]*statev1.Fork, count)
	var todo []int
	for k := range count {
		if f, ok := s.index.byRequestID(ctx, p.Org, forkRequestKey(m.GetRequestId(), k)); ok {
			if f.fileDigest != digest {
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

	src, err := r.Get(ctx, rec.id)
	if err != nil {
		return nil, runner.APIError(rec.id, err, "")
	}
	s.index.setLast(ctx, rec, src)
	if src.State != runner.StateRunning && src.State != runner.StatePaused {
		return nil, apierr.New(apierr.SandboxNotRunning,
			fmt.Sprintf("sandbox %s is %s: only a RUNNING or PAUSED sandbox is forked", rec.id, src.State),
			map[string]string{"sandbox_id": rec.id, "state": src.State.String()})
	}
	c, err := s.placeFork(ctx, rec, r, src)
	if err != nil {
		return nil, err
	}
	release, why := s.reserved.ClaimN(c, len(todo))
	if why != "" {
		return nil, placement.CapacityExhausted([]string{fmt.Sprintf("%s: %d forks: %s", r.ID(), len(todo), why)})
	}
	defer release()

	targets := make([]runner.ForkTarget, len(todo))
	for j := range todo {
		t := runner.ForkTarget{ID: runner.NewID(), Meta: forkMeta(src.Spec.Meta, p.Org, p.KeyID, c.Result.PolicyRevision)}
		if runner.NeedsShareTokens(src.Spec) {
			t.ShareTokenHash = edge.ShareTokenHash(s.shareTokens.token(t.ID))
		}
		targets[j] = t
	}
	results, err := ph.Fork(ctx, rec.id, targets)
	if err != nil {
		return nil, runner.APIError(rec.id, err, "")
	}
	s.views.poke()
	policyRevision, _ := strconv.ParseInt(c.Result.PolicyRevision, 10, 64)
	made := 0
	for j, k := range todo {
		t := targets[j]
		if j >= len(results) {
			out[k] = forkFailed(t.ID, connect.NewError(connect.CodeInternal, fmt.Errorf("runner %s returned no result for this fork", r.ID())))
			continue
		}
		res := results[j]
		if res.Err != nil {
			out[k] = forkFailed(t.ID, runner.APIError(t.ID, res.Err, ""))
			continue
		}
		sb := res.Sandbox
		if sb.ID == "" {
			sb.ID = t.ID
		}
		s.views.confirmed(c.Index, c.Need) // counted until the runner's usage shows it
		f := &record{id: sb.ID, org: p.Org, runnerID: r.ID(), spec: proto.CloneOf(rec.spec), createdAt: sb.CreatedAt, last: sb,
			policyRevision: policyRevision, fileDigest: digest}
		if f.createdAt.IsZero() {
			f.createdAt = time.Now()
		}
		out[k] = s.recordFork(ctx, f, r, forkRequestKey(m.GetRequestId(), k), digest)
		if out[k].GetError() == nil {
			made++
		}
	}
	s.log.Info("sandbox forked", "sandbox", rec.id, "org", p.Org, "runner", r.ID(), "asked", len(todo), "made", made)
	return connect.NewResponse(&statev1.ForkSandboxResponse{Forks: out}), nil
}

// placeFork is placement's answer for one more sandbox of rec's spec on its runner r:
// the runner must be ready, its current policy must accept the spec (a fork is a new
// sandbox: policy changes since the source's creation apply to it), and it must have
// room for one (ClaimN checks all of them).
func (s *Server) placeFork(ctx context.Context, rec *record, r runner.Handle, src runner.Sandbox) (placement.Candidate, error) {
	sp := proto.CloneOf(rec.spec)
	sp.RunnerIds = []string{r.ID()}
	cands, err := placement.Place(placement.Request{
		Spec:         sp,
		Engine:       src.Spec.Engine,
		Runners:      s.views.snapshot(ctx),
		Platform:     policy.RunnerPlatform(nil),
		Reservations: &s.reserved,
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
		return &statev1.Fork{SandboxId: f.id, EndpointShareToken: s.forkShareToken(f.id, f.last)}
	}
	_, _ = r.Delete(context.WithoutCancel(ctx), f.id, 0)
	var dup *store.AlreadyExistsError
	if errors.As(err, &dup) && dup.Key == store.KeyRequestID {
		// The same request on another gateway replica recorded this fork meanwhile.
		if first, ok := s.index.byRequestID(ctx, f.org, key); ok && first.fileDigest == digest {
			return s.forkReplayed(ctx, first)
		}
		return forkFailed(f.id, requestIDConflict())
	}
	return forkFailed(f.id, connect.NewError(connect.CodeUnavailable, fmt.Errorf("record fork %s: %w", f.id, err)))
}

// forkReplayed is the answer for a fork recorded by an earlier request.
func (s *Server) forkReplayed(ctx context.Context, f *record) *statev1.Fork {
	out := &statev1.Fork{SandboxId: f.id}
	if r := s.runnerByID(f.runnerID); r != nil {
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

// forkDigest identifies a ForkSandbox request in its forks' records (record.fileDigest):
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
