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

// ---- sandbox templates ----

// Templates are the organizations' sandbox templates (SandboxTemplateService). A template
// of another organization is ErrNotFound, exactly like a missing one. Deletion is soft:
// DeleteTime is set and the display name is free again.
type Templates interface {
	// Create inserts t (ID, Org, DisplayName and Spec required) with Revision 1 unless
	// the organization already has maxActive templates that are not deleted
	// (ErrLimitExceeded; maxActive <= 0: no limit). *AlreadyExistsError with key
	// KeyDisplayName (a template that is not deleted has the name), KeyRequestID or KeyID.
	Create(ctx context.Context, t Template, maxActive int) (Template, error)
	// Get returns org's template id, deleted or not.
	Get(ctx context.Context, org, id string) (Template, error)
	// GetByName returns org's template named name that is not deleted.
	GetByName(ctx context.Context, org, name string) (Template, error)
	// GetByRequestID returns the template the request requestID created, deleted or not.
	GetByRequestID(ctx context.Context, org, requestID string) (Template, error)
	// List pages through org's templates, oldest first; deleted ones only with
	// includeDeleted. A token this store did not issue is ErrInvalid.
	List(ctx context.Context, org string, includeDeleted bool, page Page) ([]Template, string, error)
	// Update applies u to org's template id if it is not deleted (ErrNotFound
	// otherwise) and its revision is revision (ErrConflict otherwise), incrementing the
	// revision. *AlreadyExistsError with key KeyDisplayName when the new name is taken.
	Update(ctx context.Context, org, id string, revision int64, u TemplateUpdate) (Template, error)
	// Delete marks org's template id deleted; a deleted one is ErrNotFound.
	Delete(ctx context.Context, org, id string) (Template, error)
	// ListWithAttachment returns the templates of every organization that are not
	// deleted and whose attachments mention key (a candidate filter: the caller parses
	// them), at most limit (ErrLimitExceeded beyond), oldest first.
	ListWithAttachment(ctx context.Context, key string, limit int) ([]Template, error)
	// ListLive returns the templates of every organization that are not deleted, at
	// most limit (ErrLimitExceeded beyond, with the oldest limit), oldest first.
	ListLive(ctx context.Context, limit int) ([]Template, error)
}

// Template is a stored sandbox template.
type Template struct {
	ID          string
	Org         string
	DisplayName string
	// Spec is the PartialSandboxSpec as binary protobuf.
	Spec []byte
	// Attachments is the google.protobuf.Struct as JSON; nil when none.
	Attachments []byte
	Revision    int64
	CreateTime  time.Time // set by the store
	UpdateTime  time.Time // set by the store
	DeleteTime  *time.Time
	// CreateUserID is the API key ID of the creator.
	CreateUserID string
	RequestID    string // "" when the create had none
	// RequestDigest identifies the create request (its request_id replayed with another
	// request is a conflict); opaque to the store.
	RequestDigest string
}

// TemplateUpdate holds the fields of a template to change; nil leaves one as it is.
type TemplateUpdate struct {
	DisplayName *string
	Spec        []byte // nil: unchanged
	// Attachments nil: unchanged; SetAttachments with nil Attachments clears them.
	Attachments    []byte
	SetAttachments bool
}

// KeyDisplayName is the key of a taken template display name.
const KeyDisplayName = "display_name"

// ErrLimitExceeded: a count limit would be exceeded.
var ErrLimitExceeded = errors.New("limit exceeded")

type templates struct{ s *sqlStore }

func (s *sqlStore) Templates() Templates { return templates{s} }

const templateCols = `id, org_id, display_name, spec, attachments, revision, create_time, update_time, delete_time,
	create_user_id, request_id, request_digest`

func scanTemplate(r row) (Template, error) {
	var t Template
	var attachments dbJSON
	var requestID sql.NullString
	var created, updated, deleted dbTime
	if err := r.Scan(&t.ID, &t.Org, &t.DisplayName, &t.Spec, &attachments, &t.Revision, &created, &updated, &deleted,
		&t.CreateUserID, &requestID, &t.RequestDigest); err != nil {
		return Template{}, err
	}
	if t.Spec == nil {
		t.Spec = []byte{}
	}
	t.Attachments = []byte(attachments)
	t.RequestID = requestID.String
	t.CreateTime, t.UpdateTime, t.DeleteTime = created.t, updated.t, deleted.ptr()
	return t, nil
}

