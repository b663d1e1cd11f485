package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1/agentv1connect"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/stack"
)

func agentOf(t *testing.T, s *stack.Stack, id string) agentv1connect.AgentServiceClient {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := s.Runner.Agent(ctx, id, "")
	if err != nil {
		sb, _ := s.Runner.Get(id)
		t.Fatalf("agent of %s: %v (state %s %s: %s)", id, err, sb.State, sb.Reason, sb.Message)
	}
	return c
}

func execIn(t *testing.T, c agentv1connect.AgentServiceClient, argv ...string) *agentv1.ExecResponse {
	t.Helper()
	res, err := c.Exec(context.Background(), connect.NewRequest(&agentv1.ExecRequest{Command: argv}))
	if err != nil {
		t.Fatalf("exec %q: %v", argv, err)
	}
	return res.Msg
}

func TestExec(t *testing.T) {
	s := startedStack(t)
	for _, tc := range []struct {
		name, image    string
		argv           []string
		stdout, stderr string
		exitCode       int32
	}{
		{"busybox stdout", busybox(), []string{"echo", "hello"}, "hello\n", "", 0},
		{"busybox stderr and exit code", busybox(), []string{"sh", "-c", "echo out; echo err >&2; exit 3"}, "out\n", "err\n", 3},
		{"busybox env from image", busybox(), []string{"sh", "-c", "echo $PATH"}, "", "", 0},
		{"python", python(), []string{"python3", "-c", "import sys; print(sys.version_info[:2]); sys.exit(7)"}, "(3, 11)\n", "", 7},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sb := create(t, s, runner.CreateRequest{Spec: sleeper(tc.image)})
			got := execIn(t, agentOf(t, s, sb.ID), tc.argv...)
			if tc.stdout != "" && string(got.Stdout) != tc.stdout {
				t.Errorf("stdout = %q, want %q", got.Stdout, tc.stdout)
			}
			if string(got.Stderr) != tc.stderr {
				t.Errorf("stderr = %q, want %q", got.Stderr, tc.stderr)
			}
			if got.ExitCode != tc.exitCode {
				t.Errorf("exit code = %d, want %d", got.ExitCode, tc.exitCode)
			}
		})
	}
}

func TestSandboxIsolationInside(t *testing.T) {
	s := startedStack(t)
	sb := create(t, s, runner.CreateRequest{Spec: func() runtime.Spec {
		sp := sleeper(busybox())
		sp.Resources = runtime.Resources{MilliCPU: 500, MemoryBytes: 256 << 20, Pids: 64}
		sp.Env = map[string]string{"GREETING": "hi"}
		return sp
	}()})
	c := agentOf(t, s, sb.ID)
	for _, tc := range []struct {
		name string
		argv []string
		want string
	}{
		{"env", []string{"sh", "-c", "echo $GREETING"}, "hi"},
		{"memory limit", []string{"cat", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}, fmt.Sprint(256 << 20)},
		{"pids limit", []string{"cat", "/sys/fs/cgroup/pids/pids.max"}, "64"},
		{"cpu quota", []string{"cat", "/sys/fs/cgroup/cpu/cpu.cfs_quota_us"}, "50000"},
		{"no new privileges", []string{"sh", "-c", "grep NoNewPrivs /proc/self/status | tr -d '\t '"}, "NoNewPrivs:1"},
		{"seccomp filter", []string{"sh", "-c", "grep '^Seccomp:' /proc/self/status | tr -d '\t '"}, "Seccomp:2"},
		{"hostname", []string{"hostname"}, sb.ID},
		{"hosts file names the sandbox", []string{"sh", "-c", "grep -c " + sb.ID + " /etc/hosts"}, "1"},
		{"pid namespace", []string{"sh", "-c", "cat /proc/1/cmdline | tr '\\0' ' '"}, "/.sandboxd/bin/sandbox-agent"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := execIn(t, c, tc.argv...)
			if out := strings.TrimSpace(string(got.Stdout)); !strings.HasPrefix(out, tc.want) {
				t.Errorf("%q: stdout %q (stderr %q, exit %d), want prefix %q", tc.argv, out, got.Stderr, got.ExitCode, tc.want)
			}
		})
	}
	// The default container capability set: no CAP_SYS_ADMIN (bit 21), no CAP_NET_ADMIN (12).
	got := execIn(t, c, "sh", "-c", "grep CapEff /proc/self/status")
	if !strings.Contains(string(got.Stdout), "00000000a80405fb") {
		t.Errorf("CapEff = %q, want the default set 00000000a80405fb", got.Stdout)
	}
	if got := execIn(t, c, "cat", "/proc/kcore"); got.ExitCode == 0 && len(got.Stdout) > 0 {
		t.Errorf("/proc/kcore readable: %d bytes", len(got.Stdout))
	}
	if got := execIn(t, c, "sh", "-c", "echo 1 > /proc/sys/kernel/domainname"); got.ExitCode == 0 {
		t.Errorf("/proc/sys writable")
	}
}

