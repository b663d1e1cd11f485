package bench

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1/sandboxv1connect"
	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/gateway"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/stack"
)

// gatewayClient serves a gateway over s on loopback (h2c, as `sandboxd dev`) and returns
// a gRPC client of it.
func gatewayClient(b *testing.B, s *stack.Stack) sandboxv1connect.SandboxServiceClient {
	b.Helper()
	keys, err := auth.OpenKeyring(filepath.Join(b.TempDir(), "keys.json"))
	if err != nil {
		b.Fatal(err)
	}
	key, _, err := keys.Create("bench", auth.RoleUser, "")
	if err != nil {
		b.Fatal(err)
	}
	g, err := gateway.New(gateway.Config{Auth: keys, Runners: []runner.Handle{runner.NewLocal("local", s.Runner)}})
	if err != nil {
		b.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(g.Handler())
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	srv.Start()
	b.Cleanup(srv.Close)
	protos := new(http.Protocols)
	protos.SetUnencryptedHTTP2(true)
	hc := &http.Client{Transport: &http.Transport{Protocols: protos}}
	return sandboxv1connect.NewSandboxServiceClient(hc, srv.URL, connect.WithGRPC(),
		connect.WithInterceptors(connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
			return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
				req.Header().Set("Authorization", "Bearer "+key)
				return next(ctx, req)
			}
		})))
}

func gatewaySleeper() *sandboxv1.CreateSandboxRequest {
	sp := sleeper()
	return &sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: &sandboxv1.SandboxSpec{
		Containers: []*sandboxv1.Container{{Name: "main", Image: sp.Image, Command: sp.Command, Args: sp.Args}},
	}}}
}

// BenchmarkTimeToFirstCommand: create → exec `true` returns, through the gateway and
// directly on the runner, sandboxes created 10 at a time. Three loads: cold (no warm
// pool), bursts with idle time between them (the pool refills in between), and bursts
// back to back (the pool cannot keep up, so this is the CPU-bound cold path again).
func BenchmarkTimeToFirstCommand(b *testing.B) {
	b.Run("cold", func(b *testing.B) { timeToFirstCommand(b, 0, false) })
	b.Run("warm-pool-bursts-with-idle", func(b *testing.B) { timeToFirstCommand(b, 10, true) })
	b.Run("warm-pool-back-to-back", func(b *testing.B) { timeToFirstCommand(b, 10, false) })
}

func timeToFirstCommand(b *testing.B, pool int, idle bool) {
	const batch = 10
	s := newStack(b, pool)
	gw := gatewayClient(b, s)
	ctx := context.Background()
	viaGateway := func() (time.Duration, error) {
		t0 := time.Now()
		sb, err := gw.CreateSandbox(ctx, connect.NewRequest(gatewaySleeper()))
		if err != nil {
			return 0, err
		}
		// Exec waits for RUNNING on the server side, as the clients expect.
		res, err := gw.Exec(ctx, connect.NewRequest(&sandboxv1.ExecRequest{SandboxId: sb.Msg.SandboxId, Command: []string{"true"}}))
		if err != nil {
			return 0, fmt.Errorf("exec: %w", err)
		}
		if res.Msg.ExitCode != 0 {
			return 0, fmt.Errorf("exec: exit code %d", res.Msg.ExitCode)
		}
		return time.Since(t0), nil
	}
	direct := func() (time.Duration, error) {
		t0 := time.Now()
		sb, err := s.Runner.Create(ctx, runner.CreateRequest{Spec: sleeper()})
		if err != nil {
			return 0, err
		}
		c, err := s.Runner.Agent(ctx, sb.ID, "")
		if err != nil {
			return 0, err
		}
		res, err := c.Exec(ctx, connect.NewRequest(&agentv1.ExecRequest{Command: []string{"true"}}))
		if err != nil {
			return 0, fmt.Errorf("exec: %w", err)
		}
		if res.Msg.ExitCode != 0 {
			return 0, fmt.Errorf("exec: exit code %d", res.Msg.ExitCode)
		}
		return time.Since(t0), nil
	}
	// Warm the image cache.
	if _, err := direct(); err != nil {
		b.Fatal(err)
	}
	cleanup(b, s)
	if idle {
		settle(b, s, batch)
	}
	measure := func(f func() (time.Duration, error)) []time.Duration {
		var mu sync.Mutex
		var lat []time.Duration
		for done := 0; done < b.N; done += batch {
			var wg sync.WaitGroup
			for i := 0; i < min(batch, b.N-done); i++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					d, err := f()
					if err != nil {
						b.Error(err)
						return
					}
					mu.Lock()
					lat = append(lat, d)
					mu.Unlock()
				}()
			}
			wg.Wait()
			b.StopTimer()
			cleanup(b, s)
			if idle {
				settle(b, s, batch)
			}
			b.StartTimer()
		}
		return lat
	}
	b.ResetTimer()
	gwLat := measure(viaGateway)
	dLat := measure(direct)
	b.StopTimer()
	g50, g99 := percentiles(b, "gateway-first-command", gwLat)
	d50, d99 := percentiles(b, "runner-first-command", dLat)
	if b.N < 10 {
		return
	}
	load := poolName(pool)
	if pool > 0 && idle {
		load += ", bursts with idle time between"
	} else if pool > 0 {
		load += ", bursts back to back"
	}
	fmt.Printf("time to first command (%s), %d sandboxes 10 at a time: gateway p50 %.1f ms p99 %.1f ms; runner directly p50 %.1f ms p99 %.1f ms (target: gateway p50 < 120 ms); pool %+v\n",
		load, len(gwLat), g50, g99, d50, d99, s.Backend.PoolStats())
}

