package e2e

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/gateway"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/local"
	"github.com/sandboxd/sandboxd/internal/sockmark"
)

// needRunsc skips when the stack will not offer the gvisor class (it offers it when
// local.FindRunsc finds a runsc: `make runsc`, or $SANDBOXD_RUNSC).
func needRunsc(t *testing.T) {
	t.Helper()
	if local.FindRunsc() == "" {
		t.Skipf("gvisor runtime class: runsc not built (run `make runsc`, or set $SANDBOXD_RUNSC to a static runsc); looked in ${SANDBOXD_CACHE:-/var/cache/sandboxd}/runsc/%s/ and $PATH", local.RunscBuild)
	}
}

func hostKernel(t *testing.T) string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		t.Fatal(err)
	}
	return unix.ByteSliceToString(u.Release[:])
}

// TestGVisorRuntimeClass runs sandboxes with runtime class gvisor through the runner:
// the effective class is reported, the kernel is gVisor's, exec, files and logs work
// through the agent, the sandbox's port is reachable at its IP (with the host mark), delete stops it and
// leaves nothing behind (assertNoLeaks in finish). A sandbox without a class stays on
// runc.
func TestGVisorRuntimeClass(t *testing.T) {
	needRunsc(t)
	s := startedStack(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	spec := runtime.Spec{Container: runtime.Container{Image: busybox(), Command: "/bin/sh", Args: []string{"-c",
		`trap "echo stopping; exit 0" TERM; echo started; httpd -f -p 8080 -h /www & wait`}, Files: []runtime.File{{Path: "/www/index.html", Content: []byte("gvisor says hi\n")}}}, RuntimeClass: local.GVisorClass,
	}
	t0 := time.Now()
	sb := create(t, s, runner.CreateRequest{Spec: spec})
	c := agentOf(t, s, sb.ID)
	if got := execIn(t, c, "true"); got.ExitCode != 0 {
		t.Fatalf("first exec exit %d", got.ExitCode)
	}
	t.Logf("create -> first exec (gvisor, via runner): %v", time.Since(t0))
	sb = waitState(t, s, sb.ID, runner.StateRunning, 30*time.Second)
	if sb.RuntimeClass != local.GVisorClass {
		t.Errorf("effective runtime class %q, want gvisor", sb.RuntimeClass)
	}

	rel := strings.TrimSpace(string(execIn(t, c, "uname", "-r").Stdout))
	if rel == "" || rel == hostKernel(t) {
		t.Errorf("uname -r = %q, host %q: want gVisor's kernel", rel, hostKernel(t))
	}
	if out := string(execIn(t, c, "dmesg").Stdout); !strings.Contains(out, "gVisor") {
		t.Errorf("dmesg does not mention gVisor: %q", out)
	}

	// Files.
	data := bytes.Repeat([]byte("0123456789abcdef"), 64<<10) // 1 MiB
	if _, err := c.WriteFile(ctx, connect.NewRequest(&agentv1.WriteFileRequest{Path: "/data/blob.bin", Content: data})); err != nil {
		t.Fatalf("write file: %v", err)
	}
	rf, err := c.ReadFile(ctx, connect.NewRequest(&agentv1.ReadFileRequest{Path: "/data/blob.bin"}))
	if err != nil || !bytes.Equal(rf.Msg.Content, data) {
		t.Fatalf("read back: %v (%d bytes)", err, len(rf.Msg.GetContent()))
	}
	if got := string(execIn(t, c, "wc", "-c", "/data/blob.bin").Stdout); !strings.HasPrefix(strings.TrimSpace(got), "1048576") {
		t.Errorf("wc -c inside = %q", got)
	}

	// The sandbox's port at its IP, from the host (netns configured before runsc booted),
	// with the network's host mark as the edge dials: the guard refuses unmarked ones.
	if sb.IP == "" {
		t.Fatal("no sandbox IP")
	}
	var body string
	d := &net.Dialer{Control: sockmark.Control(s.EdgeDialMark())}
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DialContext: d.DialContext}}
	for i := 0; i < 100 && body == ""; i++ {
		resp, err := hc.Get("http://" + net.JoinHostPort(sb.IP, "8080") + "/index.html")
		if err != nil {
			time.Sleep(20 * time.Millisecond)
			continue
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		body = string(b)
	}
	if body != "gvisor says hi\n" {
		t.Errorf("host -> %s:8080: %q", sb.IP, body)
	}

	// Logs.
	logs, err := c.Logs(ctx, connect.NewRequest(&agentv1.LogsRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	var got bytes.Buffer
	for logs.Receive() {
		got.Write(logs.Msg().Data)
	}
	if err := logs.Err(); err != nil && !errors.Is(err, context.Canceled) {
		t.Errorf("logs: %v", err)
	}
	if !strings.Contains(got.String(), "started\n") {
		t.Errorf("logs = %q", got.String())
	}

	// runc stays the default beside it.
	def := create(t, s, runner.CreateRequest{Spec: sleeper(busybox())})
	dc := agentOf(t, s, def.ID)
	if rel := strings.TrimSpace(string(execIn(t, dc, "uname", "-r").Stdout)); rel != hostKernel(t) {
		t.Errorf("default sandbox kernel %q, want the host's %q", rel, hostKernel(t))
	}
	if d, _ := s.Runner.Get(def.ID); d.RuntimeClass != "runc" {
		t.Errorf("default runtime class %q, want runc", d.RuntimeClass)
	}

	// Delete: SIGTERM reaches the main command; its logs are archived.
	if _, err := s.Runner.Delete(sb.ID, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	end, err := s.Runner.WaitTerminal(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if end.State != runner.StateTerminated || end.RuntimeClass != local.GVisorClass {
		t.Errorf("after delete: state %s (%s: %s), class %q", end.State, end.Reason, end.Message, end.RuntimeClass)
	}
	if dir, err := s.Runner.LogDir(sb.ID, ""); err != nil || dir == "" {
		t.Errorf("log dir after delete: %q, %v", dir, err)
	} else if b, _ := os.ReadFile(filepath.Join(dir, "main.log")); !strings.Contains(string(b), "stopping") {
		t.Errorf("archived main.log %q: want the TERM trap's output", b)
	}
}

// TestGVisorPython: a real image (Debian + python3) runs under gVisor.
func TestGVisorPython(t *testing.T) {
	needRunsc(t)
	s := startedStack(t)
	spec := sleeper(python())
	spec.RuntimeClass = local.GVisorClass
	sb := create(t, s, runner.CreateRequest{Spec: spec})
	got := execIn(t, agentOf(t, s, sb.ID), "python3", "-c", "import platform; print(platform.release())")
	if rel := strings.TrimSpace(string(got.Stdout)); got.ExitCode != 0 || rel == hostKernel(t) {
		t.Errorf("python3 under gvisor: exit %d, release %q, stderr %q", got.ExitCode, rel, got.Stderr)
	}
}

// TestGVisorThroughGateway: the public API picks gVisor by runtime_class, the runner's
// classes decide what exists, and a policy's allow-list decides what is allowed.
func TestGVisorThroughGateway(t *testing.T) {
	needRunsc(t)
	pol := &policies{}
	pol.set(`{"constraints": {"security": {"allowed_runtime_classes": ["runc", "gvisor"]}}}`)
	g := startGateway(t, func(c *gateway.Config) { c.Policies = pol })
	ctx := context.Background()

	sp := sleeperSpec()
	sp.RuntimeClass = local.GVisorClass
	sb := g.create(t, sp, "")
	running := g.waitState(t, sb.SandboxId, sandboxv1.State_STATE_RUNNING)
	if got := running.GetStatus().GetEffectiveRuntimeClass(); got != local.GVisorClass {
		t.Errorf("effective runtime class %q, want gvisor", got)
	}
	res, err := g.sandboxes.Exec(ctx, connect.NewRequest(&sandboxv1.ExecRequest{SandboxId: sb.SandboxId, Command: []string{"uname", "-r"}}))
	if err != nil || strings.TrimSpace(string(res.Msg.GetStdout())) == hostKernel(t) {
		t.Errorf("uname -r under gvisor: %q %v (host %s)", res.Msg.GetStdout(), err, hostKernel(t))
	}

	// A class no runner offers is refused with the ones that exist.
	sp.RuntimeClass = "kata"
	_, err = g.sandboxes.CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: sp}}))
	if vs := apierr.Violations(err); connect.CodeOf(err) != connect.CodeInvalidArgument || len(vs) == 0 ||
		vs[0].Field != "sandbox.spec.runtime_class" || !strings.Contains(vs[0].Description, "not available on this runner; use one of: runc, gvisor") {
		t.Errorf("runtime class kata: %v %v", err, vs)
	}
	// A policy that allows runc only refuses gvisor, naming the constraint.
	pol.set(`{"constraints": {"security": {"allowed_runtime_classes": ["runc"]}}}`)
	sp.RuntimeClass = local.GVisorClass
	_, err = g.sandboxes.CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: sp}}))
	if vs := apierr.Violations(err); apierr.Reason(err) != apierr.PlacementRejected || len(vs) != 1 ||
		!strings.Contains(vs[0].Description, "constraints.security.allowed_runtime_classes") {
		t.Errorf("gvisor under a runc-only policy: %v %v", err, vs)
	}
}

