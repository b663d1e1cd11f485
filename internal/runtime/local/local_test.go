package local

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

func TestCreateExecAndConfinement(t *testing.T) {
	e := newEnv(t)
	const id = "conf-1"
	start := time.Now()
	info := e.create(runtime.Spec{
		ID: id, Container: runtime.Container{Command: "sleep", Args: []string{"3600"}, Env: map[string]string{"FOO": "bar"}, Resources: runtime.Resources{MilliCPU: 500, MemoryBytes: 256 << 20, Pids: 64}},
	})
	c := agentClient(e.b, id)
	if out, _, code := execIn(t, c, "echo", "hi"); out != "hi\n" || code != 0 {
		t.Fatalf("echo hi = %q, %d", out, code)
	}
	t.Logf("create -> first exec: %v", time.Since(start))
	if info.RuntimeClass != "runc" || info.ImageDigest != "sha256:b0b0" || info.StartedAt.IsZero() {
		t.Errorf("info = %+v", info)
	}

	tests := []struct {
		name string
		argv []string
		want string // substring of stdout
	}{
		{"memory limit", []string{"cat", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}, "268435456"},
		{"swap limit", []string{"cat", "/sys/fs/cgroup/memory/memory.memsw.limit_in_bytes"}, "268435456"},
		{"pids limit", []string{"cat", "/sys/fs/cgroup/pids/pids.max"}, "64"},
		{"cpu quota", []string{"cat", "/sys/fs/cgroup/cpu/cpu.cfs_quota_us"}, "50000"},
		{"cpu period", []string{"cat", "/sys/fs/cgroup/cpu/cpu.cfs_period_us"}, "100000"},
		// CHOWN DAC_OVERRIDE FOWNER FSETID KILL SETGID SETUID SETPCAP NET_BIND_SERVICE (no NET_RAW)
		// SYS_CHROOT MKNOD AUDIT_WRITE SETFCAP = 0xa80425fb
		{"capabilities", []string{"grep", "CapEff", "/proc/self/status"}, "00000000a80405fb"},
		{"bounding set", []string{"grep", "CapBnd", "/proc/self/status"}, "00000000a80405fb"},
		{"no new privs", []string{"grep", "NoNewPrivs", "/proc/self/status"}, "1"},
		{"seccomp filter", []string{"grep", "^Seccomp:", "/proc/self/status"}, "2"},
		{"hostname", []string{"hostname"}, id},
		{"etc hosts", []string{"cat", "/etc/hosts"}, id},
		{"pid namespace", []string{"cat", "/proc/1/cmdline"}, "sandbox-agent"},
		{"env", []string{"env"}, "FOO=bar"},
		{"image env", []string{"env"}, "FROM_IMAGE=1"},
		{"nofile", []string{"sh", "-c", "ulimit -n"}, strconv.FormatUint(noFileLimit(), 10)},
		{"no core dumps", []string{"sh", "-c", "ulimit -c; ulimit -Hc"}, "0\n0\n"},
		{"proc sys read-only", []string{"sh", "-c", "echo 1 > /proc/sys/kernel/ns_last_pid 2>&1; echo rc=$?"}, "rc=1"},
		{"sys read-only", []string{"sh", "-c", "touch /sys/x 2>&1; echo rc=$?"}, "rc=1"},
		{"agent read-only", []string{"sh", "-c", "echo x > /.sandboxd/config.json 2>&1; echo rc=$?"}, "rc=1"},
		{"mount denied", []string{"sh", "-c", "mount -t tmpfs none /mnt 2>&1; echo rc=$?"}, "rc=1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, errOut, code := execIn(t, c, tc.argv...)
			if !strings.Contains(out, tc.want) {
				t.Errorf("%q: stdout %q (stderr %q, exit %d), want it to contain %q", tc.argv, out, errOut, code, tc.want)
			}
		})
	}
	t.Run("masked kcore", func(t *testing.T) {
		// Masked = /dev/null bound over it (this kernel has no /proc/kcore: check the
		// masked files it has).
		for _, p := range []string{"/proc/kcore", "/proc/keys", "/proc/timer_list"} {
			if _, err := os.Stat(p); err != nil {
				continue
			}
			out, errOut, _ := execIn(t, c, "stat", "-c", "%F %t:%T", p)
			if strings.TrimSpace(out) != "character special file 1:3" {
				t.Errorf("%s: %q %q, want /dev/null (masked)", p, out, errOut)
			}
		}
	})
	t.Run("writes land in upper", func(t *testing.T) {
		if _, _, code := execIn(t, c, "sh", "-c", "echo data > /tmp/written && rm /bin/ls"); code != 0 {
			t.Fatalf("write exit %d", code)
		}
		if b, err := os.ReadFile(filepath.Join(e.state, id, dirUpper, "tmp/written")); err != nil || string(b) != "data\n" {
			t.Errorf("upper/tmp/written = %q, %v", b, err)
		}
		if _, err := os.Lstat(filepath.Join(busyboxDir, "tmp/written")); err == nil {
			t.Error("write reached the lower layer")
		}
		if _, err := os.Lstat(filepath.Join(busyboxDir, "bin/ls")); err != nil {
			t.Error("delete reached the lower layer")
		}
	})

	if err := e.b.Destroy(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	checkNoLeaks(t, e.state, id)
	if err := e.b.Destroy(context.Background(), id); err != nil {
		t.Errorf("second destroy: %v", err)
	}
}

