package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/local"
	"github.com/sandboxd/sandboxd/internal/stack"
)

// poolStack is a stack with a warm pool of size on dataDir; t.Cleanup closes it.
func poolStack(t *testing.T, dataDir string, size int, idle time.Duration) *stack.Stack {
	t.Helper()
	cfg := env.StackConfig(dataDir)
	cfg.Pool = local.PoolConfig{Size: size, Idle: idle}
	s, err := stack.NewLocal(context.Background(), cfg)
	if err != nil {
		t.Fatalf("start stack: %v", err)
	}
	t.Cleanup(s.Close)
	return s
}

func waitPoolReady(t *testing.T, s *stack.Stack, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for s.Backend.PoolStats().Ready < n {
		if time.Now().After(deadline) {
			t.Fatalf("warm pool %+v, want %d ready", s.Backend.PoolStats(), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// createClaimed creates a sandbox and checks it was served from the warm pool.
func createClaimed(t *testing.T, s *stack.Stack, spec runtime.Spec) runner.Sandbox {
	t.Helper()
	waitPoolReady(t, s, 1)
	claims := s.Backend.PoolStats().Claims
	sb := create(t, s, runner.CreateRequest{Spec: spec})
	deadline := time.Now().Add(30 * time.Second)
	for s.Backend.PoolStats().Claims == claims {
		if cur, _ := s.Runner.Get(sb.ID); cur.State != runner.StateCreating || time.Now().After(deadline) {
			t.Fatalf("sandbox %s (%s) was not served from the warm pool: %+v", sb.ID, cur.State, s.Backend.PoolStats())
		}
		time.Sleep(5 * time.Millisecond)
	}
	return sb
}

// TestWarmPool: a sandbox served from the warm pool behaves as a cold one — env, files,
// hostname, limits, logs from offset 0, exit codes, delete, re-adoption after a runner
// restart — and idle pooled containers are removed.
func TestWarmPool(t *testing.T) {
	dir := t.TempDir()
	s := poolStack(t, dir, 2, time.Minute)
	prime := create(t, s, runner.CreateRequest{Spec: sleeper(busybox())})
	waitState(t, s, prime.ID, runner.StateRunning, 30*time.Second)

	spec := runtime.Spec{
		Container: runtime.Container{Image: busybox(), Command: "/bin/sh", Args: []string{"-c", `echo hello from main; cat /etc/motd; trap "exit 0" TERM; sleep infinity & wait`}, Env: map[string]string{"POOL_TEST": "yes"}, WorkingDir: "/tmp", Files: []runtime.File{{Path: "/etc/motd", Content: []byte("file from spec\n")}}, Resources: runtime.Resources{MilliCPU: 500, MemoryBytes: 128 << 20, Pids: 100}},
	}
	sb := createClaimed(t, s, spec)
	waitState(t, s, sb.ID, runner.StateRunning, 30*time.Second)
	c := agentOf(t, s, sb.ID)
	for _, tc := range []struct {
		argv []string
		want string
	}{
		{[]string{"hostname"}, sb.ID + "\n"},
		{[]string{"cat", "/etc/hostname"}, sb.ID + "\n"},
		{[]string{"sh", "-c", "grep -c " + sb.ID + " /etc/hosts"}, "1\n"},
		{[]string{"sh", "-c", "echo $POOL_TEST"}, "yes\n"},
		{[]string{"pwd"}, "/tmp\n"},
		{[]string{"cat", "/etc/motd"}, "file from spec\n"},
		{[]string{"cat", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}, "134217728\n"},
		{[]string{"cat", "/sys/fs/cgroup/cpu/cpu.cfs_quota_us"}, "50000\n"},
		{[]string{"cat", "/sys/fs/cgroup/pids/pids.max"}, "100\n"},
	} {
		if got := execIn(t, c, tc.argv...); string(got.Stdout) != tc.want {
			t.Errorf("%q: %q (stderr %q), want %q", tc.argv, got.Stdout, got.Stderr, tc.want)
		}
	}
	if got := execIn(t, c, "cat", "/etc/hosts"); strings.Contains(string(got.Stdout), "pool_") {
		t.Errorf("/etc/hosts names the pooled container: %q", got.Stdout)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	logs, err := c.Logs(ctx, connect.NewRequest(&agentv1.LogsRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	first := true
	for logs.Receive() {
		if first && logs.Msg().Offset != 0 {
			t.Errorf("first log chunk at offset %d", logs.Msg().Offset)
		}
		first = false
		out.Write(logs.Msg().Data)
	}
	if out.String() != "hello from main\nfile from spec\n" {
		t.Errorf("logs %q", out.String())
	}

	// Main command outcomes.
	for _, tc := range []struct {
		spec   runtime.Spec
		state  runner.State
		reason string
		code   int32
	}{
		{runtime.Spec{Container: runtime.Container{Image: busybox(), Command: "sh", Args: []string{"-c", "echo done"}}}, runner.StateCompleted, runner.ReasonCompleted, 0},
		{runtime.Spec{Container: runtime.Container{Image: busybox(), Command: "sh", Args: []string{"-c", "exit 3"}, RestartLimit: 1}}, runner.StateFailed, runner.ReasonRestartLimit, 3},
	} {
		sb := createClaimed(t, s, tc.spec)
		end, err := s.Runner.WaitTerminal(ctx, sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		if end.State != tc.state || end.Reason != tc.reason || end.ExitCode == nil || *end.ExitCode != tc.code {
			t.Errorf("%v: ended %s/%s code %v, want %s/%s %d", tc.spec.Args, end.State, end.Reason, end.ExitCode, tc.state, tc.reason, tc.code)
		}
		if tc.reason == runner.ReasonRestartLimit && end.Restarts != 1 {
			t.Errorf("restarts %d, want 1", end.Restarts)
		}
		logDir, err := s.Runner.LogDir(sb.ID, "")
		if err != nil || logDir == "" {
			t.Errorf("archived logs of %s: %q, %v", sb.ID, logDir, err)
		}
	}

	// Delete honours the grace period and TERM.
	del := createClaimed(t, s, sleeper(busybox()))
	waitState(t, s, del.ID, runner.StateRunning, 30*time.Second)
	time.Sleep(100 * time.Millisecond)
	start := time.Now()
	if _, err := s.Runner.Delete(del.ID, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if end, err := s.Runner.WaitTerminal(ctx, del.ID); err != nil || end.State != runner.StateTerminated || time.Since(start) > 3*time.Second {
		t.Errorf("delete: %+v, %v after %s", end.State, err, time.Since(start))
	}

	// A runner restart re-adopts the claimed sandbox under its own id.
	if _, err := c.WriteFile(ctx, connect.NewRequest(&agentv1.WriteFileRequest{Path: "/root/state", Content: []byte("kept")})); err != nil {
		t.Fatal(err)
	}
	waitPoolReady(t, s, 2)
	s.Close() // also destroys the idle pooled containers
	if d := poolDirs(dir); len(d) > 0 {
		t.Errorf("pooled containers left after Close: %v", d)
	}
	second := poolStack(t, dir, 2, time.Minute)
	t.Cleanup(func() { finish(t, second, dir) })
	again := waitState(t, second, sb.ID, runner.StateRunning, 10*time.Second)
	if again.IP != sb.IP && sb.IP != "" {
		t.Errorf("IP changed across restart: %s -> %s", sb.IP, again.IP)
	}
	c2 := agentOf(t, second, sb.ID)
	if got := execIn(t, c2, "cat", "/root/state"); string(got.Stdout) != "kept" {
		t.Errorf("file after restart = %q", got.Stdout)
	}
	if got := execIn(t, c2, "hostname"); string(got.Stdout) != sb.ID+"\n" {
		t.Errorf("hostname after restart = %q", got.Stdout)
	}
	if sb2, _ := second.Runner.Get(sb.ID); sb2.OOMKills != 0 {
		t.Errorf("oom kills %d", sb2.OOMKills)
	}
}

// TestWarmPoolIdle: pooled containers unused for longer than Idle are destroyed.
func TestWarmPoolIdle(t *testing.T) {
	dir := t.TempDir()
	s := poolStack(t, dir, 2, 3*time.Second) // long enough to be seen ready on a loaded machine
	t.Cleanup(func() { finish(t, s, dir) })
	sb := create(t, s, runner.CreateRequest{Spec: runtime.Spec{Container: runtime.Container{Image: busybox(), Command: "true"}}})
	waitState(t, s, sb.ID, runner.StateCompleted, 30*time.Second)
	waitPoolReady(t, s, 1)
	deadline := time.Now().Add(15 * time.Second)
	for len(poolDirs(dir)) > 0 || s.Backend.PoolStats().Ready > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("idle pooled containers not removed: %v %+v", poolDirs(dir), s.Backend.PoolStats())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if st := s.Backend.PoolStats(); st.Dropped == 0 {
		t.Errorf("stats %+v", st)
	}
}

func poolDirs(dataDir string) []string {
	ents, _ := os.ReadDir(filepath.Join(dataDir, "sandboxes"))
	var out []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "pool_") {
			out = append(out, e.Name())
		}
	}
	return out
}
