package sandbox

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/timestamppb"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1/sandboxv1connect"
)

// tmplServer is a SandboxTemplateService with an in-memory index plus
// CreateSandboxFromTemplate: it records what the SDK sends and answers like the gateway
// is to (lookup by ID or display name, revision check, soft delete). Switch these tests
// to gatewaytest once the gateway serves templates.
type tmplServer struct {
	sandboxv1connect.UnimplementedSandboxServiceHandler
	sandboxv1connect.UnimplementedSandboxTemplateServiceHandler

	mu      sync.Mutex
	tmpls   []*sandboxv1.SandboxTemplate
	creates []*sandboxv1.CreateSandboxTemplateRequest
	updates []*sandboxv1.UpdateSandboxTemplateRequest
	lists   []*sandboxv1.ListSandboxTemplatesRequest
	deletes []*sandboxv1.DeleteSandboxTemplateRequest
	fromReq []*sandboxv1.CreateSandboxFromTemplateRequest
	// failNext is returned by the next call that checks it (and cleared).
	failNext error
}

func (s *tmplServer) fail() error {
	err := s.failNext
	s.failNext = nil
	return err
}

func (s *tmplServer) find(idOrName string, showDeleted bool) (*sandboxv1.SandboxTemplate, error) {
	for _, t := range s.tmpls {
		// Like the gateway: a deleted template by ID only (with showDeleted).
		if (t.GetSandboxTemplateId() == idOrName && (showDeleted || !t.GetDeleted())) || (t.GetDisplayName() == idOrName && !t.GetDeleted()) {
			return t, nil
		}
	}
	return nil, apiErrorMsg(connect.CodeNotFound, ReasonTemplateNotFound, fmt.Sprintf("sandbox template %q not found", idOrName))
}

func (s *tmplServer) CreateSandboxTemplate(_ context.Context, req *connect.Request[sandboxv1.CreateSandboxTemplateRequest]) (*connect.Response[sandboxv1.SandboxTemplate], error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.creates = append(s.creates, req.Msg)
	if err := s.fail(); err != nil {
		return nil, err
	}
	if _, err := s.find(req.Msg.GetSandboxTemplate().GetDisplayName(), false); err == nil {
		return nil, apiError(connect.CodeAlreadyExists, ReasonAlreadyExists, nil)
	}
	t := proto.Clone(req.Msg.GetSandboxTemplate()).(*sandboxv1.SandboxTemplate)
	t.SandboxTemplateId, t.Revision, t.CreateTime = fmt.Sprintf("tmpl-%d", len(s.tmpls)+1), 1, timestamppb.Now()
	s.tmpls = append(s.tmpls, t)
	return connect.NewResponse(t), nil
}

func (s *tmplServer) GetSandboxTemplate(_ context.Context, req *connect.Request[sandboxv1.GetSandboxTemplateRequest]) (*connect.Response[sandboxv1.SandboxTemplate], error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, err := s.find(req.Msg.GetSandboxTemplateId(), req.Msg.GetShowDeleted())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(t), nil
}

func (s *tmplServer) ListSandboxTemplates(_ context.Context, req *connect.Request[sandboxv1.ListSandboxTemplatesRequest]) (*connect.Response[sandboxv1.ListSandboxTemplatesResponse], error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lists = append(s.lists, req.Msg)
	var all []*sandboxv1.SandboxTemplate
	for _, t := range s.tmpls {
		if req.Msg.GetShowDeleted() || !t.GetDeleted() {
			all = append(all, t)
		}
	}
	// One template per page, to make the SDK follow tokens.
	i := 0
	if tok := req.Msg.GetPageToken(); tok != "" {
		_, _ = fmt.Sscan(tok, &i)
	}
	res := &sandboxv1.ListSandboxTemplatesResponse{}
	if i < len(all) {
		res.SandboxTemplates = all[i : i+1]
		if i+1 < len(all) {
			res.NextPageToken = fmt.Sprint(i + 1)
		}
	}
	return connect.NewResponse(res), nil
}

func (s *tmplServer) UpdateSandboxTemplate(_ context.Context, req *connect.Request[sandboxv1.UpdateSandboxTemplateRequest]) (*connect.Response[sandboxv1.SandboxTemplate], error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.updates = append(s.updates, req.Msg)
	t, err := s.find(req.Msg.GetSandboxTemplateId(), false)
	if err != nil {
		return nil, err
	}
	if r := req.Msg.GetSandboxTemplate().GetRevision(); r != 0 && r != t.GetRevision() {
		return nil, apiError(connect.CodeAborted, ReasonEtagMismatch, nil)
	}
	for _, p := range req.Msg.GetUpdateMask().GetPaths() {
		switch p {
		case "display_name":
			t.DisplayName = req.Msg.GetSandboxTemplate().GetDisplayName()
		case "spec":
			t.Spec = req.Msg.GetSandboxTemplate().GetSpec()
		}
	}
	t.Revision++
	return connect.NewResponse(t), nil
}

