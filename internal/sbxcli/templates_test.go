package sbxcli

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/timestamppb"
	"sigs.k8s.io/yaml"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1/sandboxv1connect"
)

// fakeTemplates is an in-process SandboxTemplateService that records what sbx sends and
// answers as the gateway is to (lookup by ID or name, revision check, soft delete).
// Switch these tests to the real gateway (gatewaytest) once it serves templates.
type fakeTemplates struct {
	sandboxv1connect.UnimplementedSandboxTemplateServiceHandler

	mu      sync.Mutex
	tmpls   []*sandboxv1.SandboxTemplate
	creates []*sandboxv1.CreateSandboxTemplateRequest
	updates []*sandboxv1.UpdateSandboxTemplateRequest
	lists   []*sandboxv1.ListSandboxTemplatesRequest
	deletes []string
}

// templateNotFound is the gateway's answer for a missing template.
func templateNotFound(id string) error {
	err := connect.NewError(connect.CodeNotFound, fmt.Errorf("sandbox template %q not found", id))
	d, _ := connect.NewErrorDetail(&errdetails.ErrorInfo{Reason: "CWSANDBOX_TEMPLATE_NOT_FOUND", Domain: "cwsandbox.com"})
	err.AddDetail(d)
	return err
}

func (s *fakeTemplates) find(id string, deleted bool) (*sandboxv1.SandboxTemplate, error) {
	for _, t := range s.tmpls {
		// Like the gateway: a deleted template by ID only (with show_deleted).
		if (t.GetSandboxTemplateId() == id && (deleted || !t.GetDeleted())) || (t.GetDisplayName() == id && !t.GetDeleted()) {
			return t, nil
		}
	}
	return nil, templateNotFound(id)
}

func (s *fakeTemplates) CreateSandboxTemplate(_ context.Context, req *connect.Request[sandboxv1.CreateSandboxTemplateRequest]) (*connect.Response[sandboxv1.SandboxTemplate], error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.creates = append(s.creates, req.Msg)
	t := proto.Clone(req.Msg.GetSandboxTemplate()).(*sandboxv1.SandboxTemplate)
	t.SandboxTemplateId, t.Revision, t.CreateTime = fmt.Sprintf("tmpl-%d", len(s.tmpls)+1), 1, timestamppb.Now()
	s.tmpls = append(s.tmpls, t)
	return connect.NewResponse(t), nil
}

func (s *fakeTemplates) GetSandboxTemplate(_ context.Context, req *connect.Request[sandboxv1.GetSandboxTemplateRequest]) (*connect.Response[sandboxv1.SandboxTemplate], error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, err := s.find(req.Msg.GetSandboxTemplateId(), req.Msg.GetShowDeleted())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(proto.Clone(t).(*sandboxv1.SandboxTemplate)), nil
}

func (s *fakeTemplates) ListSandboxTemplates(_ context.Context, req *connect.Request[sandboxv1.ListSandboxTemplatesRequest]) (*connect.Response[sandboxv1.ListSandboxTemplatesResponse], error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lists = append(s.lists, req.Msg)
	out := &sandboxv1.ListSandboxTemplatesResponse{}
	for _, t := range s.tmpls {
		if req.Msg.GetShowDeleted() || !t.GetDeleted() {
			out.SandboxTemplates = append(out.SandboxTemplates, t)
		}
	}
	return connect.NewResponse(out), nil
}

