// Package bench measures the single-host runtime against the numbers that matter to
// users: how soon a new sandbox answers its first exec, and what one exec costs through
// the agent compared with `runc exec` measured in the same run. Run with `make bench`.
package bench

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/local"
	"github.com/sandboxd/sandboxd/internal/stack"
	"github.com/sandboxd/sandboxd/internal/stack/stacktest"
	"github.com/sandboxd/sandboxd/internal/testenv"
)

var env *stacktest.Env

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if code, ok := testenv.MainRequiresRoot("bench", "runc, namespaces, cgroups"); !ok {
		return code
	}
	var err error
	env, err = stacktest.Setup("bench")
	if err != nil {
		fmt.Println("bench:", err)
		return 1
	}
	code := m.Run()
	env.Close()
	// Every benchmark tears down what it made (ownStack): a sandbox's agent or cgroup, a
	// cgroup parent or a bridge of this process still on the host fails the run, and is
	// removed so that it does not stay.
	if left := env.HostLeftovers(); len(left) > 0 {
		fmt.Printf("bench: FAIL: left on the host after the benchmarks (now removed):\n  %s\n", strings.Join(left, "\n  "))
		env.RemoveHostLeftovers()
		return 1
	}
	return code
}

// newStack starts a stack; pool > 0 keeps that many warm containers per image, as
// `sandboxd dev --warm-pool` does.
func newStack(b *testing.B, pool int) *stack.Stack {
	b.Helper()
	return newStackWith(b, pool, nil)
}

