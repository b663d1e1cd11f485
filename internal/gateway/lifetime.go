package gateway

import (
	"context"
	"fmt"
	"time"

	"connectrpc.com/connect"

	statev1 "github.com/sandboxd/sandboxd/gen/sandboxd/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/policy"
	"github.com/sandboxd/sandboxd/internal/runner"
)

// UpdateSandboxLifetime implements sandboxd.sandbox.v1.SandboxStateService: it sets the
// caller's running sandbox's lifetime (counted from its creation) on its runner, within
// (0, the runner policy's constraints.lifetime.max_seconds, 30 days]. A new deadline
// already past stops the sandbox as its expiry does (COMPLETED, LifetimeExceeded).
func (s *Server) UpdateSandboxLifetime(ctx context.Context, req *connect.Request[statev1.UpdateSandboxLifetimeRequest]) (*connect.Response[statev1.UpdateSandboxLifetimeResponse], error) {
	m := req.Msg
	if m.GetChange() == nil {
		return nil, apierr.Invalid(apierr.InvalidRequest, "exactly one of max_lifetime_seconds or extend_by_seconds is required",
			[]apierr.Violation{{Field: "max_lifetime_seconds", Description: "exactly one of max_lifetime_seconds or extend_by_seconds is required"}})
	}
	rec, r, err := s.lookup(ctx, m.GetSandboxId())
	if err != nil {
		return nil, err
	}
	lh, ok := r.(runner.LifetimeHandle)
	if !ok {
		return nil, apierr.Newf(apierr.NotImplemented, "runner %s cannot change a sandbox's lifetime", r.ID())
	}
	sb := s.current(ctx, rec, r)
	if sb.State.Terminal() || sb.State == runner.StateTerminating {
		return nil, apierr.New(apierr.SandboxNotRunning, fmt.Sprintf("sandbox %s is %s: its lifetime cannot change", rec.id, sb.State), map[string]string{"sandbox_id": rec.id})
	}
	maxSec := int64(policy.MaxLifetimeSeconds)
	limit := "the platform maximum (30 days)"
	if pmax := s.policyMaxLifetime(ctx, r.ID()); pmax > 0 && pmax < maxSec {
		maxSec, limit = pmax, "this runner's policy maximum (constraints.lifetime.max_seconds)"
	}
	field := "max_lifetime_seconds"
	var lifetime time.Duration
	switch c := m.GetChange().(type) {
	case *statev1.UpdateSandboxLifetimeRequest_MaxLifetimeSeconds:
		if c.MaxLifetimeSeconds <= 0 || c.MaxLifetimeSeconds > maxSec {
			return nil, lifetimeViolation(field, "max_lifetime_seconds %d is not within 1..%d, %s", c.MaxLifetimeSeconds, maxSec, limit)
		}
		lifetime = time.Duration(c.MaxLifetimeSeconds) * time.Second
	case *statev1.UpdateSandboxLifetimeRequest_ExtendBySeconds:
		field = "extend_by_seconds"
		// Bounded before the arithmetic: no overflow whatever the caller sends.
		cur := sb.Lifetime
		if c.ExtendBySeconds > maxSec || c.ExtendBySeconds < -maxSec {
			return nil, lifetimeViolation(field, "extend_by_seconds %d would make the lifetime leave 1..%d seconds, %s", c.ExtendBySeconds, maxSec, limit)
		}
		lifetime = cur + time.Duration(c.ExtendBySeconds)*time.Second
		if lifetime <= 0 || lifetime > time.Duration(maxSec)*time.Second {
			return nil, lifetimeViolation(field, "extend_by_seconds %d makes the lifetime %s (now %s), not within 1..%d seconds, %s",
				c.ExtendBySeconds, lifetime, cur, maxSec, limit)
		}
	}
	got, err := lh.UpdateLifetime(ctx, rec.id, lifetime)
	if err != nil {
		return nil, runner.APIError(rec.id, err, "")
	}
	s.index.setLast(ctx, rec, got)
	return connect.NewResponse(&statev1.UpdateSandboxLifetimeResponse{
		Deadline:           ts(got.Deadline),
		MaxLifetimeSeconds: int64(got.Lifetime / time.Second),
	}), nil
}

func lifetimeViolation(field, format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	return apierr.Invalid(apierr.InvalidRequest, msg, []apierr.Violation{{Field: field, Description: msg}})
}

// policyMaxLifetime is runner id's policy's constraints.lifetime.max_seconds as last read
// (0: none).
func (s *Server) policyMaxLifetime(ctx context.Context, id string) int64 {
	for i, r := range s.runners {
		if r.ID() != id {
			continue
		}
		w := s.views.runner(ctx, i)
		if w.policy != nil && w.policy.Constraints.Lifetime != nil {
			return int64(w.policy.Constraints.Lifetime.MaxSeconds)
		}
		return 0
	}
	return 0
}