func (s *fakeTemplates) UpdateSandboxTemplate(_ context.Context, req *connect.Request[sandboxv1.UpdateSandboxTemplateRequest]) (*connect.Response[sandboxv1.SandboxTemplate], error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.updates = append(s.updates, req.Msg)
	t, err := s.find(req.Msg.GetSandboxTemplateId(), false)
	if err != nil {
		return nil, err
	}
	if r := req.Msg.GetSandboxTemplate().GetRevision(); r != 0 && r != t.GetRevision() {
		err := connect.NewError(connect.CodeAborted, fmt.Errorf("template %s is at revision %d, not %d", t.GetSandboxTemplateId(), t.GetRevision(), r))
		d, _ := connect.NewErrorDetail(&errdetails.ErrorInfo{Reason: "CWSANDBOX_ETAG_MISMATCH", Domain: "cwsandbox.com"})
		err.AddDetail(d)
		return nil, err
	}
	if slices.Contains(req.Msg.GetUpdateMask().GetPaths(), "display_name") {
		t.DisplayName = req.Msg.GetSandboxTemplate().GetDisplayName()
	}
	if slices.Contains(req.Msg.GetUpdateMask().GetPaths(), "spec") {
		t.Spec = req.Msg.GetSandboxTemplate().GetSpec()
	}
	t.Revision++
	return connect.NewResponse(t), nil
}

func (s *fakeTemplates) DeleteSandboxTemplate(_ context.Context, req *connect.Request[sandboxv1.DeleteSandboxTemplateRequest]) (*connect.Response[emptypb.Empty], error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.deletes = append(s.deletes, req.Msg.GetSandboxTemplateId())
	t, err := s.find(req.Msg.GetSandboxTemplateId(), false)
	if err != nil {
		return nil, err
	}
	t.Deleted, t.DeleteTime = true, timestamppb.Now()
	return connect.NewResponse(&emptypb.Empty{}), nil
}

// CreateSandboxFromTemplate merges (replace-on-presence, the fields the tests use) and
// starts a running sandbox.
func (f *fakeAPI) CreateSandboxFromTemplate(_ context.Context, req *connect.Request[sandboxv1.CreateSandboxFromTemplateRequest]) (*connect.Response[sandboxv1.Sandbox], error) {
	f.tmpl.mu.Lock()
	t, err := f.tmpl.find(req.Msg.GetTemplateId(), false)
	var spec *sandboxv1.PartialSandboxSpec
	if err == nil {
		spec = proto.Clone(t.GetSpec()).(*sandboxv1.PartialSandboxSpec)
	}
	f.tmpl.mu.Unlock()
	f.mu.Lock()
	f.fromTmpl = append(f.fromTmpl, req.Msg)
	id := fmt.Sprintf("sbx-fake-%d", len(f.order)+1)
	f.mu.Unlock()
	if err != nil {
		return nil, err
	}
	o := req.Msg.GetOverrides()
	if len(o.GetContainers()) > 0 {
		spec.Containers = o.GetContainers()
	}
	if len(o.GetTags()) > 0 {
		spec.Tags = o.GetTags()
	}
	full := &sandboxv1.SandboxSpec{Tags: spec.GetTags()}
	for _, c := range spec.GetContainers() {
		full.Containers = append(full.Containers, &sandboxv1.Container{Name: c.GetName(), Image: c.GetImage(), Command: c.GetCommand(),
			Args: c.GetArgs(), EnvironmentVariables: c.GetEnvironmentVariables(), Primary: c.Primary})
	}
	sb := f.put(&sandboxv1.Sandbox{SandboxId: id, Spec: full, SourceTemplateId: t.GetSandboxTemplateId(), SourceTemplateRevision: t.GetRevision()})
	return connect.NewResponse(proto.Clone(sb).(*sandboxv1.Sandbox)), nil
}

const pyTemplateYAML = `# a template
containers:
  - name: cache
    image: redis:7
  - name: app
    image: python:3.11
    primary: true
    command: sleep
    args: [infinity]
    environment_variables: {A: "1", B: "2"}
maxLifetimeSeconds: 600
tags: [py]
`