// newStackWith is newStack with the config changed by change (nil: as it is).
func newStackWith(b *testing.B, pool int, change func(*stack.Config)) *stack.Stack {
	b.Helper()
	cfg := env.StackConfig(b.TempDir())
	cfg.Pool = local.PoolConfig{Size: pool, Idle: 10 * time.Minute}
	if change != nil {
		change(&cfg)
	}
	s, err := stack.NewLocal(context.Background(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	ownStack(b, s, cfg.CgroupParent)
	return s
}

// ownStack registers the teardown of s (cgroup parent parent) with b's cleanup, and
// returns it for a benchmark that tears s down sooner (it runs once): every sandbox of
// s deleted and gone, s closed (its warm pool drained), its network removed, and then
// no cgroup below parent, which would hold a sandbox's processes (its agent) that
// nothing stops any more: such a leak fails the benchmark, naming what is left.
func ownStack(b *testing.B, s *stack.Stack, parent string) (teardown func()) {
	var once sync.Once
	teardown = func() {
		once.Do(func() {
			cleanup(b, s)
			s.Close()
			if err := s.Network.Cleanup(); err != nil {
				b.Error(err)
			}
			if left := stacktest.SandboxCgroups(parent); len(left) > 0 {
				b.Errorf("left on the host after the stack's teardown: %s", strings.Join(left, "; "))
			}
		})
	}
	b.Cleanup(teardown)
	return teardown
}

func sleeper() runtime.Spec {
	return runtime.Spec{Container: runtime.Container{Image: env.Busybox(), Command: "/bin/sh", Args: []string{"-c", `trap "exit 0" TERM; sleep infinity & wait`}}}
}

// percentiles reports p50 and p99 of d in milliseconds.
func percentiles(b *testing.B, prefix string, d []time.Duration) (p50, p99 float64) {
	slices.Sort(d)
	at := func(q float64) float64 {
		i := int(q * float64(len(d)-1))
		return float64(d[i]) / float64(time.Millisecond)
	}
	p50, p99 = at(0.50), at(0.99)
	b.ReportMetric(p50, prefix+"-p50-ms")
	b.ReportMetric(p99, prefix+"-p99-ms")
	return p50, p99
}

// BenchmarkCreateFirstExec: Create → the first Exec has returned, with a warm image cache,
// one sandbox at a time: cold (runc starts a container per create) and from the warm pool.
func BenchmarkCreateFirstExec(b *testing.B) {
	b.Run("cold", func(b *testing.B) { createFirstExec(b, 0) })
	b.Run("warm-pool", func(b *testing.B) { createFirstExec(b, 10) })
}

func createFirstExec(b *testing.B, pool int) {
	s := newStack(b, pool)
	ctx := context.Background()
	// Warm the image cache and the page cache.
	warm, err := s.Runner.Create(ctx, runner.CreateRequest{Spec: sleeper()})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := s.Runner.Agent(ctx, warm.ID, ""); err != nil {
		b.Fatal(err)
	}
	_, _ = s.Runner.Delete(warm.ID, 0)
	_, _ = s.Runner.WaitTerminal(ctx, warm.ID)

	var lat []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		id := createFirstExecOnce(b, s)
		lat = append(lat, time.Since(t0))
		b.StopTimer()
		_, _ = s.Runner.Delete(id, 0)
		_, _ = s.Runner.WaitTerminal(ctx, id)
		settle(b, s, 1)
		b.StartTimer()
	}
	b.StopTimer()
	p50, p99 := percentiles(b, "create-first-exec", lat)
	if b.N < 10 { // the probe run
		return
	}
	fmt.Printf("create→first exec, %s, over %d sandboxes: p50 %.1f ms, p99 %.1f ms (targets: 100 / 200 ms)\n", poolName(pool), len(lat), p50, p99)
}

// createFirstExecOnce creates a sleeper on s and returns its ID once its first exec of
// /bin/true through the agent has answered 0.
func createFirstExecOnce(b *testing.B, s *stack.Stack) string {
	b.Helper()
	ctx := context.Background()
	sb, err := s.Runner.Create(ctx, runner.CreateRequest{Spec: sleeper()})
	if err != nil {
		b.Fatal(err)
	}
	c, err := s.Runner.Agent(ctx, sb.ID, "")
	if err != nil {
		b.Fatal(err)
	}
	res, err := c.Exec(ctx, connect.NewRequest(&agentv1.ExecRequest{Command: []string{"/bin/true"}}))
	if err != nil || res.Msg.ExitCode != 0 {
		b.Fatalf("first exec: %v", err)
	}
	return sb.ID
}

// BenchmarkExec: one exec of /bin/true through the agent, and `runc exec` of the same in
// the same sandbox, as a ratio. The sandbox runs without a user namespace of its own:
// `runc exec` joins the container's user namespace first and then cannot enter its
// network namespace, which the host's user namespace owns (setns: EPERM), whereas the
// agent is inside already.
func BenchmarkExec(b *testing.B) {
	s := newStackWith(b, 0, func(cfg *stack.Config) { cfg.NoUserNS = true })
	ctx := context.Background()
	sb, err := s.Runner.Create(ctx, runner.CreateRequest{Spec: sleeper()})
	if err != nil {
		b.Fatal(err)
	}
	c, err := s.Runner.Agent(ctx, sb.ID, "")
	if err != nil {
		b.Fatal(err)
	}
	var agentLat, runcLat []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		res, err := c.Exec(ctx, connect.NewRequest(&agentv1.ExecRequest{Command: []string{"/bin/true"}}))
		if err != nil || res.Msg.ExitCode != 0 {
			b.Fatalf("agent exec: %v", err)
		}
		agentLat = append(agentLat, time.Since(t0))

		cmd, err := s.Backend.RuntimeCommand(ctx, sb.ID, "exec", sb.ID, "/bin/true")
		if err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("runc exec: %v: %s", err, out)
		}
		runcLat = append(runcLat, time.Since(t1))
	}
	b.StopTimer()
	a50, a99 := percentiles(b, "agent-exec", agentLat)
	r50, r99 := percentiles(b, "runc-exec", runcLat)
	b.ReportMetric(r50/a50, "runc/agent-p50")
	if b.N < 10 {
		return
	}
	fmt.Printf("exec of /bin/true over %d runs: agent p50 %.2f ms p99 %.2f ms; runc exec p50 %.1f ms p99 %.1f ms; agent is %.0fx faster at p50 (targets: < 2 ms, >= 20x)\n",
		len(agentLat), a50, a99, r50, r99, r50/a50)
}

func poolName(pool int) string {
	if pool == 0 {
		return "cold"
	}
	return fmt.Sprintf("warm pool of %d", pool)
}