func TestStreamExecStdin(t *testing.T) {
	s := startedStack(t)
	sb := create(t, s, runner.CreateRequest{Spec: sleeper(busybox())})
	c := agentOf(t, s, sb.ID)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stream := c.StreamExec(ctx)
	send := func(m *agentv1.StreamExecRequest) {
		if err := stream.Send(m); err != nil {
			t.Fatalf("send: %v", err)
		}
	}
	send(&agentv1.StreamExecRequest{Message: &agentv1.StreamExecRequest_Init{Init: &agentv1.StreamExecInit{Command: []string{"sh", "-c", "tr a-z A-Z; echo done >&2"}}}})
	first, err := stream.Receive()
	if err != nil || first.GetReady() == nil {
		t.Fatalf("first response = %v, %v; want ready", first, err)
	}
	send(&agentv1.StreamExecRequest{Message: &agentv1.StreamExecRequest_Stdin{Stdin: []byte("hello ")}})
	send(&agentv1.StreamExecRequest{Message: &agentv1.StreamExecRequest_Stdin{Stdin: []byte("world\n")}})
	send(&agentv1.StreamExecRequest{Message: &agentv1.StreamExecRequest_Close{Close: &agentv1.CloseStdin{}}})
	var stdout, stderr bytes.Buffer
	for {
		msg, err := stream.Receive()
		if err != nil {
			t.Fatalf("receive: %v (stdout so far %q)", err, stdout.String())
		}
		if o := msg.GetOutput(); o != nil {
			if o.Stream == agentv1.Stream_STREAM_STDERR {
				stderr.Write(o.Data)
			} else {
				stdout.Write(o.Data)
			}
		}
		if x := msg.GetExit(); x != nil {
			if x.ExitCode != 0 {
				t.Errorf("exit code %d", x.ExitCode)
			}
			break
		}
	}
	if stdout.String() != "HELLO WORLD\n" || stderr.String() != "done\n" {
		t.Errorf("stdout %q stderr %q", stdout.String(), stderr.String())
	}
}

func TestPTY(t *testing.T) {
	s := startedStack(t)
	sb := create(t, s, runner.CreateRequest{Spec: sleeper(busybox())})
	c := agentOf(t, s, sb.ID)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stream := c.StreamExec(ctx)
	init := &agentv1.StreamExecInit{Command: []string{"/bin/sh"}, Tty: true, TtyWidth: 100, TtyHeight: 30}
	if err := stream.Send(&agentv1.StreamExecRequest{Message: &agentv1.StreamExecRequest_Init{Init: init}}); err != nil {
		t.Fatal(err)
	}
	send := func(m *agentv1.StreamExecRequest) {
		if err := stream.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	var out bytes.Buffer
	var code int32 = -1
	// readUntil reads output until it contains want, or the exit.
	readUntil := func(want string) {
		for !strings.Contains(out.String(), want) {
			msg, err := stream.Receive()
			if err != nil {
				t.Fatalf("receive: %v (output %q)", err, out.String())
			}
			if o := msg.GetOutput(); o != nil {
				out.Write(o.Data)
			}
			if x := msg.GetExit(); x != nil {
				code = x.ExitCode
				return
			}
		}
	}
	send(&agentv1.StreamExecRequest{Message: &agentv1.StreamExecRequest_Stdin{Stdin: []byte("stty size; tty\n")}})
	readUntil("/dev/pts/")
	send(&agentv1.StreamExecRequest{Message: &agentv1.StreamExecRequest_Resize{Resize: &agentv1.Resize{Width: 120, Height: 40}}})
	send(&agentv1.StreamExecRequest{Message: &agentv1.StreamExecRequest_Stdin{Stdin: []byte("stty size; exit 5\n")}})
	readUntil("\x00never")
	for _, want := range []string{"30 100", "/dev/pts/", "40 120"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("tty output %q lacks %q", out.String(), want)
		}
	}
	if code != 5 {
		t.Errorf("exit code %d, want 5", code)
	}
}

