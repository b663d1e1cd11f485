package gateway

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1/sandboxv1connect"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/fsarchive"
	"github.com/sandboxd/sandboxd/internal/imagebuild"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// dockerfileOf extracts the Dockerfile of a build's context (an fsarchive archive).
func dockerfileOf(t *testing.T, req runner.BuildRequest) string {
	t.Helper()
	dir := t.TempDir()
	root, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	if _, err := fsarchive.Extract(context.Background(), req.Context, root, runtime.ArchiveLimits{}, fsarchive.IDMap{}); err != nil {
		t.Errorf("the build context is no fsarchive archive: %v", err)
		return ""
	}
	b, err := os.ReadFile(filepath.Join(dir, req.Options.Dockerfile))
	if err != nil {
		t.Errorf("the build context has no %s: %v", req.Options.Dockerfile, err)
	}
	return string(b)
}

func fileReq(contents string) *sandboxv1.CreateSandboxFromFileRequest {
	return &sandboxv1.CreateSandboxFromFileRequest{Type: sandboxv1.SandboxFileType_SANDBOX_FILE_TYPE_COMPOSE, Contents: []byte(contents)}
}

// TestComposeBuilds: a Compose service with build: {dockerfile_inline} is built through
// the build queue (any user of the organization), its container runs the pushed image by
// digest, a second create with the same file builds nothing, the build log is served by
// GetSandboxBuildLogs's URL (and kept across a restart), a failing build refuses the
// create naming the service and the step, and nothing is created then.
func TestComposeBuilds(t *testing.T) {
	ctx := t.Context()
	r := &buildingRunner{acceptingRunner: acceptingRunner{id: "r1"}, builderImage: "localhost/builder:1"}
	r.build = func(ctx context.Context, req runner.BuildRequest, emit func(imagebuild.Event)) (*runner.BuildResult, error) {
		if df := dockerfileOf(t, req); strings.Contains(df, "RUN false") {
			f := imagebuild.Step{Number: 2, Total: 2, Instruction: "RUN false"}
			emit(imagebuild.Event{Step: &f, InStep: 2})
			return &runner.BuildResult{Result: &imagebuild.Result{ExitCode: 1, Steps: []imagebuild.Step{f}, Failed: &f, Why: "exit status 1"}}, nil
		}
		return okBuild(testDigest)(ctx, req, emit)
	}
	dir := t.TempDir()
	e := newBuildEnv(t, dir, nil, r)
	sc := sandboxv1connect.NewSandboxServiceClient(http.DefaultClient, e.url)
	const file = "services: {app: {build: {dockerfile_inline: \"FROM busybox\\nRUN echo hi\\n\", args: {A: '1'}}, command: [sleep, inf]}}"

	sb, err := sc.CreateSandboxFromFile(ctx, as(e.user, fileReq(file)))
	if err != nil {
		t.Fatal(err)
	}
	reqs, _ := r.requests()
	if len(reqs) != 1 || reqs[0].Options.BuildArgs["A"] != "1" || !strings.HasPrefix(reqs[0].Push, "reg.test:5000/") || !strings.Contains(reqs[0].Push, "compose-app:") {
		t.Fatalf("builds %+v", reqs)
	}
	img := r.spec(sb.Msg.GetSandboxId()).Spec.Image
	if want := strings.SplitN(reqs[0].Push, ":", 3); img != want[0]+":"+want[1]+"@"+testDigest {
		t.Errorf("the container runs %q, want the pushed image by digest (%s)", img, reqs[0].Push)
	}

	// The same file again: the build done is used.
	sb2, err := sc.CreateSandboxFromFile(ctx, as(e.user, fileReq(file)))
	if err != nil {
		t.Fatal(err)
	}
	if reqs, _ := r.requests(); len(reqs) != 1 {
		t.Errorf("an unchanged service was built again: %d builds", len(reqs))
	}
	if got := r.spec(sb2.Msg.GetSandboxId()).Spec.Image; got != img {
		t.Errorf("second sandbox runs %q, want %q", got, img)
	}

	logURL := func(key, id, service string) (*sandboxv1.GetSandboxBuildLogsResponse, error) {
		res, err := sc.GetSandboxBuildLogs(ctx, as(key, &sandboxv1.GetSandboxBuildLogsRequest{SandboxId: id, Service: service}))
		if err != nil {
			return nil, err
		}
		return res.Msg, nil
	}
	get := func(u string) (int, string) {
		res, err := http.Get(u)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	lu, err := logURL(e.user, sb.Msg.GetSandboxId(), "app")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(lu.GetUrl(), e.url+BuildLogPath+"?") || lu.GetExpireTime().AsTime().Before(lu.GetExpireTime().AsTime().Add(-BuildLogURLTTL)) {
		t.Errorf("url %q expires %v", lu.GetUrl(), lu.GetExpireTime())
	}
	code, text := get(lu.GetUrl())
	if code != http.StatusOK || !strings.Contains(text, "STEP 2: RUN echo hi") || !strings.Contains(text, "output of RUN echo hi") || !strings.Contains(text, "SUCCEEDED") {
		t.Errorf("log: %d %q", code, text)
	}
	for _, bad := range []string{strings.Replace(lu.GetUrl(), "token=", "token=A", 1), strings.Replace(lu.GetUrl(), "org=", "org=x", 1), strings.Replace(lu.GetUrl(), "expires=", "expires=9", 1)} {
		if code, text := get(bad); code != http.StatusForbidden || strings.Contains(text, "RUN") {
			t.Errorf("altered URL %s: %d %q", bad, code, text)
		}
	}
	if _, err := logURL(e.user, sb.Msg.GetSandboxId(), "nope"); connect.CodeOf(err) != connect.CodeNotFound || apierr.Reason(err) != apierr.BuildNotFound || !strings.Contains(err.Error(), "app") {
		t.Errorf("unbuilt service: %v", err)
	}
	if _, err := logURL(e.otherAdmin, sb.Msg.GetSandboxId(), "app"); connect.CodeOf(err) != connect.CodeNotFound || apierr.Reason(err) != apierr.SandboxNotFound {
		t.Errorf("another organization's sandbox: %v", err)
	}
	if _, err := logURL(e.user, "nope", "app"); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("unknown sandbox: %v", err)
	}

	// A failing build refuses the create, naming the service and the step.
	n := len(r.got)
	_, err = sc.CreateSandboxFromFile(ctx, as(e.user, fileReq("services: {app: {build: {dockerfile_inline: \"FROM busybox\\nRUN false\\n\"}}}")))
	if connect.CodeOf(err) != connect.CodeFailedPrecondition || apierr.Reason(err) != apierr.BuildFailed || !strings.Contains(err.Error(), `service "app"`) ||
		!strings.Contains(err.Error(), "step 2/2 RUN false failed") {
		t.Errorf("failing build: %v", err)
	}
	r.mu.Lock()
	if len(r.got) != n {
		t.Errorf("a sandbox was created after a failed build")
	}
	r.mu.Unlock()

	bad := fileReq(file)
	bad.BuilderSizes = map[string]string{"app": "huge"}
	_, err = sc.CreateSandboxFromFile(ctx, as(e.user, bad))
	wantBuildErr(t, err, connect.CodeInvalidArgument, apierr.InvalidRequest, "builder_sizes[app]")

	// A restarted gateway still knows the sandbox's builds.
	e.s.Close()
	e2 := newBuildEnv(t, dir, nil, r)
	sc2 := sandboxv1connect.NewSandboxServiceClient(http.DefaultClient, e2.url)
	res, err := sc2.GetSandboxBuildLogs(ctx, as(e2.user, &sandboxv1.GetSandboxBuildLogsRequest{SandboxId: sb.Msg.GetSandboxId(), Service: "app"}))
	if err != nil {
		t.Fatal(err)
	}
	if code, text := get(res.Msg.GetUrl()); code != http.StatusOK || !strings.Contains(text, "RUN echo hi") {
		t.Errorf("log after a restart: %d %q", code, text)
	}
	if code, _ := get(strings.Replace(lu.GetUrl(), e.url, e2.url, 1)); code != http.StatusForbidden {
		t.Errorf("a URL of another key (the first gateway's random one): %d", code)
	}
}

// Without builds, a service to build is refused (not created without an image).
func TestComposeBuildsNeedBuilds(t *testing.T) {
	s := newTemplateGateway(t, t.TempDir(), &acceptingRunner{id: "r1"})
	_, err := s.CreateSandboxFromFile(tmplUser(testOrg), connect.NewRequest(fileReq("services: {app: {build: {dockerfile_inline: 'FROM x'}}}")))
	if connect.CodeOf(err) != connect.CodeUnimplemented || !strings.Contains(err.Error(), "build:") {
		t.Errorf("%v", err)
	}
}
