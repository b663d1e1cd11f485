package audit

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1/sandboxv1connect"
	auditv1 "github.com/sandboxd/sandboxd/gen/sandboxd/audit/v1"
	_ "github.com/sandboxd/sandboxd/gen/sandboxd/build/v1"
	_ "github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1"
	quotav1 "github.com/sandboxd/sandboxd/gen/sandboxd/quota/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/quota/v1/quotav1connect"
	_ "github.com/sandboxd/sandboxd/gen/sandboxd/sandbox/v1"
	_ "github.com/sandboxd/sandboxd/gen/sandboxd/settings/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/metrics"
	"github.com/sandboxd/sandboxd/internal/store"
)

// TestRulesNameRealProcedures: every audited procedure exists, and every target path
// names a string or enum field of its request or response message, so a renamed field
// cannot silently empty the log's targets.
func TestRulesNameRealProcedures(t *testing.T) {
	for proc := range OrgFields {
		if _, ok := Rules[proc]; !ok {
			t.Errorf("OrgFields names %s, which is not audited", proc)
		}
	}
	for proc, r := range Rules {
		svc, method, ok := strings.Cut(strings.TrimPrefix(proc, "/"), "/")
		if !ok {
			t.Errorf("%s: not /package.Service/Method", proc)
			continue
		}
		d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(svc))
		if err != nil {
			t.Errorf("%s: no service %s", proc, svc)
			continue
		}
		md := d.(protoreflect.ServiceDescriptor).Methods().ByName(protoreflect.Name(method))
		if md == nil {
			t.Errorf("%s: no method %s", proc, method)
			continue
		}
		if md.IsStreamingClient() || md.IsStreamingServer() {
			t.Errorf("%s streams: the interceptor audits unary calls only", proc)
		}
		if r.Kind == "" || r.TargetType == "" {
			t.Errorf("%s: kind %q, target type %q", proc, r.Kind, r.TargetType)
		}
		check := func(m protoreflect.MessageDescriptor, paths []string) {
			for _, p := range paths {
				cur := m
				names := strings.Split(p, ".")
				for i, n := range names {
					fd := cur.Fields().ByName(protoreflect.Name(n))
					if fd == nil {
						t.Errorf("%s: %s has no field %s (path %s)", proc, cur.FullName(), n, p)
						break
					}
					if i < len(names)-1 {
						cur = fd.Message()
						if cur == nil {
							t.Errorf("%s: %s.%s is not a message", proc, cur.FullName(), n)
							break
						}
					} else if fd.Kind() != protoreflect.StringKind && fd.Kind() != protoreflect.EnumKind {
						t.Errorf("%s: path %s is a %v, not a string or enum", proc, p, fd.Kind())
					}
				}
			}
		}
		check(md.Input(), r.Request)
		check(md.Output(), r.Response)
		check(md.Input(), OrgFields[proc])
	}
}

func TestConfigValidate(t *testing.T) {
	for _, c := range []struct {
		cfg Config
		ok  bool
	}{
		{Config{Retention: DefaultRetention}, true},
		{Config{Retention: time.Hour}, true},
		{Config{Retention: time.Minute}, false},
		{Config{Retention: 0}, false},
		{Config{Retention: -time.Hour}, false},
		{Config{Retention: DefaultRetention, PruneInterval: -1}, false},
	} {
		if err := c.cfg.Validate(); (err == nil) != c.ok {
			t.Errorf("%+v: %v, want ok %v", c.cfg, err, c.ok)
		}
	}
}