// TestGVisorGroupThroughRunner runs a two-container sandbox with runtime class gvisor
// through the runner (one gVisor sandbox holds both, gvisor_group.go in runtime/local):
// each container's agent by name, localhost between them, the host reaching the
// sidecar's port at the sandbox's IP, both containers reported running, delete ends it
// and leaves nothing behind (assertNoLeaks in finish).
func TestGVisorGroupThroughRunner(t *testing.T) {
	needRunsc(t)
	s := startedStack(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	spec := runtime.Spec{RuntimeClass: local.GVisorClass,
		Container: runtime.Container{Name: "app", Image: busybox(), Command: "sleep", Args: []string{"600"}},
		Sidecars: []runtime.Container{{Name: "side", Image: busybox(), Command: "httpd", Args: []string{"-f", "-p", "8080", "-h", "/www"},
			Files: []runtime.File{{Path: "/www/index.html", Content: []byte("side says hi\n")}}}},
	}
	sb := create(t, s, runner.CreateRequest{Spec: spec})
	sb = waitState(t, s, sb.ID, runner.StateRunning, 30*time.Second)
	app := agentOf(t, s, sb.ID)
	side, err := s.Runner.Agent(ctx, sb.ID, "side")
	if err != nil {
		t.Fatal(err)
	}
	if rel := strings.TrimSpace(string(execIn(t, side, "uname", "-r").Stdout)); rel == "" || rel == hostKernel(t) {
		t.Errorf("uname -r in side = %q: want gVisor's kernel", rel)
	}
	var out string
	for i := 0; i < 100 && out != "side says hi\n"; i++ {
		out = string(execIn(t, app, "wget", "-q", "-O", "-", "http://127.0.0.1:8080/index.html").Stdout)
		if out != "side says hi\n" {
			time.Sleep(50 * time.Millisecond)
		}
	}
	if out != "side says hi\n" {
		t.Errorf("app -> localhost:8080 (side): %q", out)
	}
	d := &net.Dialer{Control: sockmark.Control(s.EdgeDialMark())}
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DialContext: d.DialContext}}
	resp, err := hc.Get("http://" + net.JoinHostPort(sb.IP, "8080") + "/index.html")
	if err != nil {
		t.Fatalf("host -> %s:8080: %v", sb.IP, err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != "side says hi\n" {
		t.Errorf("host -> %s:8080: %q", sb.IP, body)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		got, _ := s.Runner.Get(sb.ID)
		running := 0
		for _, c := range got.Containers {
			if c.State == runtime.ContainerRunning {
				running++
			}
		}
		if running == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("container statuses %+v: want both running", got.Containers)
		}
	}
	if _, err := s.Runner.Delete(sb.ID, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if end, err := s.Runner.WaitTerminal(ctx, sb.ID); err != nil || end.State != runner.StateTerminated {
		t.Errorf("after delete: %+v, %v", end, err)
	}
}