func (s *tmplServer) DeleteSandboxTemplate(_ context.Context, req *connect.Request[sandboxv1.DeleteSandboxTemplateRequest]) (*connect.Response[emptypb.Empty], error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.deletes = append(s.deletes, req.Msg)
	t, err := s.find(req.Msg.GetSandboxTemplateId(), false)
	if err != nil {
		return nil, err
	}
	t.Deleted = true
	if err := s.fail(); err != nil {
		return nil, err // deleted, but the answer is lost
	}
	return connect.NewResponse(&emptypb.Empty{}), nil
}

func (s *tmplServer) CreateSandboxFromTemplate(_ context.Context, req *connect.Request[sandboxv1.CreateSandboxFromTemplateRequest]) (*connect.Response[sandboxv1.Sandbox], error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fromReq = append(s.fromReq, req.Msg)
	if err := s.fail(); err != nil {
		return nil, err
	}
	t, err := s.find(req.Msg.GetTemplateId(), false)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&sandboxv1.Sandbox{SandboxId: "sb-t", SourceTemplateId: t.GetSandboxTemplateId(),
		SourceTemplateRevision: t.GetRevision(), Status: &sandboxv1.SandboxStatus{State: sandboxv1.State_STATE_CREATING}}), nil
}

func newTmplServer(t *testing.T) (*tmplServer, *Client) {
	t.Helper()
	s := &tmplServer{}
	mux := http.NewServeMux()
	mux.Handle(sandboxv1connect.NewSandboxServiceHandler(s))
	mux.Handle(sandboxv1connect.NewSandboxTemplateServiceHandler(s))
	p := new(http.Protocols)
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	srv := &http.Server{Handler: mux, Protocols: p}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	c, err := New("http://"+ln.Addr().String(), "k", WithDataPlane(DataPlaneGateway))
	if err != nil {
		t.Fatal(err)
	}
	return s, c
}

func pyTemplate() *sandboxv1.PartialSandboxSpec {
	return &sandboxv1.PartialSandboxSpec{MaxLifetimeSeconds: 600, Tags: []string{"py"}, Containers: []*sandboxv1.PartialContainer{
		{Name: "cache", Image: "redis:7"},
		{Name: "app", Image: "python:3.11", Command: "sleep", Args: []string{"infinity"}, Primary: proto.Bool(true),
			EnvironmentVariables: map[string]string{"A": "1", "B": "2"},
			ResourceRequirements: &sandboxv1.ResourceRequirements{Requests: &sandboxv1.Resources{Cpu: "1", Memory: "1Gi"}}},
	}}
}

