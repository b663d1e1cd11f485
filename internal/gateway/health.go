package gateway

import (
	"cmp"
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/health"
	"github.com/sandboxd/sandboxd/internal/metrics"
	"github.com/sandboxd/sandboxd/internal/placement"
	"github.com/sandboxd/sandboxd/internal/runner"
)

// Runner health (internal/health, docs/observability.md): every create this gateway
// places is judged once its outcome is known, and runners whose creates keep failing are
// placed last, then not at all for a cooldown. A create's RPC answer judges it when it
// fails (the runner unreachable, timed out, an internal error); an accepted create is
// judged when the gateway next sees the sandbox (index.setLast): RUNNING heals, FAILED
// with BackendError (the runner's runtime failed it) counts. Everything the caller or its
// sandbox may have caused never counts: policy, spec, quota, start errors the agent
// reports (working dir, user, command, exec format), image pulls (not found,
// unauthorized, or a registry unreachable: possibly the caller's own), the workload's
// command failing.

// maxHealthPending bounds the accepted creates awaiting their outcome.
const maxHealthPending = 10000

// healthPending maps sandbox IDs to the tickets of their creates until judged.
type healthPending struct {
	mu sync.Mutex
	m  map[string]pendingTicket
}

type pendingTicket struct {
	k  health.Ticket
	at time.Time
}

// newHealth returns the tracker of cfg, logging and counting its transitions.
func (s *Server) newHealth(cfg health.Config, now func() time.Time) *health.Tracker {
	t := health.New(cfg, now, func(tr health.Transition) {
		scope := metrics.HealthScopeRunner
		if tr.Org != "" {
			scope = metrics.HealthScopeOrganization
		}
		metrics.Default.RunnerHealthTransition(tr.Runner, scope, tr.From.String(), tr.To.String())
		args := []any{"runner", tr.Runner, "from", tr.From.String(), "to", tr.To.String()}
		if tr.Org != "" {
			args = append(args, "org", tr.Org, "scope", "organization")
		}
		if tr.Reason != "" {
			args = append(args, "reason", tr.Reason)
		}
		switch tr.To {
		case health.Healthy:
			s.log.Info("runner healthy again", args...)
		default:
			s.log.Warn("runner health changed", args...)
		}
	})
	ids := make([]string, len(s.runners))
	for i, r := range s.runners {
		ids[i] = r.ID()
	}
	metrics.Default.RegisterRunnerHealth(ids, func() map[string]string {
		out := map[string]string{}
		for id, st := range t.Runners() {
			out[id] = st.String()
		}
		return out
	})
	return t
}

// withHealth marks runners as org sees their health: degraded and probing ones ranked
// after healthy ones, quarantined ones excluded with the reason.
func (s *Server) withHealth(runners []placement.Runner, org string) []placement.Runner {
	for i := range runners {
		switch v := s.health.View(runners[i].ID, org); v.State {
		case health.Degraded, health.Probing:
			runners[i].HealthRank = int(v.State)
		case health.Quarantined:
			runners[i].Quarantined, runners[i].QuarantineRetry = v.Reason, quarantineRetry(v)
		}
	}
	return runners
}

// quarantineRetry is how long until v's quarantine may end (0: unknown, e.g. a probe
// is out).
func quarantineRetry(v health.View) time.Duration {
	if v.Until.IsZero() {
		return 0
	}
	return max(time.Until(v.Until), 0)
}

// placementRunners is the runners' placement view for the caller's organization.
func (s *Server) placementRunners(ctx context.Context) []placement.Runner {
	return s.withHealth(s.views.snapshot(ctx), principal(ctx).Org)
}

// createFailed judges a create whose RPC failed; ctx is the attempt's (runnerCreate).
func (s *Server) createFailed(ctx context.Context, k health.Ticket, err error) {
	o, kind := createOutcome(ctx, err)
	s.health.Report(k, o, kind)
}

// judgePlacement judges a sandbox placed on r for org other than by a create (a fork, a
// move's import) by the rules of creates: its request's error as createOutcome says (ctx
// is the request's), an accepted sandbox as createAccepted does. These placements are
// not admitted one by one (health.Tracker.Begin: placement already left the quarantined
// runners out), so they never hold a probe slot.
func (s *Server) judgePlacement(ctx context.Context, r runner.Handle, org string, sb runner.Sandbox, err error) {
	k := health.Ticket{Runner: r.ID(), Org: org}
	if err != nil {
		s.createFailed(ctx, k, err)
		return
	}
	s.createAccepted(r, k, sb)
}

