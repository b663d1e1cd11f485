package bench

import (
	"context"
	"fmt"
	"testing"
	"time"

	"connectrpc.com/connect"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1/agentv1connect"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime/local"
	"github.com/sandboxd/sandboxd/internal/stack"
)

// classes are the runtime classes compared, runc first (the reference).
var classes = []string{"runc", local.GVisorClass}

func needRunsc(b *testing.B) {
	b.Helper()
	if local.FindRunsc() == "" {
		b.Skipf("runsc not built (run `make runsc`, or set $SANDBOXD_RUNSC): no gvisor class to compare")
	}
}

// startIn creates a sleeper of class and returns it with its agent client once the
// agent has answered.
func startIn(b *testing.B, s *stack.Stack, class string) (runner.Sandbox, agentv1connect.AgentServiceClient) {
	b.Helper()
	ctx := context.Background()
	spec := sleeper()
	spec.RuntimeClass = class
	sb, err := s.Runner.Create(ctx, runner.CreateRequest{Spec: spec})
	if err != nil {
		b.Fatal(err)
	}
	c, err := s.Runner.Agent(ctx, sb.ID, "")
	if err != nil {
		b.Fatal(err)
	}
	res, err := c.Exec(ctx, connect.NewRequest(&agentv1.ExecRequest{Command: []string{"/bin/true"}}))
	if err != nil || res.Msg.ExitCode != 0 {
		b.Fatalf("first exec (%s): %v", class, err)
	}
	return sb, c
}

func remove(b *testing.B, s *stack.Stack, id string) {
	b.Helper()
	_, _ = s.Runner.Delete(id, 0)
	_, _ = s.Runner.WaitTerminal(context.Background(), id)
}

// BenchmarkGVisorCreateFirstExec: Create → first Exec returned (time to first command),
// runc and gVisor alternating in the same run, one sandbox at a time, no warm pool.
func BenchmarkGVisorCreateFirstExec(b *testing.B) {
	needRunsc(b)
	s := newStack(b, 0)
	for _, class := range classes { // image and page cache warm for both
		sb, _ := startIn(b, s, class)
		remove(b, s, sb.ID)
	}
	lat := map[string][]time.Duration{}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for _, class := range classes {
			t0 := time.Now()
			sb, _ := startIn(b, s, class)
			lat[class] = append(lat[class], time.Since(t0))
			b.StopTimer()
			remove(b, s, sb.ID)
			b.StartTimer()
		}
	}
	b.StopTimer()
	report(b, "create→first exec", "ttfc", lat)
}

// BenchmarkGVisorExec: one exec of /bin/true through the agent, in a runc and in a
// gVisor sandbox, alternating.
func BenchmarkGVisorExec(b *testing.B) {
	needRunsc(b)
	s := newStack(b, 0)
	clients := map[string]agentv1connect.AgentServiceClient{}
	for _, class := range classes {
		_, clients[class] = startIn(b, s, class)
	}
	ctx := context.Background()
	lat := map[string][]time.Duration{}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for _, class := range classes {
			t0 := time.Now()
			res, err := clients[class].Exec(ctx, connect.NewRequest(&agentv1.ExecRequest{Command: []string{"/bin/true"}}))
			if err != nil || res.Msg.ExitCode != 0 {
				b.Fatalf("exec (%s): %v", class, err)
			}
			lat[class] = append(lat[class], time.Since(t0))
		}
	}
	b.StopTimer()
	report(b, "exec of /bin/true", "exec", lat)
}

// report puts p50/p99 per class on b and, for real runs, prints them with gVisor's
// cost relative to runc.
func report(b *testing.B, what, metric string, lat map[string][]time.Duration) {
	p50 := map[string]float64{}
	p99 := map[string]float64{}
	for _, class := range classes {
		p50[class], p99[class] = percentiles(b, class+"-"+metric, lat[class])
	}
	b.ReportMetric(p50[local.GVisorClass]/p50["runc"], "gvisor/runc-p50")
	if b.N < 10 { // the probe run
		return
	}
	fmt.Printf("%s over %d runs each: runc p50 %.2f ms p99 %.2f ms; gvisor p50 %.2f ms p99 %.2f ms; gvisor/runc %.1fx at p50\n",
		what, b.N, p50["runc"], p99["runc"], p50[local.GVisorClass], p99[local.GVisorClass], p50[local.GVisorClass]/p50["runc"])
}
