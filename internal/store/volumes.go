package store

import (
	"context"
	"database/sql"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// ---- registered volumes ----

// Volumes are the organizations' registered volumes (VolumeService). The ID is the
// caller's, unique within its organization; a volume of another organization is
// ErrNotFound, exactly like a missing one. Deletion is a hard delete.
type Volumes interface {
	// Create inserts v (Org, ID, RunnerID, Namespace, ClaimName and State required)
	// unless the organization already has maxActive volumes (ErrLimitExceeded; <= 0: no
	// limit) or, with quota (the default limits; nil: no check), v.SizeBytes would take
	// the organization's volumes past its max_volume_bytes (*QuotaExceededError, checked
	// and inserted under the organization's quota lock). *AlreadyExistsError with key
	// KeyID (the ID is taken), KeyRequestID or KeyClaimName (another volume of the
	// organization names the runner's claim).
	Create(ctx context.Context, v Volume, maxActive int, quota *QuotaLimits) (Volume, error)
	// Resize sets org's volume id's SizeBytes to size, which may only grow it
	// (ErrInvalid otherwise), admitting the growth against max_volume_bytes like Create.
	// It returns the volume as it was before and after.
	Resize(ctx context.Context, org, id string, size int64, quota *QuotaLimits) (before, after Volume, err error)
	Get(ctx context.Context, org, id string) (Volume, error)
	// GetByRequestID returns the volume the request requestID created.
	GetByRequestID(ctx context.Context, org, requestID string) (Volume, error)
	// List pages through org's volumes, oldest first, filtered by f.
	List(ctx context.Context, org string, f VolumeFilter, page Page) ([]Volume, string, error)
	// Update applies u to org's volume id (ErrNotFound when missing).
	Update(ctx context.Context, org, id string, u VolumeUpdate) (Volume, error)
	// Delete removes org's volume id and returns it as it was.
	Delete(ctx context.Context, org, id string) (Volume, error)
	// Attached returns the IDs of org's sandboxes that have not ended and mount volume
	// id, oldest first, at most limit, and how many there are in all.
	Attached(ctx context.Context, org, id string, limit int) ([]string, int, error)

	// AcquireLease makes holder the holder of org's write lease of volume id (a GLOBAL
	// volume's single writer) unless another holder has it and stale(that holder, since
	// when) is false: then it returns that holder and takes nothing. Taking a stale
	// lease over is a compare-and-swap, so two gateway replicas never both win it.
	AcquireLease(ctx context.Context, org, id, holder string, stale func(holder string, since time.Time) bool) (string, error)
	// MoveLease hands org's lease of id from holder from to holder to (a create's
	// placeholder to its sandbox); ErrNotFound when from does not hold it.
	MoveLease(ctx context.Context, org, id, from, to string) error
	// ReleaseLease ends holder's lease of org's volume id; no error when holder does not hold it.
	ReleaseLease(ctx context.Context, org, id, holder string) error
	// LeaseHolder is who holds org's lease of id and since when ("" when nobody).
	LeaseHolder(ctx context.Context, org, id string) (string, time.Time, error)
}

// Volume is a stored registered volume.
type Volume struct {
	Org         string
	ID          string
	RunnerID    string
	Namespace   string
	ClaimName   string
	SubPath     string
	ReadOnly    bool
	Description string
	State       string // VOLUME_STATE_* without the prefix: VALIDATING, READY, ERROR, DELETING
	StateReason string
	// CapacityBytes is the size of the runner's storage; 0 until known.
	CapacityBytes int64
	// SizeBytes is the size asked for (what max_volume_bytes counts); > 0.
	SizeBytes int64
	// AccessModes are the Kubernetes access modes the runner reported for the volume's
	// claim (e.g. ReadWriteOnce); nil until known, and on runners whose volumes are
	// ReadWriteMany (local). Stored comma-separated.
	AccessModes   []string
	CreateTime    time.Time // set by the store
	UpdateTime    time.Time // set by the store
	LastValidated *time.Time
	RequestID     string // "" when the create had none
	// RequestDigest identifies the create request; opaque to the store.
	RequestDigest string
}

// VolumeFilter narrows Volumes.List. Empty fields do not filter.
type VolumeFilter struct {
	States    []string // any of
	RunnerIDs []string // any of
}

// VolumeUpdate holds the fields of a volume to change; nil leaves one as it is.
type VolumeUpdate struct {
	Description   *string
	State         *string
	StateReason   *string // with State
	CapacityBytes *int64
	LastValidated *time.Time
	// SizeBytes sets the size without a quota check (putting back a failed Resize).
	SizeBytes *int64
	// AccessModes, when not nil, replaces the access modes (empty: unknown).
	AccessModes *[]string
	// IfSizeBytes, when not nil, makes the update a compare-and-set: it applies only while
	// the volume's SizeBytes is this (else ErrConflict, nothing changed). Size is the
	// volume's version for growing: it changes only by Resize (which only grows) and by
	// the undo of a failed one.
	IfSizeBytes *int64
}

// KeyClaimName is the key of a runner claim another volume of the organization names.
const KeyClaimName = "claim_name"

type volumes struct{ s *sqlStore }

func (s *sqlStore) Volumes() Volumes { return volumes{s} }

const volumeCols = `org_id, id, runner_id, namespace, claim_name, sub_path, read_only, description, state,
	state_reason, capacity_bytes, create_time, update_time, last_validated, request_id, request_digest, size_bytes, access_modes`

func scanVolume(r row) (Volume, error) {
	var v Volume
	var requestID sql.NullString
	var created, updated, validated dbTime
	var modes string
	if err := r.Scan(&v.Org, &v.ID, &v.RunnerID, &v.Namespace, &v.ClaimName, &v.SubPath, &v.ReadOnly, &v.Description,
		&v.State, &v.StateReason, &v.CapacityBytes, &created, &updated, &validated, &requestID, &v.RequestDigest, &v.SizeBytes, &modes); err != nil {
		return Volume{}, err
	}
	if modes != "" {
		v.AccessModes = strings.Split(modes, ",")
	}
	v.RequestID = requestID.String
	v.CreateTime, v.UpdateTime, v.LastValidated = created.t, updated.t, validated.ptr()
	return v, nil
}

func (vs volumes) Create(ctx context.Context, v Volume, maxActive int, quota *QuotaLimits) (Volume, error) {
	if err := required("org", v.Org, "id", v.ID, "runner_id", v.RunnerID, "namespace", v.Namespace,
		"claim_name", v.ClaimName, "state", v.State); err != nil {
		return Volume{}, err
	}
	if v.SizeBytes <= 0 {
		return Volume{}, invalid("volume size %d bytes", v.SizeBytes)
	}
	v.CreateTime = now()
	v.UpdateTime = v.CreateTime
	var requestID any
	if v.RequestID != "" {
		requestID = v.RequestID
	}
	err := vs.s.d.tx(ctx, func(q querier) error {
		if maxActive > 0 {
			var n int64
			if err := q.queryRow(ctx, `SELECT count(*) FROM volumes WHERE org_id = $1`, v.Org).Scan(&n); err != nil {
				return err
			}
			if n >= int64(maxActive) {
				return fmt.Errorf("%w: organization %s has %d volumes, at most %d", ErrLimitExceeded, v.Org, n, maxActive)
			}
		}
		if err := checkVolumeBytes(ctx, vs.s, q, v.Org, v.SizeBytes, quota); err != nil {
			return err
		}
		_, err := q.exec(ctx, `INSERT INTO volumes (`+volumeCols+`)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18)`,
			v.Org, v.ID, v.RunnerID, v.Namespace, v.ClaimName, v.SubPath, v.ReadOnly, v.Description, v.State,
			v.StateReason, v.CapacityBytes, v.CreateTime, v.UpdateTime, timeArg(v.LastValidated), requestID, v.RequestDigest, v.SizeBytes, strings.Join(v.AccessModes, ","))
		return err
	})
	if err != nil {
		if errors.Is(err, ErrLimitExceeded) || errors.Is(err, ErrQuotaExceeded) {
			return Volume{}, err
		}
		return Volume{}, vs.s.writeErr("volume", "create", err)
	}
	return v, nil
}

func (vs volumes) Get(ctx context.Context, org, id string) (Volume, error) {
	v, err := scanVolume(vs.s.d.queryRow(ctx, `SELECT `+volumeCols+` FROM volumes WHERE org_id = $1 AND id = $2`, org, id))
	return v, vs.s.readErr("volume", err)
}

func (vs volumes) GetByRequestID(ctx context.Context, org, requestID string) (Volume, error) {
	if requestID == "" {
		return Volume{}, fmt.Errorf("volume: %w", ErrNotFound)
	}
	v, err := scanVolume(vs.s.d.queryRow(ctx,
		`SELECT `+volumeCols+` FROM volumes WHERE org_id = $1 AND request_id = $2`, org, requestID))
	return v, vs.s.readErr("volume", err)
}

func (vs volumes) List(ctx context.Context, org string, f VolumeFilter, page Page) ([]Volume, string, error) {
	var where strings.Builder
	args := []any{org}
	arg := func(v any) string {
		args = append(args, v)
		return "$" + strconv.Itoa(len(args))
	}
	in := func(col string, vals []string) {
		ph := make([]string, len(vals))
		for i, v := range vals {
			ph[i] = arg(v)
		}
		fmt.Fprintf(&where, " AND %s IN (%s)", col, strings.Join(ph, ", "))
	}
	where.WriteString("org_id = $1")
	if len(f.States) > 0 {
		in("state", f.States)
	}
	if len(f.RunnerIDs) > 0 {
		in("runner_id", f.RunnerIDs)
	}
	if page.Token != "" {
		at, id, err := decodeSandboxCursor(page.Token) // the same (time, id) form
		if err != nil {
			return nil, "", err
		}
		a, b := arg(at), arg(id)
		fmt.Fprintf(&where, " AND (create_time > %s OR (create_time = %s AND id > %s))", a, a, b)
	}
	size := pageSize(page.Size)
	rs, err := vs.s.d.query(ctx, fmt.Sprintf(`SELECT %s FROM volumes WHERE %s ORDER BY create_time, id LIMIT %s`,
		volumeCols, where.String(), arg(size+1)), args...)
	if err != nil {
		return nil, "", fmt.Errorf("list volumes: %w", err)
	}
	defer rs.Close()
	var out []Volume
	for rs.Next() {
		v, err := scanVolume(rs)
		if err != nil {
			return nil, "", fmt.Errorf("list volumes: %w", err)
		}
		out = append(out, v)
	}
	if err := rs.Err(); err != nil {
		return nil, "", fmt.Errorf("list volumes: %w", err)
	}
	next := ""
	if len(out) > size {
		out = out[:size]
		last := out[size-1]
		next = base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(last.CreateTime.UnixMicro(), 10) + ":" + last.ID))
	}
	return out, next, nil
}

