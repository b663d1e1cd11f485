package audit

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	auditv1 "github.com/sandboxd/sandboxd/gen/sandboxd/audit/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/store"
)

// Service serves sandboxd.audit.v1.AuditService over the store's audit log: admins
// read their organization's events, the platform organization's admins any
// organization's ("*": all of them).
type Service struct {
	// Store is nil when the server keeps no audit log (UNIMPLEMENTED).
	Store store.Audit
	// PlatformOrg is the organization whose admins read every organization's events.
	PlatformOrg string
}

// AllOrgs is the org_id of every organization (the platform's admins only).
const AllOrgs = "*"

const maxFilterLen = 256

// codes are the gRPC codes a result filter may name.
var codes = func() map[string]bool {
	m := map[string]bool{"OK": true}
	for c := connect.Code(1); c <= 16; c++ {
		m[codeName(c)] = true
	}
	return m
}()

func (s Service) ListAuditEvents(ctx context.Context, req *connect.Request[auditv1.ListAuditEventsRequest]) (*connect.Response[auditv1.ListAuditEventsResponse], error) {
	p, _ := auth.FromContext(ctx)
	if p.Role != auth.RoleAdmin {
		return nil, apierr.New(apierr.PermissionDenied, "reading the audit log needs a SANDBOX_ADMIN key", nil)
	}
	if s.Store == nil {
		return nil, apierr.Newf(apierr.NotImplemented, "this server keeps no audit log (it has no store)")
	}
	m := req.Msg
	platform := s.PlatformOrg != "" && p.Org == s.PlatformOrg
	f := store.AuditFilter{Org: p.Org, KeyID: m.GetKeyId(), Method: m.GetMethod(), Code: strings.ToUpper(m.GetResult())}
	var vs []apierr.Violation
	bad := func(field, desc string) { vs = append(vs, apierr.Violation{Field: field, Description: desc}) }
	switch org := m.GetOrgId(); {
	case org == "" || org == p.Org:
	case !platform:
		return nil, apierr.New(apierr.PermissionDenied, "only an admin key of the platform organization reads another organization's audit log", nil)
	case org == AllOrgs:
		f.Org = ""
	case len(org) > maxFilterLen:
		bad("org_id", fmt.Sprintf("is %d bytes, at most %d", len(org), maxFilterLen))
	default:
		f.Org = org
	}
	if len(f.KeyID) > maxFilterLen {
		bad("key_id", fmt.Sprintf("is %d bytes, at most %d", len(f.KeyID), maxFilterLen))
	}
	if len(f.Method) > maxFilterLen || strings.ContainsFunc(f.Method, func(r rune) bool {
		return !(r == '/' || r == '.' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z')
	}) {
		bad("method", "a procedure (/package.Service/Method) or a method name: letters, digits, '.' and '/', at most 256 bytes")
	}
	if f.Code != "" && !codes[f.Code] {
		bad("result", fmt.Sprintf("%q is not a gRPC code (OK, INVALID_ARGUMENT, PERMISSION_DENIED, ...)", m.GetResult()))
	}
	if m.StartTime != nil {
		if err := m.StartTime.CheckValid(); err != nil {
			bad("start_time", err.Error())
		}
		f.Since = m.StartTime.AsTime()
	}
	if m.EndTime != nil {
		if err := m.EndTime.CheckValid(); err != nil {
			bad("end_time", err.Error())
		}
		f.Until = m.EndTime.AsTime()
	}
	if !f.Since.IsZero() && !f.Until.IsZero() && !f.Until.After(f.Since) {
		bad("end_time", "is not after start_time")
	}
	if n := m.GetPageSize(); n < 0 || n > store.MaxPageSize {
		bad("page_size", fmt.Sprintf("%d: 0 (the default, %d) to %d", n, store.DefaultPageSize, store.MaxPageSize))
	}
	if len(m.GetPageToken()) > 512 {
		bad("page_token", "is not a token this server issued")
	}
	if vs != nil {
		return nil, apierr.Invalid(apierr.InvalidRequest, "invalid audit log query: "+apierr.Describe(vs), vs)
	}
	es, next, err := s.Store.List(ctx, f, store.Page{Size: int(m.GetPageSize()), Token: m.GetPageToken()})
	if errors.Is(err, store.ErrInvalid) {
		vs := []apierr.Violation{{Field: "page_token", Description: "is not a token this server issued"}}
		return nil, apierr.Invalid(apierr.InvalidRequest, "invalid page_token", vs)
	}
	if err != nil {
		return nil, apierr.WithRetry(apierr.Newf(apierr.BackendUnavailable, "read the audit log: %v", err), 5*time.Second)
	}
	out := &auditv1.ListAuditEventsResponse{NextPageToken: next}
	for _, e := range es {
		out.Events = append(out.Events, ToProto(e))
	}
	return connect.NewResponse(out), nil
}

// ToProto is e on the wire.
func ToProto(e store.AuditEvent) *auditv1.AuditEvent {
	return &auditv1.AuditEvent{EventId: e.ID, Time: timestamppb.New(e.At), OrgId: e.Org, KeyId: e.KeyID, SourceAddress: e.Source,
		RequestId: e.RequestID, Method: e.Method, Kind: e.Kind, TargetType: e.TargetType, TargetId: e.TargetID,
		Result: e.Code, Reason: e.Reason, Message: e.Message, ActorOrgId: e.ActorOrg}
}
