package store

import (
	"context"
	"fmt"
	"time"
)

// ---- automatic rollout ----

type rollouts struct{ s *sqlStore }

func (s *sqlStore) Rollouts() Rollouts { return rollouts{s} }

func nonZero(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// checkAttempt validates an update step to store.
func checkAttempt(a UpdateAttempt) error {
	switch a.State {
	case UpdateInProgress, UpdateSucceeded, UpdateRolledBack:
	default:
		return invalid("update state %q: want IN_PROGRESS, SUCCEEDED or ROLLED_BACK", a.State)
	}
	if a.To == "" || a.StartedAt.IsZero() {
		return invalid("an update step needs to_version and start time")
	}
	return nil
}

func (ro rollouts) Runners(ctx context.Context) ([]Runner, error) {
	rs, err := ro.s.d.query(ctx, `SELECT `+runnerCols+` FROM runners ORDER BY org_id, runner_id`)
	if err != nil {
		return nil, fmt.Errorf("list all runners: %w", err)
	}
	defer rs.Close()
	var out []Runner
	for rs.Next() {
		r, err := scanRunner(rs)
		if err != nil {
			return nil, fmt.Errorf("list all runners: %w", err)
		}
		out = append(out, r)
	}
	return out, rs.Err()
}

func (ro rollouts) Halts(ctx context.Context, org string) ([]RolloutHalt, error) {
	q := `SELECT channel, version, reason, org_id, runner_id, halted_at FROM rollout_halts`
	var args []any
	if org != "" {
		q += ` WHERE org_id = $1`
		args = append(args, org)
	}
	rs, err := ro.s.d.query(ctx, q+` ORDER BY org_id, channel`, args...)
	if err != nil {
		return nil, fmt.Errorf("list rollout halts: %w", err)
	}
	defer rs.Close()
	var out []RolloutHalt
	for rs.Next() {
		var h RolloutHalt
		var at dbTime
		if err := rs.Scan(&h.Channel, &h.Version, &h.Reason, &h.Org, &h.RunnerID, &at); err != nil {
			return nil, fmt.Errorf("list rollout halts: %w", err)
		}
		h.HaltedAt = at.t
		out = append(out, h)
	}
	return out, rs.Err()
}

func (ro rollouts) Halt(ctx context.Context, h RolloutHalt) error {
	if err := checkChannel(h.Channel); err != nil {
		return err
	}
	if err := required("org", h.Org, "version", h.Version, "reason", h.Reason); err != nil {
		return err
	}
	if h.HaltedAt.IsZero() {
		h.HaltedAt = now()
	}
	_, err := ro.s.d.exec(ctx, `INSERT INTO rollout_halts (channel, version, reason, org_id, runner_id, halted_at)
		VALUES ($1, $2, $3, $4, $5, $6)
		ON CONFLICT (org_id, channel) DO UPDATE SET version = excluded.version, reason = excluded.reason,
			runner_id = excluded.runner_id, halted_at = excluded.halted_at
		WHERE rollout_halts.version <> excluded.version`,
		h.Channel, h.Version, h.Reason, h.Org, h.RunnerID, utc(h.HaltedAt))
	if err != nil {
		return fmt.Errorf("halt rollout: %w", err)
	}
	return nil
}

func (ro rollouts) Resume(ctx context.Context, org, channel string) (int, error) {
	if err := checkChannel(channel); err != nil {
		return 0, err
	}
	q, args := `DELETE FROM rollout_halts WHERE channel = $1`, []any{channel}
	if org != "" {
		q += ` AND org_id = $2`
		args = append(args, org)
	}
	n, err := ro.s.d.exec(ctx, q, args...)
	if err != nil {
		return 0, fmt.Errorf("resume rollout: %w", err)
	}
	return int(n), nil
}

func (ro rollouts) AcquireLease(ctx context.Context, name, holder string, at time.Time, ttl time.Duration) (bool, error) {
	if err := required("name", name, "holder", holder); err != nil {
		return false, err
	}
	if ttl <= 0 {
		return false, invalid("lease ttl must be positive")
	}
	at = utc(at)
	// One statement: insert, or take over when the holder is us or the lease expired.
	n, err := ro.s.d.exec(ctx, `INSERT INTO leases (name, holder, expires_at) VALUES ($1, $2, $3)
		ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at
		WHERE leases.holder = excluded.holder OR leases.expires_at <= $4`,
		name, holder, at.Add(ttl), at)
	if err != nil {
		return false, fmt.Errorf("acquire lease %s: %w", name, err)
	}
	return n == 1, nil
}