func TestSDKTemplateCRUD(t *testing.T) {
	srv, c := newTmplServer(t)
	ctx := context.Background()

	// A transient failure is retried with the same request ID.
	srv.failNext = apiError(connect.CodeUnavailable, ReasonBackendUnavailable, nil)
	tm, err := c.CreateTemplate(ctx, "py", pyTemplate())
	if err != nil {
		t.Fatal(err)
	}
	if tm.ID != "tmpl-1" || tm.DisplayName != "py" || tm.Revision != 1 || tm.CreatedAt.IsZero() || !proto.Equal(tm.Spec, pyTemplate()) {
		t.Fatalf("created %+v", tm)
	}
	if len(srv.creates) != 2 || srv.creates[0].GetRequestId() == "" || srv.creates[0].GetRequestId() != srv.creates[1].GetRequestId() {
		t.Fatalf("create requests %v", srv.creates)
	}
	if _, err := c.CreateTemplate(ctx, "py", nil); !errors.Is(err, ErrAlreadyExists) {
		t.Fatalf("duplicate name: %v", err)
	}
	if _, err := c.CreateTemplate(ctx, "", nil); err == nil || len(srv.creates) != 3 {
		t.Fatalf("no name: %v (sent %d)", err, len(srv.creates))
	}
	if _, err := c.CreateTemplate(ctx, "other", nil); err != nil {
		t.Fatal(err)
	}

	for _, key := range []string{"py", "tmpl-1"} {
		got, err := c.GetTemplate(ctx, key, false)
		if err != nil || got.ID != "tmpl-1" {
			t.Fatalf("get %s: %+v %v", key, got, err)
		}
	}
	// Update: the mask is made of what is set. (Errors against the real gateway:
	// test/e2e/templates_test.go.)
	up, err := c.UpdateTemplate(ctx, "py", TemplateUpdate{DisplayName: "py2", Revision: 1})
	if err != nil || up.DisplayName != "py2" || up.Revision != 2 {
		t.Fatalf("rename: %+v %v", up, err)
	}
	if m := srv.updates[0].GetUpdateMask().GetPaths(); !slices.Equal(m, []string{"display_name"}) || srv.updates[0].GetSandboxTemplate().GetRevision() != 1 {
		t.Fatalf("rename sent %v", srv.updates[0])
	}
	if _, err := c.UpdateTemplate(ctx, "py2", TemplateUpdate{Spec: &sandboxv1.PartialSandboxSpec{MaxLifetimeSeconds: 60}, SpecFields: []string{"maxLifetimeSeconds", "tags", "max_lifetime_seconds"}}); err != nil {
		t.Fatal(err)
	}
	if m := srv.updates[1].GetUpdateMask().GetPaths(); !slices.Equal(m, []string{"spec.max_lifetime_seconds", "spec.tags"}) {
		t.Fatalf("field mask %v", m)
	}
	for _, bad := range []TemplateUpdate{{}, {SpecFields: []string{"tags"}}, {Spec: pyTemplate(), SpecFields: []string{"nope"}}} {
		if _, err := c.UpdateTemplate(ctx, "py2", bad); err == nil {
			t.Errorf("update %+v: no error", bad)
		}
	}
	if len(srv.updates) != 2 {
		t.Errorf("refused updates reached the server: %d", len(srv.updates))
	}

	// List follows pages; show_deleted is sent.
	list, err := c.ListTemplates(ctx, TemplateListOptions{})
	if err != nil || len(list) != 2 || list[0].DisplayName != "py2" || list[1].DisplayName != "other" || len(srv.lists) != 2 {
		t.Fatalf("list: %v %v (%d calls)", list, err, len(srv.lists))
	}

	// Delete: a lost answer then NOT_FOUND on the retry is success.
	srv.failNext = apiError(connect.CodeUnavailable, ReasonBackendUnavailable, nil)
	if err := c.DeleteTemplate(ctx, "other"); err != nil || len(srv.deletes) != 2 {
		t.Fatalf("delete: %v after %d calls", err, len(srv.deletes))
	}
	if err := c.DeleteTemplate(ctx, "other"); !errors.Is(err, ErrTemplateNotFound) {
		t.Fatalf("second delete: %v", err)
	}
	list, err = c.ListTemplates(ctx, TemplateListOptions{ShowDeleted: true})
	if err != nil || len(list) != 2 || !list[1].Deleted || !srv.lists[len(srv.lists)-1].GetShowDeleted() {
		t.Fatalf("list deleted: %v %v", list, err)
	}
	if got, err := c.GetTemplate(ctx, list[1].ID, true); err != nil || !got.Deleted {
		t.Fatalf("get deleted: %+v %v", got, err)
	}
}

