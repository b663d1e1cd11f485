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
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/gateway"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/stack"
)

// BenchmarkPlacementThroughput: creates per second through one gateway spreading over
// three runners (three single-host stacks on this machine), 10 creates in flight; the
// clock stops when every sandbox is RUNNING.
func BenchmarkPlacementThroughput(b *testing.B) {
	ctx := context.Background()
	var runners []runner.Handle
	var stacks []*stack.Stack
	for n := 1; n <= 3; n++ {
		cfg := env.StackConfigN(b.TempDir(), n)
		s, err := stack.NewLocal(ctx, cfg)
		if err != nil {
			b.Fatal(err)
		}
		ownStack(b, s, cfg.CgroupParent)
		stacks = append(stacks, s)
		runners = append(runners, runner.NewLocal(fmt.Sprintf("r%d", n), s.Runner))
	}
	keys, err := auth.OpenKeyring(filepath.Join(b.TempDir(), "keys.json"))
	if err != nil {
		b.Fatal(err)
	}
	key, _, _ := keys.Create("bench", auth.RoleUser, "")
	g, err := gateway.New(gateway.Config{Auth: keys, Runners: runners})
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
	gw := sandboxv1connect.NewSandboxServiceClient(&http.Client{Transport: &http.Transport{Protocols: protos}}, srv.URL, connect.WithGRPC(),
		connect.WithInterceptors(connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
			return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
				req.Header().Set("Authorization", "Bearer "+key)
				return next(ctx, req)
			}
		})))
	// Warm each runner's image cache.
	for _, s := range stacks {
		warm(b, s)
	}

	perRunner := map[string]int{}
	var mu sync.Mutex
	sem := make(chan struct{}, 10)
	var wg sync.WaitGroup
	b.ResetTimer()
	t0 := time.Now()
	for i := 0; i < b.N; i++ {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			sb, err := gw.CreateSandbox(ctx, connect.NewRequest(gatewaySleeper()))
			if err != nil {
				b.Error(err)
				return
			}
			// Exec waits for RUNNING, so a returned exec means the sandbox runs.
			if _, err := gw.Exec(ctx, connect.NewRequest(&sandboxv1.ExecRequest{SandboxId: sb.Msg.SandboxId, Command: []string{"true"}})); err != nil {
				b.Error(err)
				return
			}
			mu.Lock()
			perRunner[sb.Msg.GetStatus().GetRunnerId()]++
			mu.Unlock()
		}()
	}
	wg.Wait()
	elapsed := time.Since(t0)
	b.StopTimer()
	rate := float64(b.N) / elapsed.Seconds()
	b.ReportMetric(rate, "creates/s")
	if b.N < 10 {
		return
	}
	fmt.Printf("placement throughput: %d sandboxes through the gateway to 3 runners, 10 in flight: %.1f creates/s (each running and answering an exec); per runner %v\n",
		b.N, rate, perRunner)
}

// warm pulls the test image into s's cache with one throwaway sandbox.
func warm(b *testing.B, s *stack.Stack) {
	b.Helper()
	ctx := context.Background()
	sb, err := s.Runner.Create(ctx, runner.CreateRequest{Spec: sleeper()})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := s.Runner.Agent(ctx, sb.ID, ""); err != nil {
		b.Fatal(err)
	}
	cleanup(b, s)
}
