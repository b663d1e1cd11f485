package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/internal/agent"
	"github.com/sandboxd/sandboxd/internal/agentconfig"
)

// BenchmarkAgentStart: the CPU sandbox-agent spends from its exec to answering, the way
// the local backend starts it (the listening socket inherited as fd 3, a config with an
// identity and a main command, here the host's /bin/sleep): its threads' CPU time
// (/proc/<pid>/task/*/schedstat, which the kernel keeps in ns) when it has answered the
// first call over an identity-checked connection (a Status, as the runner's first
// contact), and again when it has answered the first exec (/bin/true) — so initialisation
// moved from the start to the first call still counts. Every create pays this inside the
// sandbox's cgroup (docs/network.md "Where a create's CPU goes at 1,000"). Printed beside
// it, measured in the same rounds: the floor, a static Go program that accepts one
// connection on fd 3 and writes a byte (bench/testdata/startfloor; the Go runtime's start
// and nothing else), and the ratio to it. BENCH_AGENT_COMPARE=path measures another
// agent binary too (e.g. one built from an earlier commit with `make agent BIN=...`), in
// rounds that alternate with this checkout's, for a before/after on the same host state.
// Medians of b.N rounds; no root needed, but it runs in bench/ with the others.
func BenchmarkAgentStart(b *testing.B) {
	if _, err := os.Stat(fmt.Sprintf("/proc/self/task/%d/schedstat", syscall.Gettid())); err != nil {
		b.Skipf("no per-thread CPU time (schedstat, CONFIG_SCHED_INFO): %v", err)
	}
	dir := b.TempDir()
	floor := filepath.Join(dir, "startfloor")
	build := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", floor, "./testdata/startfloor")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		b.Fatalf("build the floor: %v\n%s", err, out)
	}
	bins := []struct{ name, path string }{{"agent", env.AgentBin}}
	if p := os.Getenv("BENCH_AGENT_COMPARE"); p != "" {
		bins = append(bins, struct{ name, path string }{"compare", p})
	}
	var floorCPU []time.Duration
	ready := make([][]time.Duration, len(bins))
	exec1 := make([][]time.Duration, len(bins))
	threads := make([]int, len(bins))
	n := max(b.N, 1)
	b.ResetTimer()
	for i := range n {
		floorCPU = append(floorCPU, startFloor(b, floor, dir))
		// Alternate the order, so neither binary always runs right after the floor.
		for k := range bins {
			j := (k + i) % len(bins)
			r, e, t := startAgent(b, bins[j].path, filepath.Join(dir, fmt.Sprintf("a%d-%d", i, j)))
			ready[j], exec1[j], threads[j] = append(ready[j], r), append(exec1[j], e), t
		}
	}
	b.StopTimer()
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	f := median(floorCPU)
	fmt.Printf("agent start CPU (median of %d rounds; floor: a static Go program answering on fd 3 = %.2f ms):\n", n, ms(f))
	for k, bin := range bins {
		r, e := median(ready[k]), median(exec1[k])
		fmt.Printf("  %-8s to the first answer %.2f ms (%.1fx the floor), to the first exec's %.2f ms (%.1fx), %d threads (%s)\n",
			bin.name, ms(r), float64(r)/float64(f), ms(e), float64(e)/float64(f), threads[k], bin.path)
		if k == 0 {
			b.ReportMetric(ms(r), "ready-ms")
			b.ReportMetric(ms(e), "exec-ms")
			b.ReportMetric(float64(e)/float64(f), "exec-x-floor")
		}
	}
	b.ReportMetric(ms(f), "floor-ms")
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// taskCPU is the CPU time all threads of pid have had so far.
func taskCPU(b *testing.B, pid int) (time.Duration, int) {
	b.Helper()
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		b.Fatal(err)
	}
	var sum time.Duration
	for _, t := range tasks {
		raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/schedstat", pid, t.Name()))
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ESRCH) {
			continue // the thread has ended since ReadDir (schedstat itself: checked at the start)
		}
		if err != nil {
			b.Fatalf("per-thread CPU time (schedstat, CONFIG_SCHED_INFO): %v", err)
		}
		ns, err := strconv.ParseInt(strings.Fields(string(raw))[0], 10, 64)
		if err != nil {
			b.Fatalf("schedstat %q: %v", raw, err)
		}
		sum += time.Duration(ns)
	}
	return sum, len(tasks)
}

// listenFile is a listening unix socket at path, as the file the child inherits.
func listenFile(b *testing.B, path string) *os.File {
	b.Helper()
	ln, err := net.Listen("unix", path)
	if err != nil {
		b.Fatal(err)
	}
	ul := ln.(*net.UnixListener)
	ul.SetUnlinkOnClose(false)
	f, err := ul.File()
	if err != nil {
		b.Fatal(err)
	}
	ln.Close()
	return f
}

