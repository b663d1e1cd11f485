package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1/sandboxv1connect"
	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	buildv1 "github.com/sandboxd/sandboxd/gen/sandboxd/build/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/build/v1/buildv1connect"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/fsarchive"
	"github.com/sandboxd/sandboxd/internal/gateway"
	"github.com/sandboxd/sandboxd/internal/registry"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/sbxcli"
	"github.com/sandboxd/sandboxd/internal/stack"
	"github.com/sandboxd/sandboxd/internal/stack/stacktest"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/testimage"
)

// TestTemplateBuild is issue 22's build test through the platform API: a template is
// built by BuildService from a Dockerfile (FROM a test image; ENV, WORKDIR, COPY, RUN,
// USER) inside a gVisor builder on the runner, the log followed live to its final build,
// the image pushed to the platform registry and made the template's by digest; a sandbox
// created from the template sees every instruction; a second build of the same context
// succeeds; a failing RUN names its step; another organization cannot see the build.
func TestTemplateBuild(t *testing.T) {
	if testing.Short() {
		t.Skip("real builds")
	}
	const org = "build-org"
	p := newBuildPlatform(t, org)
	host, adminKey, userKey, otherKey, s, api := p.host, p.adminKey, p.userKey, p.otherKey, p.s, p.api
	builds := buildv1connect.NewBuildServiceClient(api.Client(), api.URL)
	templates := sandboxv1connect.NewSandboxTemplateServiceClient(api.Client(), api.URL)
	sandboxes := sandboxv1connect.NewSandboxServiceClient(api.Client(), api.URL)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	// The template: a command that keeps the sandbox up; the build gives it its image.
	tmpl, err := templates.CreateSandboxTemplate(ctx, withKey(adminKey, &sandboxv1.CreateSandboxTemplateRequest{SandboxTemplate: &sandboxv1.SandboxTemplate{
		DisplayName: "Built App", Spec: &sandboxv1.PartialSandboxSpec{Containers: []*sandboxv1.PartialContainer{{Name: "main", Image: busybox(),
			Command: "/bin/sh", Args: []string{"-c", `trap "exit 0" TERM; sleep infinity & wait`}}}}}}))
	if err != nil {
		t.Fatal(err)
	}

	ctxDir := t.TempDir()
	for p, c := range map[string]string{
		"Dockerfile": "FROM " + busybox() + `
ENV GREETING=hello-from-build
WORKDIR /app
COPY hello.txt ./hello.txt
RUN echo "$GREETING" > greeting && mkdir -p /app/data && chown nobody /app/data && id -u > built-as
USER nobody
RUN id -u > /app/data/ran-as
`,
		"Dockerfile.fail": "FROM " + busybox() + "\nRUN echo fine\nRUN echo about to fail && exit 7\nRUN echo never\n",
		"Dockerfile.slow": "FROM " + busybox() + "\nRUN echo started && sleep 600\n",
		"hello.txt":       "hello-from-context\n",
	} {
		if err := os.WriteFile(filepath.Join(ctxDir, p), []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	root, err := os.Open(ctxDir)
	if err != nil {
		t.Fatal(err)
	}
	var archive bytes.Buffer
	if _, err := fsarchive.Write(ctx, root, &archive, fsarchive.IDMap{}); err != nil {
		t.Fatal(err)
	}
	_ = root.Close()

	// build starts a build of the template and follows its log to the end.
	build := func(dockerfile string) (*buildv1.Build, []*buildv1.BuildLogEvent, time.Duration) {
		t.Helper()
		start := time.Now()
		res, err := builds.StartBuild(ctx, withKey(adminKey, &buildv1.StartBuildRequest{Target: &buildv1.StartBuildRequest_Template{Template: "Built App"},
			Dockerfile: dockerfile, Context: archive.Bytes(), TimeoutSeconds: 600}))
		if err != nil {
			t.Fatal(err)
		}
		if st := res.Msg.GetBuild().GetState(); st != buildv1.BuildState_BUILD_STATE_QUEUED {
			t.Fatalf("StartBuild answered %s", st)
		}
		stream, err := builds.StreamBuildLogs(ctx, withKey(userKey, &buildv1.StreamBuildLogsRequest{BuildId: res.Msg.GetBuild().GetBuildId(), Follow: true}))
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = stream.Close() }()
		var evs []*buildv1.BuildLogEvent
		for stream.Receive() {
			evs = append(evs, stream.Msg().GetEvent())
		}
		if err := stream.Err(); err != nil || len(evs) == 0 || evs[len(evs)-1].GetBuild() == nil {
			t.Fatalf("log stream: %v (%d events)", err, len(evs))
		}
		return evs[len(evs)-1].GetBuild(), evs, time.Since(start)
	}
	logText := func(evs []*buildv1.BuildLogEvent) string {
		var b strings.Builder
		for _, ev := range evs {
			switch {
			case ev.GetStep() != nil:
				fmt.Fprintf(&b, "[step %d] %s\n", ev.GetStep().GetNumber(), ev.GetStep().GetInstruction())
			case ev.GetLine() != nil:
				fmt.Fprintf(&b, "%s\n", ev.GetLine().GetText())
			default:
				fmt.Fprintf(&b, "[build %s]\n", ev.GetBuild().GetState())
			}
		}
		return b.String()
	}

	first, evs, took := build("")
	if first.GetState() != buildv1.BuildState_BUILD_STATE_SUCCEEDED {
		t.Fatalf("first build: %v\n%s", first, logText(evs))
	}
	t.Logf("first build, StartBuild to the final event: %v (%d steps)", took, len(first.GetSteps()))
	wantImage := host + "/" + org + "/built-app@" + first.GetImageDigest()
	if first.GetImage() != wantImage || first.GetTemplateId() != tmpl.Msg.GetSandboxTemplateId() || first.GetTemplateRevision() != 2 || len(first.GetSteps()) != 7 {
		t.Fatalf("first build: %v", first)
	}
	var sawSteps int
	for _, ev := range evs {
		if ev.GetStep() != nil {
			sawSteps++
		}
	}
	if sawSteps != 7 || !strings.Contains(logText(evs), "[build BUILD_STATE_RUNNING]") {
		t.Errorf("log: %d step events\n%s", sawSteps, logText(evs))
	}
	got, err := templates.GetSandboxTemplate(ctx, withKey(userKey, &sandboxv1.GetSandboxTemplateRequest{SandboxTemplateId: "Built App"}))
	if err != nil || got.Msg.GetSpec().GetContainers()[0].GetImage() != wantImage || got.Msg.GetRevision() != 2 {
		t.Fatalf("template after the build: %v, %v", got, err)
	}

	// A sandbox from the template sees every instruction.
	sb, err := sandboxes.CreateSandboxFromTemplate(ctx, withKey(userKey, &sandboxv1.CreateSandboxFromTemplateRequest{TemplateId: "Built App"}))
	if err != nil {
		t.Fatal(err)
	}
	id := sb.Msg.GetSandboxId()
	waitState(t, s, id, runner.StateRunning, time.Minute)
	a := agentOf(t, s, id)
	for _, check := range []struct{ script, want string }{
		{"cat /app/hello.txt", "hello-from-context\n"},                                // COPY
		{"echo $GREETING; cat /app/greeting", "hello-from-build\nhello-from-build\n"}, // ENV, RUN
		{"pwd", "/app\n"},    // WORKDIR
		{"id -u", "65534\n"}, // USER
		{"cat /app/built-as /app/data/ran-as", "0\n65534\n"}, // RUN before and after USER
	} {
		res, err := a.Exec(ctx, connect.NewRequest(&agentv1.ExecRequest{Command: []string{"sh", "-c", check.script}}))
		if err != nil || string(res.Msg.GetStdout()) != check.want {
			t.Errorf("%s in the sandbox from the template: %v %q %q, want %q", check.script, err, res.Msg.GetStdout(), res.Msg.GetStderr(), check.want)
		}
	}

	// The same context again: it succeeds, every step but FROM taken from the
	// organization's layer cache.
	second, evs, took := build("")
	if second.GetState() != buildv1.BuildState_BUILD_STATE_SUCCEEDED || second.GetTemplateRevision() != 3 {
		t.Fatalf("second build: %v\n%s", second, logText(evs))
	}
	cached := 0
	for _, st := range second.GetSteps() {
		if st.GetCached() {
			cached++
		}
	}
	t.Logf("second build of the same context: %v, %d of %d steps cached, digest %s (first %s)", took, cached, len(second.GetSteps()),
		second.GetImageDigest(), first.GetImageDigest())
	if cached != len(second.GetSteps())-1 || second.GetImageDigest() != first.GetImageDigest() {
		// Every step but FROM from the organization's cache, so the same image.
		t.Errorf("rebuild with the organization's layer cache: %d of %d steps cached, digest %s, first %s", cached, len(second.GetSteps()),
			second.GetImageDigest(), first.GetImageDigest())
	}

	// A failing RUN names its step.
	failed, evs, _ := build("Dockerfile.fail")
	if failed.GetState() != buildv1.BuildState_BUILD_STATE_FAILED || failed.GetFailedStep().GetNumber() != 3 ||
		!strings.Contains(failed.GetFailedStep().GetInstruction(), "exit 7") || failed.GetFailureReason() != gateway.BuildReasonStepFailed ||
		!strings.Contains(failed.GetFailureMessage(), "exit status 7") {
		t.Fatalf("failing build: %v\n%s", failed, logText(evs))
	}
	if got, err := templates.GetSandboxTemplate(ctx, withKey(userKey, &sandboxv1.GetSandboxTemplateRequest{SandboxTemplateId: "Built App"})); err != nil ||
		got.Msg.GetRevision() != 3 {
		t.Errorf("a failed build changed the template: %v, %v", got, err)
	}

	// A running build cancelled ends CANCELLED and its builder sandbox is destroyed.
	slow, err := builds.StartBuild(ctx, withKey(adminKey, &buildv1.StartBuildRequest{Target: &buildv1.StartBuildRequest_Repository{Repository: "slow"},
		Dockerfile: "Dockerfile.slow", Context: archive.Bytes()}))
	if err != nil {
		t.Fatal(err)
	}
	slowID := slow.Msg.GetBuild().GetBuildId()
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(100 * time.Millisecond) {
		b, err := builds.GetBuild(ctx, withKey(userKey, &buildv1.GetBuildRequest{BuildId: slowID}))
		if err != nil {
			t.Fatal(err)
		}
		if b.Msg.GetBuild().GetState() == buildv1.BuildState_BUILD_STATE_RUNNING && len(b.Msg.GetBuild().GetSteps()) == 2 {
			break // in its RUN
		}
		if time.Now().After(deadline) || b.Msg.GetBuild().GetState() != buildv1.BuildState_BUILD_STATE_QUEUED && b.Msg.GetBuild().GetState() != buildv1.BuildState_BUILD_STATE_RUNNING {
			t.Fatalf("slow build: %v", b.Msg.GetBuild())
		}
	}
	cancelStart := time.Now()
	cancelled, err := builds.CancelBuild(ctx, withKey(adminKey, &buildv1.CancelBuildRequest{BuildId: slowID}))
	if err != nil || cancelled.Msg.GetBuild().GetState() != buildv1.BuildState_BUILD_STATE_CANCELLED {
		t.Fatalf("cancel: %v, %v", cancelled, err)
	}
	t.Logf("CancelBuild of a running build answered CANCELLED in %v", time.Since(cancelStart))
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		live := 0
		for _, sb := range s.Runner.List() {
			if strings.HasPrefix(sb.Spec.ID, "build-") && !sb.State.Terminal() {
				live++
			}
		}
		if live == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d builders live after the cancel", live)
		}
	}

	// Another organization sees none of it.
	for _, b := range []*buildv1.Build{first, failed} {
		_, err := builds.GetBuild(ctx, withKey(otherKey, &buildv1.GetBuildRequest{BuildId: b.GetBuildId()}))
		if connect.CodeOf(err) != connect.CodeNotFound || apierr.Reason(err) != apierr.BuildNotFound {
			t.Errorf("another organization's GetBuild: %v", err)
		}
	}
	if list, err := builds.ListBuilds(ctx, withKey(otherKey, &buildv1.ListBuildsRequest{})); err != nil || len(list.Msg.GetBuilds()) != 0 {
		t.Errorf("another organization's ListBuilds: %v, %v", list, err)
	}
	if list, err := builds.ListBuilds(ctx, withKey(userKey, &buildv1.ListBuildsRequest{Template: "Built App"})); err != nil || len(list.Msg.GetBuilds()) != 3 {
		t.Errorf("ListBuilds: %v, %v", list, err)
	}
	if _, err := sandboxes.DeleteSandbox(ctx, withKey(userKey, &sandboxv1.DeleteSandboxRequest{SandboxId: id})); err != nil {
		t.Error(err)
	}

	// The same build through sbx: `sbx template build` packs the directory, follows the log
	// with a line per step, and answers the image; a failing step is exit status 1 naming it.
	sbx := func(key string, args ...string) (string, string, int) {
		var out, errb bytes.Buffer
		code := sbxcli.ExecuteContext(ctx, append([]string{"--base-url", api.URL, "--api-key", key}, args...), strings.NewReader(""), &out, &errb)
		return out.String(), errb.String(), code
	}
	out, errOut, code := sbx(adminKey, "template", "build", "-f", filepath.Join(ctxDir, "Dockerfile"), ctxDir, "--name", "Built App")
	if code != 0 || !strings.Contains(out, "Step 2/7: ENV GREETING=hello-from-build") || !strings.Contains(out+errOut, "@sha256:") {
		t.Errorf("sbx template build: exit %d\n%s\n%s", code, out, errOut)
	}
	if !strings.Contains(out, "(6 of 7 steps from the layer cache)") {
		t.Errorf("sbx template build of an unchanged context shows no cached step:\n%s", out)
	}
	out, errOut, code = sbx(adminKey, "template", "build", "-f", filepath.Join(ctxDir, "Dockerfile.fail"), ctxDir, "--name", "Built App")
	if code != 1 || !strings.Contains(out+errOut, "step 3") {
		t.Errorf("sbx template build of a failing Dockerfile: exit %d\n%s\n%s", code, out, errOut)
	}
	if out, errOut, code := sbx(userKey, "build", "ls", "--template", "Built App"); code != 0 || strings.Count(out, "succeeded") != 3 {
		t.Errorf("sbx build ls: exit %d\n%s\n%s", code, out, errOut)
	}
}

