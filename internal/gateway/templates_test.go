package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/fieldmaskpb"
	"google.golang.org/protobuf/types/known/structpb"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1/sandboxv1connect"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/store"
)

// newTemplateGateway is a gateway over runners with its index and templates in a SQLite
// store under dir; called again on the same dir it is a restarted gateway.
func newTemplateGateway(t *testing.T, dir string, runners ...runner.Handle) *Server {
	t.Helper()
	ctx := t.Context()
	st, err := store.Open(ctx, filepath.Join(dir, "sandboxd.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	if _, err := st.Orgs().Get(ctx, testOrg); err != nil {
		if _, err := st.Orgs().Create(ctx, store.Org{ID: testOrg, Name: testOrg}); err != nil {
			t.Fatal(err)
		}
	}
	keys, err := auth.OpenKeyring(filepath.Join(dir, "keys.json"))
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Config{Auth: keys, Runners: runners, Index: st.Sandboxes(), Orgs: st.Orgs(), Templates: st.Templates(), Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

func tmplAdmin(org string) context.Context {
	return auth.WithPrincipal(context.Background(), auth.Principal{KeyID: "admin-" + org, Org: org, Role: auth.RoleAdmin})
}

func tmplUser(org string) context.Context {
	return auth.WithPrincipal(context.Background(), auth.Principal{KeyID: "user-" + org, Org: org, Role: auth.RoleUser})
}

func pyTemplate(name string) *sandboxv1.SandboxTemplate {
	return &sandboxv1.SandboxTemplate{DisplayName: name, Spec: &sandboxv1.PartialSandboxSpec{
		Containers:         []*sandboxv1.PartialContainer{{Name: "main", Image: "python:3.11", Command: "sleep", Args: []string{"inf"}}},
		Tags:               []string{"tmpl"},
		MaxLifetimeSeconds: 600,
	}}
}

func createTemplate(ctx context.Context, s *Server, t *sandboxv1.SandboxTemplate, requestID string) (*sandboxv1.SandboxTemplate, error) {
	res, err := s.CreateSandboxTemplate(ctx, connect.NewRequest(&sandboxv1.CreateSandboxTemplateRequest{SandboxTemplate: t, RequestId: requestID}))
	if err != nil {
		return nil, err
	}
	return res.Msg, nil
}

func getTemplate(ctx context.Context, s *Server, id string, showDeleted bool) (*sandboxv1.SandboxTemplate, error) {
	res, err := s.GetSandboxTemplate(ctx, connect.NewRequest(&sandboxv1.GetSandboxTemplateRequest{SandboxTemplateId: id, ShowDeleted: showDeleted}))
	if err != nil {
		return nil, err
	}
	return res.Msg, nil
}

func updateTemplate(ctx context.Context, s *Server, id string, t *sandboxv1.SandboxTemplate, paths ...string) (*sandboxv1.SandboxTemplate, error) {
	req := &sandboxv1.UpdateSandboxTemplateRequest{SandboxTemplateId: id, SandboxTemplate: t}
	if paths != nil {
		req.UpdateMask = &fieldmaskpb.FieldMask{Paths: paths}
	}
	res, err := s.UpdateSandboxTemplate(ctx, connect.NewRequest(req))
	if err != nil {
		return nil, err
	}
	return res.Msg, nil
}

func deleteTemplate(ctx context.Context, s *Server, id string) error {
	_, err := s.DeleteSandboxTemplate(ctx, connect.NewRequest(&sandboxv1.DeleteSandboxTemplateRequest{SandboxTemplateId: id}))
	return err
}

// wantTmplErr fails unless err has code and reason (and, when field is set, a violation of it).
func wantTmplErr(t *testing.T, err error, code connect.Code, reason, field string) {
	t.Helper()
	if err == nil || connect.CodeOf(err) != code || apierr.Reason(err) != reason {
		t.Fatalf("err = %v (%s, %q), want %s %s", err, connect.CodeOf(err), apierr.Reason(err), code, reason)
	}
	if field == "" {
		return
	}
	for _, v := range apierr.Violations(err) {
		if v.Field == field {
			return
		}
	}
	t.Fatalf("err = %v: no violation of %s (%v)", err, field, apierr.Violations(err))
}

func TestTemplateCRUD(t *testing.T) {
	s := newTemplateGateway(t, t.TempDir(), &acceptingRunner{id: "r1"})
	admin, user := tmplAdmin(testOrg), tmplUser(testOrg)

	_, err := createTemplate(user, s, pyTemplate("py"), "")
	wantTmplErr(t, err, connect.CodePermissionDenied, apierr.PermissionDenied, "")
	tp, err := createTemplate(admin, s, pyTemplate("py"), "")
	if err != nil {
		t.Fatal(err)
	}
	if tp.GetRevision() != 1 || tp.GetCreateUserId() != "admin-"+testOrg || tp.GetRequiresCks() || tp.GetDeleted() || tp.GetCreateTime() == nil ||
		len(tp.GetSandboxTemplateId()) != 36 || strings.ToLower(tp.GetSandboxTemplateId()) != tp.GetSandboxTemplateId() {
		t.Fatalf("created = %v", tp)
	}
	// Reads: any key of the organization, by ID or by name.
	for _, key := range []string{tp.GetSandboxTemplateId(), "py", strings.ToUpper(tp.GetSandboxTemplateId())} {
		got, err := getTemplate(user, s, key, false)
		if err != nil || got.GetSandboxTemplateId() != tp.GetSandboxTemplateId() || got.GetSpec().GetContainers()[0].GetImage() != "python:3.11" {
			t.Fatalf("get %q = %v, %v", key, got, err)
		}
	}
	_, err = createTemplate(admin, s, pyTemplate("py"), "")
	wantTmplErr(t, err, connect.CodeAlreadyExists, apierr.AlreadyExists, "sandbox_template.display_name")

	// Update: user refused; a spec field replaced alone; the revision counts.
	_, err = updateTemplate(user, s, "py", &sandboxv1.SandboxTemplate{DisplayName: "x"}, "display_name")
	wantTmplErr(t, err, connect.CodePermissionDenied, apierr.PermissionDenied, "")
	up, err := updateTemplate(admin, s, "py", &sandboxv1.SandboxTemplate{Spec: &sandboxv1.PartialSandboxSpec{Tags: []string{"new"}}}, "spec.tags")
	if err != nil || up.GetRevision() != 2 || up.GetSpec().GetTags()[0] != "new" || up.GetSpec().GetMaxLifetimeSeconds() != 600 ||
		len(up.GetSpec().GetContainers()) != 1 || !up.GetUpdateTime().AsTime().After(up.GetCreateTime().AsTime().Add(-1)) {
		t.Fatalf("update spec.tags = %v, %v", up, err)
	}
	// A masked spec field absent from the request clears it.
	up, err = updateTemplate(admin, s, "py", &sandboxv1.SandboxTemplate{Spec: &sandboxv1.PartialSandboxSpec{}}, "spec.tags")
	if err != nil || up.GetRevision() != 3 || up.GetSpec().GetTags() != nil {
		t.Fatalf("clear spec.tags = %v, %v", up, err)
	}
	// Stale revision: ABORTED naming both.
	_, err = updateTemplate(admin, s, tp.GetSandboxTemplateId(), &sandboxv1.SandboxTemplate{DisplayName: "py2", Revision: 1}, "display_name")
	wantTmplErr(t, err, connect.CodeAborted, apierr.EtagMismatch, "")
	if !strings.Contains(err.Error(), "revision 3, not 1") {
		t.Errorf("etag message: %v", err)
	}
	up, err = updateTemplate(admin, s, tp.GetSandboxTemplateId(), &sandboxv1.SandboxTemplate{DisplayName: "py2", Revision: 3,
		Attachments: &structpb.Struct{Fields: map[string]*structpb.Value{"k": structpb.NewStringValue("v")}}}, "display_name", "attachments")
	if err != nil || up.GetDisplayName() != "py2" || up.GetRevision() != 4 || up.GetAttachments().GetFields()["k"].GetStringValue() != "v" {
		t.Fatalf("rename = %v, %v", up, err)
	}
	// Whole update (empty mask): every settable field, so a missing spec empties it.
	up, err = updateTemplate(admin, s, "py2", &sandboxv1.SandboxTemplate{DisplayName: "py3"})
	if err != nil || up.GetDisplayName() != "py3" || len(up.GetSpec().GetContainers()) != 0 || up.GetAttachments() != nil {
		t.Fatalf("whole update = %v, %v", up, err)
	}
	for _, bad := range []string{"revision", "create_time", "sandbox_template_id", "deleted", "nope", "spec.nope", "spec.containers.image"} {
		_, err = updateTemplate(admin, s, "py3", &sandboxv1.SandboxTemplate{DisplayName: "x"}, bad)
		wantTmplErr(t, err, connect.CodeInvalidArgument, apierr.InvalidRequest, "update_mask")
		if !strings.Contains(err.Error(), bad) {
			t.Errorf("mask %q: %v", bad, err)
		}
	}

	// Soft delete: hidden unless show_deleted; twice NOT_FOUND; the name is free again.
	if err := deleteTemplate(user, s, "py3"); connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Fatalf("user delete: %v", err)
	}
	if err := deleteTemplate(admin, s, "py3"); err != nil {
		t.Fatal(err)
	}
	_, err = getTemplate(user, s, tp.GetSandboxTemplateId(), false)
	wantTmplErr(t, err, connect.CodeNotFound, apierr.TemplateNotFound, "")
	got, err := getTemplate(user, s, tp.GetSandboxTemplateId(), true)
	if err != nil || !got.GetDeleted() || got.GetDeleteTime() == nil {
		t.Fatalf("show_deleted = %v, %v", got, err)
	}
	wantTmplErr(t, deleteTemplate(admin, s, tp.GetSandboxTemplateId()), connect.CodeNotFound, apierr.TemplateNotFound, "")
	_, err = updateTemplate(admin, s, tp.GetSandboxTemplateId(), &sandboxv1.SandboxTemplate{DisplayName: "z"}, "display_name")
	wantTmplErr(t, err, connect.CodeNotFound, apierr.TemplateNotFound, "")
	again, err := createTemplate(admin, s, pyTemplate("py3"), "")
	if err != nil || again.GetSandboxTemplateId() == tp.GetSandboxTemplateId() {
		t.Fatalf("name reuse = %v, %v", again, err)
	}
	list, err := s.ListSandboxTemplates(user, connect.NewRequest(&sandboxv1.ListSandboxTemplatesRequest{}))
	if err != nil || len(list.Msg.GetSandboxTemplates()) != 1 {
		t.Fatalf("list = %v, %v", list, err)
	}
	list, err = s.ListSandboxTemplates(user, connect.NewRequest(&sandboxv1.ListSandboxTemplatesRequest{ShowDeleted: true}))
	if err != nil || len(list.Msg.GetSandboxTemplates()) != 2 {
		t.Fatalf("list show_deleted = %v, %v", list, err)
	}
}

func TestTemplateOrgIsolation(t *testing.T) {
	s := newTemplateGateway(t, t.TempDir(), &acceptingRunner{id: "r1"})
	tp, err := createTemplate(tmplAdmin(testOrg), s, pyTemplate("py"), "")
	if err != nil {
		t.Fatal(err)
	}
	other := tmplAdmin("org-b")
	for _, key := range []string{tp.GetSandboxTemplateId(), "py"} {
		_, err := getTemplate(other, s, key, true)
		wantTmplErr(t, err, connect.CodeNotFound, apierr.TemplateNotFound, "")
		_, err = updateTemplate(other, s, key, &sandboxv1.SandboxTemplate{DisplayName: "mine"}, "display_name")
		wantTmplErr(t, err, connect.CodeNotFound, apierr.TemplateNotFound, "")
		wantTmplErr(t, deleteTemplate(other, s, key), connect.CodeNotFound, apierr.TemplateNotFound, "")
		_, err = s.CreateSandboxFromTemplate(other, connect.NewRequest(&sandboxv1.CreateSandboxFromTemplateRequest{TemplateId: key}))
		wantTmplErr(t, err, connect.CodeNotFound, apierr.TemplateNotFound, "")
	}
	list, err := s.ListSandboxTemplates(other, connect.NewRequest(&sandboxv1.ListSandboxTemplatesRequest{ShowDeleted: true}))
	if err != nil || len(list.Msg.GetSandboxTemplates()) != 0 {
		t.Fatalf("other org's list = %v, %v", list, err)
	}
	// Its own template of the same name is its own.
	if _, err := createTemplate(other, s, pyTemplate("py"), ""); err != nil {
		t.Fatal(err)
	}
}

func TestTemplateValidation(t *testing.T) {
	s := newTemplateGateway(t, t.TempDir(), &acceptingRunner{id: "r1"})
	admin := tmplAdmin(testOrg)
	for _, name := range []string{"", " lead", "trail ", strings.Repeat("é", 129), "a\x00b", "tab\there", "\xff",
		"0f8fad5b-d9cb-469f-a165-70867728950e", "0F8FAD5B-D9CB-469F-A165-70867728950E"} {
		_, err := createTemplate(admin, s, pyTemplate(name), "")
		wantTmplErr(t, err, connect.CodeInvalidArgument, apierr.InvalidRequest, "sandbox_template.display_name")
	}
	if _, err := createTemplate(admin, s, pyTemplate(strings.Repeat("é", 128)), ""); err != nil {
		t.Errorf("128 runes: %v", err)
	}
	// A template without containers is fine; what it has must be valid.
	if _, err := createTemplate(admin, s, &sandboxv1.SandboxTemplate{DisplayName: "no containers", Spec: &sandboxv1.PartialSandboxSpec{Tags: []string{"a"}}}, ""); err != nil {
		t.Errorf("no containers: %v", err)
	}
	if _, err := createTemplate(admin, s, &sandboxv1.SandboxTemplate{DisplayName: "nothing"}, ""); err != nil {
		t.Errorf("no spec: %v", err)
	}
	bad := pyTemplate("bad lifetime")
	bad.Spec.MaxLifetimeSeconds = -1
	_, err := createTemplate(admin, s, bad, "")
	wantTmplErr(t, err, connect.CodeInvalidArgument, apierr.InvalidRequest, "sandbox_template.spec.max_lifetime_seconds")
	bad = pyTemplate("bad container")
	bad.Spec.Containers = append(bad.Spec.Containers, &sandboxv1.PartialContainer{Name: "main", Image: "busybox"})
	_, err = createTemplate(admin, s, bad, "")
	wantTmplErr(t, err, connect.CodeInvalidArgument, apierr.InvalidRequest, "")
	for _, v := range apierr.Violations(err) {
		if !strings.HasPrefix(v.Field, "sandbox_template.spec.containers") {
			t.Errorf("violation of %s", v.Field)
		}
	}
	// Bounds.
	big := pyTemplate("big")
	big.Spec.Annotations = map[string]string{"a": strings.Repeat("x", MaxTemplateSpecBytes)}
	_, err = createTemplate(admin, s, big, "")
	wantTmplErr(t, err, connect.CodeInvalidArgument, apierr.InvalidRequest, "sandbox_template.spec")
	att := pyTemplate("big attachments")
	att.Attachments = &structpb.Struct{Fields: map[string]*structpb.Value{"a": structpb.NewStringValue(strings.Repeat("x", MaxTemplateAttachmentsBytes))}}
	_, err = createTemplate(admin, s, att, "")
	wantTmplErr(t, err, connect.CodeInvalidArgument, apierr.InvalidRequest, "sandbox_template.attachments")
	_, err = s.CreateSandboxTemplate(admin, connect.NewRequest(&sandboxv1.CreateSandboxTemplateRequest{}))
	wantTmplErr(t, err, connect.CodeInvalidArgument, apierr.InvalidRequest, "sandbox_template")
	// An update is checked like a create.
	_, err = updateTemplate(admin, s, "no containers", &sandboxv1.SandboxTemplate{Spec: &sandboxv1.PartialSandboxSpec{MaxLifetimeSeconds: -5}}, "spec.max_lifetime_seconds")
	wantTmplErr(t, err, connect.CodeInvalidArgument, apierr.InvalidRequest, "sandbox_template.spec.max_lifetime_seconds")
	_, err = updateTemplate(admin, s, "no containers", &sandboxv1.SandboxTemplate{DisplayName: "bad container"}, "display_name")
	if err != nil {
		t.Errorf("rename onto a refused template's name: %v", err)
	}
	_, err = updateTemplate(admin, s, "nothing", &sandboxv1.SandboxTemplate{DisplayName: "bad container"}, "display_name")
	wantTmplErr(t, err, connect.CodeAlreadyExists, apierr.AlreadyExists, "sandbox_template.display_name")
}

func TestTemplatePagination(t *testing.T) {
	s := newTemplateGateway(t, t.TempDir(), &acceptingRunner{id: "r1"})
	admin := tmplAdmin(testOrg)
	var ids []string
	for i := range 5 {
		tp, err := createTemplate(admin, s, pyTemplate(fmt.Sprintf("t%d", i)), "")
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, tp.GetSandboxTemplateId())
	}
	var seen []string
	token := ""
	for range 4 {
		res, err := s.ListSandboxTemplates(admin, connect.NewRequest(&sandboxv1.ListSandboxTemplatesRequest{PageSize: 2, PageToken: token}))
		if err != nil {
			t.Fatal(err)
		}
		for _, tp := range res.Msg.GetSandboxTemplates() {
			seen = append(seen, tp.GetSandboxTemplateId())
		}
		if token = res.Msg.GetNextPageToken(); token == "" {
			break
		}
	}
	if fmt.Sprint(seen) != fmt.Sprint(ids) {
		t.Fatalf("pages = %v, want %v", seen, ids)
	}
	_, err := s.ListSandboxTemplates(admin, connect.NewRequest(&sandboxv1.ListSandboxTemplatesRequest{PageToken: "not-a-token"}))
	wantTmplErr(t, err, connect.CodeInvalidArgument, apierr.InvalidRequest, "page_token")
	_, err = s.ListSandboxTemplates(admin, connect.NewRequest(&sandboxv1.ListSandboxTemplatesRequest{PageSize: -1}))
	wantTmplErr(t, err, connect.CodeInvalidArgument, apierr.InvalidRequest, "page_size")
}

func TestTemplateRequestID(t *testing.T) {
	s := newTemplateGateway(t, t.TempDir(), &acceptingRunner{id: "r1"})
	admin := tmplAdmin(testOrg)
	first, err := createTemplate(admin, s, pyTemplate("py"), "req-1")
	if err != nil {
		t.Fatal(err)
	}
	again, err := createTemplate(admin, s, pyTemplate("py"), "req-1")
	if err != nil || again.GetSandboxTemplateId() != first.GetSandboxTemplateId() {
		t.Fatalf("repeat = %v, %v", again, err)
	}
	_, err = createTemplate(admin, s, pyTemplate("other"), "req-1")
	wantTmplErr(t, err, connect.CodeInvalidArgument, apierr.RequestIDConflict, "request_id")
}

func TestCreateSandboxFromTemplate(t *testing.T) {
	dir := t.TempDir()
	r := &acceptingRunner{id: "r1"}
	s := newTemplateGateway(t, dir, r)
	admin, user := tmplAdmin(testOrg), tmplUser(testOrg)
	tp, err := createTemplate(admin, s, pyTemplate("py"), "")
	if err != nil {
		t.Fatal(err)
	}
	fromTemplate := func(req *sandboxv1.CreateSandboxFromTemplateRequest) (*sandboxv1.Sandbox, error) {
		res, err := s.CreateSandboxFromTemplate(user, connect.NewRequest(req))
		if err != nil {
			return nil, err
		}
		return res.Msg, nil
	}
	// No overrides: the template's spec, by name; the sandbox names the template.
	sb, err := fromTemplate(&sandboxv1.CreateSandboxFromTemplateRequest{TemplateId: "py", DisplayName: "from py"})
	if err != nil {
		t.Fatal(err)
	}
	if sb.GetSourceTemplateId() != tp.GetSandboxTemplateId() || sb.GetSourceTemplateRevision() != 1 || sb.GetDisplayName() != "from py" ||
		sb.GetSpec().GetContainers()[0].GetImage() != "python:3.11" || sb.GetSpec().GetMaxLifetimeSeconds() != 600 {
		t.Fatalf("from template = %v", sb)
	}
	if got := r.spec(sb.GetSandboxId()); got.Spec.Container.Image != "python:3.11" || got.Spec.Container.Command != "sleep" {
		t.Fatalf("runner got %+v", got.Spec.Container)
	}
	// Overrides: containers replace whole; tags replace; a zero scalar keeps.
	over := &sandboxv1.PartialSandboxSpec{Containers: []*sandboxv1.PartialContainer{{Name: "main", Image: "alpine"}}, Tags: []string{"o"}}
	sb2, err := fromTemplate(&sandboxv1.CreateSandboxFromTemplateRequest{TemplateId: tp.GetSandboxTemplateId(), Overrides: over, RequestId: "q1"})
	if err != nil {
		t.Fatal(err)
	}
	c := sb2.GetSpec().GetContainers()
	if len(c) != 1 || c[0].GetImage() != "alpine" || c[0].GetCommand() != "" || fmt.Sprint(sb2.GetSpec().GetTags()) != "[o]" || sb2.GetSpec().GetMaxLifetimeSeconds() != 600 {
		t.Fatalf("overridden = %v", sb2.GetSpec())
	}
	// request_id: a repeat is the first sandbox; another request is a conflict.
	rep, err := fromTemplate(&sandboxv1.CreateSandboxFromTemplateRequest{TemplateId: "py", Overrides: over, RequestId: "q1"})
	if err != nil || rep.GetSandboxId() != sb2.GetSandboxId() {
		t.Fatalf("repeat = %v, %v", rep, err)
	}
	_, err = fromTemplate(&sandboxv1.CreateSandboxFromTemplateRequest{TemplateId: "py", RequestId: "q1"})
	wantTmplErr(t, err, connect.CodeInvalidArgument, apierr.RequestIDConflict, "request_id")
	_, err = s.CreateSandbox(user, connect.NewRequest(&sandboxv1.CreateSandboxRequest{RequestId: "q1", Sandbox: &sandboxv1.Sandbox{Spec: &sandboxv1.SandboxSpec{
		Containers: []*sandboxv1.Container{{Image: "alpine"}}}}}))
	wantTmplErr(t, err, connect.CodeInvalidArgument, apierr.RequestIDConflict, "request_id")

	// A template update changes later sandboxes only.
	if _, err := updateTemplate(admin, s, "py", &sandboxv1.SandboxTemplate{Spec: &sandboxv1.PartialSandboxSpec{MaxLifetimeSeconds: 60}}, "spec.max_lifetime_seconds"); err != nil {
		t.Fatal(err)
	}
	got, err := s.GetSandbox(user, connect.NewRequest(&sandboxv1.GetSandboxRequest{SandboxId: sb.GetSandboxId()}))
	if err != nil || got.Msg.GetSpec().GetMaxLifetimeSeconds() != 600 || got.Msg.GetSourceTemplateRevision() != 1 {
		t.Fatalf("after the template's update = %v, %v", got, err)
	}
	sb3, err := fromTemplate(&sandboxv1.CreateSandboxFromTemplateRequest{TemplateId: "py"})
	if err != nil || sb3.GetSpec().GetMaxLifetimeSeconds() != 60 || sb3.GetSourceTemplateRevision() != 2 {
		t.Fatalf("after the update = %v, %v", sb3, err)
	}
	// A template without containers needs the create to bring them.
	if _, err := createTemplate(admin, s, &sandboxv1.SandboxTemplate{DisplayName: "bare", Spec: &sandboxv1.PartialSandboxSpec{Tags: []string{"b"}}}, ""); err != nil {
		t.Fatal(err)
	}
	_, err = fromTemplate(&sandboxv1.CreateSandboxFromTemplateRequest{TemplateId: "bare"})
	wantTmplErr(t, err, connect.CodeInvalidArgument, apierr.InvalidRequest, "sandbox.spec.containers")
	if _, err := fromTemplate(&sandboxv1.CreateSandboxFromTemplateRequest{TemplateId: "bare", Overrides: over}); err != nil {
		t.Fatal(err)
	}
	// Deleted or unknown: NOT_FOUND; the sandbox made from it is unaffected.
	if err := deleteTemplate(admin, s, "py"); err != nil {
		t.Fatal(err)
	}
	_, err = fromTemplate(&sandboxv1.CreateSandboxFromTemplateRequest{TemplateId: tp.GetSandboxTemplateId()})
	wantTmplErr(t, err, connect.CodeNotFound, apierr.TemplateNotFound, "")
	// A request_id replayed after the delete is still the first sandbox (named by ID).
	rep, err = fromTemplate(&sandboxv1.CreateSandboxFromTemplateRequest{TemplateId: tp.GetSandboxTemplateId(), Overrides: over, RequestId: "q1"})
	if err != nil || rep.GetSandboxId() != sb2.GetSandboxId() {
		t.Fatalf("repeat after delete = %v, %v", rep, err)
	}
	_, err = fromTemplate(&sandboxv1.CreateSandboxFromTemplateRequest{TemplateId: tp.GetSandboxTemplateId(), RequestId: "q1"})
	wantTmplErr(t, err, connect.CodeNotFound, apierr.TemplateNotFound, "")
	_, err = fromTemplate(&sandboxv1.CreateSandboxFromTemplateRequest{})
	wantTmplErr(t, err, connect.CodeInvalidArgument, apierr.InvalidRequest, "template_id")
	for _, bad := range []string{strings.Repeat("n", MaxSandboxDisplayNameRunes+1), "tab\there", "\xff"} {
		_, err = fromTemplate(&sandboxv1.CreateSandboxFromTemplateRequest{TemplateId: "bare", Overrides: over, DisplayName: bad})
		wantTmplErr(t, err, connect.CodeInvalidArgument, apierr.InvalidRequest, "display_name")
	}
	_, err = s.CreateSandbox(user, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{DisplayName: "nul\x00", Spec: &sandboxv1.SandboxSpec{
		Containers: []*sandboxv1.Container{{Image: "alpine"}}}}}))
	wantTmplErr(t, err, connect.CodeInvalidArgument, apierr.InvalidRequest, "sandbox.display_name")

	// After a gateway restart: Get and List still name the template.
	s.Close()
	s2 := newTemplateGateway(t, dir, r)
	got, err = s2.GetSandbox(user, connect.NewRequest(&sandboxv1.GetSandboxRequest{SandboxId: sb2.GetSandboxId()}))
	if err != nil || got.Msg.GetSourceTemplateId() != tp.GetSandboxTemplateId() || got.Msg.GetSourceTemplateRevision() != 1 ||
		got.Msg.GetSpec().GetContainers()[0].GetImage() != "alpine" {
		t.Fatalf("after restart = %v, %v", got, err)
	}
	if got, err := s2.GetSandbox(user, connect.NewRequest(&sandboxv1.GetSandboxRequest{SandboxId: sb.GetSandboxId()})); err != nil || got.Msg.GetDisplayName() != "from py" {
		t.Fatalf("display_name after restart = %v, %v", got, err)
	}
	list, err := s2.ListSandboxes(user, connect.NewRequest(&sandboxv1.ListSandboxesRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, x := range list.Msg.GetSandboxes() {
		if x.GetSourceTemplateId() == tp.GetSandboxTemplateId() {
			n++
		}
	}
	if n != 3 {
		t.Fatalf("%d listed sandboxes name the template, want 3", n)
	}
	// And a replayed request_id after the restart is still the first sandbox; another
	// request with it still a conflict.
	res, err := s2.CreateSandboxFromTemplate(user, connect.NewRequest(&sandboxv1.CreateSandboxFromTemplateRequest{TemplateId: tp.GetSandboxTemplateId(), Overrides: over, RequestId: "q1"}))
	if err != nil || res.Msg.GetSandboxId() != sb2.GetSandboxId() || res.Msg.GetSourceTemplateId() != tp.GetSandboxTemplateId() {
		t.Fatalf("replay after restart = %v, %v", res, err)
	}
	_, err = s2.CreateSandboxFromTemplate(user, connect.NewRequest(&sandboxv1.CreateSandboxFromTemplateRequest{TemplateId: "bare", Overrides: over, RequestId: "q1"}))
	wantTmplErr(t, err, connect.CodeInvalidArgument, apierr.RequestIDConflict, "request_id")
}

// TestTemplatesWithoutStore: a gateway without a template store refuses clearly.
func TestTemplatesWithoutStore(t *testing.T) {
	s := newTestGateway(t, t.TempDir(), &acceptingRunner{id: "r1"})
	_, err := createTemplate(tmplAdmin(testOrg), s, pyTemplate("py"), "")
	wantTmplErr(t, err, connect.CodeUnimplemented, apierr.NotImplemented, "")
	_, err = s.CreateSandboxFromTemplate(tmplUser(testOrg), connect.NewRequest(&sandboxv1.CreateSandboxFromTemplateRequest{TemplateId: "py"}))
	wantTmplErr(t, err, connect.CodeUnimplemented, apierr.NotImplemented, "")
}

// TestTemplatesOverREST: the REST routes of the proto annotations serve the template RPCs,
// and JSON can say set-but-empty: `"tags": []` in overrides clears the template's tags,
// where a missing key keeps them.
func TestTemplatesOverREST(t *testing.T) {
	dir := t.TempDir()
	keys, err := auth.OpenKeyring(filepath.Join(dir, "keys.json"))
	if err != nil {
		t.Fatal(err)
	}
	adminKey, _, err := keys.Create(testOrg, auth.RoleAdmin, "admin")
	if err != nil {
		t.Fatal(err)
	}
	userKey, _, err := keys.Create(testOrg, auth.RoleUser, "user")
	if err != nil {
		t.Fatal(err)
	}
	s := newTemplateGateway(t, dir, &acceptingRunner{id: "r1"})
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	call := func(method, path, key, body string) (int, map[string]any) {
		t.Helper()
		req, err := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Content-Type", "application/json")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		var out map[string]any
		_ = json.NewDecoder(res.Body).Decode(&out)
		return res.StatusCode, out
	}
	body := `{"displayName": "py", "spec": {"containers": [{"name": "main", "image": "python:3.11"}], "tags": ["a", "b"], "annotations": {"k": "v"}}}`
	if code, out := call("POST", "/v1/sandboxTemplates", userKey, body); code != http.StatusForbidden {
		t.Fatalf("user create: %d %v", code, out)
	}
	code, tmpl := call("POST", "/v1/sandboxTemplates", adminKey, body)
	if code != http.StatusOK || tmpl["sandboxTemplateId"] == "" {
		t.Fatalf("create: %d %v", code, tmpl)
	}
	if code, out := call("GET", "/v1/sandboxTemplates/py", userKey, ""); code != http.StatusOK || out["sandboxTemplateId"] != tmpl["sandboxTemplateId"] {
		t.Fatalf("get by name: %d %v", code, out)
	}
	if code, out := call("PATCH", "/v1/sandboxTemplates/py?updateMask=spec.maxLifetimeSeconds", adminKey, `{"spec": {"maxLifetimeSeconds": 90}}`); code != http.StatusOK || out["revision"] != "2" {
		t.Fatalf("patch: %d %v", code, out)
	}
	if code, out := call("GET", "/v1/sandboxTemplates?pageSize=1", userKey, ""); code != http.StatusOK || len(out["sandboxTemplates"].([]any)) != 1 {
		t.Fatalf("list: %d %v", code, out)
	}
	specOf := func(out map[string]any) map[string]any {
		sp, _ := out["spec"].(map[string]any)
		return sp
	}
	code, sb := call("POST", "/v1/sandboxes:createFromTemplate", userKey, `{"templateId": "py", "overrides": {"tags": [], "annotations": {}}}`)
	if code != http.StatusOK || fmt.Sprint(specOf(sb)["tags"]) != "[]" || fmt.Sprint(specOf(sb)["annotations"]) != "map[]" || sb["sourceTemplateId"] != tmpl["sandboxTemplateId"] ||
		specOf(sb)["maxLifetimeSeconds"] != float64(90) {
		t.Fatalf("set-but-empty: %d %v", code, sb)
	}
	code, sb = call("POST", "/v1/sandboxes:createFromTemplate", userKey, `{"templateId": "py", "overrides": {"maxLifetimeSeconds": 0}}`)
	if code != http.StatusOK || fmt.Sprint(specOf(sb)["tags"]) != "[a b]" || fmt.Sprint(specOf(sb)["annotations"]) != "map[k:v]" {
		t.Fatalf("absent: %d %v", code, sb)
	}
	// Connect's JSON goes through the same codec.
	c := sandboxv1connect.NewSandboxServiceClient(http.DefaultClient, srv.URL, connect.WithProtoJSON())
	creq := connect.NewRequest(&sandboxv1.CreateSandboxFromTemplateRequest{TemplateId: "py"})
	creq.Header().Set("Authorization", "Bearer "+userKey)
	cres, err := c.CreateSandboxFromTemplate(t.Context(), creq)
	if err != nil || len(cres.Msg.GetSpec().GetTags()) != 2 {
		t.Fatalf("connect json: %v, %v", cres, err)
	}
	if code, out := call("DELETE", "/v1/sandboxTemplates/py", adminKey, ""); code != http.StatusOK {
		t.Fatalf("delete: %d %v", code, out)
	}
	if code, out := call("GET", "/v1/sandboxTemplates/py", userKey, ""); code != http.StatusNotFound {
		t.Fatalf("get deleted: %d %v", code, out)
	}
}

// FuzzDisplayName: a name displayNameViolations accepts is valid UTF-8, 1..128 printable
// characters, trimmed, and never UUID-shaped (so lookups by ID or name never meet).
func FuzzDisplayName(f *testing.F) {
	for _, s := range []string{"py", " x", "0f8fad5b-d9cb-469f-a165-70867728950e", "a\x00", "\xff", strings.Repeat("é", 129)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		vs := displayNameViolations("f", name)
		if vs != nil {
			if len(vs) != 1 || vs[0].Field != "f" {
				t.Fatalf("violations %v", vs)
			}
			return
		}
		n := 0
		for _, r := range name {
			if !unicode.IsPrint(r) {
				t.Fatalf("accepted %q with %U", name, r)
			}
			n++
		}
		if !utf8.ValidString(name) || n == 0 || n > MaxTemplateNameRunes || strings.TrimSpace(name) != name || uuidShape.MatchString(name) {
			t.Fatalf("accepted %q", name)
		}
	})
}

