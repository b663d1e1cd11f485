package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Snapshots is the gateway's index of file-system snapshots (issue 20). A snapshot of
// another organization is ErrNotFound, exactly like a missing one. A snapshot moves
// CREATING → READY | FAILED (Complete), READY | FAILED → DELETING (MarkDeleting), and a
// DELETING row is removed (Delete) once its archive is gone; every transition is one
// conditional statement, so concurrent gateway replicas cannot undo each other's.
type Snapshots interface {
	// Create inserts s (State SnapshotCreating when empty). A RequestID the organization
	// used before inserts nothing: it returns that snapshot and created false.
	// *AlreadyExistsError with key "id" for a taken id.
	Create(ctx context.Context, s Snapshot) (out Snapshot, created bool, err error)
	Get(ctx context.Context, org, id string) (Snapshot, error)
	GetByRequestID(ctx context.Context, org, requestID string) (Snapshot, error)
	// List returns a page of org's snapshots, newest first (create_time, then id,
	// descending), and the token of the next page ("" at the end). ErrInvalid for a
	// token it did not issue.
	List(ctx context.Context, org string, f SnapshotFilter, page Page) ([]Snapshot, string, error)
	// Complete records the outcome of a CREATING snapshot (c.State SnapshotReady or
	// SnapshotFailed). ErrConflict when the snapshot is not CREATING any more.
	Complete(ctx context.Context, org, id string, c SnapshotCompletion) (Snapshot, error)
	// MarkDeleting moves a READY or FAILED snapshot to DELETING (a DELETING one stays
	// so). ErrConflict when it is CREATING.
	MarkDeleting(ctx context.Context, org, id string) (Snapshot, error)
	// Delete removes a DELETING snapshot's row. ErrConflict when it is not DELETING.
	Delete(ctx context.Context, org, id string) error
	// ListState returns up to limit snapshots of every organization in state, oldest
	// first: the reconciler's work (CREATING: ask the runner; DELETING: finish).
	ListState(ctx context.Context, state string, limit int) ([]Snapshot, error)
	// SnapshotUsage is what org's snapshots hold against its quota: how many are not
	// FAILED, and the sum of their size_bytes.
	SnapshotUsage(ctx context.Context, org string) (count int, bytes int64, err error)
	// SnapshotKeyExists reports whether any snapshot row (any organization, any state)
	// names the blob key: the garbage collector keeps such objects.
	SnapshotKeyExists(ctx context.Context, key string) (bool, error)
	// ListSnapshotKeys returns up to limit object keys of snapshot rows that start with
	// prefix and sort after after, in key order (for a collector walking both lists).
	ListSnapshotKeys(ctx context.Context, prefix, after string, limit int) ([]string, error)
}

// Snapshot states.
const (
	SnapshotCreating = "CREATING"
	SnapshotReady    = "READY"
	SnapshotFailed   = "FAILED"
	SnapshotDeleting = "DELETING"
)

// Snapshot triggers.
const (
	TriggerManual   = "MANUAL"
	TriggerOnDelete = "ON_DELETE"
)

// Snapshot is one file-system snapshot of one scratch volume.
type Snapshot struct {
	ID    string
	Org   string
	State string // Snapshot*
	// Reason is the CWSANDBOX_* reason of a FAILED snapshot, StateReason what happened.
	Reason      string
	StateReason string
	// SizeBytes is the archive's size, ContentBytes the sum of its files' sizes, Digest
	// the archive's hex sha256 (READY).
	SizeBytes, ContentBytes int64
	Digest                  string
	SourceSandboxID         string
	SourceVolumeName        string
	Trigger                 string // Trigger*
	// ObjectBucket and ObjectKey are where the archive lives in the blob store.
	ObjectBucket, ObjectKey string
	// RunnerID is the runner taking the snapshot (the source sandbox's).
	RunnerID string
	// RequestID is the idempotency key ("" for none; unique per organization otherwise).
	RequestID string
	// Pause is how long the workload was paused for the capture.
	Pause        time.Duration
	CreateTime   time.Time  // set by the store when zero
	CompleteTime *time.Time // set once READY or FAILED
	UpdatedAt    time.Time  // set by the store
}

// SnapshotFilter narrows Snapshots.List. Empty fields do not filter.
type SnapshotFilter struct {
	SourceSandboxID string
	States          []string // any of
}