func deref(p *int32) any {
	if p == nil {
		return nil
	}
	return *p
}

func TestOOMKilled(t *testing.T) {
	e := newEnv(t)
	const id = "oom-1"
	// sort holds its input (one 200 MiB line) in memory: it grows until the memory cgroup kills it.
	e.create(runtime.Spec{
		ID: id, Container: runtime.Container{Command: "sh", Args: []string{"-c", "head -c 200m /dev/zero | sort >/dev/null"}, Resources: runtime.Resources{MemoryBytes: 32 << 20}},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ex, err := e.b.Wait(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	n, err := e.b.OOMKills(id)
	if err != nil || n < 1 {
		t.Errorf("OOMKills = %d, %v; want >= 1", n, err)
	}
	if ex.Reason != "OOMKilled" {
		t.Errorf("exit = %+v (code %v), want OOMKilled", ex, deref(ex.ExitCode))
	}
	t.Logf("exit: %+v", ex)
}

func TestOOMKillsLive(t *testing.T) {
	e := newEnv(t)
	const id = "oom-live"
	e.create(runtime.Spec{ID: id, Container: runtime.Container{Command: "sleep", Args: []string{"3600"}, Resources: runtime.Resources{MemoryBytes: 32 << 20}}})
	c := agentClient(e.b, id)
	if n, err := e.b.OOMKills(id); err != nil || n != 0 {
		t.Fatalf("OOMKills before = %d, %v", n, err)
	}
	_, _, code := execIn(t, c, "sh", "-c", "head -c 200m /dev/zero | sort >/dev/null")
	if code == 0 {
		t.Fatalf("memory hog exited 0")
	}
	if n, err := e.b.OOMKills(id); err != nil || n < 1 {
		t.Errorf("OOMKills after a hog = %d, %v", n, err)
	}
	// The sandbox survives an exec'd process's OOM kill.
	if out, _, _ := execIn(t, c, "echo", "alive"); out != "alive\n" {
		t.Errorf("after OOM: %q", out)
	}
}

func TestStop(t *testing.T) {
	e := newEnv(t)
	tests := []struct {
		id       string
		script   string
		grace    time.Duration
		min, max time.Duration
		reason   string
	}{
		// The main command traps TERM (forwarded by the agent) and exits: well within grace.
		{"stop-trap", `trap "exit 0" TERM; while true; do sleep 0.05; done`, 5 * time.Second, 0, 2 * time.Second, "Stopped"},
		// It ignores TERM: killed when grace runs out.
		{"stop-ignore", `trap "" TERM; while true; do sleep 0.05; done`, 700 * time.Millisecond, 700 * time.Millisecond, 1500 * time.Millisecond, "Killed"},
		{"stop-now", `sleep 3600`, 0, 0, 500 * time.Millisecond, "Killed"},
	}
	for _, tc := range tests {
		t.Run(tc.id, func(t *testing.T) {
			e.create(runtime.Spec{ID: tc.id, Container: runtime.Container{Command: "sh", Args: []string{"-c", tc.script}}})
			c := agentClient(e.b, tc.id)
			execIn(t, c, "true") // the main command is running
			time.Sleep(100 * time.Millisecond)
			start := time.Now()
			if err := e.b.Stop(context.Background(), tc.id, tc.grace); err != nil {
				t.Fatal(err)
			}
			d := time.Since(start)
			if d < tc.min || d > tc.max {
				t.Errorf("stop took %v, want %v..%v", d, tc.min, tc.max)
			}
			ex, err := e.b.Wait(context.Background(), tc.id)
			if err != nil {
				t.Fatal(err)
			}
			if ex.Reason != tc.reason {
				t.Errorf("exit = %+v, want reason %s", ex, tc.reason)
			}
			t.Logf("stop %v, exit %+v", d, ex)
			start = time.Now()
			if err := e.b.Destroy(context.Background(), tc.id); err != nil {
				t.Fatal(err)
			}
			t.Logf("destroy %v", time.Since(start))
			checkNoLeaks(t, e.state, tc.id)
		})
	}
}

func TestDestroyRunning(t *testing.T) {
	e := newEnv(t)
	const id = "destroy-1"
	e.create(runtime.Spec{ID: id, Container: runtime.Container{Command: "sh", Args: []string{"-c", "sleep 3600 & sleep 3600"}}})
	c := agentClient(e.b, id)
	execIn(t, c, "sh", "-c", "sleep 1000 &")
	pid := readInitPid(t, e.state, id)
	start := time.Now()
	if err := e.b.Destroy(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	t.Logf("destroy of a running sandbox: %v", time.Since(start))
	checkDead(t, pid)
	checkNoLeaks(t, e.state, id)
	if _, err := e.b.Wait(context.Background(), id); !isErr(err, runtime.ErrNotFound) {
		t.Errorf("wait after destroy = %v, want ErrNotFound", err)
	}
	if _, err := e.b.DialAgent(context.Background(), id, ""); !isErr(err, runtime.ErrNotFound) {
		t.Errorf("dial after destroy = %v, want ErrNotFound", err)
	}
}

// checkDead fails t if pid is still running. A zombie is dead: this host's PID 1
// (process_api) reaps orphaned container inits, a little later.
func checkDead(t *testing.T, pid int) {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return
	}
	if i := strings.LastIndexByte(string(b), ')'); i > 0 && len(b) > i+2 && b[i+2] != 'Z' {
		t.Errorf("pid %d still running: %s", pid, b)
	}
}

func readInitPid(t *testing.T, state, id string) int {
	t.Helper()
	pid, err := readPid(filepath.Join(state, id, filePid))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

func TestRecover(t *testing.T) {
	e := newEnv(t)
	e.create(runtime.Spec{ID: "rec-alive", Container: runtime.Container{Command: "sleep", Args: []string{"3600"}}, Meta: map[string]string{"org": "o1"}})
	e.create(runtime.Spec{ID: "rec-killed", Container: runtime.Container{Command: "sleep", Args: []string{"3600"}}})
	e.create(runtime.Spec{ID: "rec-done", Container: runtime.Container{Command: "true"}})
	if _, err := e.b.Wait(context.Background(), "rec-done"); err != nil {
		t.Fatal(err)
	}
	// Behind the runner's back: kill a container's init.
	killedPid := readInitPid(t, e.state, "rec-killed")

	// "Restart" the runner: a new Backend on the same state dir.
	b2 := e.backend()
	if err := syscall.Kill(killedPid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitGone(t, killedPid)
	rs, err := b2.Recover(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]runtime.Recovered{}
	for _, r := range rs {
		got[r.Spec.ID] = r
	}
	if len(got) != 3 {
		t.Fatalf("recovered %d sandboxes: %+v", len(got), rs)
	}
	if r := got["rec-alive"]; !r.Alive || r.Spec.Meta["org"] != "o1" || r.Info.ImageDigest != "sha256:b0b0" || r.Spec.RuntimeClass != "runc" {
		t.Errorf("rec-alive = %+v", r)
	}
	if r := got["rec-killed"]; r.Alive || r.Exit == nil || r.Exit.Reason != "Killed" && r.Exit.Reason != "Vanished" {
		t.Errorf("rec-killed = %+v exit %+v", r, r.Exit)
	}
	if r := got["rec-done"]; r.Alive || r.Exit == nil || r.Exit.Reason != "Completed" || r.Exit.ExitCode == nil || *r.Exit.ExitCode != 0 {
		t.Errorf("rec-done = %+v exit %+v", r, r.Exit)
	}
	// The survivor is reachable and controllable through the new Backend.
	c := agentClient(b2, "rec-alive")
	if out, _, _ := execIn(t, c, "echo", "still here"); out != "still here\n" {
		t.Errorf("exec after recover: %q", out)
	}
	if err := b2.Stop(context.Background(), "rec-alive", time.Second); err != nil {
		t.Fatal(err)
	}
	if ex, err := b2.Wait(context.Background(), "rec-alive"); err != nil || ex.Reason == "" {
		t.Errorf("wait after recover = %+v, %v", ex, err)
	}
	for id := range got {
		if err := b2.Destroy(context.Background(), id); err != nil {
			t.Errorf("destroy %s: %v", id, err)
		}
	}
	checkNoLeaks(t, e.state, "")
}

// TestVanishedContainer: the runtime's state is wiped too (e.g. a host reboot cleared
// /run); the sandbox is reported dead, not alive, and still destroyable.
func TestVanishedContainer(t *testing.T) {
	e := newEnv(t)
	const id = "vanish-1"
	e.create(runtime.Spec{ID: id, Container: runtime.Container{Command: "sleep", Args: []string{"3600"}}})
	pid := readInitPid(t, e.state, id)
	syscall.Kill(pid, syscall.SIGKILL)
	// This runner sees the kill; pretend it was down then: forget what it recorded.
	if _, err := e.b.Wait(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	os.Remove(filepath.Join(e.state, id, fileExit))
	if _, err := e.b.rtFor(t).run(context.Background(), "delete", id); err != nil {
		t.Fatal(err)
	}
	rs, err := e.backend().Recover(context.Background())
	if err != nil || len(rs) != 1 {
		t.Fatalf("recover = %+v, %v", rs, err)
	}
	if rs[0].Alive || rs[0].Exit == nil || rs[0].Exit.Reason != "Vanished" {
		t.Errorf("recovered %+v exit %+v, want Vanished", rs[0], rs[0].Exit)
	}
}

func (b *Backend) rtFor(t *testing.T) *ociRuntime {
	rt, _, err := b.runtimeFor("")
	if err != nil {
		t.Fatal(err)
	}
	return rt
}

func waitGone(t *testing.T, pid int) {
	t.Helper()
	p, err := openProc(pid, 0)
	if err != nil {
		t.Fatal(err)
	}
	if p != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := p.wait(ctx); err != nil {
			t.Fatal(err)
		}
		p.close()
	}
}

func TestBadInputs(t *testing.T) {
	e := newEnv(t)
	tests := []struct {
		name string
		spec runtime.Spec
		want error
	}{
		{"unknown runtime", runtime.Spec{ID: "bad-rt", Container: runtime.Container{Image: "busybox"}, RuntimeClass: "kata"}, runtime.ErrUnknownRuntime},
		{"bad id chars", runtime.Spec{ID: "Bad_ID", Container: runtime.Container{Image: "busybox"}}, runtime.ErrInvalidSpec},
		{"id path", runtime.Spec{ID: "../x", Container: runtime.Container{Image: "busybox"}}, runtime.ErrInvalidSpec},
		{"id too long", runtime.Spec{ID: strings.Repeat("a", 64), Container: runtime.Container{Image: "busybox"}}, runtime.ErrInvalidSpec},
		{"empty id", runtime.Spec{Container: runtime.Container{Image: "busybox"}}, runtime.ErrInvalidSpec},
		{"empty argv", runtime.Spec{ID: "bad-argv", Container: runtime.Container{Image: "nocmd"}}, runtime.ErrInvalidSpec},
		{"negative memory", runtime.Spec{ID: "bad-mem", Container: runtime.Container{Image: "busybox", Resources: runtime.Resources{MemoryBytes: -1}}}, runtime.ErrInvalidSpec},
		{"image not found", runtime.Spec{ID: "bad-img", Container: runtime.Container{Image: "nope"}}, runtime.ErrImageNotFound},
		{"image unauthorized", runtime.Spec{ID: "bad-auth", Container: runtime.Container{Image: "private"}}, runtime.ErrImageUnauthorized},
		{"bad image ref", runtime.Spec{ID: "bad-ref", Container: runtime.Container{Image: "bad ref"}}, runtime.ErrInvalidImageRef},
		{"empty image", runtime.Spec{ID: "bad-empty"}, runtime.ErrInvalidImageRef},
		{"relative file path", runtime.Spec{ID: "bad-file", Container: runtime.Container{Image: "busybox", Files: []runtime.File{{Path: "etc/x"}}}}, runtime.ErrInvalidSpec},
		{"missing executable", runtime.Spec{ID: "bad-exe", Container: runtime.Container{Image: "busybox", Command: "/nonexistent"}}, nil}, // starts; the agent reports it
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			spec := tc.spec
			_, err := e.b.Create(context.Background(), &spec)
			if tc.want == nil {
				if err != nil {
					t.Fatal(err)
				}
				ex, err := e.b.Wait(context.Background(), spec.ID)
				t.Logf("exit %+v, %v", ex, err)
				if err != nil || ex.Reason == "Completed" {
					t.Errorf("exit = %+v, %v", ex, err)
				}
				if err := e.b.Destroy(context.Background(), spec.ID); err != nil {
					t.Fatal(err)
				}
			} else if !isErr(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			} else {
				t.Logf("err: %v", err)
			}
			checkNoLeaks(t, e.state, "")
		})
	}
	// A duplicate id is refused without harming the existing sandbox.
	e.create(runtime.Spec{ID: "dup", Container: runtime.Container{Command: "sleep", Args: []string{"3600"}}})
	if _, err := e.b.Create(context.Background(), &runtime.Spec{ID: "dup", Container: runtime.Container{Image: "busybox"}}); !isErr(err, runtime.ErrInvalidSpec) {
		t.Errorf("duplicate create = %v", err)
	}
	if out, _, _ := execIn(t, agentClient(e.b, "dup"), "echo", "ok"); out != "ok\n" {
		t.Errorf("original after duplicate create: %q", out)
	}
}

func TestOverlayOptionsLimit(t *testing.T) {
	layers := make([]string, 200)
	for i := range layers {
		layers[i] = "/var/lib/sandboxd/images/layers/sha256/" + strings.Repeat("a", 64)
	}
	if _, err := overlayOptions(layers, "/u", "/w"); err == nil || !strings.Contains(err.Error(), "too many layers") {
		t.Errorf("200 layers: err = %v", err)
	}
	opts, err := overlayOptions([]string{"/bottom", "/top"}, "/u", "/w")
	if err != nil || opts != "lowerdir=/top:/bottom,upperdir=/u,workdir=/w" {
		t.Errorf("opts = %q, %v", opts, err)
	}
	if _, err := overlayOptions([]string{"/a:b"}, "/u", "/w"); err == nil {
		t.Error("colon in layer path accepted")
	}
}

// TestConcurrent creates, uses and destroys sandboxes in parallel, and waits on one while
// it is being created.
func TestConcurrent(t *testing.T) {
	e := newEnv(t)
	const n = 10
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		go func() {
			id := "par-" + strconv.Itoa(i)
			spec := runtime.Spec{ID: id, Container: runtime.Container{Image: "busybox", Command: "sleep", Args: []string{"3600"}}}
			waited := make(chan runtime.Exit, 1)
			go func() {
				// May run before, during or after Create.
				ex, err := e.b.Wait(context.Background(), id)
				if err == nil {
					waited <- ex
				}
				close(waited)
			}()
			if _, err := e.b.Create(context.Background(), &spec); err != nil {
				errs <- err
				return
			}
			c := agentClient(e.b, id)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			resp, err := c.Exec(ctx, connect.NewRequest(&agentv1.ExecRequest{Command: []string{"hostname"}}))
			if err != nil {
				errs <- fmt.Errorf("%s: exec: %w", id, err)
				return
			}
			if string(resp.Msg.Stdout) != id+"\n" {
				errs <- fmt.Errorf("%s: exec: stdout %q", id, resp.Msg.Stdout)
				return
			}
			errs <- e.b.Destroy(context.Background(), id)
			<-waited
		}()
	}
	for i := 0; i < n; i++ {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	checkNoLeaks(t, e.state, "")
}