func TestSDKCreateFromTemplate(t *testing.T) {
	srv, c := newTmplServer(t)
	ctx := context.Background()
	if _, err := c.CreateTemplate(ctx, "py", pyTemplate()); err != nil {
		t.Fatal(err)
	}

	// No overrides: none sent; the sandbox names its template.
	sb, err := c.RunTemplate(ctx, "py", Overrides{}, FromTemplateOptions{DisplayName: "mine"})
	if err != nil {
		t.Fatal(err)
	}
	if in := sb.Info(); in.SourceTemplateID != "tmpl-1" || in.SourceTemplateRevision != 1 {
		t.Fatalf("info %+v", in)
	}
	req := srv.fromReq[0]
	if req.GetOverrides() != nil || req.GetTemplateId() != "py" || req.GetDisplayName() != "mine" || req.GetRequestId() == "" {
		t.Fatalf("sent %v", req)
	}

	// Sandbox-level overrides only: no containers (the template's stay), no read.
	if _, err := c.RunTemplate(ctx, "py", Overrides{Tags: []string{"x"}, Lifetime: 90 * time.Second, RunnerIDs: []string{"r1"}, DenyEgress: true}, FromTemplateOptions{}); err != nil {
		t.Fatal(err)
	}
	o := srv.fromReq[1].GetOverrides()
	if len(o.GetContainers()) != 0 || !slices.Equal(o.GetTags(), []string{"x"}) || o.GetMaxLifetimeSeconds() != 90 ||
		o.GetMode() != sandboxv1.SandboxMode_SANDBOX_MODE_CKS || !o.GetNetwork().GetDenyEgress() || len(o.GetServices()) != 0 {
		t.Fatalf("overrides %v", o)
	}

	// A container override sends all the template's containers, the primary edited, by
	// the template's ID.
	if _, err := c.RunTemplate(ctx, "py", Overrides{Image: "python:3.12", Command: "python3", Args: []string{"-V"}, Env: map[string]string{"B": "3", "C": "4"}, Memory: "2Gi"}, FromTemplateOptions{}); err != nil {
		t.Fatal(err)
	}
	req = srv.fromReq[2]
	cs := req.GetOverrides().GetContainers()
	if req.GetTemplateId() != "tmpl-1" || len(cs) != 2 || !proto.Equal(cs[0], pyTemplate().GetContainers()[0]) {
		t.Fatalf("sent %v", req)
	}
	app := cs[1]
	rr := app.GetResourceRequirements()
	if app.GetName() != "app" || app.GetImage() != "python:3.12" || app.GetCommand() != "python3" || !slices.Equal(app.GetArgs(), []string{"-V"}) ||
		fmt.Sprint(app.GetEnvironmentVariables()) != "map[A:1 B:3 C:4]" || rr.GetRequests().GetCpu() != "1" || rr.GetRequests().GetMemory() != "2Gi" ||
		rr.GetLimits().GetMemory() != "2Gi" || !app.GetPrimary() {
		t.Fatalf("primary override %v", app)
	}
	// The template read is not changed by the edit.
	if tm, _ := c.GetTemplate(ctx, "py", false); !proto.Equal(tm.Spec, pyTemplate()) {
		t.Fatalf("template changed: %v", tm.Spec)
	}

	// Wire overrides are sent as given.
	raw := &sandboxv1.PartialSandboxSpec{RuntimeClass: "gvisor"}
	if _, err := c.CreateFromTemplate(ctx, "py", raw, FromTemplateOptions{}); err != nil || !proto.Equal(srv.fromReq[len(srv.fromReq)-1].GetOverrides(), raw) {
		t.Fatalf("raw overrides: %v", err)
	}
}

func TestSDKTemplateEditPrimaryWithoutContainers(t *testing.T) {
	tm := &Template{Spec: &sandboxv1.PartialSandboxSpec{Tags: []string{"a"}}}
	cs := tm.EditPrimary(func(c *sandboxv1.PartialContainer) { c.Image = "busybox" })
	if len(cs) != 1 || cs[0].GetName() != "main" || cs[0].GetImage() != "busybox" {
		t.Fatalf("containers %v", cs)
	}
	// The first container is the primary when none is marked.
	tm.Spec.Containers = []*sandboxv1.PartialContainer{{Name: "a", Image: "x"}, {Name: "b", Image: "y"}}
	cs = tm.EditPrimary(func(c *sandboxv1.PartialContainer) { c.WorkingDir = "/w" })
	if cs[0].GetWorkingDir() != "/w" || cs[1].GetWorkingDir() != "" || tm.Spec.Containers[0].GetWorkingDir() != "" {
		t.Fatalf("containers %v", cs)
	}
}

// apiErrorMsg is apiError with message msg.
func apiErrorMsg(code connect.Code, reason, msg string) error {
	err := connect.NewError(code, errors.New(msg))
	d, _ := connect.NewErrorDetail(&errdetails.ErrorInfo{Reason: reason, Domain: ErrorDomain})
	err.AddDetail(d)
	return err
}

// TestTemplateNotFoundByReason: ErrTemplateNotFound comes from the server's reason,
// whatever call answered it; a NOT_FOUND without it is not about a template.
func TestTemplateNotFoundByReason(t *testing.T) {
	tmpl := fromRPC(apiErrorMsg(connect.CodeNotFound, ReasonTemplateNotFound, "sandbox template \"x\" not found"))
	if !errors.Is(tmpl, ErrTemplateNotFound) || errors.Is(tmpl, ErrNotFound) {
		t.Errorf("template reason: template %v, sandbox %v", errors.Is(tmpl, ErrTemplateNotFound), errors.Is(tmpl, ErrNotFound))
	}
	for _, err := range []error{
		fromRPC(apiErrorMsg(connect.CodeNotFound, ReasonSandboxNotFound, "sandbox x not found")),
		fromRPC(connect.NewError(connect.CodeNotFound, errors.New("not found"))),
	} {
		if errors.Is(err, ErrTemplateNotFound) || !errors.Is(err, ErrNotFound) {
			t.Errorf("%v: template %v, sandbox %v", err, errors.Is(err, ErrTemplateNotFound), errors.Is(err, ErrNotFound))
		}
	}
}