func (vs volumes) Update(ctx context.Context, org, id string, u VolumeUpdate) (Volume, error) {
	var desc, state, reason, capacity, size, modes any
	if u.AccessModes != nil {
		modes = strings.Join(*u.AccessModes, ",")
	}
	if u.SizeBytes != nil {
		size = *u.SizeBytes
	}
	if u.Description != nil {
		desc = *u.Description
	}
	if u.State != nil {
		state = *u.State
		r := ""
		if u.StateReason != nil {
			r = *u.StateReason
		}
		reason = r
	}
	if u.CapacityBytes != nil {
		capacity = *u.CapacityBytes
	}
	where, args := "org_id = $1 AND id = $2", []any{org, id, desc, state, reason, capacity, timeArg(u.LastValidated), now(), size, modes}
	if u.IfSizeBytes != nil {
		where += " AND size_bytes = $11"
		args = append(args, *u.IfSizeBytes)
	}
	v, err := scanVolume(vs.s.d.queryRow(ctx, `UPDATE volumes SET
		description = COALESCE($3, description),
		state = COALESCE($4, state),
		state_reason = COALESCE($5, state_reason),
		capacity_bytes = COALESCE($6, capacity_bytes),
		last_validated = COALESCE($7, last_validated),
		update_time = $8,
		size_bytes = COALESCE($9, size_bytes),
		access_modes = COALESCE($10, access_modes)
		WHERE `+where+` RETURNING `+volumeCols, args...))
	if err != nil && u.IfSizeBytes != nil && vs.s.d.isNoRows(err) {
		// Missing, or its size changed: which one.
		if _, gerr := vs.Get(ctx, org, id); gerr == nil {
			return Volume{}, fmt.Errorf("volume %s: %w", id, ErrConflict)
		}
	}
	return v, vs.s.readErr("volume", err)
}

