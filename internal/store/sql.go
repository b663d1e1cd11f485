package store

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// sqlStore implements Store over either dialect; db hides what differs.
type sqlStore struct{ d db }

func newSQLStore(d db) *sqlStore { return &sqlStore{d: timedDB{d}} }

func (s *sqlStore) Orgs() Orgs                       { return orgs{s} }
func (s *sqlStore) APIKeys() APIKeys                 { return apiKeys{s} }
func (s *sqlStore) Runners() Runners                 { return runners{s} }
func (s *sqlStore) BootstrapTokens() BootstrapTokens { return tokens{s} }
func (s *sqlStore) Sandboxes() Sandboxes             { return sandboxes{s} }
func (s *sqlStore) Backend() string                  { return s.d.name() }
func (s *sqlStore) Close() error                     { return s.d.close() }

// writeErr turns constraint failures of a write into the package's errors.
func (s *sqlStore) writeErr(entity, op string, err error) error {
	if err == nil {
		return nil
	}
	if _, key, ok := s.d.uniqueViolation(err); ok {
		return &AlreadyExistsError{Entity: entity, Key: key}
	}
	if s.d.foreignKeyViolation(err) {
		return fmt.Errorf("%s %s: %w (organization or runner)", op, entity, ErrNotFound)
	}
	return fmt.Errorf("%s %s: %w", op, entity, err)
}

// readErr turns "no rows" into ErrNotFound.
func (s *sqlStore) readErr(entity string, err error) error {
	if err == nil {
		return nil
	}
	if s.d.isNoRows(err) {
		return fmt.Errorf("%s: %w", entity, ErrNotFound)
	}
	return fmt.Errorf("read %s: %w", entity, err)
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}

func required(fields ...string) error {
	for i := 0; i+1 < len(fields); i += 2 {
		if fields[i+1] == "" {
			return invalid("%s is required", fields[i])
		}
	}
	return nil
}

func checkJSON(field string, b []byte) error {
	if b != nil && !json.Valid(b) {
		return invalid("%s is not valid JSON", field)
	}
	return nil
}

// ---- organizations ----

type orgs struct{ s *sqlStore }

func (o orgs) Create(ctx context.Context, org Org) (Org, error) {
	if err := required("id", org.ID); err != nil {
		return Org{}, err
	}
	org.CreatedAt = now()
	_, err := o.s.d.exec(ctx, `INSERT INTO organizations (id, name, created_at) VALUES ($1, $2, $3)`,
		org.ID, org.Name, org.CreatedAt)
	if err != nil {
		return Org{}, o.s.writeErr("organization", "create", err)
	}
	return org, nil
}

func (o orgs) Get(ctx context.Context, id string) (Org, error) {
	var org Org
	var created dbTime
	err := o.s.d.queryRow(ctx, `SELECT id, name, created_at FROM organizations WHERE id = $1`, id).
		Scan(&org.ID, &org.Name, &created)
	if err != nil {
		return Org{}, o.s.readErr("organization", err)
	}
	org.CreatedAt = created.t
	return org, nil
}

func (o orgs) List(ctx context.Context) ([]Org, error) {
	rs, err := o.s.d.query(ctx, `SELECT id, name, created_at FROM organizations ORDER BY id`)
	if err != nil {
		return nil, fmt.Errorf("list organizations: %w", err)
	}
	defer rs.Close()
	var out []Org
	for rs.Next() {
		var org Org
		var created dbTime
		if err := rs.Scan(&org.ID, &org.Name, &created); err != nil {
			return nil, fmt.Errorf("list organizations: %w", err)
		}
		org.CreatedAt = created.t
		out = append(out, org)
	}
	return out, rs.Err()
}

// ---- API keys ----

type apiKeys struct{ s *sqlStore }

const apiKeyCols = `id, org_id, role, name, hash, created_at, revoked_at, last_used_at`

func scanAPIKey(r row) (APIKey, error) {
	var k APIKey
	var created, revoked, used dbTime
	if err := r.Scan(&k.ID, &k.Org, &k.Role, &k.Name, &k.Hash, &created, &revoked, &used); err != nil {
		return APIKey{}, err
	}
	k.CreatedAt, k.RevokedAt, k.LastUsedAt = created.t, revoked.ptr(), used.ptr()
	return k, nil
}