func TestFileRoundTrip(t *testing.T) {
	s := startedStack(t)
	sb := create(t, s, runner.CreateRequest{Spec: sleeper(busybox())})
	c := agentOf(t, s, sb.ID)
	ctx := context.Background()
	for _, size := range []int{0, 1, 10 << 20, 40 << 20} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			data := make([]byte, size)
			_, _ = rand.Read(data)
			p := fmt.Sprintf("/data/nested/f-%d.bin", size)
			if _, err := c.WriteFile(ctx, connect.NewRequest(&agentv1.WriteFileRequest{Path: p, Content: data})); err != nil {
				t.Fatalf("write: %v", err)
			}
			res, err := c.ReadFile(ctx, connect.NewRequest(&agentv1.ReadFileRequest{Path: p}))
			if err != nil {
				t.Fatalf("read: %v", err)
			}
			if !bytes.Equal(res.Msg.Content, data) {
				t.Fatalf("read back %d bytes, differ from the %d written", len(res.Msg.Content), size)
			}
			sum := sha256.Sum256(data)
			got := execIn(t, c, "sha256sum", p)
			if !strings.HasPrefix(string(got.Stdout), hex.EncodeToString(sum[:])) {
				t.Errorf("sha256sum inside = %q, want %x", got.Stdout, sum)
			}
		})
	}
}

func TestFileErrors(t *testing.T) {
	s := startedStack(t)
	sb := create(t, s, runner.CreateRequest{Spec: sleeper(busybox())})
	c := agentOf(t, s, sb.ID)
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		path string
		code connect.Code
	}{
		{"not found", "/no/such/file", connect.CodeNotFound},
		{"directory", "/etc", connect.CodeFailedPrecondition},
		{"traversal", "/tmp/../../etc/passwd", connect.CodeInvalidArgument},
		{"nul byte", "/tmp/a\x00b", connect.CodeInvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.ReadFile(ctx, connect.NewRequest(&agentv1.ReadFileRequest{Path: tc.path}))
			if connect.CodeOf(err) != tc.code {
				t.Errorf("read %q: %v, want code %v", tc.path, err, tc.code)
			}
		})
	}
	if _, err := c.WriteFile(ctx, connect.NewRequest(&agentv1.WriteFileRequest{Path: "/tmp/../x", Content: []byte("x")})); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("write with '..': %v, want InvalidArgument", err)
	}
}

func TestLogsFollow(t *testing.T) {
	s := startedStack(t)
	spec := runtime.Spec{Container: runtime.Container{Image: busybox(), Command: "/bin/sh", Args: []string{"-c", `for i in 1 2 3 4 5; do echo line $i; sleep 0.2; done; echo bye >&2`}}}
	sb := create(t, s, runner.CreateRequest{Spec: spec})
	c := agentOf(t, s, sb.ID)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stream, err := c.Logs(ctx, connect.NewRequest(&agentv1.LogsRequest{Follow: true}))
	if err != nil {
		t.Fatal(err)
	}
	var got bytes.Buffer
	var lastNext uint64
	for stream.Receive() {
		m := stream.Msg()
		if m.Offset != lastNext {
			t.Errorf("chunk at offset %d, previous ended at %d", m.Offset, lastNext)
		}
		lastNext = m.NextOffset
		got.Write(m.Data)
	}
	if err := stream.Err(); err != nil && !errors.Is(err, context.Canceled) {
		t.Logf("logs stream ended: %v", err)
	}
	want := "line 1\nline 2\nline 3\nline 4\nline 5\nbye\n"
	if got.String() != want {
		t.Errorf("followed logs %q, want %q", got.String(), want)
	}
	end := waitState(t, s, sb.ID, runner.StateCompleted, 20*time.Second)
	if end.ExitCode == nil || *end.ExitCode != 0 {
		t.Errorf("exit code %v, want 0", end.ExitCode)
	}
}