// BenchmarkGatewayExec: unary exec round trip through the gateway vs directly on the
// runner's agent client, in the same sandbox.
func BenchmarkGatewayExec(b *testing.B) {
	s := newStack(b, 0)
	gw := gatewayClient(b, s)
	ctx := context.Background()
	sb, err := s.Runner.Create(ctx, runner.CreateRequest{Spec: sleeper()})
	if err != nil {
		b.Fatal(err)
	}
	// The gateway only serves sandboxes it created, so create one through it.
	created, err := gw.CreateSandbox(ctx, connect.NewRequest(gatewaySleeper()))
	if err != nil {
		b.Fatal(err)
	}
	c, err := s.Runner.Agent(ctx, sb.ID, "")
	if err != nil {
		b.Fatal(err)
	}
	gwReq := &sandboxv1.ExecRequest{SandboxId: created.Msg.SandboxId, Command: []string{"true"}}
	if _, err := gw.Exec(ctx, connect.NewRequest(gwReq)); err != nil { // waits for RUNNING
		b.Fatal(err)
	}
	var gwLat, dLat []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		if _, err := gw.Exec(ctx, connect.NewRequest(gwReq)); err != nil {
			b.Fatal(err)
		}
		gwLat = append(gwLat, time.Since(t0))
		t1 := time.Now()
		if _, err := c.Exec(ctx, connect.NewRequest(&agentv1.ExecRequest{Command: []string{"true"}})); err != nil {
			b.Fatal(err)
		}
		dLat = append(dLat, time.Since(t1))
	}
	b.StopTimer()
	g50, g99 := percentiles(b, "gateway-exec", gwLat)
	d50, d99 := percentiles(b, "runner-exec", dLat)
	b.ReportMetric(g50-d50, "gateway-added-p50-ms")
	if b.N < 10 {
		return
	}
	fmt.Printf("exec round trip over %d runs: gateway p50 %.2f ms p99 %.2f ms; runner directly p50 %.2f ms p99 %.2f ms; the gateway adds %.2f ms at p50 (target < 2 ms)\n",
		len(gwLat), g50, g99, d50, d99, g50-d50)
}

// settle models bursts with idle time between them: it waits (up to 5 s) until the warm
// pool holds n ready containers again. Without a pool it returns at once.
func settle(b *testing.B, s *stack.Stack, n int) {
	b.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		st := s.Backend.PoolStats()
		if st.Claims+st.Misses == 0 || st.Ready >= n || time.Now().After(deadline) { // no pool (in use)
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// cleanup deletes every sandbox of s and waits until they are gone.
func cleanup(b *testing.B, s *stack.Stack) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, sb := range s.Runner.List() {
		_, _ = s.Runner.Delete(sb.ID, 0)
	}
	for _, sb := range s.Runner.List() {
		_, _ = s.Runner.WaitTerminal(ctx, sb.ID)
	}
}
