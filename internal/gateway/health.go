package gateway

import (
	"context"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/health"
	"github.com/sandboxd/sandboxd/internal/metrics"
	"github.com/sandboxd/sandboxd/internal/placement"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// Runner health (internal/health, docs/observability.md): every create this gateway
// places is judged once its outcome is known, and runners whose creates keep failing are
// placed last, then not at all for a cooldown. A create's RPC answer judges it when it
// fails (the runner unreachable, timed out, an internal error); an accepted create is
// judged when the gateway next sees the sandbox (index.setLast): RUNNING heals, FAILED
// for a runner-side reason (BackendError, a StartError that is no invalid spec, an image
// pull the registry did not answer) counts. The caller's own mistakes (policy, spec,
// quota, an image not found or unauthorized, the workload's command failing) never
// count.

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
			runners[i].Quarantined = v.Reason
		}
	}
	return runners
}

// placementRunners is the runners' placement view for the caller's organization.
func (s *Server) placementRunners(ctx context.Context) []placement.Runner {
	return s.withHealth(s.views.snapshot(ctx), principal(ctx).Org)
}

// createFailed judges a create whose RPC failed.
func (s *Server) createFailed(ctx context.Context, k health.Ticket, err error) {
	o, kind := createOutcome(ctx, err)
	s.health.Report(k, o, kind)
}

// createAccepted judges an accepted create now when its sandbox already ran or failed,
// else when the gateway next sees it (observeHealth).
func (s *Server) createAccepted(k health.Ticket, sb runner.Sandbox) {
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
	if len(p.m) >= maxHealthPending {
		cutoff := now.Add(-s.health.Config().ProbeTimeout)
		for id, t := range p.m {
			if t.at.Before(cutoff) {
				delete(p.m, id)
			}
		}
		if len(p.m) >= maxHealthPending {
			return // not judged; a probe's slot times out
		}
	}
	p.m[sb.ID] = pendingTicket{k: k, at: now}
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

// createOutcome classifies a create's RPC error: the runner gone, timed out or failing
// internally counts; a refusal (policy, room) or the caller's input does not.
func createOutcome(ctx context.Context, err error) (health.Outcome, string) {
	if err == nil || ctx.Err() != nil {
		return health.Ignored, ""
	}
	reason := apierr.Reason(err)
	switch reason {
	case apierr.RunnerUnavailable, apierr.BackendUnavailable:
		return health.Failure, reason
	}
	if rejectedByRunner(err) {
		return health.Ignored, ""
	}
	switch code := connect.CodeOf(err); code {
	case connect.CodeUnavailable, connect.CodeDeadlineExceeded, connect.CodeInternal, connect.CodeUnknown, connect.CodeDataLoss:
		if apierr.Known(reason) {
			return health.Failure, reason
		}
		return health.Failure, strings.ToUpper(code.String())
	}
	return health.Ignored, ""
}

// sandboxOutcome judges an accepted create by its sandbox's state: final once it ran
// (success) or ended. A FAILED sandbox counts against its runner only for a runner-side
// reason.
func sandboxOutcome(sb runner.Sandbox) (o health.Outcome, kind string, final bool) {
	switch {
	case sb.State == runner.StateRunning || !sb.StartedAt.IsZero():
		return health.Success, "", true
	case sb.State == runner.StateFailed:
		switch sb.Reason {
		case runner.ReasonBackendError:
			return health.Failure, sb.Reason, true
		case runner.ReasonStartError:
			for _, callers := range []error{runtime.ErrInvalidSpec, runtime.ErrUnknownRuntime, runtime.ErrEngineUnsupported, runtime.ErrInvalidImageRef} {
				if strings.Contains(sb.Message, callers.Error()) {
					return health.Ignored, "", true
				}
			}
			return health.Failure, sb.Reason, true
		case runner.ReasonImagePullFailed:
			// Not found, unauthorized and invalid references are the caller's; a registry
			// that does not answer may be this runner's network.
			if strings.Contains(sb.Message, runtime.ErrRegistry.Error()) {
				return health.Failure, sb.Reason + " (registry unreachable)", true
			}
		}
		return health.Ignored, "", true
	case sb.State.Terminal() || sb.State == runner.StateTerminating:
		return health.Ignored, "", true
	}
	return health.Ignored, "", false
}