func (a apiKeys) Create(ctx context.Context, k APIKey) (APIKey, error) {
	if err := required("id", k.ID, "org", k.Org, "hash", k.Hash); err != nil {
		return APIKey{}, err
	}
	if k.Role != RoleAdmin && k.Role != RoleUser {
		return APIKey{}, invalid("unknown role %q", k.Role)
	}
	if k.CreatedAt.IsZero() {
		k.CreatedAt = now()
	}
	k.CreatedAt, k.RevokedAt, k.LastUsedAt = utc(k.CreatedAt), nil, nil
	_, err := a.s.d.exec(ctx, `INSERT INTO api_keys (id, org_id, role, name, hash, created_at) VALUES ($1, $2, $3, $4, $5, $6)`,
		k.ID, k.Org, k.Role, k.Name, k.Hash, k.CreatedAt)
	if err != nil {
		return APIKey{}, a.s.writeErr("api_key", "create", err)
	}
	return k, nil
}

func (a apiKeys) Get(ctx context.Context, id string) (APIKey, error) {
	k, err := scanAPIKey(a.s.d.queryRow(ctx, `SELECT `+apiKeyCols+` FROM api_keys WHERE id = $1`, id))
	return k, a.s.readErr("api_key", err)
}

func (a apiKeys) List(ctx context.Context, org string) ([]APIKey, error) {
	rs, err := a.s.d.query(ctx, `SELECT `+apiKeyCols+` FROM api_keys WHERE org_id = $1 ORDER BY created_at, id`, org)
	if err != nil {
		return nil, fmt.Errorf("list api keys: %w", err)
	}
	defer rs.Close()
	var out []APIKey
	for rs.Next() {
		k, err := scanAPIKey(rs)
		if err != nil {
			return nil, fmt.Errorf("list api keys: %w", err)
		}
		out = append(out, k)
	}
	return out, rs.Err()
}

func (a apiKeys) Revoke(ctx context.Context, org, id string) (APIKey, error) {
	k, err := scanAPIKey(a.s.d.queryRow(ctx,
		`UPDATE api_keys SET revoked_at = COALESCE(revoked_at, $3) WHERE org_id = $1 AND id = $2 RETURNING `+apiKeyCols,
		org, id, now()))
	return k, a.s.readErr("api_key", err)
}

func (a apiKeys) TouchLastUsed(ctx context.Context, id string, at time.Time) error {
	n, err := a.s.d.exec(ctx,
		`UPDATE api_keys SET last_used_at = $2 WHERE id = $1 AND (last_used_at IS NULL OR last_used_at < $2)`,
		id, utc(at))
	if err != nil {
		return fmt.Errorf("touch api key: %w", err)
	}
	if n == 0 {
		_, err := a.Get(ctx, id)
		return err
	}
	return nil
}

// ---- runners ----

type runners struct{ s *sqlStore }

const runnerCols = `org_id, runner_id, cluster_id, zone, runner_group_id, display_name, release_channel,
	desired_version, policy, policy_revision, revision, created_at, updated_at,
	last_heartbeat_at, version, ready, capacity, usage, maintenance_policy,
	self_update, update_from_version, update_to_version, update_state, update_reason,
	update_started_at, update_deadline, update_ended_at, self_update_failed_version, self_update_failure, prepull`

// The etag names one revision of one incarnation of a runner: a runner deleted and
// created again under the same id does not accept the old etags.
func runnerEtag(created time.Time, revision int64) string {
	return strconv.FormatInt(created.UnixMicro(), 36) + "-" + strconv.FormatInt(revision, 36)
}

func parseEtag(etag string) (created time.Time, revision int64, ok bool) {
	c, r, ok := strings.Cut(strings.Trim(etag, `"`), "-")
	if !ok {
		return time.Time{}, 0, false
	}
	cm, err1 := strconv.ParseInt(c, 36, 64)
	rv, err2 := strconv.ParseInt(r, 36, 64)
	if err1 != nil || err2 != nil {
		return time.Time{}, 0, false
	}
	return time.UnixMicro(cm).UTC(), rv, true
}

