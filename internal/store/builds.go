package store

import (
	"context"
	"database/sql"
	"fmt"
	"time"
)

// ---- image builds ----

// Builds are the organizations' image builds (sandboxd.build.v1.BuildService) and their
// log events. A build of another organization is ErrNotFound, exactly like a missing one.
type Builds interface {
	// Create inserts b (ID, Org and Record required). *AlreadyExistsError (the ID or the
	// request_id is taken).
	Create(ctx context.Context, b Build) (Build, error)
	// Get returns org's build id.
	Get(ctx context.Context, org, id string) (Build, error)
	// GetByRequestID returns the build the request requestID started.
	GetByRequestID(ctx context.Context, org, requestID string) (Build, error)
	// List pages through org's builds (only template's when template is not ""),
	// newest first. A token this store did not issue is ErrInvalid.
	List(ctx context.Context, org, template string, page Page) ([]Build, string, error)
	// Update replaces org's build id's state and record.
	Update(ctx context.Context, org, id string, state int32, record []byte) (Build, error)
	// AppendEvents stores events as build id's events first, first+1, …: ErrConflict
	// when one of those numbers is taken (events are written by one writer, in order).
	AppendEvents(ctx context.Context, id string, first int64, events [][]byte) error
	// Events returns build id's events after afterSeq, at most limit, in order.
	Events(ctx context.Context, id string, afterSeq int64, limit int) ([]BuildEvent, error)
	// InStates returns at most limit builds of any organization whose state is one of
	// states (a gateway's start-up: the builds it left unfinished), oldest first.
	InStates(ctx context.Context, states []int32, limit int) ([]Build, error)
	// DeleteEnded deletes at most limit builds whose state is one of ended, with their
	// events: first those last updated before before (zero: none by age), then, of each
	// organization, those beyond its newest keep of them by create time (keep 0: no
	// bound). It returns how many it deleted (fewer than limit: nothing else is due).
	// A build in any other state is never deleted.
	DeleteEnded(ctx context.Context, ended []int32, before time.Time, keep, limit int) (int, error)
}

// Build is a stored image build.
type Build struct {
	ID       string
	Org      string
	State    int32  // sandboxd.build.v1.BuildState, for filtering
	Template string // the template display name of a template target ("": none)
	// Record is the sandboxd.build.v1.Build as binary protobuf.
	Record        []byte
	CreateTime    time.Time // set by the store
	UpdateTime    time.Time // set by the store
	RequestID     string    // "" when the request had none
	RequestDigest string
}

// BuildEvent is one stored log event of a build.
type BuildEvent struct {
	Seq   int64
	Event []byte
}

type builds struct{ s *sqlStore }

func (s *sqlStore) Builds() Builds { return builds{s} }

const buildCols = `id, org_id, state, template, record, create_time, update_time, request_id, request_digest`

func scanBuild(r row) (Build, error) {
	var b Build
	var requestID sql.NullString
	var created, updated dbTime
	if err := r.Scan(&b.ID, &b.Org, &b.State, &b.Template, &b.Record, &created, &updated, &requestID, &b.RequestDigest); err != nil {
		return Build{}, err
	}
	if b.Record == nil {
		b.Record = []byte{}
	}
	b.RequestID = requestID.String
	b.CreateTime, b.UpdateTime = created.t, updated.t
	return b, nil
}

func (bs builds) Create(ctx context.Context, b Build) (Build, error) {
	if err := required("id", b.ID, "org", b.Org); err != nil {
		return Build{}, err
	}
	if b.Record == nil {
		return Build{}, invalid("build %s: no record", b.ID)
	}
	b.CreateTime = now()
	b.UpdateTime = b.CreateTime
	var requestID any
	if b.RequestID != "" {
		requestID = b.RequestID
	}
	_, err := bs.s.d.exec(ctx, `INSERT INTO builds (`+buildCols+`) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`,
		b.ID, b.Org, b.State, b.Template, b.Record, b.CreateTime, b.UpdateTime, requestID, b.RequestDigest)
	if err != nil {
		return Build{}, bs.s.writeErr("build", "create", err)
	}
	return b, nil
}