// exportFailed judges a checkpoint export (a move's or a fork's to another runner) that
// failed on r (err as the caller gets it) by the rules of a failed create: a failure the runner caused counts against
// it for org (createOutcome; a source that cannot be exported, a cancelled caller do not).
// A successful export is not judged: it is not a placement, and must not heal a runner
// whose creates fail.
func (s *Server) exportFailed(ctx context.Context, r runner.Handle, org string, err error) {
	s.createFailed(ctx, health.Ticket{Runner: r.ID(), Org: org}, err)
}

// maxDetachedCreates bounds the create attempts still judged after their callers went
// away (runnerCreate), maxDetachedCreatesPerOrg those of one organization; beyond them
// an abandoned attempt is cancelled with its caller, not judged.
const (
	maxDetachedCreates       = 256
	maxDetachedCreatesPerOrg = 32
)

// abandonedError is the error of a create attempt whose caller went away while the
// attempt still runs (runnerCreate): what the create holds for it (its room on the
// runner, its quota reservation, its GLOBAL volume leases) is released only once settled
// is closed, when the runner has answered (and an accepted sandbox is deleted) or the
// attempt has ended: released earlier, a retry could take them while the abandoned
// sandbox is still being made.
type abandonedError struct {
	err     error
	settled <-chan struct{}
}

func (e *abandonedError) Error() string { return e.err.Error() }
func (e *abandonedError) Unwrap() error { return e.err }

// afterSettled runs release now or, when err is an abandoned create's, once its attempt
// has settled.
func afterSettled(err error, release func()) {
	var ab *abandonedError
	if !errors.As(err, &ab) {
		release()
		return
	}
	go func() {
		<-ab.settled
		release()
	}()
}

// detachedDeleteTimeout bounds the delete of a sandbox whose create answered after its
// caller went away.
const detachedDeleteTimeout = 30 * time.Second

// errCreateTimedOut is the cause of an attempt's context that reached its own bound
// (health.Config.CreateTimeout): the runner did not answer in time.
var errCreateTimedOut = errors.New("the runner did not answer the create in time")

// createAttempt is one create request to a runner: whoever of the caller and the attempt
// sees the other's mark first owns the accepted sandbox.
type createAttempt struct {
	mu        sync.Mutex
	done      chan struct{}
	sb        runner.Sandbox
	err       error
	finished  bool // the runner answered
	abandoned bool // the caller went away first
	slot      bool // it holds a place among the detached attempts (Server.detached)
}

// runnerCreate asks r to create cr's sandbox, judged by the attempt's own bound
// (health.Config.CreateTimeout), not by its caller's deadline: a runner that never
// answers fails the create once the bound passes, also when the caller went away before
// (at most maxDetachedCreates such attempts at once, maxDetachedCreatesPerOrg of one
// organization; they end with the server). A failed attempt is judged here
// (createFailed); an accepted one is the caller's to judge, or, when its caller went
// away, is deleted unjudged (the runner answered; its start says nothing anyone waits
// for). A caller that goes away first gets its context's error as an *abandonedError:
// the caller releases what it holds for the create with afterSettled.
func (s *Server) runnerCreate(ctx context.Context, r runner.Handle, k health.Ticket, cr runner.CreateRequest) (runner.Sandbox, error) {
	actx, cancel := context.WithTimeoutCause(context.WithoutCancel(ctx), s.health.Config().CreateTimeout, errCreateTimedOut)
	stop := context.AfterFunc(s.bg, cancel)
	a := &createAttempt{done: make(chan struct{})}
	settled := make(chan struct{})
	s.attempts.Add(1)
	go func() {
		defer s.attempts.Done()
		defer close(settled)
		sb, err := r.Create(actx, cr)
		if err != nil {
			s.createFailed(actx, k, err)
		}
		stop()
		cancel()
		a.mu.Lock()
		a.sb, a.err, a.finished = sb, err, true
		abandoned := a.abandoned
		a.mu.Unlock()
		close(a.done)
		if !abandoned {
			return
		}
		if a.slot {
			s.detached.release(k.Org)
		}
		if err == nil {
			s.health.Report(k, health.Ignored, "")
			s.dropAbandoned(r, cmp.Or(sb.ID, cr.Spec.ID))
		}
	}()
	select {
	case <-a.done:
	case <-ctx.Done():
		a.mu.Lock()
		if !a.finished {
			a.abandoned = true
			if a.slot = s.detached.acquire(k.Org); !a.slot {
				cancel() // too many already: not judged (its cause is a cancel)
			}
			a.mu.Unlock()
			return runner.Sandbox{}, &abandonedError{err: contextError(ctx), settled: settled}
		}
		a.mu.Unlock()
	}
	return a.sb, a.err
}