func scanRunner(r row) (Runner, error) {
	var x Runner
	var policy, capacity, usage, maint, prepull dbJSON
	var created, updated, heartbeat dbTime
	var revision int64
	var up UpdateAttempt
	var upStart, upDeadline, upEnd dbTime
	err := r.Scan(&x.Org, &x.RunnerID, &x.ClusterID, &x.Zone, &x.RunnerGroupID, &x.DisplayName,
		&x.ReleaseChannel, &x.DesiredVersion, &policy, &x.PolicyRevision, &revision, &created, &updated,
		&heartbeat, &x.Status.Version, &x.Status.Ready, &capacity, &usage, &maint,
		&x.Status.SelfUpdate, &up.From, &up.To, &up.State, &up.Reason, &upStart, &upDeadline, &upEnd,
		&x.Status.SelfUpdateFailedVersion, &x.Status.SelfUpdateFailure, &prepull)
	if err != nil {
		return Runner{}, err
	}
	if up.State != "" {
		up.StartedAt, up.Deadline, up.EndedAt = upStart.t, upDeadline.t, upEnd.ptr()
		x.LastUpdate = &up
	}
	x.Policy, x.Status.Capacity, x.Status.Usage = json.RawMessage(policy), json.RawMessage(capacity), json.RawMessage(usage)
	x.MaintenancePolicy, x.Status.Prepull = json.RawMessage(maint), json.RawMessage(prepull)
	x.CreatedAt, x.UpdatedAt, x.Status.LastHeartbeatAt = created.t, updated.t, heartbeat.ptr()
	x.Etag = runnerEtag(created.t, revision)
	return x, nil
}

func checkChannel(c string) error {
	if c != ChannelStable && c != ChannelRapid {
		return invalid("release channel %q: want STABLE or RAPID", c)
	}
	return nil
}

// checkMaintenance accepts a JSON object or nil (none).
func checkMaintenance(p []byte) error {
	if p == nil {
		return nil
	}
	if err := checkJSON("maintenance_policy", p); err != nil {
		return err
	}
	if t := bytes.TrimSpace(p); len(t) == 0 || t[0] != '{' {
		return invalid("maintenance_policy must be a JSON object")
	}
	return nil
}

// checkPolicy accepts a JSON object; nil means "not given".
func checkPolicy(p []byte) error {
	if p == nil {
		return nil
	}
	if err := checkJSON("policy", p); err != nil {
		return err
	}
	if t := bytes.TrimSpace(p); len(t) == 0 || t[0] != '{' {
		return invalid("policy must be a JSON object ({} is the permissive policy)")
	}
	return nil
}

func (rn runners) Create(ctx context.Context, r Runner) (Runner, error) {
	if err := required("org", r.Org, "runner_id", r.RunnerID, "cluster_id", r.ClusterID); err != nil {
		return Runner{}, err
	}
	if r.RunnerGroupID == "" {
		r.RunnerGroupID = DefaultRunnerGroup
	}
	if r.ReleaseChannel == "" {
		r.ReleaseChannel = ChannelStable
	}
	if err := checkChannel(r.ReleaseChannel); err != nil {
		return Runner{}, err
	}
	if err := checkPolicy(r.Policy); err != nil {
		return Runner{}, err
	}
	if err := checkMaintenance(r.MaintenancePolicy); err != nil {
		return Runner{}, err
	}
	r.PolicyRevision = 0
	if r.Policy != nil {
		r.PolicyRevision = 1
	}
	t := now()
	var out Runner
	// A runner ID names the runner's endpoint hosts and certificates platform-wide, so
	// another organization's runner of that ID makes it taken. No unique key covers it
	// (the primary key is per organization, and older databases may hold duplicates):
	// the check and the insert run in one transaction holding the ID's lock.
	err := rn.s.d.tx(ctx, func(q querier) error {
		if err := rn.s.d.lockName(ctx, q, lockClassRunnerID, r.RunnerID); err != nil {
			return err
		}
		var one int
		err := q.queryRow(ctx, `SELECT 1 FROM runners WHERE runner_id = $1 AND org_id <> $2
			UNION ALL SELECT 1 FROM runner_id_holds WHERE runner_id = $1 AND org_id <> $2 AND held_until > $3 LIMIT 1`,
			r.RunnerID, r.Org, t).Scan(&one)
		switch {
		case err == nil:
			return &AlreadyExistsError{Entity: "runner", Key: KeyRunnerID}
		case !rn.s.d.isNoRows(err):
			return err
		}
		out, err = scanRunner(q.queryRow(ctx, `INSERT INTO runners (org_id, runner_id, cluster_id, zone,
		runner_group_id, display_name, release_channel, desired_version, policy, policy_revision, revision,
		created_at, updated_at, maintenance_policy) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, 1, $11, $11, $12)
		RETURNING `+runnerCols,
			r.Org, r.RunnerID, r.ClusterID, r.Zone, r.RunnerGroupID, r.DisplayName, r.ReleaseChannel,
			r.DesiredVersion, jsonArg(r.Policy), r.PolicyRevision, t, jsonArg(r.MaintenancePolicy)))
		return err
	})
	var ae *AlreadyExistsError
	if errors.As(err, &ae) {
		return Runner{}, err
	}
	if err != nil {
		return Runner{}, rn.s.writeErr("runner", "create", err)
	}
	return out, nil
}