func (tp templates) Create(ctx context.Context, t Template, maxActive int) (Template, error) {
	if err := required("id", t.ID, "org", t.Org, "display_name", t.DisplayName); err != nil {
		return Template{}, err
	}
	if t.Spec == nil {
		t.Spec = []byte{}
	}
	if err := checkJSON("attachments", t.Attachments); err != nil {
		return Template{}, err
	}
	t.Revision = 1
	t.CreateTime = now()
	t.UpdateTime, t.DeleteTime = t.CreateTime, nil
	var requestID any
	if t.RequestID != "" {
		requestID = t.RequestID
	}
	err := tp.s.d.tx(ctx, func(q querier) error {
		if maxActive > 0 {
			var n int64
			if err := q.queryRow(ctx, `SELECT count(*) FROM templates WHERE org_id = $1 AND delete_time IS NULL`, t.Org).Scan(&n); err != nil {
				return err
			}
			if n >= int64(maxActive) {
				return fmt.Errorf("%w: organization %s has %d templates, at most %d", ErrLimitExceeded, t.Org, n, maxActive)
			}
		}
		_, err := q.exec(ctx, `INSERT INTO templates (`+templateCols+`) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, NULL, $9, $10, $11)`,
			t.ID, t.Org, t.DisplayName, t.Spec, jsonArg(t.Attachments), t.Revision, t.CreateTime, t.UpdateTime,
			t.CreateUserID, requestID, t.RequestDigest)
		return err
	})
	if err != nil {
		if errors.Is(err, ErrLimitExceeded) {
			return Template{}, err
		}
		return Template{}, tp.s.writeErr("template", "create", err)
	}
	return t, nil
}

func (tp templates) Get(ctx context.Context, org, id string) (Template, error) {
	t, err := scanTemplate(tp.s.d.queryRow(ctx, `SELECT `+templateCols+` FROM templates WHERE org_id = $1 AND id = $2`, org, id))
	return t, tp.s.readErr("template", err)
}

func (tp templates) GetByName(ctx context.Context, org, name string) (Template, error) {
	t, err := scanTemplate(tp.s.d.queryRow(ctx,
		`SELECT `+templateCols+` FROM templates WHERE org_id = $1 AND display_name = $2 AND delete_time IS NULL`, org, name))
	return t, tp.s.readErr("template", err)
}

func (tp templates) GetByRequestID(ctx context.Context, org, requestID string) (Template, error) {
	if requestID == "" {
		return Template{}, fmt.Errorf("template: %w", ErrNotFound)
	}
	t, err := scanTemplate(tp.s.d.queryRow(ctx,
		`SELECT `+templateCols+` FROM templates WHERE org_id = $1 AND request_id = $2`, org, requestID))
	return t, tp.s.readErr("template", err)
}

// A template page token is the (create_time, id) of the last template of a page.
func encodeTemplateCursor(t Template) string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(t.CreateTime.UnixMicro(), 10) + ":" + t.ID))
}

func (tp templates) List(ctx context.Context, org string, includeDeleted bool, page Page) ([]Template, string, error) {
	where := "org_id = $1"
	args := []any{org}
	if !includeDeleted {
		where += " AND delete_time IS NULL"
	}
	if page.Token != "" {
		at, id, err := decodeSandboxCursor(page.Token) // the same (time, id) form
		if err != nil {
			return nil, "", err
		}
		args = append(args, at, id)
		where += " AND (create_time > $2 OR (create_time = $2 AND id > $3))"
	}
	size := pageSize(page.Size)
	args = append(args, size+1)
	rs, err := tp.s.d.query(ctx, fmt.Sprintf(`SELECT %s FROM templates WHERE %s ORDER BY create_time, id LIMIT $%d`,
		templateCols, where, len(args)), args...)
	if err != nil {
		return nil, "", fmt.Errorf("list templates: %w", err)
	}
	defer rs.Close()
	var out []Template
	for rs.Next() {
		t, err := scanTemplate(rs)
		if err != nil {
			return nil, "", fmt.Errorf("list templates: %w", err)
		}
		out = append(out, t)
	}
	if err := rs.Err(); err != nil {
		return nil, "", fmt.Errorf("list templates: %w", err)
	}
	next := ""
	if len(out) > size {
		out = out[:size]
		next = encodeTemplateCursor(out[size-1])
	}
	return out, next, nil
}