func openStore(t *testing.T) store.Store {
	t.Helper()
	st, err := store.Open(t.Context(), "sqlite://"+filepath.Join(t.TempDir(), "a.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	return st
}

// TestRunPrunesByRetention: events older than the retention go at the first prune and at
// every later one; newer ones stay.
func TestRunPrunesByRetention(t *testing.T) {
	st := openStore(t)
	ctx := t.Context()
	now := time.Now()
	for _, age := range []time.Duration{48 * time.Hour, 25 * time.Hour, time.Hour} {
		if _, err := st.Audit().Append(ctx, store.AuditEvent{Org: "o", Method: "/x.Y/Z", Code: "OK", At: now.Add(-age)}); err != nil {
			t.Fatal(err)
		}
	}
	r := NewRecorder(st.Audit(), Options{Logger: slog.New(slog.DiscardHandler)})
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		r.Run(rctx, Config{Retention: 24 * time.Hour, PruneInterval: 20 * time.Millisecond})
		close(done)
	}()
	count := func() int {
		es, _, err := st.Audit().List(ctx, store.AuditFilter{}, store.Page{})
		if err != nil {
			t.Fatal(err)
		}
		return len(es)
	}
	deadline := time.Now().Add(5 * time.Second)
	for count() != 1 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := count(); n != 1 {
		t.Fatalf("%d events after pruning, want 1", n)
	}
	// A later event that ages past the retention goes at a later prune.
	if _, err := st.Audit().Append(ctx, store.AuditEvent{Org: "o", Method: "/x.Y/Z", Code: "OK", At: now.Add(-30 * time.Hour)}); err != nil {
		t.Fatal(err)
	}
	for count() != 1 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := count(); n != 1 {
		t.Fatalf("%d events after the second prune, want 1", n)
	}
	cancel()
	<-done
}

// failingAudit fails every write.
type failingAudit struct {
	store.Audit
	mu    sync.Mutex
	tries int
}

func (f *failingAudit) Append(context.Context, store.AuditEvent) (store.AuditEvent, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.tries++
	return store.AuditEvent{}, errors.New("disk full")
}

type sandboxes struct {
	sandboxv1connect.UnimplementedSandboxServiceHandler
}

func (sandboxes) CreateSandbox(context.Context, *connect.Request[sandboxv1.CreateSandboxRequest]) (*connect.Response[sandboxv1.Sandbox], error) {
	return connect.NewResponse(&sandboxv1.Sandbox{SandboxId: "sb-1"}), nil
}

func (sandboxes) DeleteSandbox(context.Context, *connect.Request[sandboxv1.DeleteSandboxRequest]) (*connect.Response[sandboxv1.DeleteSandboxResponse], error) {
	return nil, apierr.New(apierr.PermissionDenied, "no", nil)
}

type keys map[string]auth.Principal

func (k keys) Authenticate(key string) (auth.Principal, error) {
	if p, ok := k[key]; ok {
		return p, nil
	}
	return auth.Principal{}, auth.ErrInvalidKey
}

// TestInterceptor: a call's event carries its caller, target (from the response for a
// create), a long x-request-id replaced by a generated one, and a role refusal by the
// authenticating interceptor; a failed write never fails the call.
func TestInterceptor(t *testing.T) {
	st := openStore(t)
	ks := keys{"user": {KeyID: "ku", Org: "acme", Role: auth.RoleUser}}
	serve := func(a store.Audit, require auth.Role) sandboxv1connect.SandboxServiceClient {
		r := NewRecorder(a, Options{Logger: slog.New(slog.DiscardHandler), Source: func(context.Context) string { return "" }})
		mux := http.NewServeMux()
		mux.Handle(sandboxv1connect.NewSandboxServiceHandler(sandboxes{}, connect.WithInterceptors(r.Interceptor(), auth.Interceptor{Auth: ks, Require: require})))
		srv := httptest.NewServer(mux)
		t.Cleanup(srv.Close)
		return sandboxv1connect.NewSandboxServiceClient(http.DefaultClient, srv.URL)
	}
	c := serve(st.Audit(), "")
	req := connect.NewRequest(&sandboxv1.CreateSandboxRequest{})
	req.Header().Set("Authorization", "Bearer user")
	req.Header().Set("X-Request-Id", strings.Repeat("x", 500))
	if _, err := c.CreateSandbox(t.Context(), req); err != nil {
		t.Fatal(err)
	}
	es, _, err := st.Audit().List(t.Context(), store.AuditFilter{}, store.Page{})
	if err != nil || len(es) != 1 {
		t.Fatalf("%v %v", es, err)
	}
	if e := es[0]; e.KeyID != "ku" || e.Org != "acme" || e.TargetID != "sb-1" || e.Code != "OK" || e.Source != "127.0.0.1" || len(e.RequestID) != 32 {
		t.Fatalf("event %+v", e)
	}

	// Refused by role (an admin-only server): recorded with the caller.
	admin := serve(st.Audit(), auth.RoleAdmin)
	dreq := connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: "sb-9", RequestId: "r-9"})
	dreq.Header().Set("Authorization", "Bearer user")
	if _, err := admin.DeleteSandbox(t.Context(), dreq); connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Fatal(err)
	}
	es, _, _ = st.Audit().List(t.Context(), store.AuditFilter{Method: "DeleteSandbox"}, store.Page{})
	if len(es) != 1 || es[0].KeyID != "ku" || es[0].Code != "PERMISSION_DENIED" || es[0].Reason != apierr.PermissionDenied || es[0].TargetID != "sb-9" || es[0].RequestID != "r-9" {
		t.Fatalf("refusal recorded as %+v", es)
	}

	// Caller-controlled text with control sequences (a body's request_id, a target ID)
	// is stored escaped: no terminal escape, tab or newline reaches an admin's screen.
	freq := connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: "sb\x1b]52;c;Zm9v\x07\n2026-01-01\tforged", RequestId: "r\x1b[2J\u202e"})
	freq.Header().Set("Authorization", "Bearer user")
	_, _ = admin.DeleteSandbox(t.Context(), freq)
	es, _, _ = st.Audit().List(t.Context(), store.AuditFilter{Method: "DeleteSandbox"}, store.Page{Size: 10})
	if len(es) != 2 {
		t.Fatalf("%d DeleteSandbox events, want 2", len(es))
	}
	for _, e := range es {
		for _, v := range []string{e.TargetID, e.RequestID, e.Message} {
			if strings.ContainsFunc(v, func(r rune) bool { return !unicode.IsPrint(r) }) {
				t.Errorf("stored with a non-printable rune: %q (%+v)", v, e)
			}
		}
	}
	if got := es[0].TargetID; got != `sb\x1b]52;c;Zm9v\x07\x0a2026-01-01\x09forged` {
		t.Errorf("forged target stored as %q", got)
	}
	if got := es[0].RequestID; got != `r\x1b[2J\u202e` {
		t.Errorf("forged request ID stored as %q", got)
	}

	// The store fails: the call does not.
	fa := &failingAudit{}
	c = serve(fa, "")
	req = connect.NewRequest(&sandboxv1.CreateSandboxRequest{})
	req.Header().Set("Authorization", "Bearer user")
	if res, err := c.CreateSandbox(t.Context(), req); err != nil || res.Msg.GetSandboxId() != "sb-1" {
		t.Fatalf("create with a failing audit store: %v %v", res, err)
	}
	if fa.tries != 1 {
		t.Fatalf("%d writes tried, want 1", fa.tries)
	}
}