// lockClassRunnerID is the lockName class of runner IDs.
const lockClassRunnerID = 1

func (rn runners) IDHolder(ctx context.Context, runnerID string) (string, error) {
	var org string
	err := rn.s.d.queryRow(ctx, `SELECT org_id FROM runners WHERE runner_id = $1
		ORDER BY created_at, org_id LIMIT 1`, runnerID).Scan(&org)
	return org, rn.s.readErr("runner "+runnerID, err)
}

func (rn runners) Get(ctx context.Context, org, runnerID string) (Runner, error) {
	r, err := scanRunner(rn.s.d.queryRow(ctx,
		`SELECT `+runnerCols+` FROM runners WHERE org_id = $1 AND runner_id = $2`, org, runnerID))
	return r, rn.s.readErr("runner", err)
}

func (rn runners) List(ctx context.Context, org string, page Page) ([]Runner, string, error) {
	after := ""
	if page.Token != "" {
		b, err := base64.RawURLEncoding.DecodeString(page.Token)
		if err != nil || len(b) == 0 {
			return nil, "", invalid("page token")
		}
		after = string(b)
	}
	size := pageSize(page.Size)
	rs, err := rn.s.d.query(ctx, `SELECT `+runnerCols+` FROM runners WHERE org_id = $1 AND runner_id > $2
		ORDER BY runner_id LIMIT $3`, org, after, size+1)
	if err != nil {
		return nil, "", fmt.Errorf("list runners: %w", err)
	}
	defer rs.Close()
	var out []Runner
	for rs.Next() {
		r, err := scanRunner(rs)
		if err != nil {
			return nil, "", fmt.Errorf("list runners: %w", err)
		}
		out = append(out, r)
	}
	if err := rs.Err(); err != nil {
		return nil, "", fmt.Errorf("list runners: %w", err)
	}
	next := ""
	if len(out) > size {
		out = out[:size]
		next = base64.RawURLEncoding.EncodeToString([]byte(out[size-1].RunnerID))
	}
	return out, next, nil
}

func pageSize(n int) int {
	switch {
	case n <= 0:
		return DefaultPageSize
	case n > MaxPageSize:
		return MaxPageSize
	}
	return n
}

// conflictOrMissing tells a failed conditional write on a runner apart.
func (rn runners) conflictOrMissing(ctx context.Context, org, runnerID string) error {
	if _, err := rn.Get(ctx, org, runnerID); err != nil {
		return err
	}
	return fmt.Errorf("runner %s: %w", runnerID, ErrConflict)
}