func TestMainCommandOutcomes(t *testing.T) {
	s := startedStack(t)
	for _, tc := range []struct {
		name     string
		spec     runtime.Spec
		state    runner.State
		reason   string
		exitCode int32
		restarts int
	}{
		{"exit 0 completes", runtime.Spec{Container: runtime.Container{Image: busybox(), Command: "true"}}, runner.StateCompleted, runner.ReasonCompleted, 0, 0},
		{"non-zero exits restart then fail", runtime.Spec{Container: runtime.Container{Image: busybox(), Command: "sh", Args: []string{"-c", "exit 4"}, RestartLimit: 2}}, runner.StateFailed, runner.ReasonRestartLimit, 4, 2},
		{"missing binary fails to start", runtime.Spec{Container: runtime.Container{Image: busybox(), Command: "/no/such/binary"}}, runner.StateFailed, runner.ReasonStartError, -1, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sb := create(t, s, runner.CreateRequest{Spec: tc.spec})
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			end, err := s.Runner.WaitTerminal(ctx, sb.ID)
			if err != nil {
				t.Fatal(err)
			}
			if end.State != tc.state || end.Reason != tc.reason {
				t.Errorf("ended %s/%s (%s), want %s/%s", end.State, end.Reason, end.Message, tc.state, tc.reason)
			}
			if tc.exitCode >= 0 && (end.ExitCode == nil || *end.ExitCode != tc.exitCode) {
				t.Errorf("exit code %v, want %d", end.ExitCode, tc.exitCode)
			}
			if end.Restarts != tc.restarts {
				t.Errorf("restarts %d, want %d", end.Restarts, tc.restarts)
			}
			if _, err := s.Runner.Agent(ctx, sb.ID, ""); !errors.Is(err, runner.ErrNotRunning) {
				t.Errorf("agent of an ended sandbox: %v, want ErrNotRunning", err)
			}
		})
	}
}

func TestMemoryLimitEnforced(t *testing.T) {
	s := startedStack(t)
	spec := sleeper(busybox())
	spec.Resources.MemoryBytes = 64 << 20
	sb := create(t, s, runner.CreateRequest{Spec: spec})
	c := agentOf(t, s, sb.ID)
	got := execIn(t, c, "dd", "if=/dev/zero", "of=/dev/null", "bs=200M", "count=1")
	if got.ExitCode != 137 {
		t.Errorf("memory hog exit code %d (stderr %q), want 137 (SIGKILL)", got.ExitCode, got.Stderr)
	}
	if after, _ := s.Runner.Get(sb.ID); after.OOMKills < 1 {
		t.Errorf("OOMKills = %d after a memory hog was killed, want >= 1", after.OOMKills)
	}
	if got := execIn(t, c, "echo", "alive"); string(got.Stdout) != "alive\n" {
		t.Errorf("sandbox not usable after an OOM kill: %q", got.Stdout)
	}

	// A main command over the limit fails the sandbox with OOMKilled.
	hog := runtime.Spec{Container: runtime.Container{Image: busybox(), Command: "dd", Args: []string{"if=/dev/zero", "of=/dev/null", "bs=200M", "count=1"}, RestartLimit: 1}}
	hog.Resources.MemoryBytes = 64 << 20
	sb2 := create(t, s, runner.CreateRequest{Spec: hog})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	end, err := s.Runner.WaitTerminal(ctx, sb2.ID)
	if err != nil {
		t.Fatal(err)
	}
	if end.State != runner.StateFailed || end.Reason != runner.ReasonOOMKilled {
		t.Errorf("memory hog main ended %s/%s (%s), want FAILED/OOMKilled", end.State, end.Reason, end.Message)
	}
}