func startFloor(b *testing.B, bin, dir string) time.Duration {
	b.Helper()
	sock := filepath.Join(dir, "floor.sock")
	_ = os.Remove(sock)
	lf := listenFile(b, sock)
	cmd := exec.Command(bin)
	cmd.ExtraFiles = []*os.File{lf}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	lf.Close()
	waited := false
	defer func() {
		if !waited { // a failure below: no floor left running
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	}()
	c, err := net.Dial("unix", sock)
	if err != nil {
		b.Fatal(err)
	}
	var one [1]byte
	if _, err := c.Read(one[:]); err != nil {
		b.Fatal(err)
	}
	cpu, _ := taskCPU(b, cmd.Process.Pid)
	c.Close()
	err = cmd.Wait()
	waited = true
	if err != nil {
		b.Fatal("floor:", err)
	}
	return cpu
}

// startAgent starts the agent bin in dir as the local backend does and returns its CPU
// time at its first answer, at its first exec's, and its threads then; it stops the agent
// (SIGTERM, as a stop) and waits for it.
func startAgent(b *testing.B, bin, dir string) (ready, exec1 time.Duration, threads int) {
	b.Helper()
	state := filepath.Join(dir, "run")
	if err := os.MkdirAll(state, 0o755); err != nil {
		b.Fatal(err)
	}
	ident := agent.NewIdentity("bench-agent-start")
	cfg, _ := json.Marshal(&agentconfig.Config{
		Argv: []string{"/bin/sleep", "600"}, Env: []string{"PATH=/usr/bin:/bin"}, Identity: ident,
	})
	cfgPath := filepath.Join(dir, "config.json")
	if err := os.WriteFile(cfgPath, cfg, 0o644); err != nil {
		b.Fatal(err)
	}
	sock := filepath.Join(dir, "agent.sock")
	lf := listenFile(b, sock)
	cmd := exec.Command(bin, "--config", cfgPath, "--state-dir", state)
	cmd.ExtraFiles = []*os.File{lf}
	cmd.Env = []string{}
	// A group of its own, killed whole on a failure (killAgent).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	lf.Close()
	done := make(chan error, 1)
	waiting, stopped := false, false
	defer func() {
		if stopped {
			return
		}
		// A failure below: nothing of this round left running.
		killAgent(cmd.Process.Pid)
		if waiting {
			<-done
		} else {
			_ = cmd.Wait()
		}
	}()
	cl := agent.NewClient(func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		c, err := d.DialContext(ctx, "unix", sock)
		if err != nil {
			return nil, err
		}
		if err := agent.VerifyIdentity(ctx, c, ident); err != nil {
			c.Close()
			return nil, err
		}
		return c, nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := cl.Status(ctx, connect.NewRequest(&agentv1.StatusRequest{})); err != nil {
		b.Fatalf("agent status: %v\n%s", err, stderr.String())
	}
	ready, _ = taskCPU(b, cmd.Process.Pid)
	res, err := cl.Exec(ctx, connect.NewRequest(&agentv1.ExecRequest{Command: []string{"/bin/true"}}))
	if err != nil || res.Msg.ExitCode != 0 {
		b.Fatalf("agent exec: %v %v\n%s", res, err, stderr.String())
	}
	exec1, threads = taskCPU(b, cmd.Process.Pid)
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		b.Fatal(err)
	}
	waiting = true
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		stopped = true
		// The main command was stopped by SIGTERM, so the agent's code is its exit's; the
		// agent itself must have exited, not died of a signal.
		var ee *exec.ExitError
		if err != nil && (!errors.As(err, &ee) || ee.ExitCode() < 0) {
			b.Fatalf("agent stop: %v\n%s", err, stderr.String())
		}
	case <-time.After(30 * time.Second):
		b.Fatalf("agent did not stop within 30 s after SIGTERM\n%s", stderr.String())
	}
	return ready, exec1, threads
}

// killAgent kills the agent pid with its process group and what it started: the main
// command and its execs run in process groups (or sessions) of their own, which the
// agent's group does not hold and which would outlive it (/bin/sleep 600), so each of
// its children's groups is killed first, found while it is still theirs.
func killAgent(pid int) {
	tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	for _, t := range tasks {
		raw, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/children", pid, t.Name()))
		for _, f := range strings.Fields(string(raw)) {
			if c, err := strconv.Atoi(f); err == nil && c > 0 {
				_ = syscall.Kill(-c, syscall.SIGKILL)
				_ = syscall.Kill(c, syscall.SIGKILL)
			}
		}
	}
	_ = syscall.Kill(-pid, syscall.SIGKILL)
}