func (rn runners) Update(ctx context.Context, org, runnerID, etag string, u RunnerUpdate) (Runner, error) {
	created, revision, ok := parseEtag(etag)
	if !ok {
		return Runner{}, rn.conflictOrMissing(ctx, org, runnerID)
	}
	if u.ReleaseChannel != nil {
		if err := checkChannel(*u.ReleaseChannel); err != nil {
			return Runner{}, err
		}
	}
	if u.RunnerGroupID != nil && *u.RunnerGroupID == "" {
		return Runner{}, invalid("runner_group_id must not be empty")
	}
	if err := checkPolicy(u.Policy); err != nil {
		return Runner{}, err
	}
	if err := checkMaintenance(u.MaintenancePolicy); err != nil {
		return Runner{}, err
	}
	setMaint := 0
	if u.SetMaintenancePolicy {
		setMaint = 1
	}
	setUpdate, up := 0, UpdateAttempt{}
	if u.LastUpdate != nil {
		if err := checkAttempt(*u.LastUpdate); err != nil {
			return Runner{}, err
		}
		setUpdate, up = 1, *u.LastUpdate
	}
	// One conditional statement: the etag check and the write are atomic. A nil argument
	// keeps the column (COALESCE); a policy write bumps policy_revision.
	policyWrite := 0
	if u.Policy != nil {
		policyWrite = 1
	}
	r, err := scanRunner(rn.s.d.queryRow(ctx, `UPDATE runners SET
		display_name = COALESCE($5, display_name),
		runner_group_id = COALESCE($6, runner_group_id),
		release_channel = COALESCE($7, release_channel),
		desired_version = COALESCE($8, desired_version),
		policy = COALESCE($9, policy),
		policy_revision = policy_revision + $10,
		maintenance_policy = CASE WHEN $12 = 1 THEN $13 ELSE maintenance_policy END,
		update_from_version = CASE WHEN $14 = 1 THEN $15 ELSE update_from_version END,
		update_to_version = CASE WHEN $14 = 1 THEN $16 ELSE update_to_version END,
		update_state = CASE WHEN $14 = 1 THEN $17 ELSE update_state END,
		update_reason = CASE WHEN $14 = 1 THEN $18 ELSE update_reason END,
		update_started_at = CASE WHEN $14 = 1 THEN $19 ELSE update_started_at END,
		update_deadline = CASE WHEN $14 = 1 THEN $20 ELSE update_deadline END,
		update_ended_at = CASE WHEN $14 = 1 THEN $21 ELSE update_ended_at END,
		revision = revision + 1,
		updated_at = $11
		WHERE org_id = $1 AND runner_id = $2 AND revision = $3 AND created_at = $4
		RETURNING `+runnerCols,
		org, runnerID, revision, created, strArg(u.DisplayName), strArg(u.RunnerGroupID),
		strArg(u.ReleaseChannel), strArg(u.DesiredVersion), jsonArg(u.Policy), policyWrite, now(),
		setMaint, jsonArg(u.MaintenancePolicy),
		setUpdate, up.From, up.To, up.State, up.Reason, timeArg(nonZero(up.StartedAt)), timeArg(nonZero(up.Deadline)),
		timeArg(up.EndedAt)))
	if rn.s.d.isNoRows(err) {
		return Runner{}, rn.conflictOrMissing(ctx, org, runnerID)
	}
	if err != nil {
		return Runner{}, rn.s.writeErr("runner", "update", err)
	}
	return r, nil
}

func strArg(s *string) any {
	if s == nil {
		return nil
	}
	return *s
}

// RunnerIDHold is how long a deleted runner's ID stays its organization's (no other
// may create a runner of that ID): the longest lifetime of a certificate naming it (a
// runner certificate's, a year), and a day more.
const RunnerIDHold = 366 * 24 * time.Hour

func (rn runners) Delete(ctx context.Context, org, runnerID, etag string) error {
	q := `DELETE FROM runners WHERE org_id = $1 AND runner_id = $2`
	args := []any{org, runnerID}
	if etag != "" {
		created, revision, ok := parseEtag(etag)
		if !ok {
			return rn.conflictOrMissing(ctx, org, runnerID)
		}
		q += ` AND revision = $3 AND created_at = $4`
		args = append(args, revision, created)
	}
	var n int64
	err := rn.s.d.tx(ctx, func(tq querier) error {
		var err error
		if n, err = tq.exec(ctx, q, args...); err != nil || n == 0 {
			return err
		}
		// Certificates naming the ID outlive the runner: the ID stays this
		// organization's for as long (RunnerIDHold).
		_, err = tq.exec(ctx, `INSERT INTO runner_id_holds (runner_id, org_id, held_until) VALUES ($1, $2, $3)
			ON CONFLICT (runner_id) DO UPDATE SET org_id = excluded.org_id, held_until = excluded.held_until`,
			runnerID, org, utc(now().Add(RunnerIDHold)))
		return err
	})
	if err != nil {
		return fmt.Errorf("delete runner: %w", err)
	}
	if n == 0 {
		return rn.conflictOrMissing(ctx, org, runnerID)
	}
	return nil
}