// SnapshotCompletion is the outcome of a snapshot.
type SnapshotCompletion struct {
	State                   string // SnapshotReady or SnapshotFailed
	Reason, StateReason     string
	SizeBytes, ContentBytes int64
	Digest                  string
	Pause                   time.Duration
	CompleteTime            time.Time // the store's clock when zero
}

// Bounds of what a snapshot row keeps, in bytes.
const (
	MaxSnapshotStateReasonLen = 4096
	MaxSnapshotRequestIDLen   = 512
)

type snapshots struct{ s *sqlStore }

func (s *sqlStore) Snapshots() Snapshots { return snapshots{s} }

const snapshotCols = `id, org_id, state, state_reason, reason, size_bytes, content_bytes, digest,
	source_sandbox_id, source_volume_name, trigger_kind, object_bucket, object_key, runner_id, request_id,
	pause_ns, create_time, complete_time, updated_at`

func scanSnapshot(r row) (Snapshot, error) {
	var x Snapshot
	var requestID sql.NullString
	var pause int64
	var created, completed, updated dbTime
	err := r.Scan(&x.ID, &x.Org, &x.State, &x.StateReason, &x.Reason, &x.SizeBytes, &x.ContentBytes, &x.Digest,
		&x.SourceSandboxID, &x.SourceVolumeName, &x.Trigger, &x.ObjectBucket, &x.ObjectKey, &x.RunnerID, &requestID,
		&pause, &created, &completed, &updated)
	if err != nil {
		return Snapshot{}, err
	}
	x.RequestID, x.Pause = requestID.String, time.Duration(pause)
	x.CreateTime, x.CompleteTime, x.UpdatedAt = created.t, completed.ptr(), updated.t
	return x, nil
}

func checkSnapshotState(st string, allowed ...string) error {
	for _, a := range allowed {
		if st == a {
			return nil
		}
	}
	return invalid("snapshot state %q: want one of %s", st, strings.Join(allowed, ", "))
}

func (sn snapshots) Create(ctx context.Context, x Snapshot) (Snapshot, bool, error) {
	if err := required("id", x.ID, "org", x.Org, "source_sandbox_id", x.SourceSandboxID,
		"source_volume_name", x.SourceVolumeName, "object_key", x.ObjectKey, "runner_id", x.RunnerID); err != nil {
		return Snapshot{}, false, err
	}
	if x.State == "" {
		x.State = SnapshotCreating
	}
	if err := checkSnapshotState(x.State, SnapshotCreating, SnapshotReady, SnapshotFailed); err != nil {
		return Snapshot{}, false, err
	}
	if x.Trigger != TriggerManual && x.Trigger != TriggerOnDelete {
		return Snapshot{}, false, invalid("snapshot trigger %q: want MANUAL or ON_DELETE", x.Trigger)
	}
	if len(x.RequestID) > MaxSnapshotRequestIDLen {
		return Snapshot{}, false, invalid("request_id is %d bytes, at most %d", len(x.RequestID), MaxSnapshotRequestIDLen)
	}
	x.StateReason = clip(x.StateReason, MaxSnapshotStateReasonLen)
	if x.CreateTime.IsZero() {
		x.CreateTime = now()
	}
	x.CreateTime, x.UpdatedAt = utc(x.CreateTime), now()
	if x.CompleteTime != nil {
		c := utc(*x.CompleteTime)
		x.CompleteTime = &c
	}
	var requestID any
	if x.RequestID != "" {
		requestID = x.RequestID
	}
	_, err := sn.s.d.exec(ctx, `INSERT INTO snapshots (id, org_id, state, state_reason, reason, size_bytes, content_bytes,
		digest, source_sandbox_id, source_volume_name, trigger_kind, object_bucket, object_key, runner_id, request_id,
		pause_ns, create_time, complete_time, updated_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19)`,
		x.ID, x.Org, x.State, x.StateReason, x.Reason, x.SizeBytes, x.ContentBytes, x.Digest, x.SourceSandboxID,
		x.SourceVolumeName, x.Trigger, x.ObjectBucket, x.ObjectKey, x.RunnerID, requestID, int64(x.Pause),
		x.CreateTime, timeArg(x.CompleteTime), x.UpdatedAt)
	if err != nil {
		werr := sn.s.writeErr("snapshot", "create", err)
		var dup *AlreadyExistsError
		if x.RequestID != "" && asAlreadyExists(werr, &dup) && dup.Key == KeyRequestID {
			first, gerr := sn.GetByRequestID(ctx, x.Org, x.RequestID)
			if gerr != nil {
				return Snapshot{}, false, gerr
			}
			return first, false, nil
		}
		return Snapshot{}, false, werr
	}
	return x, true, nil
}