func (bs builds) Get(ctx context.Context, org, id string) (Build, error) {
	b, err := scanBuild(bs.s.d.queryRow(ctx, `SELECT `+buildCols+` FROM builds WHERE org_id = $1 AND id = $2`, org, id))
	return b, bs.s.readErr("build", err)
}

func (bs builds) GetByRequestID(ctx context.Context, org, requestID string) (Build, error) {
	if requestID == "" {
		return Build{}, fmt.Errorf("build: %w", ErrNotFound)
	}
	b, err := scanBuild(bs.s.d.queryRow(ctx, `SELECT `+buildCols+` FROM builds WHERE org_id = $1 AND request_id = $2`, org, requestID))
	return b, bs.s.readErr("build", err)
}

func (bs builds) List(ctx context.Context, org, template string, page Page) ([]Build, string, error) {
	where := "org_id = $1"
	args := []any{org}
	if template != "" {
		args = append(args, template)
		where += fmt.Sprintf(" AND template = $%d", len(args))
	}
	if page.Token != "" {
		at, id, err := decodeSandboxCursor(page.Token) // the same (time, id) form
		if err != nil {
			return nil, "", err
		}
		args = append(args, at, id)
		n := len(args)
		where += fmt.Sprintf(" AND (create_time < $%d OR (create_time = $%d AND id < $%d))", n-1, n-1, n)
	}
	size := pageSize(page.Size)
	args = append(args, size+1)
	rs, err := bs.s.d.query(ctx, fmt.Sprintf(`SELECT %s FROM builds WHERE %s ORDER BY create_time DESC, id DESC LIMIT $%d`,
		buildCols, where, len(args)), args...)
	if err != nil {
		return nil, "", fmt.Errorf("list builds: %w", err)
	}
	defer rs.Close()
	var out []Build
	for rs.Next() {
		b, err := scanBuild(rs)
		if err != nil {
			return nil, "", fmt.Errorf("list builds: %w", err)
		}
		out = append(out, b)
	}
	if err := rs.Err(); err != nil {
		return nil, "", fmt.Errorf("list builds: %w", err)
	}
	next := ""
	if len(out) > size {
		out = out[:size]
		last := out[size-1]
		next = encodeTemplateCursor(Template{ID: last.ID, CreateTime: last.CreateTime})
	}
	return out, next, nil
}

func (bs builds) Update(ctx context.Context, org, id string, state int32, record []byte) (Build, error) {
	if record == nil {
		return Build{}, invalid("build %s: no record", id)
	}
	n, err := bs.s.d.exec(ctx, `UPDATE builds SET state = $1, record = $2, update_time = $3 WHERE org_id = $4 AND id = $5`,
		state, record, now(), org, id)
	if err != nil {
		return Build{}, bs.s.writeErr("build", "update", err)
	}
	if n == 0 {
		return Build{}, fmt.Errorf("build: %w", ErrNotFound)
	}
	return bs.Get(ctx, org, id)
}

