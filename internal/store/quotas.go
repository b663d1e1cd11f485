package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// Quotas are the organizations' quotas (issue 23 point 4): the limits an admin set, and
// the reservations of creates in flight that the gateway admits against them.
//
// What counts against an organization: every sandbox of its index that has not ended
// (ended_at unset: CREATING/PENDING, RUNNING, PAUSED, TERMINATING), with the CPU and memory
// its record holds (Sandbox.MilliCPU, Sandbox.MemoryBytes), plus every reservation not yet
// expired. Reserve checks and takes in one transaction that first locks the
// organization's quota_locks row, so gateway replicas sharing one database admit one at
// a time per organization and never past a limit.
type Quotas interface {
	// Get returns org's quota as set (ErrNotFound when none is).
	Get(ctx context.Context, org string) (Quota, error)
	// Put replaces org's quota (UpdatedAt set by the store). ErrInvalid for a limit
	// below -1.
	Put(ctx context.Context, q Quota) (Quota, error)
	// Delete removes org's quota (its limits are the defaults again); ErrNotFound when
	// none is set.
	Delete(ctx context.Context, org string) error
	// Reserve admits r against org's limits (its quota, unset limits from defaults) as
	// of now: it drops org's expired reservations, counts its usage and, when r fits
	// every limit, records r (unless no limit applies: then nothing is recorded and the
	// returned reservation ID is ""). It returns the usage before r; a limit r would
	// pass is *QuotaExceededError (matches ErrQuotaExceeded).
	Reserve(ctx context.Context, r QuotaReservation, defaults QuotaLimits, now time.Time) (id string, used QuotaUsage, err error)
	// Release drops what is left of reservation id of org (nothing when it is gone).
	Release(ctx context.Context, org, id string) error
	// Usage is org's usage as of now (live sandboxes plus reservations not expired).
	Usage(ctx context.Context, org string, now time.Time) (QuotaUsage, error)
}

// Unlimited is a quota limit without a bound.
const Unlimited int64 = -1

// QuotaLimits are an organization's limits. A nil limit is unset (Quota: the default
// applies; effective limits: unlimited); Unlimited (-1) is explicitly unlimited; 0 and
// up is the limit.
type QuotaLimits struct {
	MaxSandboxes   *int64
	MaxMilliCPU    *int64
	MaxMemoryBytes *int64
	// MaxVolumeBytes bounds the sum of the sizes of the organization's registered
	// volumes (Volumes.Create and Volumes.Resize check it).
	MaxVolumeBytes *int64
	// MaxSnapshots and MaxSnapshotBytes bound its file-system snapshots (the gateway
	// checks them; its --fss-max-* flags are the defaults).
	MaxSnapshots     *int64
	MaxSnapshotBytes *int64
}

// limitFields are l's limits by column (Put validates every one).
func (l QuotaLimits) limitFields() map[string]*int64 {
	return map[string]*int64{"max_sandboxes": l.MaxSandboxes, "max_cpu_millis": l.MaxMilliCPU, "max_memory_bytes": l.MaxMemoryBytes,
		"max_volume_bytes": l.MaxVolumeBytes, "max_snapshots": l.MaxSnapshots, "max_snapshot_bytes": l.MaxSnapshotBytes}
}

// Over returns l with every unset limit taken from def.
func (l QuotaLimits) Over(def QuotaLimits) QuotaLimits {
	if l.MaxSandboxes == nil {
		l.MaxSandboxes = def.MaxSandboxes
	}
	if l.MaxMilliCPU == nil {
		l.MaxMilliCPU = def.MaxMilliCPU
	}
	if l.MaxMemoryBytes == nil {
		l.MaxMemoryBytes = def.MaxMemoryBytes
	}
	if l.MaxVolumeBytes == nil {
		l.MaxVolumeBytes = def.MaxVolumeBytes
	}
	if l.MaxSnapshots == nil {
		l.MaxSnapshots = def.MaxSnapshots
	}
	if l.MaxSnapshotBytes == nil {
		l.MaxSnapshotBytes = def.MaxSnapshotBytes
	}
	return l
}

// Bounded reports whether a sandbox limit of l (sandboxes, CPU, memory) bounds anything
// (is set and not Unlimited): only those take reservations.
func (l QuotaLimits) Bounded() bool {
	for _, v := range []*int64{l.MaxSandboxes, l.MaxMilliCPU, l.MaxMemoryBytes} {
		if v != nil && *v >= 0 {
			return true
		}
	}
	return false
}

// Quota is the quota an admin set for an organization.
type Quota struct {
	Org string
	QuotaLimits
	UpdatedAt time.Time // set by the store
	UpdatedBy string    // the admin key that set it
}