func asAlreadyExists(err error, dup **AlreadyExistsError) bool { return errors.As(err, dup) }

func (sn snapshots) Get(ctx context.Context, org, id string) (Snapshot, error) {
	x, err := scanSnapshot(sn.s.d.queryRow(ctx, `SELECT `+snapshotCols+` FROM snapshots WHERE org_id = $1 AND id = $2`, org, id))
	return x, sn.s.readErr("snapshot", err)
}

func (sn snapshots) GetByRequestID(ctx context.Context, org, requestID string) (Snapshot, error) {
	if requestID == "" {
		return Snapshot{}, fmt.Errorf("snapshot: %w", ErrNotFound)
	}
	x, err := scanSnapshot(sn.s.d.queryRow(ctx,
		`SELECT `+snapshotCols+` FROM snapshots WHERE org_id = $1 AND request_id = $2`, org, requestID))
	return x, sn.s.readErr("snapshot", err)
}

func encodeSnapshotCursor(x Snapshot) string {
	return encodeSandboxCursor(Sandbox{ID: x.ID, CreatedAt: x.CreateTime})
}

func (sn snapshots) List(ctx context.Context, org string, f SnapshotFilter, page Page) ([]Snapshot, string, error) {
	var where strings.Builder
	args := []any{org}
	arg := func(v any) string {
		args = append(args, v)
		return "$" + strconv.Itoa(len(args))
	}
	where.WriteString("org_id = $1")
	if f.SourceSandboxID != "" {
		fmt.Fprintf(&where, " AND source_sandbox_id = %s", arg(f.SourceSandboxID))
	}
	if len(f.States) > 0 {
		ph := make([]string, len(f.States))
		for i, st := range f.States {
			ph[i] = arg(st)
		}
		fmt.Fprintf(&where, " AND state IN (%s)", strings.Join(ph, ", "))
	}
	if page.Token != "" {
		at, id, err := decodeSandboxCursor(page.Token)
		if err != nil {
			return nil, "", err
		}
		a, b := arg(at), arg(id)
		fmt.Fprintf(&where, " AND (create_time < %s OR (create_time = %s AND id < %s))", a, a, b)
	}
	size := pageSize(page.Size)
	q := fmt.Sprintf(`SELECT %s FROM snapshots WHERE %s ORDER BY create_time DESC, id DESC LIMIT %s`,
		snapshotCols, where.String(), arg(size+1))
	out, err := sn.query(ctx, "list snapshots", q, args...)
	if err != nil {
		return nil, "", err
	}
	next := ""
	if len(out) > size {
		out = out[:size]
		next = encodeSnapshotCursor(out[size-1])
	}
	return out, next, nil
}

func (sn snapshots) query(ctx context.Context, op, q string, args ...any) ([]Snapshot, error) {
	rs, err := sn.s.d.query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	defer rs.Close()
	var out []Snapshot
	for rs.Next() {
		x, err := scanSnapshot(rs)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", op, err)
		}
		out = append(out, x)
	}
	if err := rs.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	return out, nil
}

// conflictOrMissing tells a failed conditional write on a snapshot apart.
func (sn snapshots) conflictOrMissing(ctx context.Context, org, id, want string) error {
	x, err := sn.Get(ctx, org, id)
	if err != nil {
		return err
	}
	return fmt.Errorf("snapshot %s is %s, not %s: %w", id, x.State, want, ErrConflict)
}

func (sn snapshots) Complete(ctx context.Context, org, id string, c SnapshotCompletion) (Snapshot, error) {
	if err := checkSnapshotState(c.State, SnapshotReady, SnapshotFailed); err != nil {
		return Snapshot{}, err
	}
	c.StateReason, c.Reason = clip(c.StateReason, MaxSnapshotStateReasonLen), clip(c.Reason, 128)
	if c.CompleteTime.IsZero() {
		c.CompleteTime = now()
	}
	x, err := scanSnapshot(sn.s.d.queryRow(ctx, `UPDATE snapshots SET state = $3, reason = $4, state_reason = $5,
		size_bytes = $6, content_bytes = $7, digest = $8, pause_ns = $9, complete_time = $10, updated_at = $11
		WHERE org_id = $1 AND id = $2 AND state = 'CREATING' RETURNING `+snapshotCols,
		org, id, c.State, c.Reason, c.StateReason, c.SizeBytes, c.ContentBytes, c.Digest, int64(c.Pause),
		utc(c.CompleteTime), now()))
	if sn.s.d.isNoRows(err) {
		return Snapshot{}, sn.conflictOrMissing(ctx, org, id, SnapshotCreating)
	}
	if err != nil {
		return Snapshot{}, sn.s.writeErr("snapshot", "complete", err)
	}
	return x, nil
}

