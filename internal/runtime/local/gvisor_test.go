package local

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/testenv"
)

// gvisorEnv is newEnv whose Backend has the gvisor class, or a skip when runsc is not
// built (scripts/build-runsc.sh, `make runsc`; or point $SANDBOXD_RUNSC at a static runsc).
func gvisorEnv(t testing.TB) *env {
	t.Helper()
	e := newEnv(t)
	if e.b.runtimes[GVisorClass] == nil {
		t.Skipf("runsc not found ($SANDBOXD_RUNSC, ${SANDBOXD_CACHE:-/var/cache/sandboxd}/runsc/%s/runsc or $PATH): run `make runsc`", RunscBuild)
	}
	return e
}

func hostRelease(t *testing.T) string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		t.Fatal(err)
	}
	return unix.ByteSliceToString(u.Release[:])
}

// TestGVisorSandbox runs a busybox sandbox under runsc: the agent answers exec, files
// and logs over the same host socket as under runc, host cgroup limits apply, Stop
// delivers SIGTERM to the main command, Destroy leaves nothing behind.
func TestGVisorSandbox(t *testing.T) {
	e := gvisorEnv(t)
	const id = "gv-1"
	start := time.Now()
	info := e.create(runtime.Spec{
		ID: id, RuntimeClass: GVisorClass,
		Container: runtime.Container{Command: "sh", Args: []string{"-c", `trap 'echo got-term; exit 3' TERM; echo hello-from-main; while :; do sleep 0.1; done`}, Files: []runtime.File{{Path: "/data/in.txt", Content: []byte("from spec\n")}}, Resources: runtime.Resources{MilliCPU: 500, MemoryBytes: 256 << 20, Pids: 64}},
	})
	c := agentClient(e.b, id)
	if out, _, code := execIn(t, c, "echo", "hi"); out != "hi\n" || code != 0 {
		t.Fatalf("echo hi = %q, %d", out, code)
	}
	t.Logf("create -> first exec under gVisor: %v", time.Since(start))
	if info.RuntimeClass != GVisorClass || info.ImageDigest != "sha256:b0b0" {
		t.Errorf("info = %+v", info)
	}

	// The kernel is gVisor's, not the host's.
	rel, _, _ := execIn(t, c, "uname", "-r")
	rel = strings.TrimSpace(rel)
	if rel == "" || rel == hostRelease(t) {
		t.Errorf("uname -r = %q, host %q: want gVisor's kernel", rel, hostRelease(t))
	}
	if out, _, _ := execIn(t, c, "dmesg"); !strings.Contains(out, "gVisor") {
		t.Errorf("dmesg does not mention gVisor: %q", out)
	}
	t.Logf("uname -r in the sandbox: %s (host %s)", rel, hostRelease(t))

	for _, tc := range []struct {
		name string
		argv []string
		want string
	}{
		{"hostname", []string{"hostname"}, id},
		{"pid 1 is the agent", []string{"cat", "/proc/1/cmdline"}, "sandbox-agent"},
		{"spec file", []string{"cat", "/data/in.txt"}, "from spec"},
		{"etc hosts", []string{"cat", "/etc/hosts"}, id},
		{"agent read-only", []string{"sh", "-c", "echo x > /.sandboxd/config.json 2>&1; echo rc=$?"}, "rc=1"},
		{"no new privs", []string{"grep", "NoNewPrivs", "/proc/self/status"}, "1"},
		// The same set as under runc (which drops CAP_NET_RAW too).
		{"capabilities", []string{"grep", "CapEff", "/proc/self/status"}, "00000000a80405fb"},
		{"proc sys read-only", []string{"sh", "-c", "echo 1 > /proc/sys/kernel/ns_last_pid 2>&1; echo rc=$?"}, "rc=1"},
		{"mount denied", []string{"sh", "-c", "mount -t tmpfs none /mnt 2>&1; echo rc=$?"}, "rc=1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if out, errOut, code := execIn(t, c, tc.argv...); !strings.Contains(out, tc.want) {
				t.Errorf("%q: stdout %q (stderr %q, exit %d), want %q", tc.argv, out, errOut, code, tc.want)
			}
		})
	}

	// Limits are the host's cgroup limits on the sandbox (cgroup v1 here, or v2).
	mem := mustGlob("/sys/fs/cgroup/memory/" + testCgroupParent + "/" + id + "/memory.limit_in_bytes")
	if len(mem) == 1 {
		if b, _ := os.ReadFile(mem[0]); strings.TrimSpace(string(b)) != "268435456" {
			t.Errorf("host memory.limit_in_bytes = %q", b)
		}
	} else if b, err := os.ReadFile("/sys/fs/cgroup/" + testCgroupParent + "/" + id + "/memory.max"); err != nil || strings.TrimSpace(string(b)) != "268435456" {
		t.Errorf("host memory.max = %q (%v)", b, err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Files through the agent.
	if _, err := c.WriteFile(ctx, connect.NewRequest(&agentv1.WriteFileRequest{Path: "/tmp/x/y.txt", Content: []byte("written\n")})); err != nil {
		t.Fatalf("write file: %v", err)
	}
	if out, _, _ := execIn(t, c, "cat", "/tmp/x/y.txt"); out != "written\n" {
		t.Errorf("cat written file = %q", out)
	}
	if _, _, code := execIn(t, c, "sh", "-c", "echo made-inside > /tmp/z.txt"); code != 0 {
		t.Fatal("write inside failed")
	}
	rf, err := c.ReadFile(ctx, connect.NewRequest(&agentv1.ReadFileRequest{Path: "/tmp/z.txt"}))
	if err != nil || string(rf.Msg.Content) != "made-inside\n" {
		t.Errorf("read file = %v, %v", rf, err)
	}

	// Logs through the agent and on the host (the runner keeps them after Destroy).
	logs, err := c.Logs(ctx, connect.NewRequest(&agentv1.LogsRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	var got strings.Builder
	for logs.Receive() {
		got.Write(logs.Msg().Data)
	}
	if !strings.Contains(got.String(), "hello-from-main") {
		t.Errorf("logs = %q (%v)", got.String(), logs.Err())
	}
	if b, _ := os.ReadFile(filepath.Join(e.b.LogDir(id, ""), "main.log")); !strings.Contains(string(b), "hello-from-main") {
		t.Errorf("host main.log = %q", b)
	}

	// Stop: SIGTERM reaches the main command through `runsc kill`.
	t0 := time.Now()
	if err := e.b.Stop(context.Background(), id, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	t.Logf("stop: %v", time.Since(t0))
	ex, err := e.b.Wait(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if ex.ExitCode == nil || *ex.ExitCode != 3 {
		t.Errorf("exit = %+v, want exit code 3 from the TERM trap", ex)
	}
	if time.Since(t0) > 5*time.Second {
		t.Errorf("stop took %v: SIGTERM did not reach the main command", time.Since(t0))
	}
	t0 = time.Now()
	if err := e.b.Destroy(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	t.Logf("destroy: %v", time.Since(t0))
	checkNoLeaks(t, e.state, id)
}

// TestGVisorRecoverAndKill: a new Backend re-adopts a running gVisor sandbox (the agent
// socket is the gofer's, still there), then Destroy kills it.
func TestGVisorRecoverAndKill(t *testing.T) {
	e := gvisorEnv(t)
	const id = "gv-rec"
	e.create(runtime.Spec{ID: id, RuntimeClass: GVisorClass, Container: runtime.Container{Command: "sleep", Args: []string{"3600"}}})
	b2 := e.backend()
	recs, err := b2.Recover(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 || !recs[0].Alive || recs[0].Info.RuntimeClass != GVisorClass || recs[0].Spec.RuntimeClass != GVisorClass {
		t.Fatalf("recovered %+v", recs)
	}
	if out, _, _ := execIn(t, agentClient(b2, id), "echo", "again"); out != "again\n" {
		t.Errorf("exec after recover = %q", out)
	}
	e.b = b2
	// No grace: SIGKILL to the sentry ends the sandbox.
	if err := b2.Stop(context.Background(), id, 0); err != nil {
		t.Fatal(err)
	}
	// The first Backend's watcher may record the exit first (Killed); the recovered one
	// calls an agent it never saw start Vanished; and the agent itself may still record
	// the SIGTERM that precedes the SIGKILL (Stopped).
	ex, err := b2.Wait(context.Background(), id)
	switch {
	case err != nil:
		t.Errorf("wait after kill: %v", err)
	case ex.Reason == "Vanished" || ex.Reason == "Killed":
		if ex.ExitCode != nil {
			t.Errorf("exit after kill = %+v: an exit code for a killed sandbox", ex)
		}
	case ex.Reason != "Stopped":
		t.Errorf("exit after kill = %+v; want Killed, Vanished or Stopped", ex)
	}
	if err := b2.Destroy(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	checkNoLeaks(t, e.state, id)
}

// TestGVisorMainExit: the agent's final status (written through the gofer) is the
// sandbox's exit, also for a main command that ends before Create has returned.
func TestGVisorMainExit(t *testing.T) {
	e := gvisorEnv(t)
	for _, tc := range []struct {
		id       string
		argv     []string
		restarts int
		code     int32
		reason   string
	}{
		{"gv-exit-ok", []string{"true"}, 0, 0, "Completed"},
		{"gv-exit-3", []string{"sh", "-c", "exit 3"}, 0, 3, "RestartLimit"},
		{"gv-exit-restarts", []string{"sh", "-c", "exit 4"}, 2, 4, "RestartLimit"},
	} {
		t.Run(tc.id, func(t *testing.T) {
			e.create(runtime.Spec{ID: tc.id, RuntimeClass: GVisorClass, Container: runtime.Container{Command: tc.argv[0], Args: tc.argv[1:], RestartLimit: tc.restarts}})
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			ex, err := e.b.Wait(ctx, tc.id)
			if err != nil {
				t.Fatal(err)
			}
			if ex.ExitCode == nil || *ex.ExitCode != tc.code || ex.Restarts != tc.restarts || ex.Reason != tc.reason {
				t.Errorf("exit = %+v (code %v), want code %d reason %s restarts %d", ex, deref(ex.ExitCode), tc.code, tc.reason, tc.restarts)
			}
			if err := e.b.Destroy(ctx, tc.id); err != nil {
				t.Fatal(err)
			}
			checkNoLeaks(t, e.state, tc.id)
		})
	}
}

// TestRuncStaysDefault: without a runtime class a sandbox runs on runc, on the host's
// kernel, even when gvisor is offered.
func TestRuncStaysDefault(t *testing.T) {
	e := newEnv(t)
	if e.b.cfg.DefaultRuntime != "runc" {
		t.Fatalf("default runtime = %q", e.b.cfg.DefaultRuntime)
	}
	info := e.create(runtime.Spec{ID: "def-1", Container: runtime.Container{Command: "sleep", Args: []string{"3600"}}})
	want := "runc"
	if FindRunsc() != "" {
		want += " " + GVisorClass
	}
	if got := strings.Join(e.b.RuntimeClasses(), " "); got != want {
		t.Errorf("RuntimeClasses() = %q, want %q", got, want)
	}
	if info.RuntimeClass != "runc" {
		t.Errorf("runtime class = %q, want runc", info.RuntimeClass)
	}
	if out, _, _ := execIn(t, agentClient(e.b, "def-1"), "uname", "-r"); strings.TrimSpace(out) != hostRelease(t) {
		t.Errorf("uname -r under runc = %q, host %q", out, hostRelease(t))
	}
}

// TestRunscVersionMatchesScript: the version FindRunsc looks for is the one the build
// script builds.
func TestRunscVersionMatchesScript(t *testing.T) {
	b, err := os.ReadFile("../../../scripts/build-runsc.sh")
	if err != nil {
		t.Skip(err)
	}
	if !strings.Contains(string(b), `VERSION="${SANDBOXD_RUNSC_VERSION:-`+RunscVersion+`}"`) {
		t.Errorf("scripts/build-runsc.sh does not build RunscVersion %s", RunscVersion)
	}
	if !strings.Contains(string(b), "\nSECCOMP="+strings.TrimPrefix(RunscBuild, RunscVersion+"+")+"\n") {
		t.Errorf("scripts/build-runsc.sh does not build RunscBuild %s", RunscBuild)
	}
}

// TestGVisorNetwork: the sandbox's network namespace, configured before runsc starts,
// is gVisor's network: the host (with the network's host mark) reaches a server in the
// sandbox at the sandbox's IP.
func TestGVisorNetwork(t *testing.T) {
	e := gvisorEnv(t)
	m := e.withNetwork(t, 2)
	const id = "gv-net"
	info := e.create(runtime.Spec{ID: id, RuntimeClass: GVisorClass, Container: runtime.Container{Command: "httpd", Args: []string{"-f", "-p", "8080", "-h", "/www"}, Files: []runtime.File{{Path: "/www/index.html", Content: []byte("hello from gvisor\n")}}}})
	if !strings.HasPrefix(info.IP, "10.233.79.") {
		t.Fatalf("IP = %q", info.IP)
	}
	c := agentClient(e.b, id)
	if out, _, _ := execIn(t, c, "ip", "-4", "addr"); !strings.Contains(out, info.IP) {
		t.Errorf("addresses in the sandbox: %q", out)
	}
	if body := getFromHost(m, info.IP, "8080", "/index.html"); body != "hello from gvisor\n" {
		t.Errorf("host -> %s:8080 read %q", info.IP, body)
	}
	if err := e.b.Destroy(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	if a, _ := m.Lookup(id); a != nil {
		t.Errorf("attachment left after destroy: %+v", a)
	}
}

// TestEnsureCpusetParents: fresh cgroup v1 cpuset parents get their parent's cpus and
// mems (runsc does not copy them, and a gVisor sandbox with a cpuset under an empty
// parent fails with EACCES); existing values are kept.
func TestEnsureCpusetParents(t *testing.T) {
	testenv.RequireRoot(t, "cgroups")
	root := filepath.Join(cgroupRoot, "cpuset")
	if _, err := os.Stat(filepath.Join(root, "cpuset.cpus")); err != nil {
		t.Skip("no cgroup v1 cpuset hierarchy")
	}
	top := fmt.Sprintf("sandboxd-cpusettest-%d", os.Getpid())
	t.Cleanup(func() {
		_ = os.Remove(filepath.Join(root, top, "a"))
		_ = os.Remove(filepath.Join(root, top))
	})
	if err := ensureCpusetParents("/" + top + "/a"); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
		want, _ := os.ReadFile(filepath.Join(root, f))
		for _, d := range []string{top, top + "/a"} {
			if got, _ := os.ReadFile(filepath.Join(root, d, f)); strings.TrimSpace(string(got)) == "" || string(got) != string(want) {
				t.Errorf("%s/%s = %q, want the root's %q", d, f, got, want)
			}
		}
	}
	if err := ensureCpusetParents(top + "/a"); err != nil {
		t.Errorf("again: %v", err)
	}
}

// TestRunscStaleLockDropped: runsc recreates a container's lock file when a concurrent
// delete removed its state file after the command had found it (seen as a leaked
// "<id>+_sandbox:<id>+.lock" after a crash-recovery destroy); a failed command or a
// delete removes such a lock file, and never one whose state file is there.
func TestRunscStaleLockDropped(t *testing.T) {
	root := t.TempDir()
	fake := filepath.Join(t.TempDir(), "runsc")
	// The fake runsc plays the race: the state file vanishes, the lock file is made again.
	script := "#!/bin/sh\nrm -f \"" + root + "/c+_sandbox:c+.state\"\ntouch \"" + root + "/c+_sandbox:c+.lock\"\nexit 1\n"
	if err := os.WriteFile(fake, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	r := newOCIRuntime(GVisorClass, fake, root)
	for _, cmd := range [][]string{{"state", "c"}, {"delete", "--force", "c"}, {"wait", "c"}} {
		for _, n := range []string{"c+_sandbox:c+.state", "c+_sandbox:c+.lock", "d+_sandbox:d+.state", "d+_sandbox:d+.lock", "c+x_sandbox:c+x.lock"} {
			if err := os.WriteFile(filepath.Join(root, n), nil, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := r.run(context.Background(), cmd...); err == nil {
			t.Fatalf("%v: the fake runsc failed, run did not", cmd)
		}
		if _, err := os.Lstat(filepath.Join(root, "c+_sandbox:c+.lock")); err == nil {
			t.Errorf("%v: the lock file of a container whose state is gone was left", cmd)
		}
		for _, n := range []string{"d+_sandbox:d+.lock", "c+x_sandbox:c+x.lock"} {
			if _, err := os.Lstat(filepath.Join(root, n)); err != nil {
				t.Errorf("%v: %s (another container's) was removed: %v", cmd, n, err)
			}
		}
	}
	// A lock file someone holds (a create under the same id, before its state file) stays.
	held := filepath.Join(root, "e+_sandbox:e+.lock")
	f, err := os.Create(held)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	r.dropStaleLocks("e+")
	if _, err := os.Lstat(held); err != nil {
		t.Errorf("a held lock file was removed: %v", err)
	}
	f.Close()
	r.dropStaleLocks("e+")
	if _, err := os.Lstat(held); err == nil {
		t.Error("a stale lock file, no longer held, was left")
	}
}
