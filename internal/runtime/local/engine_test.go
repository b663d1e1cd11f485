package local

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/startseq"
	"github.com/sandboxd/sandboxd/internal/testenv"
	"github.com/sandboxd/sandboxd/internal/testimage"
)

// TestEngineRefused: the local backend hosts a container engine under gVisor only, and
// only with an image store that writes archives; otherwise it says why (runners then
// report NoContainerEngine) and refuses a spec with an engine rather than running its
// container without it; nothing is left behind.
func TestEngineRefused(t *testing.T) {
	e := newEnv(t)
	if why := e.b.EngineUnavailable("runc"); !strings.Contains(why, "not gVisor") {
		t.Errorf("EngineUnavailable(runc) = %q, want it to say runc is not gVisor", why)
	}
	if why := e.b.EngineUnavailable("nosuch"); why == "" {
		t.Error("EngineUnavailable of an unknown class is empty")
	}
	spec := runtime.Spec{ID: "engine1", Container: runtime.Container{Name: runtime.EngineContainerName, Image: "busybox"},
		Engine: &runtime.Engine{Compose: []byte("services: {a: {image: busybox}}"), Project: "sandbox", Images: []string{"busybox"}}}
	for _, class := range []string{"runc", GVisorClass} {
		if class == GVisorClass && e.b.runtimes[GVisorClass] == nil {
			continue
		}
		spec.RuntimeClass = class
		s := spec
		_, err := e.b.Create(context.Background(), &s)
		if !errors.Is(err, runtime.ErrEngineUnsupported) {
			t.Fatalf("create under %s: %v, want ErrEngineUnsupported", class, err)
		}
		// testImages writes no archives: gVisor is refused for that reason.
		t.Logf("%s: %v", class, err)
	}
	if found, err := e.b.Recover(context.Background()); err != nil || len(found) != 0 {
		t.Errorf("after the refusal the backend has %d sandboxes (%v)", len(found), err)
	}
}

// engineImages serves the engine image (an unpacked rootfs) as "engine" and writes the
// busybox test image's docker-archive for the services.
type engineImages struct {
	rootfs  string
	busybox v1.Image
	asked   []string
}

func (ei *engineImages) Pull(_ context.Context, ref string, _ *runtime.Credentials) (*Image, error) {
	if ref != "engine" {
		return nil, fmt.Errorf("%w: %s", runtime.ErrImageNotFound, ref)
	}
	return &Image{Ref: ref, Digest: "sha256:e0e0", Layers: []string{ei.rootfs}, Config: ImageConfig{Env: []string{testimage.DefaultPath}}}, nil
}

func (ei *engineImages) WriteArchive(_ context.Context, ref string, _ *runtime.Credentials, w io.Writer, limit int64) error {
	ei.asked = append(ei.asked, ref)
	tag, err := name.NewTag(ref)
	if err != nil || ref != "localhost/sandboxd/busybox:latest" {
		return fmt.Errorf("%w: %s", runtime.ErrImageNotFound, ref)
	}
	return tarball.Write(tag, ei.busybox, w)
}