func (rn runners) RecordHeartbeat(ctx context.Context, org, runnerID string, st RunnerStatus) error {
	if err := checkJSON("capacity", st.Capacity); err != nil {
		return err
	}
	if err := checkJSON("usage", st.Usage); err != nil {
		return err
	}
	if err := checkSelfUpdateFailure(st); err != nil {
		return err
	}
	if err := checkJSON("prepull", st.Prepull); err != nil {
		return err
	}
	if len(st.Prepull) > MaxPrepullLen {
		return invalid("prepull must be at most %d bytes (got %d)", MaxPrepullLen, len(st.Prepull))
	}
	at := now()
	if st.LastHeartbeatAt != nil {
		at = utc(*st.LastHeartbeatAt)
	}
	n, err := rn.s.d.exec(ctx, `UPDATE runners SET last_heartbeat_at = $3, version = $4, ready = $5,
		capacity = $6, usage = $7, self_update = $8, self_update_failed_version = $9, self_update_failure = $10,
		prepull = $11
		WHERE org_id = $1 AND runner_id = $2`,
		org, runnerID, at, st.Version, st.Ready, jsonArg(st.Capacity), jsonArg(st.Usage), st.SelfUpdate,
		st.SelfUpdateFailedVersion, st.SelfUpdateFailure, jsonArg(st.Prepull))
	if err != nil {
		return fmt.Errorf("record heartbeat: %w", err)
	}
	if n == 0 {
		return fmt.Errorf("runner %s: %w", runnerID, ErrNotFound)
	}
	return nil
}

// checkSelfUpdateFailure bounds a heartbeat's self-update failure; a reason needs a version.
func checkSelfUpdateFailure(st RunnerStatus) error {
	switch {
	case len(st.SelfUpdateFailedVersion) > MaxSelfUpdateFailedVersionLen:
		return invalid("self_update_failed_version must be at most %d bytes (got %d)", MaxSelfUpdateFailedVersionLen, len(st.SelfUpdateFailedVersion))
	case len(st.SelfUpdateFailure) > MaxSelfUpdateFailureLen:
		return invalid("self_update_failure must be at most %d bytes (got %d)", MaxSelfUpdateFailureLen, len(st.SelfUpdateFailure))
	case st.SelfUpdateFailure != "" && st.SelfUpdateFailedVersion == "":
		return invalid("self_update_failure needs self_update_failed_version")
	}
	return nil
}

// ---- bootstrap tokens ----

type tokens struct{ s *sqlStore }

func (tk tokens) Create(ctx context.Context, t BootstrapToken) error {
	if err := required("hash", t.Hash, "org", t.Org, "runner_id", t.RunnerID); err != nil {
		return err
	}
	if t.ExpiresAt.IsZero() {
		return invalid("expires_at is required")
	}
	_, err := tk.s.d.exec(ctx, `INSERT INTO bootstrap_tokens (hash, org_id, runner_id, expires_at, created_at)
		VALUES ($1, $2, $3, $4, $5)`, t.Hash, t.Org, t.RunnerID, utc(t.ExpiresAt), now())
	return tk.s.writeErr("bootstrap_token", "create", err)
}

func (tk tokens) Consume(ctx context.Context, hash string) (BootstrapToken, error) {
	var t BootstrapToken
	var expires, created, consumed dbTime
	err := tk.s.d.queryRow(ctx, `UPDATE bootstrap_tokens SET consumed_at = $2
		WHERE hash = $1 AND consumed_at IS NULL AND expires_at > $2
		RETURNING hash, org_id, runner_id, expires_at, created_at, consumed_at`, hash, now()).
		Scan(&t.Hash, &t.Org, &t.RunnerID, &expires, &created, &consumed)
	if tk.s.d.isNoRows(err) {
		return BootstrapToken{}, fmt.Errorf("bootstrap token unknown, used or expired: %w", ErrNotFound)
	}
	if err != nil {
		return BootstrapToken{}, fmt.Errorf("consume bootstrap token: %w", err)
	}
	t.ExpiresAt, t.CreatedAt, t.ConsumedAt = expires.t, created.t, consumed.ptr()
	return t, nil
}

// ---- sandboxes ----

type sandboxes struct{ s *sqlStore }

const sandboxCols = `id, org_id, runner_id, request_id, spec, tags, created_at, state, policy_revision,
	status, updated_at, ended_at, source_template_id, source_template_revision, cpu_millis, memory_bytes`