// QuotaReservation is what one create in flight holds: Sandboxes sandboxes (a fork of N:
// N) with MilliCPU and MemoryBytes in all, until ExpiresAt.
type QuotaReservation struct {
	ID                    string
	Org                   string
	Sandboxes             int64
	MilliCPU, MemoryBytes int64
	ExpiresAt             time.Time
}

// QuotaUsage is what counts against an organization's quota: its live sandboxes and
// the reservations in flight (included in the totals).
type QuotaUsage struct {
	Sandboxes, MilliCPU, MemoryBytes int64
	// Reserved* are the reservations' part of the totals.
	ReservedSandboxes, ReservedMilliCPU, ReservedMemoryBytes int64
	// Volumes and VolumeBytes: the organization's registered volumes and the sum of their
	// sizes (Volume.SizeBytes).
	Volumes, VolumeBytes int64
}

// Quota names of QuotaExceededError.
const (
	QuotaSandboxes   = "sandboxes"
	QuotaMilliCPU    = "cpu_millicores"
	QuotaMemoryBytes = "memory_bytes"
	QuotaVolumeBytes = "volume_bytes"
)

// ErrQuotaExceeded: an organization's quota has no room for a reservation.
var ErrQuotaExceeded = errors.New("quota exceeded")

// QuotaExceededError says which limit a reservation would pass.
type QuotaExceededError struct {
	Quota   string // QuotaSandboxes, QuotaMilliCPU, QuotaMemoryBytes, QuotaVolumeBytes
	Limit   int64
	Current int64 // usage before the reservation (live and reserved)
	Asked   int64
	Usage   QuotaUsage
}

func (e *QuotaExceededError) Error() string {
	return fmt.Sprintf("quota %s exceeded: limit %d, in use %d, asked %d", e.Quota, e.Limit, e.Current, e.Asked)
}

// Is makes errors.Is(err, ErrQuotaExceeded) hold.
func (e *QuotaExceededError) Is(target error) bool { return target == ErrQuotaExceeded }

type quotas struct{ s *sqlStore }

func (s *sqlStore) Quotas() Quotas { return quotas{s} }

func nullInt(v sql.NullInt64) *int64 {
	if !v.Valid {
		return nil
	}
	x := v.Int64
	return &x
}

func intArg(v *int64) any {
	if v == nil {
		return nil
	}
	return *v
}

func (qs quotas) Get(ctx context.Context, org string) (Quota, error) {
	return getQuota(ctx, qs.s, qs.s.d, org)
}

func getQuota(ctx context.Context, s *sqlStore, q querier, org string) (Quota, error) {
	var out Quota
	var ms, mc, mm, mv, mn, mb sql.NullInt64
	var updated dbTime
	err := q.queryRow(ctx, `SELECT org_id, max_sandboxes, max_cpu_millis, max_memory_bytes, max_volume_bytes, max_snapshots,
		max_snapshot_bytes, updated_at, updated_by
		FROM org_quotas WHERE org_id = $1`, org).Scan(&out.Org, &ms, &mc, &mm, &mv, &mn, &mb, &updated, &out.UpdatedBy)
	if err != nil {
		return Quota{}, s.readErr("quota", err)
	}
	out.MaxSandboxes, out.MaxMilliCPU, out.MaxMemoryBytes = nullInt(ms), nullInt(mc), nullInt(mm)
	out.MaxVolumeBytes, out.MaxSnapshots, out.MaxSnapshotBytes = nullInt(mv), nullInt(mn), nullInt(mb)
	out.UpdatedAt = updated.t
	return out, nil
}

func (qs quotas) Put(ctx context.Context, x Quota) (Quota, error) {
	if err := required("org", x.Org); err != nil {
		return Quota{}, err
	}
	for name, v := range x.limitFields() {
		if v != nil && *v < Unlimited {
			return Quota{}, invalid("%s %d: -1 (unlimited) or more", name, *v)
		}
	}
	x.UpdatedAt = now()
	_, err := qs.s.d.exec(ctx, `INSERT INTO org_quotas (org_id, max_sandboxes, max_cpu_millis, max_memory_bytes, updated_at, updated_by,
			max_volume_bytes, max_snapshots, max_snapshot_bytes)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
		ON CONFLICT (org_id) DO UPDATE SET max_sandboxes = excluded.max_sandboxes, max_cpu_millis = excluded.max_cpu_millis,
			max_memory_bytes = excluded.max_memory_bytes, updated_at = excluded.updated_at, updated_by = excluded.updated_by,
			max_volume_bytes = excluded.max_volume_bytes, max_snapshots = excluded.max_snapshots,
			max_snapshot_bytes = excluded.max_snapshot_bytes`,
		x.Org, intArg(x.MaxSandboxes), intArg(x.MaxMilliCPU), intArg(x.MaxMemoryBytes), x.UpdatedAt, x.UpdatedBy,
		intArg(x.MaxVolumeBytes), intArg(x.MaxSnapshots), intArg(x.MaxSnapshotBytes))
	if err != nil {
		return Quota{}, qs.s.writeErr("quota", "put", err)
	}
	return x, nil
}

