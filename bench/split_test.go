package bench

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1/sandboxv1connect"
	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/gateway"
	"github.com/sandboxd/sandboxd/internal/pki"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runnerapi"
	"github.com/sandboxd/sandboxd/internal/stack"
)

// serveGateway serves a gateway over rn on loopback (h2c) and returns a client of it with
// a running sandbox's ID.
func serveGateway(b *testing.B, rn runner.Handle) (sandboxv1connect.SandboxServiceClient, string) {
	b.Helper()
	keys, err := auth.OpenKeyring(filepath.Join(b.TempDir(), "keys.json"))
	if err != nil {
		b.Fatal(err)
	}
	key, _, err := keys.Create("bench", auth.RoleUser, "")
	if err != nil {
		b.Fatal(err)
	}
	g, err := gateway.New(gateway.Config{Auth: keys, Runners: []runner.Handle{rn}})
	if err != nil {
		b.Fatal(err)
	}
	srv := &http.Server{Handler: g.Handler(), Protocols: new(http.Protocols)}
	srv.Protocols.SetUnencryptedHTTP2(true)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	b.Cleanup(func() { _ = srv.Close() })
	p := new(http.Protocols)
	p.SetUnencryptedHTTP2(true)
	hc := &http.Client{Transport: &http.Transport{Protocols: p}}
	c := sandboxv1connect.NewSandboxServiceClient(hc, "http://"+ln.Addr().String(), connect.WithGRPC(), connect.WithInterceptors(connect.UnaryInterceptorFunc(
		func(next connect.UnaryFunc) connect.UnaryFunc {
			return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
				req.Header().Set("Authorization", "Bearer "+key)
				return next(ctx, req)
			}
		})))
	sp := sleeper()
	res, err := c.CreateSandbox(context.Background(), connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: &sandboxv1.SandboxSpec{
		Containers: []*sandboxv1.Container{{Image: sp.Image, Command: sp.Command, Args: sp.Args}},
	}}}))
	if err != nil {
		b.Fatal(err)
	}
	return c, res.Msg.GetSandboxId()
}

// BenchmarkSplitExec: one exec of /bin/true through the gateway, with the runner in the
// same process (runner.Local) and behind runnerapi over mTLS on loopback, interleaved in
// the same run; and directly on the agent for reference.
func BenchmarkSplitExec(b *testing.B) {
	s := newStack(b, 0)
	ctx := context.Background()

	remote := remoteRunner(b, s)

	localGW, localID := serveGateway(b, runner.NewLocal("local", s.Runner))
	splitGW, splitID := serveGateway(b, remote)
	direct, err := s.Runner.Agent(ctx, localID, "")
	if err != nil {
		b.Fatal(err)
	}
	exec := func(c sandboxv1connect.SandboxServiceClient, id string) time.Duration {
		t0 := time.Now()
		res, err := c.Exec(ctx, connect.NewRequest(&sandboxv1.ExecRequest{SandboxId: id, Command: []string{"/bin/true"}}))
		if err != nil || res.Msg.ExitCode != 0 {
			b.Fatalf("exec: %v", err)
		}
		return time.Since(t0)
	}
	// Warm up connections and both sandboxes (the first exec waits for RUNNING).
	for range 3 {
		exec(localGW, localID)
		exec(splitGW, splitID)
	}
	var localLat, splitLat, directLat []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		localLat = append(localLat, exec(localGW, localID))
		splitLat = append(splitLat, exec(splitGW, splitID))
		t0 := time.Now()
		if _, err := direct.Exec(ctx, connect.NewRequest(&agentv1.ExecRequest{Command: []string{"/bin/true"}})); err != nil {
			b.Fatal(err)
		}
		directLat = append(directLat, time.Since(t0))
	}
	b.StopTimer()
	d50, d99 := percentiles(b, "agent-direct", directLat)
	l50, l99 := percentiles(b, "gateway-local", localLat)
	s50, s99 := percentiles(b, "gateway-mtls", splitLat)
	b.ReportMetric(s50-l50, "mtls-added-p50-ms")
	if b.N < 10 {
		return
	}
	fmt.Printf("exec of /bin/true over %d runs (ms):\n", len(splitLat))
	fmt.Printf("  %-40s p50 %6.2f  p99 %6.2f\n", "agent, directly on the runner", d50, d99)
	fmt.Printf("  %-40s p50 %6.2f  p99 %6.2f\n", "gateway → in-process runner", l50, l99)
	fmt.Printf("  %-40s p50 %6.2f  p99 %6.2f\n", "gateway → runner over mTLS (runnerapi)", s50, s99)
	fmt.Printf("  the network hop adds %.2f ms at p50, %.2f ms at p99; gateway over mTLS adds %.2f ms to a direct exec at p50 (target < 2 ms)\n",
		s50-l50, s99-l99, s50-d50)
}

// remoteRunner serves s's runner behind runnerapi over mTLS on loopback (runner ID r1)
// and returns a client of it, as a gateway reaches a runner of its own process's
// machine; both are closed at the benchmark's end.
func remoteRunner(b *testing.B, s *stack.Stack) *runnerapi.Client {
	b.Helper()
	ca, err := pki.LoadOrCreateCA(b.TempDir(), "bench CA")
	if err != nil {
		b.Fatal(err)
	}
	serverTLS, err := runnerapi.ServerTLSConfig(ca, "r1", []string{"127.0.0.1"})
	if err != nil {
		b.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	rsrv := runnerapi.NewServer("r1", s.Runner, nil).HTTPServer(serverTLS)
	go func() { _ = rsrv.ServeTLS(ln, "", "") }()
	b.Cleanup(func() { _ = rsrv.Close() })
	clientTLS, err := runnerapi.ClientTLSConfig(ca, "bench", "r1")
	if err != nil {
		b.Fatal(err)
	}
	remote, err := runnerapi.NewClient(runnerapi.ClientConfig{ID: "r1", Addr: ln.Addr().String(), TLS: clientTLS})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(remote.Close)
	return remote
}