func (sn snapshots) MarkDeleting(ctx context.Context, org, id string) (Snapshot, error) {
	x, err := scanSnapshot(sn.s.d.queryRow(ctx, `UPDATE snapshots SET state = 'DELETING',
		updated_at = CASE WHEN state = 'DELETING' THEN updated_at ELSE $3 END
		WHERE org_id = $1 AND id = $2 AND state IN ('READY', 'FAILED', 'DELETING') RETURNING `+snapshotCols,
		org, id, now()))
	if sn.s.d.isNoRows(err) {
		return Snapshot{}, sn.conflictOrMissing(ctx, org, id, "READY or FAILED")
	}
	if err != nil {
		return Snapshot{}, sn.s.writeErr("snapshot", "mark deleting", err)
	}
	return x, nil
}

func (sn snapshots) Delete(ctx context.Context, org, id string) error {
	n, err := sn.s.d.exec(ctx, `DELETE FROM snapshots WHERE org_id = $1 AND id = $2 AND state = 'DELETING'`, org, id)
	if err != nil {
		return fmt.Errorf("delete snapshot: %w", err)
	}
	if n == 0 {
		return sn.conflictOrMissing(ctx, org, id, SnapshotDeleting)
	}
	return nil
}

func (sn snapshots) ListState(ctx context.Context, state string, limit int) ([]Snapshot, error) {
	if err := checkSnapshotState(state, SnapshotCreating, SnapshotReady, SnapshotFailed, SnapshotDeleting); err != nil {
		return nil, err
	}
	return sn.query(ctx, "list snapshots by state", `SELECT `+snapshotCols+` FROM snapshots WHERE state = $1
		ORDER BY create_time, id LIMIT $2`, state, pageSize(limit))
}

func (sn snapshots) SnapshotUsage(ctx context.Context, org string) (int, int64, error) {
	var n, bytes int64
	err := sn.s.d.queryRow(ctx, `SELECT COUNT(*), CAST(COALESCE(SUM(size_bytes), 0) AS BIGINT) FROM snapshots
		WHERE org_id = $1 AND state <> 'FAILED'`, org).Scan(&n, &bytes)
	if err != nil {
		return 0, 0, fmt.Errorf("snapshot usage: %w", err)
	}
	return int(n), bytes, nil
}

func (sn snapshots) SnapshotKeyExists(ctx context.Context, key string) (bool, error) {
	var n int64
	if err := sn.s.d.queryRow(ctx, `SELECT COUNT(*) FROM snapshots WHERE object_key = $1`, key).Scan(&n); err != nil {
		return false, fmt.Errorf("snapshot key: %w", err)
	}
	return n > 0, nil
}

func (sn snapshots) ListSnapshotKeys(ctx context.Context, prefix, after string, limit int) ([]string, error) {
	// A prefix range rather than LIKE: no escaping, and the index on object_key serves it.
	q := `SELECT DISTINCT object_key FROM snapshots WHERE object_key > $1 AND object_key >= $2`
	args := []any{after, prefix, pageSize(limit)}
	if prefix != "" {
		q += ` AND object_key < $4`
		args = append(args, prefixEnd(prefix))
	}
	q += ` ORDER BY object_key LIMIT $3`
	rs, err := sn.s.d.query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("list snapshot keys: %w", err)
	}
	defer rs.Close()
	var out []string
	for rs.Next() {
		var k string
		if err := rs.Scan(&k); err != nil {
			return nil, fmt.Errorf("list snapshot keys: %w", err)
		}
		out = append(out, k)
	}
	return out, rs.Err()
}

// clip bounds a text another process wrote (a runner's message) to n bytes of valid
// UTF-8: the public API sends it as a protobuf string.
func clip(s string, n int) string {
	if len(s) > n {
		s = s[:n]
	}
	return strings.ToValidUTF8(s, "")
}

// prefixEnd is the least string greater than every string starting with p (p non-empty,
// its last byte below 0xff, as blob keys are ASCII).
func prefixEnd(p string) string {
	b := []byte(p)
	b[len(b)-1]++
	return string(b)
}