func TestPrintable(t *testing.T) {
	for in, want := range map[string]string{
		"":                         "",
		"sb-1 é 日本":                "sb-1 é 日本",
		"a\tb\nc\r":                `a\x09b\x0ac\x0d`,
		"\x1b[31m":                 `\x1b[31m`,
		"bidi\u202eevil":           `bidi\u202eevil`,
		"bad\xffutf8":              `bad\xffutf8`,
		"nul\x00 del\x7f c1\u0085": `nul\x00 del\x7f c1\x85`,
	} {
		if got := Printable(in); got != want {
			t.Errorf("Printable(%q) = %q, want %q", in, got, want)
		}
	}
}

// errAudit fails every write with err.
type errAudit struct {
	store.Audit
	err error
}

func (f errAudit) Append(context.Context, store.AuditEvent) (store.AuditEvent, error) {
	return store.AuditEvent{}, f.err
}

// TestWriteFailureCountedAndLogged: an event the store cannot take is logged at WARN
// (with the call's method and request ID, not its message) and counted by reason.
func TestWriteFailureCountedAndLogged(t *testing.T) {
	m := metrics.New()
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	e := store.AuditEvent{Org: "acme", KeyID: "ku", Method: "/x.Y/Z", RequestID: "r-1", Code: "OK"}
	NewRecorder(errAudit{err: errors.New("disk full")}, Options{Logger: log, Metrics: m}).write(t.Context(), e)
	NewRecorder(errAudit{err: fmt.Errorf("append: %w", context.DeadlineExceeded)}, Options{Logger: log, Metrics: m}).write(t.Context(), e)
	NewRecorder(errAudit{err: errors.New("disk full")}, Options{Logger: log, Metrics: m}).write(t.Context(), e)
	got := map[string]float64{}
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "cwsandbox_audit_write_failures_total" {
			continue
		}
		for _, s := range mf.GetMetric() {
			got[s.GetLabel()[0].GetValue()] = s.GetCounter().GetValue()
		}
	}
	if got[metrics.AuditFailError] != 2 || got[metrics.AuditFailTimeout] != 1 || len(got) != 2 {
		t.Fatalf("cwsandbox_audit_write_failures_total: %v", got)
	}
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	if len(lines) != 3 || !strings.Contains(lines[0], "level=WARN") || !strings.Contains(lines[0], `msg="audit: cannot record a call"`) ||
		!strings.Contains(lines[0], "request_id=r-1") || !strings.Contains(lines[0], `err="disk full"`) {
		t.Fatalf("logs:\n%s", logs.String())
	}
}