func scanSandbox(r row) (Sandbox, error) {
	var x Sandbox
	var requestID sql.NullString
	var spec, tags, status dbJSON
	var created, updated, ended dbTime
	err := r.Scan(&x.ID, &x.Org, &x.RunnerID, &requestID, &spec, &tags, &created, &x.State,
		&x.PolicyRevision, &status, &updated, &ended, &x.SourceTemplateID, &x.SourceTemplateRevision, &x.MilliCPU, &x.MemoryBytes)
	if err != nil {
		return Sandbox{}, err
	}
	x.RequestID, x.Spec, x.Status = requestID.String, json.RawMessage(spec), json.RawMessage(status)
	x.CreatedAt, x.UpdatedAt, x.EndedAt = created.t, updated.t, ended.ptr()
	if err := json.Unmarshal(tags, &x.Tags); err != nil {
		return Sandbox{}, fmt.Errorf("sandbox %s tags: %w", x.ID, err)
	}
	if len(x.Tags) == 0 {
		x.Tags = nil
	}
	return x, nil
}

func (sb sandboxes) Create(ctx context.Context, x Sandbox) (Sandbox, error) {
	if err := required("id", x.ID, "org", x.Org, "runner_id", x.RunnerID, "state", x.State); err != nil {
		return Sandbox{}, err
	}
	if x.Spec == nil {
		x.Spec = json.RawMessage("{}")
	}
	if err := checkJSON("spec", x.Spec); err != nil {
		return Sandbox{}, err
	}
	if err := checkJSON("status", x.Status); err != nil {
		return Sandbox{}, err
	}
	var tags []string
	for _, t := range x.Tags {
		if !slices.Contains(tags, t) {
			tags = append(tags, t)
		}
	}
	x.Tags = tags
	tagsJSON, _ := json.Marshal(tags)
	if tags == nil {
		tagsJSON = []byte("[]")
	}
	if x.CreatedAt.IsZero() {
		x.CreatedAt = now()
	}
	x.CreatedAt, x.UpdatedAt = utc(x.CreatedAt), now()
	if x.EndedAt != nil {
		e := utc(*x.EndedAt)
		x.EndedAt = &e
	}
	var requestID any
	if x.RequestID != "" {
		requestID = x.RequestID
	}
	err := sb.s.d.tx(ctx, func(q querier) error {
		if _, err := q.exec(ctx, `INSERT INTO sandboxes (id, org_id, runner_id, request_id, spec, tags, created_at,
			state, policy_revision, status, updated_at, ended_at, source_template_id, source_template_revision, cpu_millis, memory_bytes)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)`,
			x.ID, x.Org, x.RunnerID, requestID, string(x.Spec), string(tagsJSON), x.CreatedAt, x.State,
			x.PolicyRevision, jsonArg(x.Status), x.UpdatedAt, timeArg(x.EndedAt), x.SourceTemplateID, x.SourceTemplateRevision,
			x.MilliCPU, x.MemoryBytes); err != nil {
			return err
		}
		if err := consumeReservation(ctx, q, x); err != nil {
			return err
		}
		for _, t := range tags {
			if _, err := q.exec(ctx, `INSERT INTO sandbox_tags (sandbox_id, tag) VALUES ($1, $2)`, x.ID, t); err != nil {
				return err
			}
		}
		seen := map[string]bool{}
		for _, v := range x.VolumeIDs {
			if seen[v] {
				continue
			}
			seen[v] = true
			if _, err := q.exec(ctx, `INSERT INTO sandbox_volumes (sandbox_id, volume_id) VALUES ($1, $2)`, x.ID, v); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return Sandbox{}, sb.s.writeErr("sandbox", "create", err)
	}
	return x, nil
}

func (sb sandboxes) Get(ctx context.Context, org, id string) (Sandbox, error) {
	x, err := scanSandbox(sb.s.d.queryRow(ctx,
		`SELECT `+sandboxCols+` FROM sandboxes WHERE org_id = $1 AND id = $2`, org, id))
	return x, sb.s.readErr("sandbox", err)
}

func (sb sandboxes) GetByRequestID(ctx context.Context, org, requestID string) (Sandbox, error) {
	if requestID == "" {
		return Sandbox{}, fmt.Errorf("sandbox: %w", ErrNotFound)
	}
	x, err := scanSandbox(sb.s.d.queryRow(ctx,
		`SELECT `+sandboxCols+` FROM sandboxes WHERE org_id = $1 AND request_id = $2`, org, requestID))
	return x, sb.s.readErr("sandbox", err)
}

// sandboxCursor is the (created_at, id) of the last record of a page.
func encodeSandboxCursor(x Sandbox) string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(x.CreatedAt.UnixMicro(), 10) + ":" + x.ID))
}