func (vs volumes) Resize(ctx context.Context, org, id string, size int64, quota *QuotaLimits) (Volume, Volume, error) {
	var before, after Volume
	err := vs.s.d.tx(ctx, func(q querier) error {
		// Lock first (an admitted grow must see every other committed one), then read.
		if quota != nil {
			if err := lockQuota(ctx, q, org); err != nil {
				return err
			}
		}
		var err error
		if before, err = scanVolume(q.queryRow(ctx, `SELECT `+volumeCols+` FROM volumes WHERE org_id = $1 AND id = $2`, org, id)); err != nil {
			return err
		}
		if size < before.SizeBytes {
			return invalid("volume %s is %d bytes: it can only grow, not to %d", id, before.SizeBytes, size)
		}
		if err := checkVolumeBytes(ctx, vs.s, q, org, size-before.SizeBytes, quota); err != nil {
			return err
		}
		after, err = scanVolume(q.queryRow(ctx, `UPDATE volumes SET size_bytes = $3, update_time = $4
			WHERE org_id = $1 AND id = $2 RETURNING `+volumeCols, org, id, size, now()))
		return err
	})
	switch {
	case err == nil:
		return before, after, nil
	case errors.Is(err, ErrQuotaExceeded), errors.Is(err, ErrInvalid):
		return before, Volume{}, err
	}
	return Volume{}, Volume{}, vs.s.readErr("volume", err)
}

