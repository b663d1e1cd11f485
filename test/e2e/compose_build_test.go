package e2e

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1/sandboxv1connect"
	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/runner"
)

// TestComposeBuild is issue 22's "a Compose file with a build: service" through the
// platform API: CreateSandboxFromFile with a service whose Dockerfile is inline (FROM a
// test image, a RUN writing a file; no context, as the official client's run_from_file
// sends none) builds it in a gVisor builder, pushes it and runs it; exec sees the file;
// GetSandboxBuildLogs's URL shows the steps; the same file again builds nothing; a
// failing RUN refuses the create naming the service and the step.
func TestComposeBuild(t *testing.T) {
	if testing.Short() {
		t.Skip("real builds")
	}
	p := newBuildPlatform(t, "compose-org")
	sandboxes := sandboxv1connect.NewSandboxServiceClient(p.api.Client(), p.api.URL)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	file := func(dockerfile string) *sandboxv1.CreateSandboxFromFileRequest {
		return &sandboxv1.CreateSandboxFromFileRequest{Type: sandboxv1.SandboxFileType_SANDBOX_FILE_TYPE_COMPOSE, Contents: []byte(`
services:
  app:
    build:
      dockerfile_inline: |
` + indent(dockerfile, "        ") + `
      args: {WORD: built-by-compose}
    command: ["/bin/sh", "-c", "trap 'exit 0' TERM; sleep infinity & wait"]
`)}
	}
	ok := file("FROM " + busybox() + "\nARG WORD\nRUN echo \"$$WORD\" > /built.txt\n")

	start := time.Now()
	sb, err := sandboxes.CreateSandboxFromFile(ctx, withKey(p.userKey, ok))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("CreateSandboxFromFile with a build: %v", time.Since(start))
	id := sb.Msg.GetSandboxId()
	waitState(t, p.s, id, runner.StateRunning, time.Minute)
	res, err := agentOf(t, p.s, id).Exec(ctx, connect.NewRequest(&agentv1.ExecRequest{Command: []string{"cat", "/built.txt"}}))
	if err != nil || string(res.Msg.GetStdout()) != "built-by-compose\n" {
		t.Fatalf("the file the build wrote: %v %q %q", err, res.Msg.GetStdout(), res.Msg.GetStderr())
	}
	got, err := sandboxes.GetSandbox(ctx, withKey(p.userKey, &sandboxv1.GetSandboxRequest{SandboxId: id}))
	if err != nil || !strings.HasPrefix(got.Msg.GetSpec().GetContainers()[0].GetImage(), p.host+"/compose-org/compose-app@sha256:") {
		t.Errorf("the sandbox's image: %v, %v", got.Msg.GetSpec().GetContainers(), err)
	}

	logs, err := sandboxes.GetSandboxBuildLogs(ctx, withKey(p.userKey, &sandboxv1.GetSandboxBuildLogsRequest{SandboxId: id, Service: "app"}))
	if err != nil {
		t.Fatal(err)
	}
	hres, err := http.Get(logs.Msg.GetUrl())
	if err != nil {
		t.Fatal(err)
	}
	text, _ := io.ReadAll(hres.Body)
	_ = hres.Body.Close()
	if hres.StatusCode != http.StatusOK || !strings.Contains(string(text), "RUN echo") || !strings.Contains(string(text), "SUCCEEDED") {
		t.Errorf("build log at %s: %d\n%s", logs.Msg.GetUrl(), hres.StatusCode, text)
	}
	if _, err := sandboxes.DeleteSandbox(ctx, withKey(p.userKey, &sandboxv1.DeleteSandboxRequest{SandboxId: id})); err != nil {
		t.Error(err)
	}

	// The same file again: the image built is used, no second build.
	start = time.Now()
	sb2, err := sandboxes.CreateSandboxFromFile(ctx, withKey(p.userKey, ok))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("CreateSandboxFromFile, image already built: %v", time.Since(start))
	logs2, err := sandboxes.GetSandboxBuildLogs(ctx, withKey(p.userKey, &sandboxv1.GetSandboxBuildLogsRequest{SandboxId: sb2.Msg.GetSandboxId(), Service: "app"}))
	if err != nil || buildOf(logs2.Msg.GetUrl()) != buildOf(logs.Msg.GetUrl()) {
		t.Errorf("second create's build: %v, %v (want the first's)", logs2, err)
	}
	waitState(t, p.s, sb2.Msg.GetSandboxId(), runner.StateRunning, time.Minute)
	if _, err := sandboxes.DeleteSandbox(ctx, withKey(p.userKey, &sandboxv1.DeleteSandboxRequest{SandboxId: sb2.Msg.GetSandboxId()})); err != nil {
		t.Error(err)
	}

	// A failing RUN refuses the create, naming the service and the step.
	_, err = sandboxes.CreateSandboxFromFile(ctx, withKey(p.userKey, file("FROM "+busybox()+"\nRUN echo about to fail && exit 7\n")))
	if connect.CodeOf(err) != connect.CodeFailedPrecondition || apierr.Reason(err) != apierr.BuildFailed || !strings.Contains(err.Error(), `service "app"`) ||
		!strings.Contains(err.Error(), "RUN echo about to fail") {
		t.Errorf("failing build: %v", err)
	}
}

func indent(s, by string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return by + strings.Join(lines, "\n"+by)
}

// buildOf is the build a URL of GetSandboxBuildLogs names.
func buildOf(u string) string {
	_, rest, _ := strings.Cut(u, "build=")
	b, _, _ := strings.Cut(rest, "&")
	return b
}