func (qs quotas) Delete(ctx context.Context, org string) error {
	n, err := qs.s.d.exec(ctx, `DELETE FROM org_quotas WHERE org_id = $1`, org)
	if err != nil {
		return qs.s.writeErr("quota", "delete", err)
	}
	if n == 0 {
		return fmt.Errorf("quota: %w", ErrNotFound)
	}
	return nil
}

// usageQuery is an organization's usage in ONE statement: under PostgreSQL's READ
// COMMITTED each statement reads one snapshot, so a sandbox recorded (and its
// reservation's share dropped) between two statements could be counted by neither.
const usageQuery = `SELECT
	(SELECT COUNT(*) FROM sandboxes WHERE org_id = $1 AND ended_at IS NULL),
	(SELECT CAST(COALESCE(SUM(cpu_millis), 0) AS BIGINT) FROM sandboxes WHERE org_id = $1 AND ended_at IS NULL),
	(SELECT CAST(COALESCE(SUM(memory_bytes), 0) AS BIGINT) FROM sandboxes WHERE org_id = $1 AND ended_at IS NULL),
	(SELECT CAST(COALESCE(SUM(sandboxes), 0) AS BIGINT) FROM quota_reservations WHERE org_id = $1 AND expires_at > $2),
	(SELECT CAST(COALESCE(SUM(cpu_millis), 0) AS BIGINT) FROM quota_reservations WHERE org_id = $1 AND expires_at > $2),
	(SELECT CAST(COALESCE(SUM(memory_bytes), 0) AS BIGINT) FROM quota_reservations WHERE org_id = $1 AND expires_at > $2),
	(SELECT COUNT(*) FROM volumes WHERE org_id = $1),
	(SELECT CAST(COALESCE(SUM(size_bytes), 0) AS BIGINT) FROM volumes WHERE org_id = $1)`

func readUsage(ctx context.Context, q querier, org string, at time.Time) (QuotaUsage, error) {
	var u QuotaUsage
	var n, c, m, rn, rc, rm int64
	if err := q.queryRow(ctx, usageQuery, org, utc(at)).Scan(&n, &c, &m, &rn, &rc, &rm, &u.Volumes, &u.VolumeBytes); err != nil {
		return QuotaUsage{}, fmt.Errorf("quota usage: %w", err)
	}
	u.ReservedSandboxes, u.ReservedMilliCPU, u.ReservedMemoryBytes = max(rn, 0), max(rc, 0), max(rm, 0)
	u.Sandboxes, u.MilliCPU, u.MemoryBytes = n+u.ReservedSandboxes, c+u.ReservedMilliCPU, m+u.ReservedMemoryBytes
	return u, nil
}

func (qs quotas) Usage(ctx context.Context, org string, at time.Time) (QuotaUsage, error) {
	return readUsage(ctx, qs.s.d, org, at)
}

func (qs quotas) Reserve(ctx context.Context, r QuotaReservation, defaults QuotaLimits, at time.Time) (string, QuotaUsage, error) {
	if err := required("id", r.ID, "org", r.Org); err != nil {
		return "", QuotaUsage{}, err
	}
	if r.Sandboxes < 1 || r.MilliCPU < 0 || r.MemoryBytes < 0 {
		return "", QuotaUsage{}, invalid("reservation of %d sandboxes, %d millicores, %d bytes", r.Sandboxes, r.MilliCPU, r.MemoryBytes)
	}
	at = utc(at)
	var (
		id   string
		used QuotaUsage
	)
	err := qs.s.d.tx(ctx, func(q querier) error {
		set, err := getQuota(ctx, qs.s, q, r.Org)
		if err != nil && !isNotFound(err) {
			return err
		}
		lim := set.QuotaLimits.Over(defaults)
		if !lim.Bounded() {
			return nil // nothing to hold: no lock, no row
		}
		// The organization's lock row, locked until the end of the transaction.
		if err := lockQuota(ctx, q, r.Org); err != nil {
			return err
		}
		if _, err := q.exec(ctx, `DELETE FROM quota_reservations WHERE org_id = $1 AND expires_at <= $2`, r.Org, at); err != nil {
			return fmt.Errorf("drop expired reservations: %w", err)
		}
		if used, err = readUsage(ctx, q, r.Org, at); err != nil {
			return err
		}
		for _, c := range []struct {
			name         string
			limit        *int64
			current, ask int64
		}{
			{QuotaSandboxes, lim.MaxSandboxes, used.Sandboxes, r.Sandboxes},
			{QuotaMilliCPU, lim.MaxMilliCPU, used.MilliCPU, r.MilliCPU},
			{QuotaMemoryBytes, lim.MaxMemoryBytes, used.MemoryBytes, r.MemoryBytes},
		} {
			if c.limit != nil && *c.limit >= 0 && c.current+c.ask > *c.limit {
				return &QuotaExceededError{Quota: c.name, Limit: *c.limit, Current: c.current, Asked: c.ask, Usage: used}
			}
		}
		if _, err := q.exec(ctx, `INSERT INTO quota_reservations (id, org_id, sandboxes, cpu_millis, memory_bytes, created_at, expires_at)
			VALUES ($1, $2, $3, $4, $5, $6, $7)`, r.ID, r.Org, r.Sandboxes, r.MilliCPU, r.MemoryBytes, at, utc(r.ExpiresAt)); err != nil {
			return err
		}
		id = r.ID
		return nil
	})
	if err != nil {
		var qe *QuotaExceededError
		if errors.As(err, &qe) {
			return "", used, err
		}
		return "", QuotaUsage{}, qs.s.writeErr("quota reservation", "create", err)
	}
	return id, used, nil
}