func (vs volumes) Delete(ctx context.Context, org, id string) (Volume, error) {
	v, err := scanVolume(vs.s.d.queryRow(ctx, `DELETE FROM volumes WHERE org_id = $1 AND id = $2 RETURNING `+volumeCols, org, id))
	return v, vs.s.readErr("volume", err)
}

func (vs volumes) Attached(ctx context.Context, org, id string, limit int) ([]string, int, error) {
	var n int
	if err := vs.s.d.queryRow(ctx, `SELECT count(*) FROM sandbox_volumes v JOIN sandboxes s ON s.id = v.sandbox_id
		WHERE s.org_id = $1 AND v.volume_id = $2 AND s.ended_at IS NULL`, org, id).Scan(&n); err != nil {
		return nil, 0, fmt.Errorf("volume attachments: %w", err)
	}
	if n == 0 || limit <= 0 {
		return nil, n, nil
	}
	rs, err := vs.s.d.query(ctx, `SELECT s.id FROM sandbox_volumes v JOIN sandboxes s ON s.id = v.sandbox_id
		WHERE s.org_id = $1 AND v.volume_id = $2 AND s.ended_at IS NULL ORDER BY s.created_at, s.id LIMIT $3`, org, id, limit)
	if err != nil {
		return nil, 0, fmt.Errorf("volume attachments: %w", err)
	}
	defer rs.Close()
	var ids []string
	for rs.Next() {
		var s string
		if err := rs.Scan(&s); err != nil {
			return nil, 0, fmt.Errorf("volume attachments: %w", err)
		}
		ids = append(ids, s)
	}
	return ids, n, rs.Err()
}

func (vs volumes) AcquireLease(ctx context.Context, org, id, holder string, stale func(string, time.Time) bool) (string, error) {
	if err := required("org", org, "id", id, "holder", holder); err != nil {
		return "", err
	}
	for range 4 {
		n, err := vs.s.d.exec(ctx, `INSERT INTO volume_leases (org_id, volume_id, holder, since) VALUES ($1, $2, $3, $4)
			ON CONFLICT (org_id, volume_id) DO NOTHING`, org, id, holder, now())
		if err != nil {
			return "", fmt.Errorf("volume lease: %w", err)
		}
		if n == 1 {
			return "", nil
		}
		cur, since, err := vs.LeaseHolder(ctx, org, id)
		if err != nil {
			return "", err
		}
		switch {
		case cur == "":
			continue // released meanwhile
		case cur == holder:
			return "", nil
		case stale != nil && stale(cur, since):
			n, err := vs.s.d.exec(ctx, `UPDATE volume_leases SET holder = $3, since = $4 WHERE org_id = $1 AND volume_id = $2 AND holder = $5`,
				org, id, holder, now(), cur)
			if err != nil {
				return "", fmt.Errorf("volume lease: %w", err)
			}
			if n == 1 {
				return "", nil
			}
			continue // another replica took it over first: look again
		default:
			return cur, nil
		}
	}
	return "", fmt.Errorf("volume lease of %s: contended, try again", id)
}

func (vs volumes) MoveLease(ctx context.Context, org, id, from, to string) error {
	n, err := vs.s.d.exec(ctx, `UPDATE volume_leases SET holder = $4 WHERE org_id = $1 AND volume_id = $2 AND holder = $3`, org, id, from, to)
	if err != nil {
		return fmt.Errorf("volume lease: %w", err)
	}
	if n == 0 {
		return fmt.Errorf("volume lease of %s held by %s: %w", id, from, ErrNotFound)
	}
	return nil
}

func (vs volumes) ReleaseLease(ctx context.Context, org, id, holder string) error {
	if _, err := vs.s.d.exec(ctx, `DELETE FROM volume_leases WHERE org_id = $1 AND volume_id = $2 AND holder = $3`, org, id, holder); err != nil {
		return fmt.Errorf("volume lease: %w", err)
	}
	return nil
}

func (vs volumes) LeaseHolder(ctx context.Context, org, id string) (string, time.Time, error) {
	var h string
	var since dbTime
	err := vs.s.d.queryRow(ctx, `SELECT holder, since FROM volume_leases WHERE org_id = $1 AND volume_id = $2`, org, id).Scan(&h, &since)
	if vs.s.d.isNoRows(err) {
		return "", time.Time{}, nil
	}
	if err != nil {
		return "", time.Time{}, fmt.Errorf("volume lease: %w", err)
	}
	return h, since.t, nil
}
