package store

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Audit is the audit log (issue 24 point 3): one event per audited call (admin writes and
// sandbox lifecycle calls), appended after the call completes, read by admins newest
// first, pruned by age.
type Audit interface {
	// Append records e (ID and, when zero, At set by the store; every text field cut to
	// MaxAuditField bytes). ErrInvalid without Org, Method or Code.
	Append(ctx context.Context, e AuditEvent) (AuditEvent, error)
	// List returns a page of the events f selects, newest first, and the token of the
	// next page ("" at the end).
	List(ctx context.Context, f AuditFilter, page Page) ([]AuditEvent, string, error)
	// DeleteBefore drops the events (of every organization) older than cutoff and returns
	// how many.
	DeleteBefore(ctx context.Context, cutoff time.Time) (int64, error)
}

// MaxAuditField bounds every text field of an AuditEvent (longer values are cut, on a
// UTF-8 boundary).
const MaxAuditField = 256

// MaxAuditMessage bounds AuditEvent.Message.
const MaxAuditMessage = 1024

// AuditEvent is one audited call.
type AuditEvent struct {
	ID string
	At time.Time
	// Org is the organization acted on: the caller's, or another one's when a platform
	// admin acted on its objects (then ActorOrg is the caller's).
	Org       string
	ActorOrg  string // the caller's organization when it is not Org; "" otherwise
	KeyID     string // the caller's API key
	Source    string // the caller's address
	RequestID string
	Method    string // the procedure, e.g. /coreweave.sandbox.v1.SandboxService/CreateSandbox
	Kind      string // what it does, e.g. sandbox.create
	// TargetType and TargetID name what the call acted on (e.g. sandbox, sb-…).
	TargetType, TargetID string
	Code                 string // the gRPC code: OK, PERMISSION_DENIED, …
	Reason               string // the CWSANDBOX_* reason of an error ("" for OK)
	Message              string // the error's message, cut to MaxAuditMessage
}

// AuditFilter selects events. Zero fields select everything; Org "" is every
// organization (the caller scopes it); Org selects the events acted on that organization
// and those its callers made on others (ActorOrg).
type AuditFilter struct {
	Org          string
	Since, Until time.Time // Since inclusive, Until exclusive
	KeyID        string
	Method       string // exact procedure, or its last element (CreateSandbox; no '%' or '_')
	Code         string
}

type audit struct{ s *sqlStore }

func (s *sqlStore) Audit() Audit { return audit{s} }

const auditCols = `id, at, org_id, key_id, source, request_id, method, kind, target_type, target_id, code, reason, message, actor_org`

func (a audit) Append(ctx context.Context, e AuditEvent) (AuditEvent, error) {
	if err := required("org", e.Org, "method", e.Method, "code", e.Code); err != nil {
		return AuditEvent{}, err
	}
	if e.ActorOrg == e.Org {
		e.ActorOrg = ""
	}
	for _, f := range []*string{&e.Org, &e.ActorOrg, &e.KeyID, &e.Source, &e.RequestID, &e.Method, &e.Kind, &e.TargetType, &e.TargetID, &e.Code, &e.Reason} {
		*f = clip(*f, MaxAuditField)
	}
	e.Message = clip(e.Message, MaxAuditMessage)
	if e.At.IsZero() {
		e.At = now()
	}
	e.At = utc(e.At)
	var b [12]byte
	_, _ = rand.Read(b[:])
	e.ID = hex.EncodeToString(b[:])
	_, err := a.s.d.exec(ctx, `INSERT INTO audit_events (`+auditCols+`) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)`,
		e.ID, e.At, e.Org, e.KeyID, e.Source, e.RequestID, e.Method, e.Kind, e.TargetType, e.TargetID, e.Code, e.Reason, e.Message, e.ActorOrg)
	if err != nil {
		return AuditEvent{}, a.s.writeErr("audit event", "append", err)
	}
	return e, nil
}

func encodeAuditCursor(e AuditEvent) string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(e.At.UnixMicro(), 10) + ":" + e.ID))
}

func (a audit) List(ctx context.Context, f AuditFilter, page Page) ([]AuditEvent, string, error) {
	var where []string
	var args []any
	arg := func(v any) string {
		args = append(args, v)
		return "$" + strconv.Itoa(len(args))
	}
	if f.Org != "" {
		x := arg(f.Org)
		where = append(where, "(org_id = "+x+" OR actor_org = "+x+")")
	}
	if !f.Since.IsZero() {
		where = append(where, "at >= "+arg(utc(f.Since)))
	}
	if !f.Until.IsZero() {
		where = append(where, "at < "+arg(utc(f.Until)))
	}
	if f.KeyID != "" {
		where = append(where, "key_id = "+arg(f.KeyID))
	}
	if f.Method != "" {
		if strings.HasPrefix(f.Method, "/") {
			where = append(where, "method = "+arg(f.Method))
		} else {
			// The last element of the procedure; LIKE's wildcards are dropped from it.
			where = append(where, "method LIKE "+arg("%/"+strings.NewReplacer("%", "", "_", "", "\\", "").Replace(f.Method)))
		}
	}
	if f.Code != "" {
		where = append(where, "code = "+arg(f.Code))
	}
	if page.Token != "" {
		at, id, err := decodeSandboxCursor(page.Token)
		if err != nil {
			return nil, "", err
		}
		x, y := arg(at), arg(id)
		where = append(where, fmt.Sprintf("(at < %s OR (at = %s AND id < %s))", x, x, y))
	}
	size := pageSize(page.Size)
	q := `SELECT ` + auditCols + ` FROM audit_events`
	if len(where) > 0 {
		q += ` WHERE ` + strings.Join(where, " AND ")
	}
	q += ` ORDER BY at DESC, id DESC LIMIT ` + arg(size+1)
	rs, err := a.s.d.query(ctx, q, args...)
	if err != nil {
		return nil, "", fmt.Errorf("list audit events: %w", err)
	}
	defer rs.Close()
	var out []AuditEvent
	for rs.Next() {
		var e AuditEvent
		var at dbTime
		if err := rs.Scan(&e.ID, &at, &e.Org, &e.KeyID, &e.Source, &e.RequestID, &e.Method, &e.Kind, &e.TargetType, &e.TargetID,
			&e.Code, &e.Reason, &e.Message, &e.ActorOrg); err != nil {
			return nil, "", fmt.Errorf("list audit events: %w", err)
		}
		e.At = at.t
		out = append(out, e)
	}
	if err := rs.Err(); err != nil {
		return nil, "", fmt.Errorf("list audit events: %w", err)
	}
	next := ""
	if len(out) > size {
		out = out[:size]
		next = encodeAuditCursor(out[size-1])
	}
	return out, next, nil
}

func (a audit) DeleteBefore(ctx context.Context, cutoff time.Time) (int64, error) {
	n, err := a.s.d.exec(ctx, `DELETE FROM audit_events WHERE at < $1`, utc(cutoff))
	if err != nil {
		return 0, fmt.Errorf("prune audit events: %w", err)
	}
	return n, nil
}