func pyTemplateSpec() *sandboxv1.PartialSandboxSpec {
	return &sandboxv1.PartialSandboxSpec{MaxLifetimeSeconds: 600, Tags: []string{"py"}, Containers: []*sandboxv1.PartialContainer{
		{Name: "cache", Image: "redis:7"},
		{Name: "app", Image: "python:3.11", Primary: proto.Bool(true), Command: "sleep", Args: []string{"infinity"},
			EnvironmentVariables: map[string]string{"A": "1", "B": "2"}},
	}}
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestSbxTemplateCreateGetLs(t *testing.T) {
	f := newFake(t)
	out, errs, code := f.sbx("", "template", "create", "py", "-f", writeFile(t, "py.yaml", pyTemplateYAML))
	if code != 0 || out != "tmpl-1\n" {
		t.Fatalf("create: %d %q %q", code, out, errs)
	}
	if r := f.tmpl.creates[0]; r.GetSandboxTemplate().GetDisplayName() != "py" || !proto.Equal(r.GetSandboxTemplate().GetSpec(), pyTemplateSpec()) || r.GetRequestId() == "" {
		t.Fatalf("create sent %v", r)
	}
	// JSON on stdin, -o json.
	out, errs, code = f.sbx(`{"containers": [{"name": "main", "image": "busybox"}]}`, "template", "create", "bb", "-f", "-", "-o", "json")
	var got map[string]any
	if err := json.Unmarshal([]byte(out), &got); code != 0 || err != nil || got["sandboxTemplateId"] != "tmpl-2" || got["displayName"] != "bb" {
		t.Fatalf("create -f - -o json: %d %q %q", code, out, errs)
	}

	// Strict: unknown fields (top-level or nested), duplicate keys, a non-mapping, no -f.
	for _, bad := range []struct{ doc, want string }{
		{"containers: []\nimage: x\n", `unknown field "image"`},
		{"containers:\n  - name: m\n    imag: x\n", `unknown field "imag"`},
		{"tags: [a]\ntags: [b]\n", `already set`},
		{"max_lifetime_seconds: 1\nmaxLifetimeSeconds: 2\n", `given twice`},
		{"- a\n- b\n", "must be a mapping"},
		{"max_lifetime_seconds: soon\n", "invalid value for int32 field maxLifetimeSeconds"},
	} {
		_, errs, code := f.sbx(bad.doc, "template", "create", "x", "-f", "-")
		if code != 1 || !strings.Contains(errs, bad.want) || !strings.HasPrefix(errs, "sbx: spec -: ") {
			t.Errorf("create %q: %d %q, want %q", bad.doc, code, errs, bad.want)
		}
	}
	if _, errs, code := f.sbx("", "template", "create", "x"); code != 1 || !strings.Contains(errs, `"file" not set`) {
		t.Errorf("create without -f: %d %q", code, errs)
	}
	if len(f.tmpl.creates) != 2 {
		t.Errorf("refused creates reached the server: %d", len(f.tmpl.creates))
	}

	// get by name and by ID: the rows and the spec as YAML.
	for _, key := range []string{"py", "tmpl-1"} {
		out, errs, code = f.sbx("", "template", "get", key)
		for _, re := range []string{`(?m)^ID:\s+tmpl-1$`, `(?m)^Name:\s+py$`, `(?m)^Revision:\s+1$`, `(?m)^Image:\s+python:3.11$`,
			`(?m)^Spec:\n  containers:\n  - image: redis:7`, `(?m)^  max_lifetime_seconds: 600$`, `(?m)^    environment_variables:\n      A: "1"`} {
			if !regexp.MustCompile(re).MatchString(out) {
				t.Errorf("get %s: no %s in %q (%d %q)", key, re, out, code, errs)
			}
		}
	}
	// -o yaml gives the template back in a form create takes again.
	out, errs, code = f.sbx("", "template", "get", "py", "-o", "yaml")
	var back sandboxv1.SandboxTemplate
	j, err := yaml.YAMLToJSON([]byte(out))
	if code != 0 || err != nil || protojson.Unmarshal(j, &back) != nil || !proto.Equal(back.GetSpec(), pyTemplateSpec()) || back.GetDisplayName() != "py" {
		t.Errorf("get -o yaml: %d %q %q", code, out, errs)
	}
	if _, errs, code := f.sbx("", "ls", "-o", "yaml"); code != 1 || !strings.Contains(errs, "-o yaml is for sbx template get only") {
		t.Errorf("ls -o yaml: %d %q", code, errs)
	}
	_, errs, code = f.sbx("", "template", "get", "nope")
	if code != 1 || errs != "sbx: sandbox template \"nope\" not found (CWSANDBOX_TEMPLATE_NOT_FOUND)\n" {
		t.Errorf("get of a missing template: %d %q", code, errs)
	}

	out, _, code = f.sbx("", "template", "ls")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 0 || len(lines) != 3 || !regexp.MustCompile(`^ID\s+NAME\s+REVISION\s+IMAGE\s+UPDATED$`).MatchString(lines[0]) ||
		!regexp.MustCompile(`^tmpl-1\s+py\s+1\s+python:3.11\s+\S+ ago$`).MatchString(lines[1]) ||
		!regexp.MustCompile(`^tmpl-2\s+bb\s+1\s+busybox\s`).MatchString(lines[2]) {
		t.Errorf("ls:\n%s", out)
	}
	if f.tmpl.lists[0].GetShowDeleted() {
		t.Error("ls sent show_deleted")
	}
	out, _, code = f.sbx("", "template", "ls", "-o", "json")
	var items []map[string]any
	if err := json.Unmarshal([]byte(out), &items); code != 0 || err != nil || len(items) != 2 || items[1]["displayName"] != "bb" {
		t.Errorf("ls -o json: %d %q %v", code, out, err)
	}
}

func TestSbxTemplateUpdateRm(t *testing.T) {
	f := newFake(t)
	if _, errs, code := f.sbx(pyTemplateYAML, "template", "create", "py", "-f", "-"); code != 0 {
		t.Fatal(errs)
	}
	last := func() *sandboxv1.UpdateSandboxTemplateRequest { return f.tmpl.updates[len(f.tmpl.updates)-1] }

	// The fields the file names (an empty list too) make the mask; the rest is kept.
	out, errs, code := f.sbx("tags: []\nmax_lifetime_seconds: 60\n", "template", "update", "py", "-f", "-", "--revision", "1")
	if code != 0 || out != "tmpl-1 py revision 2\n" {
		t.Fatalf("update: %d %q %q", code, out, errs)
	}
	if r := last(); !slices.Equal(r.GetUpdateMask().GetPaths(), []string{"spec.max_lifetime_seconds", "spec.tags"}) ||
		r.GetSandboxTemplate().GetRevision() != 1 || r.GetSandboxTemplate().GetSpec().GetMaxLifetimeSeconds() != 60 || r.GetSandboxTemplateId() != "py" {
		t.Errorf("update sent %v", r)
	}
	// --replace sends the whole spec; --name renames.
	if _, errs, code = f.sbx("tags: [x]\n", "template", "update", "py", "-f", "-", "--replace", "--name", "py2"); code != 0 {
		t.Fatalf("update --replace: %d %q", code, errs)
	}
	if r := last(); !slices.Equal(r.GetUpdateMask().GetPaths(), []string{"display_name", "spec"}) || r.GetSandboxTemplate().GetDisplayName() != "py2" || r.GetSandboxTemplate().GetRevision() != 0 {
		t.Errorf("update --replace --name sent %v", r)
	}
	// A stale revision is the server's ETAG_MISMATCH.
	_, errs, code = f.sbx("", "template", "update", "py2", "--name", "py3", "--revision", "1")
	if code != 1 || !strings.Contains(errs, "is at revision 3, not 1") || !strings.HasSuffix(errs, "(CWSANDBOX_ETAG_MISMATCH)\n") {
		t.Errorf("stale revision: %d %q", code, errs)
	}
	n := len(f.tmpl.updates)
	for _, bad := range []struct {
		stdin string
		args  []string
		want  string
	}{
		{"", []string{"py2"}, "nothing to change"},
		{"", []string{"py2", "--name", ""}, "cannot be empty"},
		{"", []string{"py2", "--replace"}, "--replace needs -f"},
		{"{}\n", []string{"py2", "-f", "-"}, "names no field"},
		{"nope: 1\n", []string{"py2", "-f", "-"}, `unknown field "nope"`},
	} {
		if _, errs, code := f.sbx(bad.stdin, append([]string{"template", "update"}, bad.args...)...); code != 1 || !strings.Contains(errs, bad.want) {
			t.Errorf("update %v: %d %q, want %q", bad.args, code, errs, bad.want)
		}
	}
	if len(f.tmpl.updates) != n {
		t.Errorf("refused updates reached the server")
	}

	if _, errs, code = f.sbx("", "template", "rm", "py2"); code != 0 || !slices.Equal(f.tmpl.deletes, []string{"py2"}) {
		t.Fatalf("rm: %d %q", code, errs)
	}
	_, errs, code = f.sbx("", "template", "rm", "py2")
	if code != 1 || errs != "sbx: delete py2: sandbox template \"py2\" not found (CWSANDBOX_TEMPLATE_NOT_FOUND)\n" {
		t.Errorf("rm of a deleted template: %d %q", code, errs)
	}
	out, _, _ = f.sbx("", "template", "ls")
	if strings.Contains(out, "tmpl-1") {
		t.Errorf("ls shows a deleted template:\n%s", out)
	}
	out, _, _ = f.sbx("", "template", "ls", "--deleted")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 || !strings.HasSuffix(lines[0], "DELETED") || !regexp.MustCompile(`^tmpl-1\s+py2\s+3\s.*\syes$`).MatchString(lines[1]) ||
		!f.tmpl.lists[len(f.tmpl.lists)-1].GetShowDeleted() {
		t.Errorf("ls --deleted:\n%s", out)
	}
	out, _, code = f.sbx("", "template", "get", "tmpl-1", "--deleted")
	if code != 0 || !regexp.MustCompile(`(?m)^Deleted:\s+\S`).MatchString(out) {
		t.Errorf("get --deleted: %d %q", code, out)
	}
}

func TestSbxRunTemplate(t *testing.T) {
	f := newFake(t)
	if _, errs, code := f.sbx(pyTemplateYAML, "template", "create", "py", "-f", "-"); code != 0 {
		t.Fatal(errs)
	}
	last := func() *sandboxv1.CreateSandboxFromTemplateRequest { return f.fromTmpl[len(f.fromTmpl)-1] }

	// No flags: no overrides; the ID on stdout; get shows the template.
	out, errs, code := f.sbx("", "run", "--template", "py")
	if code != 0 || out != "sbx-fake-1\n" {
		t.Fatalf("run --template: %d %q %q", code, out, errs)
	}
	if r := last(); r.GetTemplateId() != "py" || r.GetOverrides() != nil || r.GetRequestId() == "" {
		t.Errorf("run --template sent %v", r)
	}
	out, _, _ = f.sbx("", "get", "sbx-fake-1")
	if !regexp.MustCompile(`(?m)^Template:\s+tmpl-1 \(revision 1\)$`).MatchString(out) || !regexp.MustCompile(`(?m)^Image:\s+python:3.11$`).MatchString(out) {
		t.Errorf("get of a sandbox from a template:\n%s", out)
	}

	// Sandbox-level flags only: no containers sent.
	if _, errs, code = f.sbx("", "run", "--template", "py", "--tag", "x", "--lifetime", "90s", "--deny-egress"); code != 0 {
		t.Fatal(errs)
	}
	o := last().GetOverrides()
	if len(o.GetContainers()) != 0 || !slices.Equal(o.GetTags(), []string{"x"}) || o.GetMaxLifetimeSeconds() != 90 || !o.GetNetwork().GetDenyEgress() || len(o.GetRunnerIds()) != 0 {
		t.Errorf("sandbox-level overrides %v", o)
	}

	// IMAGE, --env and a command: the template's containers, its primary changed; CMD runs.
	out, errs, code = f.sbx("", "run", "--template", "py", "python:3.12", "-e", "B=3", "--workdir", "/w", "--rm", "--", "echo", "hi")
	if code != 0 || out != "hi\n" {
		t.Fatalf("run --template IMAGE -- CMD: %d %q %q", code, out, errs)
	}
	r := last()
	cs := r.GetOverrides().GetContainers()
	if r.GetTemplateId() != "tmpl-1" || len(cs) != 2 || !proto.Equal(cs[0], pyTemplateSpec().GetContainers()[0]) ||
		cs[1].GetImage() != "python:3.12" || cs[1].GetCommand() != "sleep" || cs[1].GetWorkingDir() != "/w" ||
		fmt.Sprint(cs[1].GetEnvironmentVariables()) != "map[A:1 B:3]" {
		t.Errorf("container overrides %v", r)
	}
	if !slices.Equal(f.lastExec(), []string{"echo", "hi"}) || len(f.deleted) != 1 {
		t.Errorf("exec %v, deleted %v", f.lastExec(), f.deleted)
	}
	if _, _, code = f.sbx("", "run", "--template", "py", "--main", "python3 -m http.server"); code != 0 {
		t.Fatal("run --main")
	}
	if c := last().GetOverrides().GetContainers()[1]; c.GetCommand() != "/bin/sh" || !slices.Equal(c.GetArgs(), []string{"-c", "python3 -m http.server"}) || c.GetImage() != "python:3.11" {
		t.Errorf("--main override %v", c)
	}

	n := len(f.fromTmpl)
	for _, bad := range []struct {
		args []string
		want string
	}{
		{[]string{"a", "b"}, "CMD follows --"},
		{[]string{"a", "b", "--", "c"}, "at most one argument (IMAGE)"},
		{[]string{"--volume", "w:/w"}, "[template volume] were all set"},
		{[]string{"--container", "name=a,image=b"}, "were all set"},
		{[]string{"--rm"}, "--rm needs a command"},
	} {
		_, errs, code := f.sbx("", append([]string{"run", "--template", "py"}, bad.args...)...)
		if code != 1 || !strings.Contains(errs, bad.want) {
			t.Errorf("run --template py %v: %d %q, want %q", bad.args, code, errs, bad.want)
		}
	}
	if len(f.fromTmpl) != n {
		t.Error("refused runs reached the server")
	}
	for _, args := range [][]string{{"--template", "nope"}, {"--template", "nope", "-e", "A=1"}} {
		_, errs, code := f.sbx("", append([]string{"run"}, args...)...)
		if code != 1 || errs != "sbx: sandbox template \"nope\" not found (CWSANDBOX_TEMPLATE_NOT_FOUND)\n" {
			t.Errorf("run %v: %d %q", args, code, errs)
		}
	}
}

// FuzzParseTemplateSpec: any input is a spec or an error, never a panic; a spec parsed
// once survives printing as YAML (sbx template get) and parsing again unchanged.
func FuzzParseTemplateSpec(f *testing.F) {
	for _, seed := range []string{pyTemplateYAML, "{}", "tags: []\n", `{"containers":[{"name":"m","image":"x","files":[{"path":"/a","content":"aGk="}]}]}`,
		"network: {deny_egress: true}\n", "mode: SANDBOX_MODE_CKS\n", "- a\n", "a: &x [*x]\n", "containers: [{name: m, imag: x}]\n"} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		spec, fields, err := parseTemplateSpec("fuzz", b)
		if err != nil {
			return
		}
		if !slices.IsSorted(fields) {
			t.Fatalf("fields %v not sorted", fields)
		}
		y, err := specYAML(spec)
		if err != nil {
			t.Fatal(err)
		}
		again, _, err := parseTemplateSpec("again", []byte(y))
		if err != nil || !proto.Equal(spec, again) {
			t.Fatalf("round trip: %v\n%s", err, y)
		}
	})
}

// TestSbxTemplateExamples: the documented example templates parse strictly.
func TestSbxTemplateExamples(t *testing.T) {
	files, err := filepath.Glob("../../examples/templates/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no examples: %v", err)
	}
	for _, p := range files {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		spec, _, err := parseTemplateSpec(p, b)
		if err != nil {
			t.Errorf("%s: %v", p, err)
			continue
		}
		if len(spec.GetContainers()) == 0 || spec.GetContainers()[0].GetImage() == "" {
			t.Errorf("%s: no container with an image: %v", p, spec)
		}
	}
}