// dropAbandoned deletes sandbox id on r: its create answered after its caller went away,
// so nobody records it (the reconciler would delete it after the orphan grace).
func (s *Server) dropAbandoned(r runner.Handle, id string) {
	ctx, cancel := context.WithTimeout(s.bg, detachedDeleteTimeout)
	defer cancel()
	if _, err := r.Delete(ctx, id, 0); err != nil && s.bg.Err() == nil {
		s.log.Warn("delete a sandbox whose caller went away during its create", "sandbox", id, "runner", r.ID(), "err", err)
	}
}

// contextError is a gone caller's error as an RPC answers it.
func contextError(ctx context.Context) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return connect.NewError(connect.CodeDeadlineExceeded, ctx.Err())
	}
	return connect.NewError(connect.CodeCanceled, ctx.Err())
}

// ProbeJudgeFor bounds how long the gateway itself watches an accepted probe create
// (judgeProbe): a probe still starting then frees the half-open slot unjudged.
const ProbeJudgeFor = 60 * time.Second

// probeJudgePoll is how often judgeProbe asks a runner that cannot await a start.
const probeJudgePoll = time.Second

// createAccepted judges an accepted create now when its sandbox already ran or failed,
// else when the gateway next sees it (observeHealth). A probe is also watched actively
// (judgeProbe), so that it does not hold the runner's half-open slot, and keep the runner
// quarantined for everyone, only because nobody asks about its sandbox here.
func (s *Server) createAccepted(r runner.Handle, k health.Ticket, sb runner.Sandbox) {
	if o, kind, final := sandboxOutcome(sb); final {
		s.health.Report(k, o, kind)
		return
	}
	p := &s.healthPending
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.m == nil {
		p.m = map[string]pendingTicket{}
	}
	now := time.Now()
	if len(p.m) >= maxHealthPending && !k.Probe() { // probes are few: one per runner and organization at most
		cutoff := now.Add(-s.health.Config().ProbeTimeout)
		for id, t := range p.m {
			if t.at.Before(cutoff) {
				delete(p.m, id)
			}
		}
		if len(p.m) >= maxHealthPending {
			return // not judged
		}
	}
	p.m[sb.ID] = pendingTicket{k: k, at: now}
	if k.Probe() && s.bg.Err() == nil {
		s.probeWatches.Add(1)
		go func() {
			defer s.probeWatches.Done()
			s.judgeProbe(r, sb.ID)
		}()
	}
}

// claimPending takes id's pending ticket: whoever takes it judges the create, once.
func (s *Server) claimPending(id string) (health.Ticket, bool) {
	p := &s.healthPending
	p.mu.Lock()
	defer p.mu.Unlock()
	t, ok := p.m[id]
	if ok {
		delete(p.m, id)
	}
	return t.k, ok
}

// pendingOf reports whether id's create still awaits judgement.
func (s *Server) pendingOf(id string) bool {
	p := &s.healthPending
	p.mu.Lock()
	defer p.mu.Unlock()
	_, ok := p.m[id]
	return ok
}