func (tp templates) Update(ctx context.Context, org, id string, revision int64, u TemplateUpdate) (Template, error) {
	if u.DisplayName != nil && *u.DisplayName == "" {
		return Template{}, invalid("display_name is required")
	}
	if err := checkJSON("attachments", u.Attachments); err != nil {
		return Template{}, err
	}
	var name any
	if u.DisplayName != nil {
		name = *u.DisplayName
	}
	var spec any
	if u.Spec != nil {
		spec = u.Spec
	}
	t, err := scanTemplate(tp.s.d.queryRow(ctx, `UPDATE templates SET
		display_name = COALESCE($4, display_name),
		spec = COALESCE($5, spec),
		attachments = CASE WHEN $6 THEN $7 ELSE attachments END,
		revision = revision + 1, update_time = $8
		WHERE org_id = $1 AND id = $2 AND revision = $3 AND delete_time IS NULL RETURNING `+templateCols,
		org, id, revision, name, spec, u.SetAttachments, jsonArg(u.Attachments), now()))
	if err == nil {
		return t, nil
	}
	if !tp.s.d.isNoRows(err) {
		return Template{}, tp.s.writeErr("template", "update", err)
	}
	cur, gerr := tp.Get(ctx, org, id)
	switch {
	case gerr != nil:
		return Template{}, gerr
	case cur.DeleteTime != nil:
		return Template{}, fmt.Errorf("template %s: %w (deleted)", id, ErrNotFound)
	default:
		return Template{}, fmt.Errorf("template %s at revision %d, not %d: %w", id, cur.Revision, revision, ErrConflict)
	}
}

func (tp templates) Delete(ctx context.Context, org, id string) (Template, error) {
	t, err := scanTemplate(tp.s.d.queryRow(ctx, `UPDATE templates SET delete_time = $3, update_time = $3
		WHERE org_id = $1 AND id = $2 AND delete_time IS NULL RETURNING `+templateCols, org, id, now()))
	return t, tp.s.readErr("template", err)
}

func (tp templates) ListWithAttachment(ctx context.Context, key string, limit int) ([]Template, error) {
	pat := "%" + strings.NewReplacer(`\`, `\\`, "%", `\%`, "_", `\_`).Replace(key) + "%"
	return tp.listAll(ctx, `attachments IS NOT NULL AND CAST(attachments AS TEXT) LIKE $2 ESCAPE '\'`, limit,
		fmt.Sprintf("more than %d templates mention %s", limit, key), pat)
}

func (tp templates) ListLive(ctx context.Context, limit int) ([]Template, error) {
	return tp.listAll(ctx, "1 = 1", limit, fmt.Sprintf("more than %d templates", limit))
}

// listAll lists the templates of every organization that are not deleted and match
// cond (its parameters from $2 on: args), oldest first, at most limit (ErrLimitExceeded
// with over beyond).
func (tp templates) listAll(ctx context.Context, cond string, limit int, over string, args ...any) ([]Template, error) {
	rs, err := tp.s.d.query(ctx, `SELECT `+templateCols+` FROM templates
		WHERE delete_time IS NULL AND `+cond+`
		ORDER BY create_time, id LIMIT $1`, append([]any{limit + 1}, args...)...)
	if err != nil {
		return nil, fmt.Errorf("list templates: %w", err)
	}
	defer rs.Close()
	var out []Template
	for rs.Next() {
		t, err := scanTemplate(rs)
		if err != nil {
			return nil, fmt.Errorf("list templates: %w", err)
		}
		out = append(out, t)
	}
	if err := rs.Err(); err != nil {
		return nil, fmt.Errorf("list templates: %w", err)
	}
	if len(out) > limit {
		return out[:limit], fmt.Errorf("%w: %s", ErrLimitExceeded, over)
	}
	return out, nil
}
