package e2e

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1/sandboxv1connect"
	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/internal/relay"
	"github.com/sandboxd/sandboxd/internal/runner"
)

// tarGzDir is the tar.gz of dir's content, as a client sends a build context.
func tarGzDir(t *testing.T, dir string) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	if err := tw.AddFS(os.DirFS(dir)); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestComposeBuildContext: a Compose service with `build: .` whose Dockerfile (in the
// context) COPYs a file and a script from it, its context sent as a tar.gz in
// build_contexts over gRPC (the Go client; the official client's run_from_file sends
// none): the build runs, the sandbox sees the file and runs the script; the same context
// again builds nothing; a changed file builds again and the new sandbox sees the change.
func TestComposeBuildContext(t *testing.T) {
	if testing.Short() {
		t.Skip("real builds")
	}
	p := newBuildPlatform(t, "ctx-org")
	hc := &http.Client{Transport: &http.Transport{Protocols: func() *http.Protocols {
		pr := new(http.Protocols)
		pr.SetUnencryptedHTTP2(true)
		return pr
	}()}}
	sandboxes := sandboxv1connect.NewSandboxServiceClient(hc, p.api.URL, connect.WithGRPC(), connect.WithSendMaxBytes(relay.MaxMessageBytes))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	dir := t.TempDir()
	write := func(name, data string, mode os.FileMode) {
		fp := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(fp), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(fp, []byte(data), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(fp, mode); err != nil {
			t.Fatal(err)
		}
	}
	write("Dockerfile", "FROM "+busybox()+"\nCOPY data/greeting.txt /srv/greeting.txt\nCOPY greet.sh /usr/local/bin/greet\n", 0o644)
	write("greet.sh", "#!/bin/sh\necho \"greeting: $(cat /srv/greeting.txt)\"\n", 0o755)
	write("data/greeting.txt", "hello from the context v1", 0o644)
	file := []byte(`
services:
  app:
    build: .
    command: ["/bin/sh", "-c", "trap 'exit 0' TERM; sleep infinity & wait"]
`)
	create := func() (id, build string) {
		t.Helper()
		start := time.Now()
		sb, err := sandboxes.CreateSandboxFromFile(ctx, withKey(p.userKey, &sandboxv1.CreateSandboxFromFileRequest{
			Type: sandboxv1.SandboxFileType_SANDBOX_FILE_TYPE_COMPOSE, Contents: file,
			BuildContexts: map[string][]byte{"app": tarGzDir(t, dir)}}))
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("CreateSandboxFromFile with a build context: %v", time.Since(start))
		id = sb.Msg.GetSandboxId()
		t.Cleanup(func() {
			_, _ = sandboxes.DeleteSandbox(context.Background(), withKey(p.userKey, &sandboxv1.DeleteSandboxRequest{SandboxId: id}))
		})
		logs, err := sandboxes.GetSandboxBuildLogs(ctx, withKey(p.userKey, &sandboxv1.GetSandboxBuildLogsRequest{SandboxId: id, Service: "app"}))
		if err != nil {
			t.Fatal(err)
		}
		waitState(t, p.s, id, runner.StateRunning, time.Minute)
		return id, buildOf(logs.Msg.GetUrl())
	}
	greet := func(id string) string {
		t.Helper()
		res, err := agentOf(t, p.s, id).Exec(ctx, connect.NewRequest(&agentv1.ExecRequest{Command: []string{"/usr/local/bin/greet"}}))
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(res.Msg.GetStdout())) + string(res.Msg.GetStderr())
	}

	id1, b1 := create()
	if got := greet(id1); got != "greeting: hello from the context v1" {
		t.Fatalf("the script and file COPYed from the context: %q", got)
	}
	id2, b2 := create()
	if b2 != b1 {
		t.Errorf("the same context built again: build %s, then %s", b1, b2)
	}
	if got := greet(id2); got != "greeting: hello from the context v1" {
		t.Errorf("second sandbox: %q", got)
	}
	write("data/greeting.txt", "hello from the context v2", 0o644)
	id3, b3 := create()
	if b3 == b1 {
		t.Errorf("a changed context did not build again (build %s)", b3)
	}
	if got := greet(id3); got != "greeting: hello from the context v2" {
		t.Errorf("after the change: %q", got)
	}
}
