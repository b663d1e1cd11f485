package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/gateway"
	"github.com/sandboxd/sandboxd/internal/sbxcli"
	"github.com/sandboxd/sandboxd/internal/store"
	sandbox "github.com/sandboxd/sandboxd/sdk/go"
)

// tmplGW is a gateway over a real runner with templates in a SQLite store, the
// runner's policy capping lifetimes at 600 s, and an admin key of organization a (keyA
// is a user key of it).
type tmplGW struct {
	*gw
	admin string
}

func startTemplateGateway(t *testing.T) *tmplGW {
	t.Helper()
	st, err := store.Open(t.Context(), filepath.Join(t.TempDir(), "sandboxd.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	pol := &policies{}
	pol.set(`{"base": {"max_lifetime_seconds": 120}, "constraints": {"lifetime": {"max_seconds": 600}}}`)
	var keys *auth.Keyring
	g := startGateway(t, func(c *gateway.Config) {
		c.Templates, c.Policies = st.Templates(), pol
		keys = c.Auth.(*auth.Keyring)
	})
	admin, _, err := keys.Create("org-a", auth.RoleAdmin, "")
	if err != nil {
		t.Fatal(err)
	}
	return &tmplGW{gw: g, admin: admin}
}

// sbxAs runs sbx against g with key.
func sbxAs(g *gw, key, stdin string, args ...string) (stdout, stderr string, code int) {
	var out, errb bytes.Buffer
	code = sbxcli.Execute(append([]string{"--base-url", g.url, "--api-key", key}, args...), strings.NewReader(stdin), &out, &errb)
	return out.String(), errb.String(), code
}

// templateSpec is a busybox sleeper template with an environment and tags.
func templateSpec() *sandboxv1.PartialSandboxSpec {
	return &sandboxv1.PartialSandboxSpec{
		Containers: []*sandboxv1.PartialContainer{{Name: "main", Image: busybox(), Command: "/bin/sh",
			Args: []string{"-c", `trap "exit 0" TERM; sleep infinity & wait`}, EnvironmentVariables: map[string]string{"FROM": "template", "KEEP": "1"}}},
		Tags: []string{"tmpl", "base"},
	}
}

// resolved returns the sandbox id's spec as the gateway reports it, with its source.
func resolved(t *testing.T, c *sandbox.Client, id string) (*sandboxv1.Sandbox, *sandboxv1.Container) {
	t.Helper()
	sb, err := c.Get(context.Background(), id)
	if err != nil {
		t.Fatalf("get %s: %v", id, err)
	}
	p := sb.Proto()
	cs := p.GetSpec().GetContainers()
	if len(cs) != 1 {
		t.Fatalf("sandbox %s has %d containers, want the template's 1", id, len(cs))
	}
	return p, cs[0]
}

func waitRunning(t *testing.T, c *sandbox.Client, id string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := c.Sandbox(id).Wait(ctx); err != nil {
		t.Fatalf("sandbox %s: %v", id, err)
	}
}

// TestSDKTemplatesAgainstGateway runs the Go SDK's template calls against the real
// gateway and a real runner.
func TestSDKTemplatesAgainstGateway(t *testing.T) {
	g := startTemplateGateway(t)
	ctx := context.Background()
	admin, user := sdkClient(t, g.gw, g.admin), sdkClient(t, g.gw, g.keyA)

	tm, err := admin.CreateTemplate(ctx, "sdk-py", templateSpec())
	if err != nil || tm.ID == "" || tm.Revision != 1 {
		t.Fatalf("create: %+v %v", tm, err)
	}

	// Image and env override: a copy of the primary container changes, the rest stays.
	sb, err := user.RunTemplate(ctx, "sdk-py", sandbox.Overrides{Image: python(), Env: map[string]string{"FROM": "override", "ADDED": "2"}}, sandbox.FromTemplateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	waitRunning(t, user, sb.ID())
	p, c := resolved(t, user, sb.ID())
	if c.GetImage() != python() || !maps.Equal(c.GetEnvironmentVariables(), map[string]string{"FROM": "override", "KEEP": "1", "ADDED": "2"}) ||
		c.GetCommand() != "/bin/sh" || !slices.Equal(p.GetSpec().GetTags(), []string{"tmpl", "base"}) {
		t.Errorf("image/env override resolved to image %q env %v command %q tags %v", c.GetImage(), c.GetEnvironmentVariables(), c.GetCommand(), p.GetSpec().GetTags())
	}
	if in := sb.Info(); in.SourceTemplateID != tm.ID || in.SourceTemplateRevision != 1 {
		t.Errorf("source template %q rev %d, want %s rev 1", in.SourceTemplateID, in.SourceTemplateRevision, tm.ID)
	}
	var out bytes.Buffer
	if code, err := sb.Exec(ctx, []string{"sh", "-c", "echo $FROM $KEEP $ADDED; python3 -c 'print(1)'"}, sandbox.ExecOptions{Stdout: &out}); err != nil || code != 0 || out.String() != "override 1 2\n1\n" {
		t.Errorf("in the sandbox: %q %d %v", out.String(), code, err)
	}

	// An update bumps the revision; a sandbox started after it records the new one.
	// The tags override replaces the template's; nothing else changes.
	up, err := admin.UpdateTemplate(ctx, tm.ID, sandbox.TemplateUpdate{Spec: &sandboxv1.PartialSandboxSpec{Tags: []string{"v2"}}, SpecFields: []string{"tags"}, Revision: 1})
	if err != nil || up.Revision != 2 || !slices.Equal(up.Spec.GetTags(), []string{"v2"}) || len(up.Spec.GetContainers()) != 1 {
		t.Fatalf("update spec.tags: %+v %v", up, err)
	}
	sb2, err := user.CreateFromTemplate(ctx, tm.ID, &sandboxv1.PartialSandboxSpec{Tags: []string{"mine"}}, sandbox.FromTemplateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p2, c2 := resolved(t, user, sb2.ID())
	if !slices.Equal(p2.GetSpec().GetTags(), []string{"mine"}) || c2.GetImage() != busybox() || c2.GetEnvironmentVariables()["FROM"] != "template" ||
		p2.GetSourceTemplateId() != tm.ID || p2.GetSourceTemplateRevision() != 2 {
		t.Errorf("tags override resolved to tags %v image %q env %v source %s/%d", p2.GetSpec().GetTags(), c2.GetImage(), c2.GetEnvironmentVariables(),
			p2.GetSourceTemplateId(), p2.GetSourceTemplateRevision())
	}

	// A stale revision.
	_, err = admin.UpdateTemplate(ctx, "sdk-py", sandbox.TemplateUpdate{DisplayName: "sdk-py2", Revision: 1})
	var e *sandbox.Error
	if !errors.Is(err, sandbox.ErrRevisionMismatch) || !errors.As(err, &e) || e.Metadata["current_revision"] != "2" {
		t.Errorf("stale revision: %v", err)
	}

	// A user key reads and runs, but writes nothing.
	if _, err := user.CreateTemplate(ctx, "mine", templateSpec()); !isPermissionDenied(err) {
		t.Errorf("user create: %v", err)
	}
	if _, err := user.UpdateTemplate(ctx, "sdk-py", sandbox.TemplateUpdate{DisplayName: "x"}); !isPermissionDenied(err) {
		t.Errorf("user update: %v", err)
	}
	if err := user.DeleteTemplate(ctx, "sdk-py"); !isPermissionDenied(err) {
		t.Errorf("user delete: %v", err)
	}
	if list, err := user.ListTemplates(ctx, sandbox.TemplateListOptions{}); err != nil || len(list) != 1 || list[0].ID != tm.ID {
		t.Errorf("user list: %d %v", len(list), err)
	}
	if got, err := user.GetTemplate(ctx, "sdk-py", false); err != nil || got.ID != tm.ID || got.Revision != 2 {
		t.Errorf("user get: %+v %v", got, err)
	}

	// Deleted: gone by name and by ID, for runs too (by ID with or without a read).
	if err := admin.DeleteTemplate(ctx, "sdk-py"); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"sdk-py", tm.ID} {
		for _, o := range []sandbox.Overrides{{}, {Image: python()}} {
			_, err := user.RunTemplate(ctx, key, o, sandbox.FromTemplateOptions{})
			if !errors.Is(err, sandbox.ErrTemplateNotFound) || errors.Is(err, sandbox.ErrNotFound) || !strings.Contains(err.Error(), key) {
				t.Errorf("run deleted %s (%+v): %v", key, o, err)
			}
		}
	}
	if got, err := user.GetTemplate(ctx, tm.ID, true); err != nil || !got.Deleted {
		t.Errorf("get deleted with showDeleted: %+v %v", got, err)
	}

	// The template carries no authority: the runner's policy judges the merged spec.
	long := templateSpec()
	long.MaxLifetimeSeconds = 3600
	if _, err := admin.CreateTemplate(ctx, "sdk-long", long); err != nil {
		t.Fatal(err)
	}
	_, err = user.RunTemplate(ctx, "sdk-long", sandbox.Overrides{}, sandbox.FromTemplateOptions{})
	if !errors.Is(err, sandbox.ErrInvalidArgument) || !strings.Contains(err.Error(), "constraints.lifetime.max_seconds") {
		t.Errorf("policy-rejected template: %v", err)
	}
	// An override within the policy fixes it.
	if sb, err := user.RunTemplate(ctx, "sdk-long", sandbox.Overrides{Lifetime: 5 * time.Minute}, sandbox.FromTemplateOptions{}); err != nil {
		t.Errorf("lifetime override: %v", err)
	} else if p, _ := resolved(t, user, sb.ID()); p.GetSpec().GetMaxLifetimeSeconds() != 300 {
		t.Errorf("lifetime override resolved to %d", p.GetSpec().GetMaxLifetimeSeconds())
	}
}

func isPermissionDenied(err error) bool {
	var e *sandbox.Error
	return errors.As(err, &e) && e.Code == connect.CodePermissionDenied && e.Reason == "CWSANDBOX_PERMISSION_DENIED"
}

// TestSbxTemplatesAgainstGateway runs sbx template and sbx run --template against the
// real gateway and a real runner, and checks what sbx prints.
func TestSbxTemplatesAgainstGateway(t *testing.T) {
	g := startTemplateGateway(t)
	user := sdkClient(t, g.gw, g.keyA)
	spec := fmt.Sprintf(`containers:
  - name: main
    image: %s
    command: /bin/sh
    args: ["-c", "trap 'exit 0' TERM; sleep infinity & wait"]
    environment_variables: {FROM: template, KEEP: "1"}
tags: [tmpl, base]
`, busybox())

	out, errs, code := sbxAs(g.gw, g.admin, spec, "template", "create", "py", "-f", "-")
	id := strings.TrimSpace(out)
	if code != 0 || id == "" || errs != "" {
		t.Fatalf("template create: %q %q %d", out, errs, code)
	}

	// A user key cannot write templates; sbx says why.
	for _, args := range [][]string{
		{"template", "create", "mine", "-f", "-"},
		{"template", "update", "py", "--name", "x"},
		{"template", "rm", "py"},
	} {
		_, errs, code := sbxAs(g.gw, g.keyA, spec, args...)
		if code != 1 || !strings.Contains(errs, "needs an API key of role SANDBOX_ADMIN (CWSANDBOX_PERMISSION_DENIED)") {
			t.Errorf("user %v: %q %d", args, errs, code)
		}
	}
	// But reads and runs.
	if out, errs, code := sbxAs(g.gw, g.keyA, "", "template", "ls"); code != 0 || !strings.Contains(out, id+"  py  ") || !strings.Contains(out, busybox()) {
		t.Errorf("user template ls: %q %q %d", out, errs, code)
	}
	if out, errs, code := sbxAs(g.gw, g.keyA, "", "template", "get", "py"); code != 0 || !strings.Contains(out, "ID:") || !strings.Contains(out, id) || !strings.Contains(out, "FROM: template") {
		t.Errorf("user template get: %q %q %d", out, errs, code)
	}

	// run --template with an image and an env override.
	out, errs, code = sbxAs(g.gw, g.keyA, "", "run", "--template", "py", "-e", "FROM=override", "-e", "ADDED=2", python())
	sbID := strings.TrimSpace(out)
	if code != 0 || sbID == "" {
		t.Fatalf("run --template IMAGE -e: %q %q %d", out, errs, code)
	}
	p, c := resolved(t, user, sbID)
	if c.GetImage() != python() || !maps.Equal(c.GetEnvironmentVariables(), map[string]string{"FROM": "override", "KEEP": "1", "ADDED": "2"}) ||
		!slices.Equal(p.GetSpec().GetTags(), []string{"tmpl", "base"}) || p.GetSourceTemplateId() != id || p.GetSourceTemplateRevision() != 1 {
		t.Errorf("run --template IMAGE -e resolved to image %q env %v tags %v source %s/%d", c.GetImage(), c.GetEnvironmentVariables(), p.GetSpec().GetTags(),
			p.GetSourceTemplateId(), p.GetSourceTemplateRevision())
	}

	if out, errs, code := sbxAs(g.gw, g.keyA, "", "get", sbID); code != 0 || !strings.Contains(out, fmt.Sprintf("%s (revision 1)", id)) {
		t.Errorf("get of a sandbox from a template: %q %q %d", out, errs, code)
	}

	// A spec field given empty clears the template's (tags: []), then another update.
	if out, errs, code := sbxAs(g.gw, g.admin, "tags: []\n", "template", "update", "py", "-f", "-"); code != 0 || out != id+" py revision 2\n" {
		t.Fatalf("template update tags: []: %q %q %d", out, errs, code)
	}
	if tm, err := user.GetTemplate(context.Background(), id, false); err != nil || len(tm.Spec.GetTags()) != 0 || len(tm.Spec.GetContainers()) != 1 {
		t.Fatalf("after tags: []: %+v %v", tm, err)
	}

	// An update (spec fields named by the file), then run --template --tag with a command.
	if out, errs, code := sbxAs(g.gw, g.admin, "tags: [v2]\n", "template", "update", "py", "-f", "-", "--revision", "2"); code != 0 || out != id+" py revision 3\n" {
		t.Fatalf("template update: %q %q %d", out, errs, code)
	}
	out, errs, code = sbxAs(g.gw, g.keyA, "", "run", "--template", "py", "--tag", "mine", "--rm", "--", "sh", "-c", "echo $FROM")
	if code != 0 || out != "template\n" {
		t.Errorf("run --template --tag --rm: %q %q %d", out, errs, code)
	}
	out, errs, code = sbxAs(g.gw, g.keyA, "", "run", "--template", id, "--tag", "mine")
	if code != 0 {
		t.Fatalf("run --template ID --tag: %q %q %d", out, errs, code)
	}
	p, c = resolved(t, user, strings.TrimSpace(out))
	if !slices.Equal(p.GetSpec().GetTags(), []string{"mine"}) || c.GetImage() != busybox() || p.GetSourceTemplateRevision() != 3 {
		t.Errorf("run --template --tag resolved to tags %v image %q revision %d", p.GetSpec().GetTags(), c.GetImage(), p.GetSourceTemplateRevision())
	}

	// A stale --revision.
	_, errs, code = sbxAs(g.gw, g.admin, "tags: [v3]\n", "template", "update", "py", "-f", "-", "--revision", "1")
	if code != 1 || errs != fmt.Sprintf("sbx: sandbox template %s is at revision 3, not 1: read it again (CWSANDBOX_ETAG_MISMATCH)\n", id) {
		t.Errorf("stale --revision: %q %d", errs, code)
	}

	// A template the runner's policy rejects: the constraint is named.
	if _, errs, code := sbxAs(g.gw, g.admin, spec+"max_lifetime_seconds: 3600\n", "template", "create", "long", "-f", "-"); code != 0 {
		t.Fatalf("create long: %q %d", errs, code)
	}
	_, errs, code = sbxAs(g.gw, g.keyA, "", "run", "--template", "long")
	if code != 1 || !strings.Contains(errs, "constraints.lifetime.max_seconds") || !strings.Contains(errs, "max_lifetime_seconds") || !strings.Contains(errs, "(CWSANDBOX_") {
		t.Errorf("policy-rejected template: %q %d", errs, code)
	}

	// Deleted: run --template says the template is not found.
	if out, errs, code := sbxAs(g.gw, g.admin, "", "template", "rm", "py"); code != 0 {
		t.Fatalf("template rm: %q %q %d", out, errs, code)
	}
	for _, key := range []string{"py", id} {
		for _, args := range [][]string{{"run", "--template", key}, {"run", "--template", key, python()}} {
			_, errs, code := sbxAs(g.gw, g.keyA, "", args...)
			if want := fmt.Sprintf("sbx: sandbox template %q not found (CWSANDBOX_TEMPLATE_NOT_FOUND)\n", key); code != 1 || errs != want {
				t.Errorf("%v after rm: %q %d, want %q", args, errs, code, want)
			}
		}
	}
	// A deleted template is shown by ID; by name sbx says why not.
	if out, errs, code := sbxAs(g.gw, g.keyA, "", "template", "get", "--deleted", id); code != 0 || !strings.Contains(out, "Deleted:") {
		t.Errorf("get --deleted ID: %q %q %d", out, errs, code)
	}
	_, errs, code = sbxAs(g.gw, g.keyA, "", "template", "get", "--deleted", "py")
	if code != 1 || errs != "sbx: sandbox template \"py\" not found; a deleted template is found by its ID only (sbx template ls --deleted) (CWSANDBOX_TEMPLATE_NOT_FOUND)\n" {
		t.Errorf("get --deleted NAME: %q %d", errs, code)
	}
	_, errs, code = sbxAs(g.gw, g.admin, "", "template", "rm", "py")
	if code != 1 || errs != "sbx: delete py: sandbox template \"py\" not found (CWSANDBOX_TEMPLATE_NOT_FOUND)\n" {
		t.Errorf("rm again: %q %d", errs, code)
	}
}