type quotas struct {
	quotav1connect.UnimplementedQuotaServiceHandler
}

func (quotas) SetQuota(_ context.Context, req *connect.Request[quotav1.SetQuotaRequest]) (*connect.Response[quotav1.Quota], error) {
	if req.Msg.GetOrgId() == "nope" {
		return nil, apierr.New(apierr.InvalidRequest, "no organization nope", nil)
	}
	return connect.NewResponse(&quotav1.Quota{}), nil
}

// TestPlatformAdminActsOnAnotherOrg: a platform admin's successful call on another
// organization's objects is that organization's event, its actor the platform: that
// organization's admins read it, the platform's admins still do (their own listing);
// the same call by another organization's admin, or a failed one by the platform's,
// stays the caller's.
func TestPlatformAdminActsOnAnotherOrg(t *testing.T) {
	st := openStore(t)
	ks := keys{
		"platform": {KeyID: "kp", Org: "platform", Role: auth.RoleAdmin},
		"acme":     {KeyID: "ka", Org: "acme", Role: auth.RoleAdmin},
	}
	r := NewRecorder(st.Audit(), Options{Logger: slog.New(slog.DiscardHandler), PlatformOrg: "platform"})
	mux := http.NewServeMux()
	mux.Handle(quotav1connect.NewQuotaServiceHandler(quotas{}, connect.WithInterceptors(r.Interceptor(), auth.Interceptor{Auth: ks})))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	c := quotav1connect.NewQuotaServiceClient(http.DefaultClient, srv.URL)
	set := func(key, org string) {
		t.Helper()
		req := connect.NewRequest(&quotav1.SetQuotaRequest{OrgId: org})
		req.Header().Set("Authorization", "Bearer "+key)
		_, _ = c.SetQuota(t.Context(), req)
	}
	set("platform", "acme") // the platform on acme's quota: acme's event
	set("acme", "other")    // not the platform: acme's own
	set("platform", "nope") // failed: the platform's own
	set("platform", "platform")

	svc := Service{Store: st.Audit(), PlatformOrg: "platform"}
	list := func(org string) []*auditv1.AuditEvent {
		t.Helper()
		ctx := auth.WithPrincipal(t.Context(), ks[org])
		res, err := svc.ListAuditEvents(ctx, connect.NewRequest(&auditv1.ListAuditEventsRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		return res.Msg.GetEvents()
	}
	var acme []string
	for _, e := range list("acme") {
		acme = append(acme, e.GetOrgId()+"/"+e.GetActorOrgId()+"/"+e.GetKeyId()+"/"+e.GetTargetId())
	}
	slices.Sort(acme)
	if want := []string{"acme//ka/other", "acme/platform/kp/acme"}; !slices.Equal(acme, want) {
		t.Fatalf("acme's admins read %v, want %v", acme, want)
	}
	var platform []string
	for _, e := range list("platform") {
		platform = append(platform, e.GetOrgId()+"/"+e.GetActorOrgId()+"/"+e.GetTargetId()+"/"+e.GetResult())
	}
	slices.Sort(platform)
	if want := []string{"acme/platform/acme/OK", "platform//nope/INVALID_ARGUMENT", "platform//platform/OK"}; !slices.Equal(platform, want) {
		t.Fatalf("the platform's admins read %v, want %v", platform, want)
	}
}
