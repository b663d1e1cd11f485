package gateway

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1/sandboxv1connect"
	auditv1 "github.com/sandboxd/sandboxd/gen/sandboxd/audit/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/audit/v1/auditv1connect"
	quotav1 "github.com/sandboxd/sandboxd/gen/sandboxd/quota/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/quota/v1/quotav1connect"
	statev1 "github.com/sandboxd/sandboxd/gen/sandboxd/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/sandbox/v1/statev1connect"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime/runtimetest"
	"github.com/sandboxd/sandboxd/internal/store"
)

// TestAuditLog: over the gateway's handler with a store (SQLite, and PostgreSQL when
// available), every audited call appears exactly once with its caller, organization,
// source address, request ID, target and result, a refusal included, while reads do not
// appear; a user key cannot read the log; another organization's admin sees none of it;
// the platform's admins see every organization's; REST serves it too.
func TestAuditLog(t *testing.T) {
	dsns := map[string]string{"sqlite": "sqlite://" + filepath.Join(t.TempDir(), "audit.db")}
	if dsn := quotaPostgres(t); dsn != "" {
		dsns["postgres"] = dsn
	}
	for name, dsn := range dsns {
		t.Run(name, func(t *testing.T) { testAuditLog(t, dsn) })
	}
}

func testAuditLog(t *testing.T, dsn string) {
	ctx := t.Context()
	st, err := store.Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	for _, o := range []string{"acme", "other", "platform"} {
		if _, err := st.Orgs().Create(ctx, store.Org{ID: o, Name: o}); err != nil {
			t.Fatal(err)
		}
	}
	be := runtimetest.NewFake()
	t.Cleanup(be.Close)
	rr, err := runner.New(context.Background(), runner.Config{Backend: be, DataDir: t.TempDir(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rr.Close)
	keys, err := auth.OpenKeyring(filepath.Join(t.TempDir(), "keys.json"))
	if err != nil {
		t.Fatal(err)
	}
	mk := func(org string, role auth.Role) (string, auth.Principal) {
		k, p, err := keys.Create(org, role, org)
		if err != nil {
			t.Fatal(err)
		}
		return k, p
	}
	userKey, user := mk("acme", auth.RoleUser)
	adminKey, admin := mk("acme", auth.RoleAdmin)
	otherAdminKey, _ := mk("other", auth.RoleAdmin)
	platformKey, _ := mk("platform", auth.RoleAdmin)
	s, err := New(Config{Auth: keys, Runners: []runner.Handle{runner.NewLocal("r1", rr)}, Index: st.Sandboxes(), Orgs: st.Orgs(),
		Logger: slog.New(slog.DiscardHandler), Quota: QuotaOptions{Store: st.Quotas(), PlatformOrg: "platform"}, Audit: AuditOptions{Store: st.Audit(), PlatformOrg: "platform"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	sc := sandboxv1connect.NewSandboxServiceClient(http.DefaultClient, srv.URL)
	lc := statev1connect.NewSandboxStateServiceClient(http.DefaultClient, srv.URL)
	qc := quotav1connect.NewQuotaServiceClient(http.DefaultClient, srv.URL)
	ac := auditv1connect.NewAuditServiceClient(http.DefaultClient, srv.URL)
	as := func(r interface{ Header() http.Header }, key string) { r.Header().Set("Authorization", "Bearer "+key) }

	// Audited: a create with a request_id, a delete with an x-request-id header, a
	// lifetime update of a missing sandbox (NOT_FOUND), a quota set refused
	// (PERMISSION_DENIED: not the platform organization). Not audited: a read, and a call
	// without a valid key.
	creq := connect.NewRequest(&sandboxv1.CreateSandboxRequest{RequestId: "req-create-1", Sandbox: &sandboxv1.Sandbox{Spec: &sandboxv1.SandboxSpec{
		Containers: []*sandboxv1.Container{{Name: "main", Image: "busybox"}}}}})
	as(creq, userKey)
	cres, err := sc.CreateSandbox(ctx, creq)
	if err != nil {
		t.Fatal(err)
	}
	id := cres.Msg.GetSandboxId()
	greq := connect.NewRequest(&sandboxv1.GetSandboxRequest{SandboxId: id})
	as(greq, userKey)
	if _, err := sc.GetSandbox(ctx, greq); err != nil {
		t.Fatal(err)
	}
	dreq := connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: id})
	as(dreq, userKey)
	dreq.Header().Set("X-Request-Id", "hdr-delete-7")
	if _, err := sc.DeleteSandbox(ctx, dreq); err != nil {
		t.Fatal(err)
	}
	lreq := connect.NewRequest(&statev1.UpdateSandboxLifetimeRequest{SandboxId: "sb-missing", Change: &statev1.UpdateSandboxLifetimeRequest_ExtendBySeconds{ExtendBySeconds: 60}})
	as(lreq, userKey)
	if _, err := lc.UpdateSandboxLifetime(ctx, lreq); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("lifetime of a missing sandbox: %v, want NOT_FOUND", err)
	}
	one := int64(1)
	qreq := connect.NewRequest(&quotav1.SetQuotaRequest{OrgId: "acme", Limits: &quotav1.QuotaLimits{MaxSandboxes: &one}})
	as(qreq, adminKey)
	if _, err := qc.SetQuota(ctx, qreq); connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Fatalf("SetQuota by acme's admin: %v, want a refusal", err)
	}
	anon := connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: id})
	anon.Header().Set("Authorization", "Bearer sbx_nope_nope")
	if _, err := sc.DeleteSandbox(ctx, anon); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("delete without a valid key: %v", err)
	}

	list := func(key string, m *auditv1.ListAuditEventsRequest) ([]*auditv1.AuditEvent, error) {
		req := connect.NewRequest(m)
		as(req, key)
		res, err := ac.ListAuditEvents(ctx, req)
		if err != nil {
			return nil, err
		}
		return res.Msg.GetEvents(), nil
	}
	es, err := list(adminKey, &auditv1.ListAuditEventsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	byMethod := map[string][]*auditv1.AuditEvent{}
	for _, e := range es {
		byMethod[e.GetMethod()] = append(byMethod[e.GetMethod()], e)
	}
	if len(es) != 4 {
		for _, e := range es {
			t.Logf("event %v", e)
		}
		t.Fatalf("acme's audit log holds %d events, want 4 (create, delete, lifetime, quota)", len(es))
	}
	want := func(method, key, target, result, reason, requestID string) {
		t.Helper()
		got := byMethod[method]
		if len(got) != 1 {
			t.Fatalf("%s: %d events, want exactly 1", method, len(got))
		}
		e := got[0]
		if e.GetOrgId() != "acme" || e.GetKeyId() != key || e.GetTargetId() != target || e.GetResult() != result || e.GetReason() != reason ||
			e.GetSourceAddress() != "127.0.0.1" || e.GetTime().AsTime().Before(time.Now().Add(-time.Minute)) {
			t.Errorf("%s: %v", method, e)
		}
		if requestID != "" && e.GetRequestId() != requestID || e.GetRequestId() == "" {
			t.Errorf("%s: request_id %q, want %q", method, e.GetRequestId(), requestID)
		}
	}
	want("/coreweave.sandbox.v1.SandboxService/CreateSandbox", user.KeyID, id, "OK", "", "req-create-1")
	want("/coreweave.sandbox.v1.SandboxService/DeleteSandbox", user.KeyID, id, "OK", "", "hdr-delete-7")
	want("/sandboxd.sandbox.v1.SandboxStateService/UpdateSandboxLifetime", user.KeyID, "sb-missing", "NOT_FOUND", apierr.SandboxNotFound, "")
	want("/sandboxd.quota.v1.QuotaService/SetQuota", admin.KeyID, "acme", "PERMISSION_DENIED", apierr.PermissionDenied, "")
	if byMethod["/coreweave.sandbox.v1.SandboxService/CreateSandbox"][0].GetKind() != "sandbox.create" {
		t.Errorf("create's kind: %v", byMethod["/coreweave.sandbox.v1.SandboxService/CreateSandbox"][0])
	}

	// Filters and pages.
	if es, err := list(adminKey, &auditv1.ListAuditEventsRequest{Result: "OK", KeyId: user.KeyID}); err != nil || len(es) != 2 {
		t.Errorf("OK calls of the user key: %d, %v; want 2", len(es), err)
	}
	if es, err := list(adminKey, &auditv1.ListAuditEventsRequest{Method: "SetQuota"}); err != nil || len(es) != 1 {
		t.Errorf("SetQuota calls: %d, %v; want 1", len(es), err)
	}
	req := connect.NewRequest(&auditv1.ListAuditEventsRequest{PageSize: 3})
	as(req, adminKey)
	p1, err := ac.ListAuditEvents(ctx, req)
	if err != nil || len(p1.Msg.GetEvents()) != 3 || p1.Msg.GetNextPageToken() == "" {
		t.Fatalf("page 1: %v %v", p1, err)
	}
	if es, err := list(adminKey, &auditv1.ListAuditEventsRequest{PageSize: 3, PageToken: p1.Msg.GetNextPageToken()}); err != nil || len(es) != 1 {
		t.Errorf("page 2: %d, %v; want 1", len(es), err)
	}
	for _, bad := range []struct {
		m     *auditv1.ListAuditEventsRequest
		field string
	}{
		{&auditv1.ListAuditEventsRequest{Result: "NOPE"}, "result"},
		{&auditv1.ListAuditEventsRequest{PageSize: 5000}, "page_size"},
		{&auditv1.ListAuditEventsRequest{Method: "Create%"}, "method"},
		{&auditv1.ListAuditEventsRequest{PageToken: "garbage!"}, "page_token"},
	} {
		_, err := list(adminKey, bad.m)
		if vs := apierr.Violations(err); connect.CodeOf(err) != connect.CodeInvalidArgument || len(vs) != 1 || vs[0].Field != bad.field {
			t.Errorf("%v: %v, want INVALID_ARGUMENT on %s", bad.m, err, bad.field)
		}
	}

	// Who reads it.
	if _, err := list(userKey, &auditv1.ListAuditEventsRequest{}); connect.CodeOf(err) != connect.CodePermissionDenied || apierr.Reason(err) != apierr.PermissionDenied {
		t.Errorf("a user key read the audit log: %v", err)
	}
	if es, err := list(otherAdminKey, &auditv1.ListAuditEventsRequest{}); err != nil || len(es) != 0 {
		t.Errorf("another organization's admin sees %d events, %v", len(es), err)
	}
	if _, err := list(otherAdminKey, &auditv1.ListAuditEventsRequest{OrgId: "acme"}); connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Errorf("another organization's admin asked for acme's: %v", err)
	}
	if _, err := list(otherAdminKey, &auditv1.ListAuditEventsRequest{OrgId: "*"}); connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Errorf("another organization's admin asked for every one: %v", err)
	}
	if es, err := list(platformKey, &auditv1.ListAuditEventsRequest{OrgId: "acme"}); err != nil || len(es) != 4 {
		t.Errorf("the platform's admin reads acme's: %d, %v", len(es), err)
	}
	if es, err := list(platformKey, &auditv1.ListAuditEventsRequest{OrgId: "*"}); err != nil || len(es) != 4 {
		t.Errorf("the platform's admin reads every one: %d, %v", len(es), err)
	}

	// REST: GET /v1/auditEvents.
	hreq, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/v1/auditEvents?result=OK", nil)
	hreq.Header.Set("Authorization", "Bearer "+adminKey)
	hres, err := http.DefaultClient.Do(hreq)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(hres.Body)
	_ = hres.Body.Close()
	var doc struct {
		Events []struct {
			Method string `json:"method"`
			Result string `json:"result"`
		} `json:"events"`
	}
	if hres.StatusCode != http.StatusOK || json.Unmarshal(body, &doc) != nil || len(doc.Events) != 2 || doc.Events[0].Result != "OK" {
		t.Errorf("REST: %d %s", hres.StatusCode, body)
	}
	hreq.Header.Set("Authorization", "Bearer "+userKey)
	if hres, err := http.DefaultClient.Do(hreq); err != nil || hres.StatusCode != http.StatusForbidden {
		t.Errorf("REST with a user key: %v %v", hres, err)
	} else {
		_ = hres.Body.Close()
	}
}