// judgeProbe watches an accepted probe create's sandbox on its runner until it runs
// (success) or ends (judged as sandboxOutcome says), for at most probeJudgeFor; a probe
// still starting then is released without judgement (Ignored: the next create probes).
// It stops early when observeHealth judged the create first, and with the server.
func (s *Server) judgeProbe(r runner.Handle, id string) {
	ctx, cancel := context.WithTimeout(s.bg, s.probeJudgeFor)
	defer cancel()
	ah, await := r.(runner.AwaitHandle)
	for s.pendingOf(id) {
		var (
			sb  runner.Sandbox
			err error
		)
		if await {
			sb, err = ah.AwaitStart(ctx, id, runner.MaxAwaitStart)
		} else {
			sb, err = r.Get(ctx, id)
		}
		if err == nil {
			if o, kind, final := sandboxOutcome(sb); final {
				if k, ok := s.claimPending(id); ok {
					s.health.Report(k, o, kind)
				}
				return
			}
		}
		if !await || err != nil || (sb.State != runner.StateCreating && sb.State != runner.StatePending) {
			t := time.NewTimer(s.probeJudgeEvery)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
			}
		}
		if ctx.Err() != nil {
			if s.bg.Err() == nil { // the bound, not the server's end
				if k, ok := s.claimPending(id); ok {
					s.health.Report(k, health.Ignored, "")
				}
			}
			return
		}
	}
}

// observeHealth judges a pending create from its sandbox's state as the gateway sees it.
func (s *Server) observeHealth(rec *record, sb runner.Sandbox) {
	p := &s.healthPending
	p.mu.Lock()
	t, ok := p.m[rec.id]
	if !ok {
		p.mu.Unlock()
		return
	}
	o, kind, final := sandboxOutcome(sb)
	if final {
		delete(p.m, rec.id)
	}
	p.mu.Unlock()
	if final {
		s.health.Report(t.k, o, kind)
	}
}

// createOutcome classifies the error of a request placing a sandbox on a runner (a
// create, a fork, a move's import): the runner gone (RUNNER_UNAVAILABLE,
// BACKEND_UNAVAILABLE, a transport UNAVAILABLE), not answering within the attempt's own
// bound (ctx's cause errCreateTimedOut: runnerCreate) or timed out while ctx still
// waited (DEADLINE_EXCEEDED), or failing internally (INTERNAL, UNKNOWN, DATA_LOSS)
// counts; a refusal (policy, room), the caller's input or a cancelled ctx (the caller's,
// or the server's end) does not. ctx is the request's context.
func createOutcome(ctx context.Context, err error) (health.Outcome, string) {
	if err == nil {
		return health.Ignored, ""
	}
	if errors.Is(context.Cause(ctx), errCreateTimedOut) {
		return health.Failure, strings.ToUpper(connect.CodeDeadlineExceeded.String())
	}
	if ctx.Err() != nil {
		return health.Ignored, ""
	}
	reason := apierr.Reason(err)
	switch reason {
	case apierr.RunnerUnavailable, apierr.BackendUnavailable:
		return health.Failure, reason
	}
	code := connect.CodeOf(err)
	// A bare UNAVAILABLE (no reason) is the transport's: the runner did not answer. A
	// runner's own refusals carry a reason.
	if rejectedByRunner(err) && (reason != "" || code != connect.CodeUnavailable) {
		return health.Ignored, ""
	}
	switch code {
	case connect.CodeUnavailable, connect.CodeDeadlineExceeded, connect.CodeInternal, connect.CodeUnknown, connect.CodeDataLoss:
		if apierr.Known(reason) {
			return health.Failure, reason
		}
		return health.Failure, strings.ToUpper(code.String())
	}
	return health.Ignored, ""
}

// sandboxOutcome judges an accepted create by its sandbox's state: final once it ran
// (success) or ended. A FAILED sandbox counts against its runner only when the runner
// itself failed it (BackendError). A StartError comes from the agent inside the sandbox
// (a missing working directory or user, a command not found, an exec format error) and
// an image pull failure from the caller's image or registry (a registry outage is not
// the runner's health): neither counts, so tenants cannot quarantine a shared runner with
// bad specs or an unreachable registry of their own.
func sandboxOutcome(sb runner.Sandbox) (o health.Outcome, kind string, final bool) {
	switch {
	case sb.State == runner.StateRunning || !sb.StartedAt.IsZero():
		return health.Success, "", true
	case sb.State == runner.StateFailed:
		if sb.Reason == runner.ReasonBackendError {
			return health.Failure, sb.Reason, true
		}
		return health.Ignored, "", true
	case sb.State.Terminal() || sb.State == runner.StateTerminating:
		return health.Ignored, "", true
	}
	return health.Ignored, "", false
}
