// Package rollout moves managed runners to their release channel's version by themselves
// (issue 18 point 3): inside each runner's maintenance windows, at most Batch runners of a
// runner group at a time, each step gated on the runner's heartbeats reporting the new
// version and ready within a deadline. A step that misses its deadline, or whose runner
// reports that it refused or rolled back from the version (a single-host runner updating
// itself: HeartbeatRequest.self_update_failed_version, ended at the next tick with the
// runner's reason instead of at the deadline), sends the runner back to the version it ran
// and halts the channel's rollout of that version to the runner's organization until the
// channel's target changes or an admin resumes it. A halt is per organization: a runner is
// its tenant's to run (and to break, or to report failures from at will), so it must not
// stop, or speak to, any other tenant's rollout.
//
// The controller keeps no state of its own: every decision is read from and written to the
// store (the runners' desired_version and last update step, the channels' halts), so it
// survives restarts and moves between control-plane replicas. Replicas sharing a store
// take turns by a lease in the store (only the holder ticks), and every runner write is
// conditional on the etag read in the same tick, so a write racing an admin's (or a
// replica's whose lease just expired) loses instead of overwriting it.
package rollout

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"slices"
	"time"

	"github.com/sandboxd/sandboxd/internal/maintenance"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/textclip"
)

// Defaults and bounds of Config.
const (
	DefaultTick     = 10 * time.Second
	DefaultBatch    = 1
	DefaultDeadline = 10 * time.Minute

	MinTick     = 10 * time.Millisecond
	MaxTick     = time.Hour
	MaxBatch    = 1000
	MinDeadline = 10 * time.Millisecond
	MaxDeadline = 24 * time.Hour
)

// LeaseName is the store lease the controller ticks under.
const LeaseName = "rollout"

// Store is what the controller reads and writes; FromStore adapts a store.Store.
type Store interface {
	// Runners is every runner of every organization.
	Runners(ctx context.Context) ([]store.Runner, error)
	// UpdateRunner writes u if etag is the runner's current one (store.ErrConflict otherwise).
	UpdateRunner(ctx context.Context, org, runnerID, etag string, u store.RunnerUpdate) (store.Runner, error)
	// Halts is every organization's halts.
	Halts(ctx context.Context) ([]store.RolloutHalt, error)
	Halt(ctx context.Context, h store.RolloutHalt) error
	// Resume lifts org's halt of channel.
	Resume(ctx context.Context, org, channel string) (int, error)
	AcquireLease(ctx context.Context, name, holder string, now time.Time, ttl time.Duration) (bool, error)
}

type storeAdapter struct{ st store.Store }

// FromStore is st as the controller's Store.
func FromStore(st store.Store) Store { return storeAdapter{st} }

func (a storeAdapter) Runners(ctx context.Context) ([]store.Runner, error) {
	return a.st.Rollouts().Runners(ctx)
}

func (a storeAdapter) UpdateRunner(ctx context.Context, org, id, etag string, u store.RunnerUpdate) (store.Runner, error) {
	return a.st.Runners().Update(ctx, org, id, etag, u)
}

func (a storeAdapter) Halts(ctx context.Context) ([]store.RolloutHalt, error) {
	return a.st.Rollouts().Halts(ctx, "")
}

func (a storeAdapter) Halt(ctx context.Context, h store.RolloutHalt) error {
	return a.st.Rollouts().Halt(ctx, h)
}

func (a storeAdapter) Resume(ctx context.Context, org, channel string) (int, error) {
	return a.st.Rollouts().Resume(ctx, org, channel)
}

func (a storeAdapter) AcquireLease(ctx context.Context, name, holder string, now time.Time, ttl time.Duration) (bool, error) {
	return a.st.Rollouts().AcquireLease(ctx, name, holder, now, ttl)
}

