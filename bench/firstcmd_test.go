package bench

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1/sandboxv1connect"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/connecttest"
	"github.com/sandboxd/sandboxd/internal/gateway"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/stack"
)

// servedGateway serves a gateway over s on loopback (h2c, as `sandboxd dev`) and
// returns its URL and an API key.
func servedGateway(b *testing.B, s *stack.Stack) (url, key string) {
	b.Helper()
	keys, err := auth.OpenKeyring(filepath.Join(b.TempDir(), "keys.json"))
	if err != nil {
		b.Fatal(err)
	}
	key, _, err = keys.Create("bench", auth.RoleUser, "")
	if err != nil {
		b.Fatal(err)
	}
	cfg := gateway.Config{Auth: keys, Runners: []runner.Handle{runner.NewLocal("local", s.Runner)}}
	if os.Getenv("BENCH_NO_START_WAIT") != "" { // the figures before GetSandbox waited
		cfg.StartWait.Max = -1
	}
	g, err := gateway.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(g.Handler())
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	srv.Start()
	b.Cleanup(srv.Close)
	b.Cleanup(g.Close)
	return srv.URL, key
}

// BenchmarkFirstCommandClient: sequential create → first command's result, one sandbox
// at a time (busybox, no warm pool), as users measure it: through the official Python
// client (Sandbox.run, then exec(["true"]).result(), which polls GetSandbox until
// RUNNING), and through `sbx run` then `sbx exec`, each against the floor measured in
// the same run: CreateSandbox then the unary Exec (which waits for RUNNING on the
// server) over a Go gRPC connection. b.N runs of each; the Python part skips without
// python3 and cwsandbox (make pydeps).
func BenchmarkFirstCommandClient(b *testing.B) {
	s := newStack(b, 0)
	url, key := servedGateway(b, s)
	tr := &http.Transport{Protocols: new(http.Protocols)}
	tr.Protocols.SetUnencryptedHTTP2(true)
	gw := sandboxv1connect.NewSandboxServiceClient(&http.Client{Transport: tr}, url, connect.WithGRPC(), connect.WithInterceptors(connecttest.Bearer(key)))
	ctx := context.Background()
	image := sleeper().Image
	floor := func() time.Duration {
		t0 := time.Now()
		sb, err := gw.CreateSandbox(ctx, connect.NewRequest(gatewaySleeper()))
		if err != nil {
			b.Fatal(err)
		}
		res, err := gw.Exec(ctx, connect.NewRequest(&sandboxv1.ExecRequest{SandboxId: sb.Msg.GetSandboxId(), Command: []string{"true"}}))
		if err != nil || res.Msg.GetExitCode() != 0 {
			b.Fatalf("exec: %v", err)
		}
		took := time.Since(t0)
		if _, err := gw.DeleteSandbox(ctx, connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: sb.Msg.GetSandboxId()})); err != nil {
			b.Fatal(err)
		}
		return took
	}
	floor() // warm the image cache
	cleanup(b, s)
	var lat []time.Duration
	for range b.N {
		lat = append(lat, floor())
	}
	cleanup(b, s)
	fp50, fp99 := percentiles(b, "floor-go", lat)
	fmt.Printf("first command, floor (Go: CreateSandbox + Exec), %d runs: p50 %.1f ms, p99 %.1f ms\n", len(lat), fp50, fp99)

	environ := append(os.Environ(), "CWSANDBOX_BASE_URL="+url, "CWSANDBOX_API_KEY="+key)
	sbxFirstCommand(b, s, environ, image, fp50)
	if err := exec.Command("python3", "-c", "import cwsandbox").Run(); err != nil {
		b.Logf("official client part skipped: python3 with cwsandbox not found (make pydeps): %v", err)
		return
	}
	cmd := exec.Command("python3", "firstcmd/first_command.py", strconv.Itoa(b.N), image)
	cmd.Env = environ
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		b.Fatalf("first_command.py: %v\n%s", err, stderr.String())
	}
	lat = lat[:0]
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "ms "); ok {
			ms, err := strconv.ParseFloat(v, 64)
			if err != nil {
				b.Fatal(err)
			}
			lat = append(lat, time.Duration(ms*float64(time.Millisecond)))
		}
	}
	if len(lat) != b.N {
		b.Fatalf("first_command.py gave %d runs, want %d:\n%s", len(lat), b.N, out)
	}
	cleanup(b, s)
	p50, p99 := percentiles(b, "official-client", lat)
	fmt.Printf("first command, official Python client, %d runs: p50 %.1f ms, p99 %.1f ms (targets 100 / 150 ms); %.2fx the floor's p50\n", len(lat), p50, p99, p50/fp50)
}

// sbxFirstCommand times `sbx run IMAGE` (prints the ID once the sandbox runs) then
// `sbx exec ID -- true`, b.N times, with sbx built for the run.
func sbxFirstCommand(b *testing.B, s *stack.Stack, environ []string, image string, floorP50 float64) {
	b.Helper()
	bin := filepath.Join(b.TempDir(), "sbx")
	if out, err := exec.Command("go", "build", "-o", bin, "../cmd/sbx").CombinedOutput(); err != nil {
		b.Fatalf("build sbx: %v\n%s", err, out)
	}
	run := func(args ...string) string {
		cmd := exec.Command(bin, args...)
		cmd.Env = environ
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			b.Fatalf("sbx %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
		}
		return strings.TrimSpace(string(out))
	}
	var lat, runLat []time.Duration
	for range b.N {
		t0 := time.Now()
		id := run("run", image)
		runLat = append(runLat, time.Since(t0))
		run("exec", id, "--", "true")
		lat = append(lat, time.Since(t0))
		run("delete", id)
	}
	cleanup(b, s)
	r50, _ := percentiles(b, "sbx-run", runLat)
	p50, p99 := percentiles(b, "sbx", lat)
	fmt.Printf("first command, sbx run + sbx exec, %d runs: p50 %.1f ms (sbx run %.1f ms), p99 %.1f ms; %.2fx the floor's p50\n", len(lat), p50, r50, p99, p50/floorP50)
}