// TestAuditLogREST: a call through REST transcoding is recorded once, like its gRPC form.
func TestAuditLogREST(t *testing.T) {
	ctx := t.Context()
	st, err := store.Open(ctx, "sqlite://"+filepath.Join(t.TempDir(), "audit.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	if _, err := st.Orgs().Create(ctx, store.Org{ID: "acme", Name: "acme"}); err != nil {
		t.Fatal(err)
	}
	be := runtimetest.NewFake()
	t.Cleanup(be.Close)
	rr, err := runner.New(context.Background(), runner.Config{Backend: be, DataDir: t.TempDir(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rr.Close)
	keys, err := auth.OpenKeyring(filepath.Join(t.TempDir(), "keys.json"))
	if err != nil {
		t.Fatal(err)
	}
	key, p, err := keys.Create("acme", auth.RoleUser, "u")
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Config{Auth: keys, Runners: []runner.Handle{runner.NewLocal("r1", rr)}, Index: st.Sandboxes(), Orgs: st.Orgs(),
		Logger: slog.New(slog.DiscardHandler), Audit: AuditOptions{Store: st.Audit()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	do := func(method, path, body string) []byte {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, method, srv.URL+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Content-Type", "application/json")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		if res.StatusCode != http.StatusOK {
			t.Fatalf("%s %s: HTTP %d %s", method, path, res.StatusCode, b)
		}
		return b
	}
	var created struct {
		SandboxID string `json:"sandboxId"`
	}
	if err := json.Unmarshal(do("POST", "/v1/sandboxes?requestId=rest-1", `{"spec":{"containers":[{"name":"main","image":"busybox"}]}}`), &created); err != nil || created.SandboxID == "" {
		t.Fatalf("create: %v", err)
	}
	do("DELETE", "/v1/sandboxes/"+created.SandboxID, "")
	es, _, err := st.Audit().List(ctx, store.AuditFilter{Org: "acme"}, store.Page{})
	if err != nil || len(es) != 2 {
		t.Fatalf("%d events, %v; want 2: %+v", len(es), err, es)
	}
	del, cr := es[0], es[1]
	if cr.Kind != "sandbox.create" || cr.RequestID != "rest-1" || cr.TargetID != created.SandboxID || cr.KeyID != p.KeyID || cr.Code != "OK" {
		t.Errorf("create: %+v", cr)
	}
	if del.Kind != "sandbox.delete" || del.TargetID != created.SandboxID || del.Code != "OK" {
		t.Errorf("delete: %+v", del)
	}
}