// Config configures a Controller. Zero values take the defaults.
type Config struct {
	Store Store
	// Targets returns the version each release channel offers (store.ChannelStable,
	// store.ChannelRapid; "" or absent: none).
	Targets func(ctx context.Context) (map[string]string, error)
	// Tick is how often the controller runs; DefaultTick.
	Tick time.Duration
	// Batch is how many runners of one runner group may be updating at once; DefaultBatch.
	Batch int
	// Deadline is how long a runner has to report the new version and ready; DefaultDeadline.
	Deadline time.Duration
	// HeartbeatInterval: a runner is connected while its last heartbeat is within three.
	HeartbeatInterval time.Duration
	// Holder names this controller in the lease; default host name and a random suffix.
	Holder string
	// Now is the clock; default time.Now.
	Now func() time.Time
	// Started, when set, is called with each runner (as written) whose step the controller
	// started: the control plane re-applies an installed runner's objects then
	// (controlplane.Service.UpdateStarted). Its error fails the tick (logged); the step
	// stands.
	Started func(ctx context.Context, r store.Runner) error
	// Starting, when set, is called with each runner (as read) before the controller writes
	// its step (controlplane.Service.UpdateStarting: an installed runner's install record
	// goes INSTALLING first, so that no heartbeat hands it the version before its objects
	// are re-applied). Its error skips the runner this tick (and fails the tick); undo is
	// called when the step is then not written.
	Starting func(ctx context.Context, r store.Runner) (undo func(), err error)
	Logger   *slog.Logger
}

// Validate checks the configurable values (zero means the default) and says what is
// wrong with each, in the flag names' terms.
func (c Config) Validate() error {
	var errs []error
	if c.Tick != 0 && (c.Tick < MinTick || c.Tick > MaxTick) {
		errs = append(errs, fmt.Errorf("rollout tick must be between %s and %s (got %s)", MinTick, MaxTick, c.Tick))
	}
	if c.Batch < 0 || c.Batch > MaxBatch {
		errs = append(errs, fmt.Errorf("rollout batch must be between 1 and %d (got %d)", MaxBatch, c.Batch))
	}
	if c.Deadline != 0 && (c.Deadline < MinDeadline || c.Deadline > MaxDeadline) {
		errs = append(errs, fmt.Errorf("rollout deadline must be between %s and %s (got %s)", MinDeadline, MaxDeadline, c.Deadline))
	}
	if c.HeartbeatInterval < 0 {
		errs = append(errs, fmt.Errorf("heartbeat interval must not be negative (got %s)", c.HeartbeatInterval))
	}
	return errors.Join(errs...)
}

// Controller runs the automatic rollout.
type Controller struct {
	cfg Config
	log *slog.Logger
}