// TestLifetimeExpiry: at its lifetime a sandbox goes TERMINATING (the grace period) and
// then COMPLETED with reason LifetimeExceeded, as in the target system, and with no exit
// code: its main command did not exit by itself.
func TestLifetimeExpiry(t *testing.T) {
	s := startedStack(t)
	// The main command ignores SIGTERM, so the grace period (1 s here) runs out.
	spec := runtime.Spec{Container: runtime.Container{Image: busybox(), Command: "/bin/sh", Args: []string{"-c", `trap "" TERM; while true; do sleep 0.1; done`}}}
	sb := create(t, s, runner.CreateRequest{Spec: spec, Lifetime: 2 * time.Second})
	if sb.Lifetime != 2*time.Second {
		t.Errorf("effective lifetime %s", sb.Lifetime)
	}
	seen := map[runner.State]bool{}
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		cur, err := s.Runner.Get(sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		seen[cur.State] = true
		if cur.State.Terminal() {
			break
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	end, err := s.Runner.WaitTerminal(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if end.State != runner.StateCompleted || end.Reason != runner.ReasonLifetimeExceeded || end.ExitCode != nil {
		t.Errorf("ended %s/%s exit code %v, want COMPLETED/LifetimeExceeded without an exit code", end.State, end.Reason, end.ExitCode)
	}
	if !seen[runner.StateRunning] || !seen[runner.StateTerminating] {
		t.Errorf("states seen %v, want RUNNING then TERMINATING", seen)
	}
	if lived := end.EndedAt.Sub(end.CreatedAt); lived < 2*time.Second || lived > 6*time.Second {
		t.Errorf("lived %s with a 2s lifetime", lived)
	}
	def := create(t, s, runner.CreateRequest{Spec: sleeper(busybox())})
	if def.Lifetime != runner.DefaultLifetime {
		t.Errorf("default lifetime %s, want %s", def.Lifetime, runner.DefaultLifetime)
	}
}

func TestDeleteWithinGrace(t *testing.T) {
	s := startedStack(t)
	for _, tc := range []struct {
		name     string
		script   string
		grace    time.Duration
		min, max time.Duration
	}{
		{"honours TERM", `trap "exit 0" TERM; sleep infinity & wait`, 10 * time.Second, 0, 3 * time.Second},
		{"ignores TERM, killed at grace", `trap "" TERM; while true; do sleep 1; done`, 2 * time.Second, 2 * time.Second, 6 * time.Second},
		{"zero grace kills at once", `trap "" TERM; while true; do sleep 1; done`, 0, 0, 3 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sb := create(t, s, runner.CreateRequest{Spec: runtime.Spec{Container: runtime.Container{Image: busybox(), Command: "/bin/sh", Args: []string{"-c", tc.script}}}})
			waitState(t, s, sb.ID, runner.StateRunning, 30*time.Second)
			time.Sleep(100 * time.Millisecond) // let the shell install its trap
			start := time.Now()
			del, err := s.Runner.Delete(sb.ID, tc.grace)
			if err != nil {
				t.Fatal(err)
			}
			if del.State != runner.StateTerminating {
				t.Errorf("delete returned %s, want TERMINATING", del.State)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			end, err := s.Runner.WaitTerminal(ctx, sb.ID)
			if err != nil {
				t.Fatal(err)
			}
			took := time.Since(start)
			if end.State != runner.StateTerminated {
				t.Errorf("ended %s/%s, want TERMINATED", end.State, end.Reason)
			}
			if took < tc.min || took > tc.max {
				t.Errorf("delete took %s, want between %s and %s", took, tc.min, tc.max)
			}
		})
	}
}

func TestRunnerRestartReadoptsSandboxes(t *testing.T) {
	dir := t.TempDir()
	first := newStack(t, dir)
	sb := create(t, first, runner.CreateRequest{Spec: sleeper(busybox())})
	c := agentOf(t, first, sb.ID)
	if _, err := c.WriteFile(context.Background(), connect.NewRequest(&agentv1.WriteFileRequest{Path: "/root/state", Content: []byte("kept")})); err != nil {
		t.Fatal(err)
	}
	first.Close()

	second := newStack(t, dir)
	t.Cleanup(func() { finish(t, second, dir) })
	again := waitState(t, second, sb.ID, runner.StateRunning, 10*time.Second)
	if again.IP != sb.IP && sb.IP != "" {
		t.Errorf("IP changed across restart: %s -> %s", sb.IP, again.IP)
	}
	c2 := agentOf(t, second, sb.ID)
	if got := execIn(t, c2, "cat", "/root/state"); string(got.Stdout) != "kept" {
		t.Errorf("file after runner restart = %q", got.Stdout)
	}
}

func TestManySandboxesAtOnce(t *testing.T) {
	s := startedStack(t)
	const n = 20
	var wg sync.WaitGroup
	errs := make(chan error, n)
	ips := make(chan string, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			sb, err := s.Runner.Create(context.Background(), runner.CreateRequest{Spec: sleeper(busybox())})
			if err != nil {
				errs <- err
				return
			}
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			c, err := s.Runner.Agent(ctx, sb.ID, "")
			if err != nil {
				errs <- fmt.Errorf("sandbox %d: %w", i, err)
				return
			}
			res, err := c.Exec(ctx, connect.NewRequest(&agentv1.ExecRequest{Command: []string{"echo", fmt.Sprint(i)}}))
			if err != nil {
				errs <- fmt.Errorf("sandbox %d exec: %w", i, err)
				return
			}
			if string(res.Msg.Stdout) != fmt.Sprintf("%d\n", i) {
				errs <- fmt.Errorf("sandbox %d exec: stdout %q", i, res.Msg.Stdout)
				return
			}
			got, _ := s.Runner.Get(sb.ID)
			ips <- got.IP
		}(i)
	}
	wg.Wait()
	close(errs)
	close(ips)
	for err := range errs {
		t.Error(err)
	}
	seen := map[string]bool{}
	for ip := range ips {
		if seen[ip] {
			t.Errorf("IP %s given twice", ip)
		}
		seen[ip] = true
	}
}

func TestBadInputs(t *testing.T) {
	s := startedStack(t)
	t.Run("rejected before start", func(t *testing.T) {
		for _, tc := range []struct {
			name  string
			req   runner.CreateRequest
			field string
		}{
			{"negative memory", runner.CreateRequest{Spec: runtime.Spec{Container: runtime.Container{Image: busybox(), Resources: runtime.Resources{MemoryBytes: -1}}}}, "resources.memory"},
			{"negative cpu", runner.CreateRequest{Spec: runtime.Spec{Container: runtime.Container{Image: busybox(), Resources: runtime.Resources{MilliCPU: -5}}}}, "resources.cpu"},
			{"negative lifetime", runner.CreateRequest{Spec: runtime.Spec{Container: runtime.Container{Image: busybox()}}, Lifetime: -time.Second}, "max_lifetime_seconds"},
			{"lifetime over 30 days", runner.CreateRequest{Spec: runtime.Spec{Container: runtime.Container{Image: busybox()}}, Lifetime: 31 * 24 * time.Hour}, "max_lifetime_seconds"},
			{"file path traversal", runner.CreateRequest{Spec: runtime.Spec{Container: runtime.Container{Image: busybox(), Files: []runtime.File{{Path: "/tmp/../../etc/shadow"}}}}}, "files[0].path"},
			{"relative file path", runner.CreateRequest{Spec: runtime.Spec{Container: runtime.Container{Image: busybox(), Files: []runtime.File{{Path: "etc/x"}}}}}, "files[0].path"},
			{"no image", runner.CreateRequest{Spec: runtime.Spec{}}, "image"},
			{"bad id", runner.CreateRequest{Spec: runtime.Spec{ID: "Not_A_Label", Container: runtime.Container{Image: busybox()}}}, "sandbox_id"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				_, err := s.Runner.Create(context.Background(), tc.req)
				var verr *runner.ValidationError
				if !errors.As(err, &verr) {
					t.Fatalf("create: %v, want a ValidationError", err)
				}
				found := false
				for _, v := range verr.Violations {
					found = found || strings.Contains(v.Field, tc.field)
				}
				if !found {
					t.Errorf("violations %+v do not name %q", verr.Violations, tc.field)
				}
			})
		}
		if n := len(s.Runner.List()); n != 0 {
			t.Errorf("%d sandboxes exist after rejected creates", n)
		}
	})
	t.Run("fail while starting", func(t *testing.T) {
		for _, tc := range []struct {
			name, image, reason, msg string
		}{
			{"unknown image", env.Registry + "/sandboxd/nope:latest", runner.ReasonImagePullFailed, "not found"},
			{"unknown tag", env.Registry + "/sandboxd/busybox:nope", runner.ReasonImagePullFailed, "not found"},
			// A host port the operator did not configure as a registry: refused before any
			// dial, and the reason says nothing of what answers there (issue 15 §4).
			{"unconfigured loopback registry", "127.0.0.1:1/sandboxd/busybox:latest", runner.ReasonImagePullFailed, "not allowed"},
			{"invalid reference", "UPPER CASE!!", runner.ReasonImagePullFailed, "invalid"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				sb := create(t, s, runner.CreateRequest{Spec: runtime.Spec{Container: runtime.Container{Image: tc.image}}})
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				end, err := s.Runner.WaitTerminal(ctx, sb.ID)
				if err != nil {
					t.Fatal(err)
				}
				if end.State != runner.StateFailed || end.Reason != tc.reason || !strings.Contains(strings.ToLower(end.Message), tc.msg) {
					t.Errorf("ended %s/%s %q, want FAILED/%s mentioning %q", end.State, end.Reason, end.Message, tc.reason, tc.msg)
				}
			})
		}
	})
}

