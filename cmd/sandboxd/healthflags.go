package main

import (
	"context"
	"errors"
	"flag"
	"fmt"

	"github.com/sandboxd/sandboxd/internal/health"
	"github.com/sandboxd/sandboxd/internal/store"
)

// healthFlags are the runner health thresholds of the processes that place sandboxes
// (gateway, dev): internal/health, docs/observability.md.
type healthFlags struct {
	cfg health.Config
}

func (h *healthFlags) register(fs *flag.FlagSet) {
	fs.IntVar(&h.cfg.DegradedAfter, "runner-degraded-after", health.DefaultDegradedAfter, "consecutive failed creates (runner-side failures only) after which a runner is degraded: placed after healthy runners")
	fs.IntVar(&h.cfg.QuarantineAfter, "runner-quarantine-after", health.DefaultQuarantineAfter, "consecutive failed creates after which a runner is quarantined: not placed for the cooldown, then one probe create is admitted")
	fs.DurationVar(&h.cfg.Cooldown, "runner-quarantine-cooldown", health.DefaultCooldown, "first quarantine's cooldown; doubled at each quarantine until the runner heals")
	fs.DurationVar(&h.cfg.MaxCooldown, "runner-quarantine-max-cooldown", health.DefaultMaxCooldown, "bound of the doubling quarantine cooldown")
	fs.IntVar(&h.cfg.MinOrgs, "runner-health-min-orgs", health.DefaultMinOrgs, "organizations that must each see the failures before a runner is degraded or quarantined for everyone (fewer: only for those organizations)")
	fs.DurationVar(&h.cfg.DecayAfter, "runner-health-decay", health.DefaultDecayAfter, "an organization's failure count on a runner is forgotten once its last counted failure is this old (a degraded runner heals; quarantines end by their probe)")
	fs.DurationVar(&h.cfg.CreateTimeout, "runner-create-timeout", health.DefaultCreateTimeout, "bound of one create request to a runner, apart from the caller's deadline: a runner that has not answered by then failed the create (counted for its health, also when the caller gave up first)")
	fs.BoolVar(&h.cfg.Disabled, "runner-health-disabled", false, "never degrade or quarantine runners")
}

func (h healthFlags) validate() error {
	if err := h.cfg.Validate(); err != nil {
		return fmt.Errorf("runner health flags: %w", err)
	}
	return nil
}

// storeReady is a readiness check: the store answers (the default organization is read).
func storeReady(st store.Store) func(context.Context) error {
	return func(ctx context.Context) error {
		if _, err := st.Orgs().Get(ctx, defaultOrg); err != nil && !errors.Is(err, store.ErrNotFound) {
			return fmt.Errorf("store unreachable: %w", err)
		}
		return nil
	}
}