func (bs builds) AppendEvents(ctx context.Context, id string, first int64, events [][]byte) error {
	if first < 1 {
		return invalid("build %s: event numbers start at 1, got %d", id, first)
	}
	err := bs.s.d.tx(ctx, func(q querier) error {
		for i, ev := range events {
			if _, err := q.exec(ctx, `INSERT INTO build_events (build_id, seq, event) VALUES ($1, $2, $3)`, id, first+int64(i), ev); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		if _, _, dup := bs.s.d.uniqueViolation(err); dup {
			return fmt.Errorf("build %s events from %d: %w", id, first, ErrConflict)
		}
		return bs.s.writeErr("build event", "append", err)
	}
	return nil
}

func (bs builds) Events(ctx context.Context, id string, afterSeq int64, limit int) ([]BuildEvent, error) {
	if limit <= 0 || limit > 10000 {
		limit = 10000
	}
	rs, err := bs.s.d.query(ctx, `SELECT seq, event FROM build_events WHERE build_id = $1 AND seq > $2 ORDER BY seq LIMIT $3`, id, afterSeq, limit)
	if err != nil {
		return nil, fmt.Errorf("build events: %w", err)
	}
	defer rs.Close()
	var out []BuildEvent
	for rs.Next() {
		var e BuildEvent
		if err := rs.Scan(&e.Seq, &e.Event); err != nil {
			return nil, fmt.Errorf("build events: %w", err)
		}
		out = append(out, e)
	}
	return out, rs.Err()
}

func (bs builds) InStates(ctx context.Context, states []int32, limit int) ([]Build, error) {
	if len(states) == 0 {
		return nil, nil
	}
	if limit <= 0 || limit > 10000 {
		limit = 10000
	}
	var args []any
	in := ""
	for i, st := range states {
		if i > 0 {
			in += ", "
		}
		args = append(args, st)
		in += fmt.Sprintf("$%d", len(args))
	}
	args = append(args, limit)
	rs, err := bs.s.d.query(ctx, fmt.Sprintf(`SELECT %s FROM builds WHERE state IN (%s) ORDER BY create_time, id LIMIT $%d`, buildCols, in, len(args)), args...)
	if err != nil {
		return nil, fmt.Errorf("builds in states: %w", err)
	}
	defer rs.Close()
	var out []Build
	for rs.Next() {
		b, err := scanBuild(rs)
		if err != nil {
			return nil, fmt.Errorf("builds in states: %w", err)
		}
		out = append(out, b)
	}
	return out, rs.Err()
}

// inList is "$first, $first+1, …" for states, appended to args.
func inList(args []any, states []int32) ([]any, string) {
	in := ""
	for i, st := range states {
		if i > 0 {
			in += ", "
		}
		args = append(args, st)
		in += fmt.Sprintf("$%d", len(args))
	}
	return args, in
}

func (bs builds) DeleteEnded(ctx context.Context, ended []int32, before time.Time, keep, limit int) (int, error) {
	if len(ended) == 0 || limit <= 0 {
		return 0, nil
	}
	if keep < 0 {
		return 0, invalid("builds: keep %d", keep)
	}
	// del deletes the builds the subquery (over args) selects, events first.
	del := func(sub string, args []any) (int, error) {
		var n int64
		err := bs.s.d.tx(ctx, func(q querier) error {
			if _, err := q.exec(ctx, `DELETE FROM build_events WHERE build_id IN (`+sub+`)`, args...); err != nil {
				return err
			}
			var err error
			n, err = q.exec(ctx, `DELETE FROM builds WHERE id IN (`+sub+`)`, args...)
			return err
		})
		if err != nil {
			return 0, fmt.Errorf("delete ended builds: %w", err)
		}
		return int(n), nil
	}
	total := 0
	if !before.IsZero() {
		args, in := inList(nil, ended)
		args = append(args, utc(before), limit)
		n, err := del(fmt.Sprintf(`SELECT id FROM builds WHERE state IN (%s) AND update_time < $%d ORDER BY update_time, id LIMIT $%d`, in, len(args)-1, len(args)), args)
		if err != nil {
			return 0, err
		}
		total += n
	}
	if keep == 0 || total >= limit {
		return total, nil
	}
	args, in := inList(nil, ended)
	args = append(args, keep)
	rs, err := bs.s.d.query(ctx, fmt.Sprintf(`SELECT org_id FROM builds WHERE state IN (%s) GROUP BY org_id HAVING COUNT(*) > $%d ORDER BY org_id`, in, len(args)), args...)
	if err != nil {
		return total, fmt.Errorf("organizations over their build bound: %w", err)
	}
	var orgs []string
	for rs.Next() {
		var org string
		if err := rs.Scan(&org); err != nil {
			rs.Close()
			return total, fmt.Errorf("organizations over their build bound: %w", err)
		}
		orgs = append(orgs, org)
	}
	rs.Close()
	if err := rs.Err(); err != nil {
		return total, fmt.Errorf("organizations over their build bound: %w", err)
	}
	for _, org := range orgs {
		if total >= limit {
			break
		}
		args, in := inList([]any{org}, ended)
		args = append(args, limit-total, keep)
		n, err := del(fmt.Sprintf(`SELECT id FROM builds WHERE org_id = $1 AND state IN (%s) ORDER BY create_time DESC, id DESC LIMIT $%d OFFSET $%d`, in, len(args)-1, len(args)), args)
		if err != nil {
			return total, err
		}
		total += n
	}
	return total, nil
}