func TestRunnerRestartReportsVanishedSandbox(t *testing.T) {
	dir := t.TempDir()
	first := newStack(t, dir)
	sb := create(t, first, runner.CreateRequest{Spec: sleeper(busybox())})
	waitState(t, first, sb.ID, runner.StateRunning, 30*time.Second)
	first.Close()
	// The container dies while no runner is watching.
	kill, err := first.Backend.RuntimeCommand(context.Background(), sb.ID, "kill", sb.ID, "KILL")
	if err != nil {
		t.Fatal(err)
	}
	if out, err := kill.CombinedOutput(); err != nil {
		t.Fatalf("runc kill: %v: %s", err, out)
	}
	time.Sleep(200 * time.Millisecond)

	second := newStack(t, dir)
	t.Cleanup(func() { finish(t, second, dir) })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	end, err := second.Runner.WaitTerminal(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if end.State != runner.StateFailed || end.Reason == "" || end.Message == "" {
		t.Errorf("vanished sandbox reported %s/%s %q, want FAILED with a reason", end.State, end.Reason, end.Message)
	}
	t.Logf("vanished sandbox: %s/%s: %s", end.State, end.Reason, end.Message)
}

func TestImageGCKeepsImagesInUse(t *testing.T) {
	s := startedStack(t)
	live := create(t, s, runner.CreateRequest{Spec: sleeper(busybox())})
	done := create(t, s, runner.CreateRequest{Spec: runtime.Spec{Container: runtime.Container{Image: python(), Command: "true"}}})
	waitState(t, s, live.ID, runner.StateRunning, 30*time.Second)
	waitState(t, s, done.ID, runner.StateCompleted, 60*time.Second)
	ctx := context.Background()
	imgs, layers, err := s.GC(ctx)
	if err != nil || imgs != 1 || layers != 1 {
		t.Fatalf("GC removed %d images, %d layers (%v); want the python image and its layer", imgs, layers, err)
	}
	c := agentOf(t, s, live.ID)
	if got := execIn(t, c, "ls", "/bin/busybox"); got.ExitCode != 0 {
		t.Errorf("sandbox broken after GC: %q %q", got.Stdout, got.Stderr)
	}
	if _, err := s.Images.Lookup(busybox()); err != nil {
		t.Errorf("image in use was collected: %v", err)
	}
}