// New returns a Controller; Store and Targets are required.
func New(cfg Config) (*Controller, error) {
	if cfg.Store == nil || cfg.Targets == nil {
		return nil, errors.New("rollout: Store and Targets are required")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Tick == 0 {
		cfg.Tick = DefaultTick
	}
	if cfg.Batch == 0 {
		cfg.Batch = DefaultBatch
	}
	if cfg.Deadline == 0 {
		cfg.Deadline = DefaultDeadline
	}
	if cfg.HeartbeatInterval == 0 {
		cfg.HeartbeatInterval = 5 * time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Holder == "" {
		host, _ := os.Hostname()
		b := make([]byte, 6)
		_, _ = rand.Read(b)
		cfg.Holder = host + "-" + hex.EncodeToString(b)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	return &Controller{cfg: cfg, log: log.With("component", "rollout")}, nil
}

// Run ticks until ctx ends. A failed tick is logged and retried at the next one.
func (c *Controller) Run(ctx context.Context) {
	t := time.NewTicker(c.cfg.Tick)
	defer t.Stop()
	for {
		if err := c.Tick(ctx); err != nil && ctx.Err() == nil {
			c.log.Warn("rollout tick failed", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// leaseTTL: long enough that a holder renewing every tick keeps it through a slow tick,
// short enough that another replica takes over soon after the holder dies.
func (c *Controller) leaseTTL() time.Duration { return max(3*c.cfg.Tick, 30*time.Second) }

// Attempt is a new update step of a runner running from to version to, started at now,
// whose health gate gives up after deadline. ApplyAvailableUpdate records the same.
func Attempt(from, to string, now time.Time, deadline time.Duration) store.UpdateAttempt {
	return store.UpdateAttempt{From: from, To: to, State: store.UpdateInProgress, StartedAt: now.UTC(), Deadline: now.UTC().Add(deadline)}
}

func (c *Controller) connected(r store.Runner, now time.Time) bool {
	hb := r.Status.LastHeartbeatAt
	return hb != nil && now.Sub(*hb) <= 3*c.cfg.HeartbeatInterval
}

// Tick runs one round: it ends the steps whose runners passed their health gate or
// missed their deadline, clears desired versions that were reached, and starts the next
// runners. Without the lease it does nothing.
func (c *Controller) Tick(ctx context.Context) error {
	now := c.cfg.Now().UTC()
	ok, err := c.cfg.Store.AcquireLease(ctx, LeaseName, c.cfg.Holder, now, c.leaseTTL())
	if err != nil || !ok {
		return err
	}
	targets, err := c.cfg.Targets(ctx)
	if err != nil {
		return fmt.Errorf("channel targets: %w", err)
	}
	runners, err := c.cfg.Store.Runners(ctx)
	if err != nil {
		return fmt.Errorf("runners: %w", err)
	}
	inFlight := map[string]int{} // by organization and runner group
	busy := map[string]bool{}    // by organization and runner_id
	var errs []error
	for _, r := range runners {
		flying, err := c.gate(ctx, r, now, targets)
		if err != nil {
			errs = append(errs, err)
		}
		if flying {
			inFlight[groupKey(r)]++
			busy[runnerKey(r)] = true
		}
	}
	// Read after the gates: a halt this round stops its channel (for its organization)
	// this round too.
	halts, err := c.activeHalts(ctx, targets)
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	for _, ch := range slices.Sorted(maps.Keys(targets)) {
		t := targets[ch]
		if t == "" {
			continue
		}
		for _, r := range runners {
			if _, halted := halts[haltKey(r.Org, ch)]; halted {
				continue
			}
			if r.ReleaseChannel != ch || busy[runnerKey(r)] || !c.candidate(r, t, now) {
				continue
			}
			if inFlight[groupKey(r)] >= c.cfg.Batch {
				continue
			}
			if !allowed(r, now) {
				continue
			}
			att := Attempt(r.Status.Version, t, now, c.cfg.Deadline)
			undo := func() {}
			if c.cfg.Starting != nil {
				u, err := c.cfg.Starting(ctx, r)
				if err != nil {
					errs = append(errs, fmt.Errorf("runner %s/%s update starting: %w", r.Org, r.RunnerID, err))
					continue
				}
				undo = u
			}
			started, err := c.cfg.Store.UpdateRunner(ctx, r.Org, r.RunnerID, r.Etag, store.RunnerUpdate{DesiredVersion: &t, LastUpdate: &att})
			if err != nil {
				undo()
			}
			if errors.Is(err, store.ErrConflict) || errors.Is(err, store.ErrNotFound) {
				continue // changed since read (an admin, another replica): the next tick sees it
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("start runner %s/%s: %w", r.Org, r.RunnerID, err))
				continue
			}
			inFlight[groupKey(r)]++
			c.log.Info("runner update started", "org", r.Org, "runner", r.RunnerID, "channel", ch, "from", att.From, "to", t,
				"deadline", att.Deadline)
			if c.cfg.Started != nil {
				if err := c.cfg.Started(ctx, started); err != nil {
					errs = append(errs, fmt.Errorf("runner %s/%s update started: %w", r.Org, r.RunnerID, err))
				}
			}
		}
	}
	return errors.Join(errs...)
}

// activeHalts are the halts of the channels' current targets, by haltKey; halts of a
// version the channel no longer offers ended when its target changed, and are dropped.
func (c *Controller) activeHalts(ctx context.Context, targets map[string]string) (map[string]store.RolloutHalt, error) {
	hs, err := c.cfg.Store.Halts(ctx)
	if err != nil {
		return nil, fmt.Errorf("rollout halts: %w", err)
	}
	out := map[string]store.RolloutHalt{}
	for _, h := range hs {
		if targets[h.Channel] == h.Version {
			out[haltKey(h.Org, h.Channel)] = h
			continue
		}
		if _, err := c.cfg.Store.Resume(ctx, h.Org, h.Channel); err != nil {
			return nil, fmt.Errorf("end halt of %s for %s: %w", h.Channel, h.Org, err)
		}
		c.log.Info("rollout halt ended: the channel's target changed", "org", h.Org, "channel", h.Channel, "halted", h.Version,
			"target", targets[h.Channel])
	}
	return out, nil
}

// candidate: r can move itself, is connected, runs a known version other than target
// and has no step in flight. A runner that passed its gate on target within the last
// Deadline is not started again: while a Deployment rolls, the old pod may still heartbeat
// its old version until it terminates.
func (c *Controller) candidate(r store.Runner, target string, now time.Time) bool {
	if !r.Status.SelfUpdate || !c.connected(r, now) || r.Status.Version == "" || r.Status.Version == target {
		return false
	}
	lu := r.LastUpdate
	switch {
	case lu == nil:
		return true
	case lu.State == store.UpdateInProgress:
		return false
	case lu.State == store.UpdateSucceeded && lu.To == target && lu.EndedAt != nil && now.Before(lu.EndedAt.Add(c.cfg.Deadline)):
		return false
	}
	return true
}

// allowed: now is inside r's maintenance policy (none: any time). A policy that does not
// decode allows nothing: better a runner that is not updated than one updated at a time
// its admin excluded.
func allowed(r store.Runner, now time.Time) bool {
	if r.MaintenancePolicy == nil {
		return true
	}
	var p maintenance.Policy
	if err := json.Unmarshal(r.MaintenancePolicy, &p); err != nil {
		return false
	}
	ok, _ := maintenance.Allowed(p, now)
	return ok
}

// gate ends r's step in flight when it passed or missed its health gate, and clears a
// desired version r reached outside a step (a rollback's). It reports whether r still has
// a step in flight.
func (c *Controller) gate(ctx context.Context, r store.Runner, now time.Time, targets map[string]string) (bool, error) {
	healthyOn := func(v string) bool {
		return c.connected(r, now) && r.Status.Ready && r.Status.Version == v
	}
	lu := r.LastUpdate
	if lu == nil || lu.State != store.UpdateInProgress {
		if r.DesiredVersion != "" && healthyOn(r.DesiredVersion) {
			clear := ""
			_, err := c.cfg.Store.UpdateRunner(ctx, r.Org, r.RunnerID, r.Etag, store.RunnerUpdate{DesiredVersion: &clear})
			if err != nil && !errors.Is(err, store.ErrConflict) && !errors.Is(err, store.ErrNotFound) {
				return false, fmt.Errorf("clear desired version of %s/%s: %w", r.Org, r.RunnerID, err)
			}
		}
		return false, nil
	}
	end := now
	done := *lu
	done.EndedAt = &end
	switch {
	case healthyOn(lu.To):
		done.State = store.UpdateSucceeded
		clear := ""
		if _, err := c.cfg.Store.UpdateRunner(ctx, r.Org, r.RunnerID, r.Etag, store.RunnerUpdate{DesiredVersion: &clear, LastUpdate: &done}); err != nil {
			if errors.Is(err, store.ErrConflict) || errors.Is(err, store.ErrNotFound) {
				return true, nil
			}
			return true, fmt.Errorf("end update of %s/%s: %w", r.Org, r.RunnerID, err)
		}
		c.log.Info("runner update succeeded", "org", r.Org, "runner", r.RunnerID, "from", lu.From, "to", lu.To)
		return false, nil
	case lu.To != "" && r.Status.SelfUpdateFailedVersion == lu.To:
		// The runner says it refused or rolled back from the step's version (a single-host
		// runner updating itself): no need to wait for the deadline, and its reason beats
		// ours. A failure of To reported before this step is as good: a runner does not
		// try again a version it failed while it is asked for it.
		done.State = store.UpdateRolledBack
		why := orUnknown(r.Status.SelfUpdateFailure)
		done.Reason = textclip.Clip("runner reports: "+why, MaxReason)
		return c.rollBack(ctx, r, lu, done, textclip.Clip("reports: "+why, MaxReason), now, targets)
	case !now.Before(lu.Deadline):
		done.State = store.UpdateRolledBack
		done.Reason = failReason(r, lu, c.connected(r, now))
		return c.rollBack(ctx, r, lu, done, done.Reason, now, targets)
	}
	return true, nil
}

// rollBack ends r's step lu as done (rolled back with a reason): desired_version goes back
// to the version r ran, and the channel's rollout of lu.To to r's organization halts when
// the version is at fault, because "runner <org>/<id> <why>". Only r's organization: its
// runner's word (or silence) says nothing a tenant can trust about another tenant's. It reports whether r still has a step in
// flight (only when the write lost).
func (c *Controller) rollBack(ctx context.Context, r store.Runner, lu *store.UpdateAttempt, done store.UpdateAttempt, why string,
	now time.Time, targets map[string]string) (bool, error) {
	back := lu.From
	if _, err := c.cfg.Store.UpdateRunner(ctx, r.Org, r.RunnerID, r.Etag, store.RunnerUpdate{DesiredVersion: &back, LastUpdate: &done}); err != nil {
		if errors.Is(err, store.ErrConflict) || errors.Is(err, store.ErrNotFound) {
			return true, nil
		}
		return true, fmt.Errorf("roll back %s/%s: %w", r.Org, r.RunnerID, err)
	}
	c.log.Warn("runner update failed: rolled back", "org", r.Org, "runner", r.RunnerID, "from", lu.From, "to", lu.To, "reason", done.Reason)
	if targets[r.ReleaseChannel] != lu.To || !r.Status.SelfUpdate {
		// The channel moved on already, or the runner could not move itself (an
		// ApplyAvailableUpdate on a runner updated by hand): the version is not at fault.
		return false, nil
	}
	h := store.RolloutHalt{Channel: r.ReleaseChannel, Version: lu.To, Org: r.Org, RunnerID: r.RunnerID, HaltedAt: now,
		Reason: fmt.Sprintf("runner %s/%s %s; rolled back to %s", r.Org, r.RunnerID, why, orNone(lu.From))}
	if err := c.cfg.Store.Halt(ctx, h); err != nil {
		return false, fmt.Errorf("halt %s: %w", r.ReleaseChannel, err)
	}
	c.log.Warn("rollout halted", "org", h.Org, "channel", h.Channel, "version", h.Version, "reason", h.Reason)
	return false, nil
}

// MaxReason bounds, in bytes, a step's failure reason and the halt's part of it that comes
// from a runner: what a runner reports is at most as long, the prefix makes it longer.
const MaxReason = store.MaxSelfUpdateFailureLen

func orUnknown(s string) string {
	if s == "" {
		return "no reason given"
	}
	return s
}

// failReason says how the runner missed its health gate.
func failReason(r store.Runner, lu *store.UpdateAttempt, connected bool) string {
	s := fmt.Sprintf("did not report ready on %s within %s", lu.To, lu.Deadline.Sub(lu.StartedAt))
	switch {
	case !connected:
		return s + " (not connected)"
	case r.Status.Version != lu.To:
		return s + fmt.Sprintf(" (reports %s)", orNone(r.Status.Version))
	}
	return s + " (reports it, not ready)"
}

func orNone(v string) string {
	if v == "" {
		return "no version"
	}
	return v
}

func haltKey(org, channel string) string { return org + "\x00" + channel }
func groupKey(r store.Runner) string     { return r.Org + "\x00" + r.RunnerGroupID }
func runnerKey(r store.Runner) string    { return r.Org + "\x00" + r.RunnerID }