// TestEngineSandbox runs container-engine sandboxes through Backend.Create under gVisor:
// Create returns once `docker compose up --wait` brought two services up (one healthy
// through the other by name); `docker compose stop/start` of one service by exec work; a
// file whose service exits fails Create naming that service, and leaves nothing behind;
// Destroy leaves no mounts, cgroups or runsc state (newEnv's check).
func TestEngineSandbox(t *testing.T) {
	e := gvisorEnv(t)
	engineTar, err := testimage.EngineTar()
	if errors.Is(err, testimage.ErrNoTestImages) {
		t.Skip(err)
	} else if err != nil {
		t.Fatal(err)
	}
	imgs, err := testimage.StandardImages()
	if errors.Is(err, testimage.ErrNoTestImages) {
		t.Skip(err)
	} else if err != nil {
		t.Fatal(err)
	}
	testenv.RequireRoot(t, "runsc")
	rootfs := t.TempDir()
	if out, err := exec.Command("tar", "--numeric-owner", "-xpf", engineTar, "-C", rootfs).CombinedOutput(); err != nil {
		t.Fatalf("unpack %s: %v: %s", engineTar, err, out)
	}
	ei := &engineImages{rootfs: rootfs, busybox: imgs.Busybox}
	b, err := New(Config{OCIRuntime: testOCIRuntime, StateDir: e.state, AgentBinary: agentBin, CgroupParent: testCgroupParent, Images: ei, Runtimes: e.b.cfg.Runtimes})
	if err != nil {
		t.Fatal(err)
	}
	e.b = b
	if why := b.EngineUnavailable(GVisorClass); why != "" {
		t.Fatalf("EngineUnavailable(gvisor) = %q", why)
	}
	spec := func(id, file string) runtime.Spec {
		return runtime.Spec{ID: id, RuntimeClass: GVisorClass,
			Container: runtime.Container{Name: runtime.EngineContainerName, Image: "engine"},
			Engine:    &runtime.Engine{Compose: []byte(file), Project: "enginetest", Images: []string{"localhost/sandboxd/busybox:latest"}}}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()

	start := time.Now()
	s := spec("eng-1", engineCompose)
	if _, err := b.Create(ctx, &s); err != nil {
		t.Fatalf("create: %v\n%s", err, tailOf(filepath.Join(e.state, "eng-1", fileAgentOut), 2000))
	}
	t.Logf("Create -> compose up --wait done: %v", time.Since(start))
	c := agentClient(b, "eng-1")
	sh := func(script string) (string, string, int32) {
		t.Helper()
		ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		resp, err := c.Exec(ctx, connect.NewRequest(&agentv1.ExecRequest{Command: []string{"sh", "-c", script}}))
		if err != nil {
			t.Fatalf("exec %q: %v", script, err)
		}
		return string(resp.Msg.Stdout), string(resp.Msg.Stderr), resp.Msg.ExitCode
	}
	const p = "docker compose -p enginetest -f /cws-engine/compose.yaml"
	if out, stderr, code := sh(p + ` ps -a --format '{{.Service}} {{.State}}' | sort`); code != 0 || out != "client running\nweb running\n" {
		t.Fatalf("after Create: %q (%d) %s", out, code, stderr)
	}
	if out, stderr, code := sh(p + ` stop web >/dev/null 2>&1 && ` + p + ` ps -a --format '{{.Service}} {{.State}}' | sort`); code != 0 || out != "client running\nweb exited\n" {
		t.Fatalf("stop web: %q (%d) %s", out, code, stderr)
	}
	if out, _, _ := sh(`docker exec enginetest-client-1 sh -c 'nc -w 2 web 80 </dev/null && echo reached'`); strings.Contains(out, "reached") {
		t.Fatalf("web answered while stopped: %q", out)
	}
	if out, stderr, code := sh(p + ` start web >/dev/null 2>&1 && docker exec enginetest-client-1 sh -c 'printf "GET / HTTP/1.0\r\n\r\n" | nc -w 2 web 80'`); code != 0 || !strings.Contains(out, "hello-from-web") {
		t.Fatalf("start web, then the client fetches it by name: %q (%d) %s", out, code, stderr)
	}
	// The handed-in dir is read-only to the engine.
	if _, _, code := sh(`touch /cws-engine/x`); code == 0 {
		t.Error("the engine wrote to /cws-engine")
	}
	// A restarted backend adopts the engine sandbox (its runsc flags are no longer in
	// memory) and destroys it without leaks.
	b2, err := New(Config{OCIRuntime: testOCIRuntime, StateDir: e.state, AgentBinary: agentBin, CgroupParent: testCgroupParent, Images: ei, Runtimes: e.b.cfg.Runtimes})
	if err != nil {
		t.Fatal(err)
	}
	if found, err := b2.Recover(ctx); err != nil || len(found) != 1 {
		t.Fatalf("recover: %d sandboxes (%v), want the engine sandbox", len(found), err)
	}
	if out, stderr, code := func() (string, string, int32) {
		return execIn(t, agentClient(b2, "eng-1"), "sh", "-c", p+` ps --format '{{.Service}}' | sort`)
	}(); code != 0 || out != "client\nweb\n" {
		t.Errorf("after the restart: %q (%d) %s", out, code, stderr)
	}
	if err := b2.Destroy(ctx, "eng-1"); err != nil {
		t.Fatal(err)
	}
	checkNoLeaks(t, e.state, "eng-1")
	e.b = b2
	b = b2

	bad := spec("eng-2", engineBroken)
	bad.Engine.Project = "broken"
	_, err = b.Create(ctx, &bad)
	var f *startseq.Failure
	if !errors.As(err, &f) || f.Container != runtime.EngineContainerName || !strings.HasSuffix(f.Message, "failing services: broken") {
		t.Fatalf("create of a file whose service exits: %v, want a failure naming service broken", err)
	}
	if _, err := os.Stat(filepath.Join(e.state, "eng-2")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the failed sandbox's dir is left: %v", err)
	}
	checkNoLeaks(t, e.state, "eng-2")
}

// TestEngineUpFailed: the failure names the services of cws-engine-up's last line,
// bounded (the line is the sandbox's own text), and otherwise carries the output's tail.
func TestEngineUpFailed(t *testing.T) {
	var f *startseq.Failure
	err := engineUpFailed("loading\ncws-engine: failing services: db web\n", nil)
	if !errors.As(err, &f) || f.Container != runtime.EngineContainerName || f.Message != "docker compose up failed: failing services: db web" {
		t.Errorf("got %v", err)
	}
	long := engineUpFailed("cws-engine: failing services: "+strings.Repeat("x", 1<<16), nil)
	if !errors.As(long, &f) || len(f.Message) > maxEngineReason+100 {
		t.Errorf("a long line gives a message of %d bytes", len(f.Message))
	}
	other := engineUpFailed("something else broke\n", nil)
	if !errors.As(other, &f) || !strings.HasSuffix(f.Message, "something else broke") {
		t.Errorf("got %v", other)
	}
}