func (qs quotas) Release(ctx context.Context, org, id string) error {
	if id == "" {
		return nil
	}
	if _, err := qs.s.d.exec(ctx, `DELETE FROM quota_reservations WHERE org_id = $1 AND id = $2`, org, id); err != nil {
		return fmt.Errorf("release quota reservation: %w", err)
	}
	return nil
}

// lockQuota takes org's quota lock row until the end of the transaction q is in (SQLite:
// the transaction holds the database's write lock already), so gateway replicas sharing
// one database admit one at a time per organization.
func lockQuota(ctx context.Context, q querier, org string) error {
	if _, err := q.exec(ctx, `INSERT INTO quota_locks (org_id, n) VALUES ($1, 1)
		ON CONFLICT (org_id) DO UPDATE SET n = quota_locks.n + 1`, org); err != nil {
		return fmt.Errorf("lock quota: %w", err)
	}
	return nil
}

// checkVolumeBytes admits grow more bytes of org's registered volumes against its
// max_volume_bytes (its quota's, else def's) inside transaction q, which it first locks
// on org: the volumes' rows are their own reservations, so a create or resize committed
// by another replica is counted once this one holds the lock. A limit passed is
// *QuotaExceededError (QuotaVolumeBytes).
func checkVolumeBytes(ctx context.Context, s *sqlStore, q querier, org string, grow int64, def *QuotaLimits) error {
	if def == nil || grow <= 0 {
		return nil
	}
	set, err := getQuota(ctx, s, q, org)
	if err != nil && !isNotFound(err) {
		return err
	}
	lim := set.QuotaLimits.Over(*def).MaxVolumeBytes
	if lim == nil || *lim < 0 {
		return nil
	}
	if err := lockQuota(ctx, q, org); err != nil {
		return err
	}
	var n, used int64
	if err := q.queryRow(ctx, `SELECT COUNT(*), CAST(COALESCE(SUM(size_bytes), 0) AS BIGINT) FROM volumes WHERE org_id = $1`, org).Scan(&n, &used); err != nil {
		return fmt.Errorf("volume usage: %w", err)
	}
	if used+grow > *lim {
		return &QuotaExceededError{Quota: QuotaVolumeBytes, Limit: *lim, Current: used, Asked: grow, Usage: QuotaUsage{Volumes: n, VolumeBytes: used}}
	}
	return nil
}

// consumeReservation moves one sandbox's share (x's CPU and memory) out of reservation
// x.ReservationID, inside the transaction that records x, dropping the reservation once
// it holds no sandbox. A reservation gone (expired, released) changes nothing.
func consumeReservation(ctx context.Context, q querier, x Sandbox) error {
	if x.ReservationID == "" {
		return nil
	}
	if _, err := q.exec(ctx, `UPDATE quota_reservations SET sandboxes = sandboxes - 1,
		cpu_millis = cpu_millis - $3, memory_bytes = memory_bytes - $4 WHERE org_id = $1 AND id = $2`,
		x.Org, x.ReservationID, x.MilliCPU, x.MemoryBytes); err != nil {
		return err
	}
	_, err := q.exec(ctx, `DELETE FROM quota_reservations WHERE org_id = $1 AND id = $2 AND sandboxes <= 0`, x.Org, x.ReservationID)
	return err
}

func isNotFound(err error) bool { return errors.Is(err, ErrNotFound) }