// blockingLive is a template store whose ListLive (the warm loop's read) waits for release.
type blockingLive struct {
	store.Templates
	entered chan struct{}
	release chan struct{}
}

func (b *blockingLive) ListLive(ctx context.Context, limit int) ([]store.Template, error) {
	select {
	case b.entered <- struct{}{}:
	default:
	}
	<-b.release
	return b.Templates.ListLive(ctx, limit)
}

// TestCloseWaitsForLoops: Close returns only once the background loops (here the warm
// pools' read of the templates) have ended, so a caller may close the store right after
// (a test's TempDir removal once raced the warm loop's SQLite files).
func TestCloseWaitsForLoops(t *testing.T) {
	st, err := store.Open(t.Context(), filepath.Join(t.TempDir(), "sandboxd.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	keys, err := auth.OpenKeyring(filepath.Join(t.TempDir(), "keys.json"))
	if err != nil {
		t.Fatal(err)
	}
	b := &blockingLive{Templates: st.Templates(), entered: make(chan struct{}, 1), release: make(chan struct{})}
	s, err := New(Config{Auth: keys, Runners: []runner.Handle{&acceptingRunner{id: "r1"}}, Index: st.Sandboxes(), Orgs: st.Orgs(), Templates: b, Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	<-b.entered
	closed := make(chan struct{})
	go func() { s.Close(); close(closed) }()
	select {
	case <-closed:
		t.Fatal("Close returned while the warm loop was still reading the store")
	case <-time.After(100 * time.Millisecond):
	}
	close(b.release)
	<-closed
}
