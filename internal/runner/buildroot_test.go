package runner_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/internal/fsarchive"
	"github.com/sandboxd/sandboxd/internal/imagebuild"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/stack/stacktest"
	"github.com/sandboxd/sandboxd/internal/testenv"
	"github.com/sandboxd/sandboxd/internal/testimage"
)

// TestLocalBuild runs runner.Local.Build on a real stack (local backend, gVisor): the
// builder image comes from a registry like any image, the base image is pulled by the
// runner's image store and handed in, the result is pushed to the registry, and the
// builder sandbox is gone afterwards.
func TestLocalBuild(t *testing.T) {
	if testing.Short() {
		t.Skip("a real build")
	}
	_, err := testimage.BuilderTar()
	if errors.Is(err, testimage.ErrNoTestImages) {
		t.Skip(err)
	} else if err != nil {
		t.Fatal(err)
	}
	testenv.RequireRoot(t, "runsc, namespaces")
	e, err := stacktest.Setup("bld")
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	st, err := e.Stack(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		st.Close()
		if err := st.Network.Cleanup(); err != nil { // the bridge, its rules, the netns mount
			t.Errorf("network cleanup: %v", err)
		}
	}()
	l := runner.NewLocal("r1", st.Runner)
	if !strings.Contains(strings.Join(l.Classes(), ","), runner.BuildRuntimeClass) {
		t.Skipf("no gvisor class on this machine (%v)", l.Classes())
	}
	if l.BuilderImage, err = testimage.PushBuilder(e.Registry); err != nil {
		t.Fatal(err)
	}
	l.BuildImages = st.BaseArchiver()

	dir := t.TempDir()
	for p, c := range map[string]string{
		"Dockerfile": "FROM " + e.Busybox() + "\nCOPY hello.txt /hello.txt\nRUN cat /hello.txt\n",
		"hello.txt":  "hello-from-local-build\n",
	} {
		if err := os.WriteFile(filepath.Join(dir, p), []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	var buildIn func(dir, org string) (*runner.BuildResult, string)
	build := func(org string) (*runner.BuildResult, string) { return buildIn(dir, org) }
	buildIn = func(dir, org string) (*runner.BuildResult, string) {
		t.Helper()
		root, err := os.Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		defer root.Close()
		var archive bytes.Buffer
		if _, err := fsarchive.Write(context.Background(), root, &archive, fsarchive.IDMap{}); err != nil {
			t.Fatal(err)
		}
		var lines []string
		start := time.Now()
		res, err := l.Build(ctx, runner.BuildRequest{
			Context: &archive, ContextLimits: runtime.ArchiveLimits{MaxBytes: 1 << 20, MaxFiles: 10},
			Push: e.Registry + "/" + org + "/built:1", OrganizationID: org,
			Resources: runtime.Resources{MilliCPU: 2000, MemoryBytes: 2 << 30, Pids: 1024},
			Timeout:   4 * time.Minute,
		}, func(ev imagebuild.Event) {
			if ev.Step == nil {
				lines = append(lines, ev.Line)
			}
		})
		if err != nil {
			t.Fatalf("build for %s: %v\n%s", org, err, strings.Join(lines, "\n"))
		}
		t.Logf("Local.Build for %s (builder created, base handed in, steps run, pushed when it succeeded): %v, exit %d", org, time.Since(start), res.ExitCode)
		return res, strings.Join(lines, "\n")
	}
	cached := func(res *runner.BuildResult) (n int) {
		for _, s := range res.Steps {
			if s.Cached {
				n++
			}
		}
		return n
	}
	res, out := build("org-1")
	if res.ExitCode != 0 || len(res.Steps) != 3 || !strings.HasPrefix(res.Digest, "sha256:") || !strings.Contains(out, "hello-from-local-build") || cached(res) != 0 {
		t.Errorf("result: exit %d, steps %+v, digest %q\n%s", res.ExitCode, res.Steps, res.Digest, out)
	}
	// The layer cache is the organization's and outlives the builder: org-1's second
	// build, in a new builder, takes every step after FROM from it; org-2's first takes
	// none.
	again, out := build("org-1")
	if again.ExitCode != 0 || len(again.Steps) != 3 || cached(again) != 2 {
		t.Errorf("org-1 rebuild: exit %d, steps %+v (%d cached, want 2)\n%s", again.ExitCode, again.Steps, cached(again), out)
	}
	other, out := build("org-2")
	if other.ExitCode != 0 || len(other.Steps) != 3 || cached(other) != 0 {
		t.Errorf("org-2's first build: exit %d, steps %+v (%d cached, want 0)\n%s", other.ExitCode, other.Steps, cached(other), out)
	}
	// A base image already in the cache is not loaded again, unless its tag moved on:
	// then the new image is loaded and the steps after FROM are not taken from the cache.
	busybox, err := remote.Image(mustRef(t, e.Busybox()))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := testimage.Push(e.Registry, "t/base:1", busybox); err != nil {
		t.Fatal(err)
	}
	bdir := t.TempDir()
	if err := os.WriteFile(filepath.Join(bdir, "Dockerfile"), []byte("FROM "+e.Registry+"/t/base:1\nRUN cat /marker 2>/dev/null || echo base-is-1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for i, want := range []struct {
		base, run string
		cached    int
	}{{"loaded", "base-is-1", 0}, {"in the layer cache", "", 1}, {"loaded", "base-is-2", 0}} {
		if i == 2 {
			layer, err := testimage.LayerFromFiles(map[string][]byte{"marker": []byte("base-is-2\n")})
			if err != nil {
				t.Fatal(err)
			}
			moved, err := mutate.AppendLayers(busybox, layer)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := testimage.Push(e.Registry, "t/base:1", moved); err != nil {
				t.Fatal(err)
			}
		}
		res, out := buildIn(bdir, "org-1")
		if res.ExitCode != 0 || !strings.Contains(out, "/t/base:1: "+want.base) || !strings.Contains(out, want.run) || cached(res) != want.cached {
			t.Errorf("base build %d: exit %d, %d cached (want %d), want the base %s and %q\n%s", i+1, res.ExitCode, cached(res), want.cached, want.base, want.run, out)
		}
	}
	// The builder is destroyed: it ends and nothing of it stays running.
	deadline := time.Now().Add(30 * time.Second)
	for {
		live := 0
		for _, sb := range st.Runner.List() {
			if strings.HasPrefix(sb.Spec.ID, "build-") && !sb.State.Terminal() {
				live++
			}
		}
		if live == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d builders still live", live)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// The pushed image runs as a sandbox.
	sb, err := st.Runner.Create(ctx, runner.CreateRequest{Spec: runtime.Spec{ID: "from-build",
		Container: runtime.Container{Image: e.Registry + "/org-1/built@" + res.Digest, Command: "httpd", Args: []string{"-f", "-p", "8080", "-h", "/"}}}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		_, _ = st.Runner.Delete(sb.Spec.ID, 0)
		_, _ = st.Runner.WaitTerminal(context.Background(), sb.Spec.ID)
	}()
	agent, err := st.Runner.Agent(ctx, sb.Spec.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	got, err := agent.ReadFile(ctx, connect.NewRequest(&agentv1.ReadFileRequest{Path: "/hello.txt", MaxBytes: 1024}))
	if err != nil || string(got.Msg.Content) != "hello-from-local-build\n" {
		t.Errorf("/hello.txt in the built image: %v %v", got, err)
	}

	// Builders' egress: even the widest rules (any) keep RUN steps away from other
	// sandboxes (from-build's httpd, which answers inside it) and from the host (a
	// listener at the bridge's address); the build fails naming the step.
	secret := func(script string) string {
		t.Helper()
		var out string
		for i := 0; i < 50; i++ { // httpd may not listen yet right after create
			r, err := agent.Exec(ctx, connect.NewRequest(&agentv1.ExecRequest{Command: []string{"sh", "-c", script}}))
			if err == nil && r.Msg.ExitCode == 0 {
				return string(r.Msg.Stdout)
			}
			out = fmt.Sprint(r, err)
			time.Sleep(100 * time.Millisecond)
		}
		return out
	}
	get := "printf 'GET /hello.txt HTTP/1.0\\r\\n\\r\\n' | nc -w 3 "
	if out := secret(get + "127.0.0.1 8080"); !strings.Contains(out, "hello-from-local-build") {
		t.Fatalf("from-build's httpd does not answer inside it: %s", out)
	}
	peer, err := st.Runner.Get(sb.Spec.ID)
	if err != nil || peer.IP == "" {
		t.Fatalf("from-build's address: %q %v", peer.IP, err)
	}
	ln, err := net.Listen("tcp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = conn.Write([]byte("HTTP/1.0 200 OK\r\n\r\nhost-secret\n"))
			conn.Close()
		}
	}()
	l.BuildEgress = []runtime.EgressRule{{Any: true}}
	for _, target := range []string{peer.IP + " 8080", st.Network.Gateway().String() + " " + strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)} {
		ndir := t.TempDir()
		df := "FROM " + e.Busybox() + "\nRUN " + get + target + "\n"
		if err := os.WriteFile(filepath.Join(ndir, "Dockerfile"), []byte(df), 0o644); err != nil {
			t.Fatal(err)
		}
		res, out := buildIn(ndir, "org-3")
		if res.ExitCode == 0 || res.Failed == nil || !strings.HasPrefix(res.Failed.Instruction, "RUN printf") ||
			!strings.Contains(out, "nc: timed out") || strings.Contains(out, "hello-from-local-build") || strings.Contains(out, "host-secret") {
			t.Errorf("a RUN reaching %s: exit %d, failed step %+v, want a failure naming the RUN\n%s", target, res.ExitCode, res.Failed, out)
		}
	}
}

func mustRef(t *testing.T, s string) name.Reference {
	t.Helper()
	r, err := name.ParseReference(s, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	return r
}