func decodeSandboxCursor(tok string) (time.Time, string, error) {
	b, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil {
		return time.Time{}, "", invalid("page token")
	}
	ts, id, ok := strings.Cut(string(b), ":")
	us, err := strconv.ParseInt(ts, 10, 64)
	if !ok || err != nil || id == "" {
		return time.Time{}, "", invalid("page token")
	}
	return time.UnixMicro(us).UTC(), id, nil
}

func (sb sandboxes) List(ctx context.Context, org string, f SandboxFilter, page Page) ([]Sandbox, string, error) {
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
	if !f.IncludeTerminal {
		where.WriteString(" AND ended_at IS NULL")
	}
	if len(f.States) > 0 {
		in("state", f.States)
	}
	if len(f.RunnerIDs) > 0 {
		in("runner_id", f.RunnerIDs)
	}
	if len(f.VolumeIDs) > 0 {
		ph := make([]string, len(f.VolumeIDs))
		for i, v := range f.VolumeIDs {
			ph[i] = arg(v)
		}
		fmt.Fprintf(&where, " AND EXISTS (SELECT 1 FROM sandbox_volumes v WHERE v.sandbox_id = sandboxes.id AND v.volume_id IN (%s))", strings.Join(ph, ", "))
	}
	for _, t := range f.Tags {
		fmt.Fprintf(&where, " AND EXISTS (SELECT 1 FROM sandbox_tags t WHERE t.sandbox_id = sandboxes.id AND t.tag = %s)", arg(t))
	}
	cmp, order := ">", "ASC"
	if f.Descending {
		cmp, order = "<", "DESC"
	}
	if page.Token != "" {
		at, id, err := decodeSandboxCursor(page.Token)
		if err != nil {
			return nil, "", err
		}
		a, b := arg(at), arg(id)
		fmt.Fprintf(&where, " AND (created_at %s %s OR (created_at = %s AND id %s %s))", cmp, a, a, cmp, b)
	}
	size := pageSize(page.Size)
	q := fmt.Sprintf(`SELECT %s FROM sandboxes WHERE %s ORDER BY created_at %s, id %s LIMIT %s`,
		sandboxCols, where.String(), order, order, arg(size+1))
	rs, err := sb.s.d.query(ctx, q, args...)
	if err != nil {
		return nil, "", fmt.Errorf("list sandboxes: %w", err)
	}
	defer rs.Close()
	var out []Sandbox
	for rs.Next() {
		x, err := scanSandbox(rs)
		if err != nil {
			return nil, "", fmt.Errorf("list sandboxes: %w", err)
		}
		out = append(out, x)
	}
	if err := rs.Err(); err != nil {
		return nil, "", fmt.Errorf("list sandboxes: %w", err)
	}
	next := ""
	if len(out) > size {
		out = out[:size]
		next = encodeSandboxCursor(out[size-1])
	}
	return out, next, nil
}

func (sb sandboxes) UpdateStatus(ctx context.Context, org, id string, u SandboxStatusUpdate) (Sandbox, error) {
	if err := required("state", u.State); err != nil {
		return Sandbox{}, err
	}
	if err := checkJSON("status", u.Status); err != nil {
		return Sandbox{}, err
	}
	x, err := scanSandbox(sb.s.d.queryRow(ctx, `UPDATE sandboxes SET state = $3,
		status = COALESCE($4, status), ended_at = COALESCE(ended_at, $5), updated_at = $6,
		runner_id = COALESCE(NULLIF($7, ''), runner_id)
		WHERE org_id = $1 AND id = $2 RETURNING `+sandboxCols,
		org, id, u.State, jsonArg(u.Status), timeArg(u.EndedAt), now(), u.RunnerID))
	if err != nil && !sb.s.d.isNoRows(err) {
		return Sandbox{}, sb.s.writeErr("sandbox", "update", err)
	}
	return x, sb.s.readErr("sandbox", err)
}

func (sb sandboxes) DeleteEndedBefore(ctx context.Context, cutoff time.Time) (int64, error) {
	n, err := sb.s.d.exec(ctx, `DELETE FROM sandboxes WHERE ended_at IS NOT NULL AND ended_at < $1`, utc(cutoff))
	if err != nil {
		return 0, fmt.Errorf("delete ended sandboxes: %w", err)
	}
	return n, nil
}