// buildPlatform is a whole platform that builds: a local stack whose runner has a gVisor
// builder, the platform registry on loopback, a gateway with BuildService and templates
// on a SQLite store, its API on api; keys of org (admin, user) and of another organization.
type buildPlatform struct {
	host                        string // the registry's
	adminKey, userKey, otherKey string
	s                           *stack.Stack
	api                         *httptest.Server
}

// newBuildPlatform skips the test where builds cannot run (no test images, no gvisor).
func newBuildPlatform(t *testing.T, org string) *buildPlatform {
	t.Helper()
	_, err := testimage.BuilderTar()
	if errors.Is(err, testimage.ErrNoTestImages) {
		t.Skip(err)
	} else if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	keys, err := auth.OpenKeyring(filepath.Join(dir, "keys.json"))
	if err != nil {
		t.Fatal(err)
	}
	adminKey, _, err := keys.Create(org, auth.RoleAdmin, "admin")
	if err != nil {
		t.Fatal(err)
	}
	userKey, _, err := keys.Create(org, auth.RoleUser, "user")
	if err != nil {
		t.Fatal(err)
	}
	otherKey, _, err := keys.Create("other-org", auth.RoleAdmin, "other")
	if err != nil {
		t.Fatal(err)
	}

	// The platform registry on loopback (plain HTTP), authenticated by the same keys.
	regSrv := httptest.NewUnstartedServer(nil)
	regSrv.Start()
	host := strings.TrimPrefix(regSrv.URL, "http://")
	reg, err := registry.New(context.Background(), registry.Config{Dir: filepath.Join(dir, "registry"), Auth: keys,
		TokenKey: []byte(strings.Repeat("b", 32)), Host: host})
	if err != nil {
		t.Fatal(err)
	}
	regSrv.Config.Handler = reg
	t.Cleanup(func() { regSrv.Close(); reg.Close() })

	cfg := env.StackConfig(filepath.Join(dir, "stack"))
	cfg.InsecureRegistries = append(cfg.InsecureRegistries, host)
	s, err := stack.NewLocal(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	t.Cleanup(func() { finish(t, s, cfg.DataDir) })
	t.Cleanup(func() { stacktest.RemoveKept(t, s.Backend) }) // before finish: the organizations' layer caches outlive their builders
	l := runner.NewLocal("local", s.Runner)
	if !slices.Contains(l.Classes(), runner.BuildRuntimeClass) {
		t.Skipf("no gvisor class on this machine (%v)", l.Classes())
	}
	if l.BuilderImage, err = testimage.PushBuilder(env.Registry); err != nil {
		t.Fatal(err)
	}
	l.BuildImages = s.BaseArchiver()

	st, err := store.Open(context.Background(), filepath.Join(dir, "sandboxd.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	for _, o := range []string{org, "other-org"} {
		if _, err := st.Orgs().Create(context.Background(), store.Org{ID: o, Name: o}); err != nil {
			t.Fatal(err)
		}
	}
	g, err := gateway.New(gateway.Config{Auth: keys, Runners: []runner.Handle{l}, Index: st.Sandboxes(), Orgs: st.Orgs(), Templates: st.Templates(),
		RegistryCredentials: reg.PullCredentials,
		Builds:              gateway.BuildOptions{Store: st.Builds(), RegistryHost: host, MintPushToken: reg.MintPushToken, MintPullToken: reg.MintPullToken, PushInsecure: true}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Close)
	// HTTP/1.1 and h2c, like sandboxd's API port: sbx speaks HTTP/2 with prior knowledge.
	api := httptest.NewUnstartedServer(g.Handler())
	api.Config.Protocols = new(http.Protocols)
	api.Config.Protocols.SetHTTP1(true)
	api.Config.Protocols.SetUnencryptedHTTP2(true)
	api.Start()
	t.Cleanup(api.Close)
	return &buildPlatform{host: host, adminKey: adminKey, userKey: userKey, otherKey: otherKey, s: s, api: api}
}

func withKey[T any](key string, m *T) *connect.Request[T] {
	r := connect.NewRequest(m)
	r.Header().Set("Authorization", "Bearer "+key)
	return r
}
