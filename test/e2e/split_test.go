package e2e

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1/sandboxv1connect"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/connecttest"
	"github.com/sandboxd/sandboxd/internal/gateway"
	"github.com/sandboxd/sandboxd/internal/pki"
	"github.com/sandboxd/sandboxd/internal/relay"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runnerapi"
	"github.com/sandboxd/sandboxd/internal/runtime/local/network"
	"github.com/sandboxd/sandboxd/internal/testenv"
	"github.com/sandboxd/sandboxd/internal/testenv/logbuf"
)

// startSplitGateway is startGateway with the runner behind runnerapi: the gateway reaches
// it over gRPC with mTLS on loopback, as it would on another host.
func startSplitGateway(t *testing.T) *gw {
	t.Helper()
	s := startedStack(t)
	ca, err := pki.LoadOrCreateCA(t.TempDir(), "split test CA")
	if err != nil {
		t.Fatal(err)
	}
	serverTLS, err := runnerapi.ServerTLSConfig(ca, "r1", []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rsrv := runnerapi.NewServer("r1", s.Runner, nil).HTTPServer(serverTLS)
	go func() { _ = rsrv.ServeTLS(ln, "", "") }()
	t.Cleanup(func() { _ = rsrv.Close() })
	clientTLS, err := runnerapi.ClientTLSConfig(ca, "gw-test", "r1")
	if err != nil {
		t.Fatal(err)
	}
	rc, err := runnerapi.NewClient(runnerapi.ClientConfig{ID: "r1", Addr: ln.Addr().String(), TLS: clientTLS})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rc.Close)

	keys, err := auth.OpenKeyring(filepath.Join(t.TempDir(), "keys.json"))
	if err != nil {
		t.Fatal(err)
	}
	keyA, _, _ := keys.Create("org-a", auth.RoleUser, "")
	keyB, _, _ := keys.Create("org-b", auth.RoleUser, "")
	g, err := gateway.New(gateway.Config{Auth: keys, Runners: []runner.Handle{rc}})
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: g.Handler(), Protocols: new(http.Protocols)}
	srv.Protocols.SetHTTP1(true)
	srv.Protocols.SetUnencryptedHTTP2(true)
	gln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(gln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return gwClients("http://"+gln.Addr().String(), keyA, keyB)
}

// gwClients are gRPC clients (h2c) of the gateway at url for organizations a and b.
func gwClients(url, keyA, keyB string) *gw {
	hc := &http.Client{Transport: &http.Transport{Protocols: func() *http.Protocols {
		p := new(http.Protocols)
		p.SetUnencryptedHTTP2(true)
		return p
	}()}}
	client := func(key string) sandboxv1connect.SandboxServiceClient {
		opts := []connect.ClientOption{connect.WithGRPC(), connect.WithReadMaxBytes(relay.MaxMessageBytes), connect.WithSendMaxBytes(relay.MaxMessageBytes)}
		if key != "" {
			opts = append(opts, connect.WithInterceptors(connecttest.Bearer(key)))
		}
		return sandboxv1connect.NewSandboxServiceClient(hc, url, opts...)
	}
	return &gw{
		url: url, keyA: keyA, keyB: keyB,
		sandboxes:       client(keyA),
		other:           client(keyB),
		unauthenticated: client(""),
		discovery:       sandboxv1connect.NewDiscoveryServiceClient(hc, url, connect.WithGRPC(), connect.WithInterceptors(connecttest.Bearer(keyA))),
	}
}

// TestSplitGateway runs the gateway's flows through runnerapi.Client and Server.
func TestSplitGateway(t *testing.T) {
	g := startSplitGateway(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	sp := spec(busybox(), "/bin/sh", "-c", `echo one; echo two; trap "exit 0" TERM; sleep infinity & wait`)
	sp.Containers[0].Resources = &sandboxv1.Resources{Cpu: "500m", Memory: "256Mi"}
	sp.MaxLifetimeSeconds = 120
	sb := g.create(t, sp, "req-1")
	if sb.GetStatus().GetState() != sandboxv1.State_STATE_CREATING || sb.GetStatus().GetRunnerId() != "r1" {
		t.Errorf("created %s", sb.GetStatus())
	}
	if again := g.create(t, sp, "req-1"); again.SandboxId != sb.SandboxId {
		t.Errorf("same request_id created %s and %s", sb.SandboxId, again.SandboxId)
	}

	// Exec waits for RUNNING through the runner's relay.
	ex, err := g.sandboxes.Exec(ctx, connect.NewRequest(&sandboxv1.ExecRequest{SandboxId: sb.SandboxId, Command: []string{"sh", "-c", "echo out; echo err >&2; exit 3"}}))
	if err != nil || string(ex.Msg.Stdout) != "out\n" || string(ex.Msg.Stderr) != "err\n" || ex.Msg.ExitCode != 3 {
		t.Fatalf("exec: %v %v", ex, err)
	}
	running := g.waitState(t, sb.SandboxId, sandboxv1.State_STATE_RUNNING).GetStatus()
	if running.GetStartTime() == nil || running.GetEffectiveMaxLifetimeSeconds() != 120 || running.ExitCode != nil || running.GetEffectiveResources().GetMemory() != "256Mi" {
		t.Errorf("running status %v", running)
	}

	// StreamExec: stdin, then half-close is EOF.
	stream := g.sandboxes.StreamExec(ctx)
	send := func(m *sandboxv1.ExecStreamRequest) {
		if err := stream.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	send(&sandboxv1.ExecStreamRequest{Message: &sandboxv1.ExecStreamRequest_Init{Init: &sandboxv1.ExecStreamInit{SandboxId: sb.SandboxId, Command: []string{"sh", "-c", "cat; echo done"}}}})
	send(&sandboxv1.ExecStreamRequest{Message: &sandboxv1.ExecStreamRequest_Stdin{Stdin: []byte("piped\n")}})
	var out bytes.Buffer
	first, err := stream.Receive()
	if err != nil || first.GetReady() == nil {
		t.Fatalf("first message %v %v, want ready", first, err)
	}
	// The echo of stdin arrives while the stream is still open: no whole-output buffering.
	for out.Len() < len("piped\n") {
		m, err := stream.Receive()
		if err != nil {
			t.Fatalf("receive: %v", err)
		}
		out.Write(m.GetOutput().GetData())
	}
	if err := stream.CloseRequest(); err != nil {
		t.Fatal(err)
	}
	exitCode := int32(-1)
	for {
		m, err := stream.Receive()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("receive: %v", err)
		}
		out.Write(m.GetOutput().GetData())
		if m.GetExit() != nil {
			exitCode = m.GetExit().GetExitCode()
		}
	}
	if exitCode != 0 || out.String() != "piped\ndone\n" {
		t.Errorf("stream exec: exit %d, output %q", exitCode, out.String())
	}

	// Logs.
	logs, err := g.sandboxes.StreamLogs(ctx, connect.NewRequest(&sandboxv1.StreamLogsRequest{SandboxId: sb.SandboxId}))
	if err != nil {
		t.Fatal(err)
	}
	var all bytes.Buffer
	for logs.Receive() {
		all.Write(logs.Msg().GetData())
	}
	if logs.Err() != nil || all.String() != "one\ntwo\n" {
		t.Errorf("logs %q %v", all.String(), logs.Err())
	}

	// Files, with the reasons the client maps.
	data := bytes.Repeat([]byte("0123456789abcdef"), 1<<16)
	if _, err := g.sandboxes.WriteFile(ctx, connect.NewRequest(&sandboxv1.WriteFileRequest{SandboxId: sb.SandboxId, Path: "/tmp/a/b.bin", Content: data})); err != nil {
		t.Fatal(err)
	}
	read, err := g.sandboxes.ReadFile(ctx, connect.NewRequest(&sandboxv1.ReadFileRequest{SandboxId: sb.SandboxId, Path: "/tmp/a/b.bin"}))
	if err != nil || !bytes.Equal(read.Msg.Content, data) {
		t.Fatalf("read back: %d bytes, %v", len(read.Msg.GetContent()), err)
	}
	_, err = g.sandboxes.ReadFile(ctx, connect.NewRequest(&sandboxv1.ReadFileRequest{SandboxId: sb.SandboxId, Path: "/no/such"}))
	if info := apierr.Info(err); info.GetReason() != apierr.FileNotFound || info.GetMetadata()["filepath"] != "/no/such" || connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("missing file: %v", err)
	}

	// Another organization sees nothing.
	if _, err := g.other.Exec(ctx, connect.NewRequest(&sandboxv1.ExecRequest{SandboxId: sb.SandboxId, Command: []string{"true"}})); connect.CodeOf(err) != connect.CodeNotFound || apierr.Reason(err) != apierr.SandboxNotFound {
		t.Errorf("exec in another organization's sandbox: %v", err)
	}
	if _, err := g.other.GetSandbox(ctx, connect.NewRequest(&sandboxv1.GetSandboxRequest{SandboxId: sb.SandboxId})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("get another organization's sandbox: %v", err)
	}

	// The runner's validation names the request's fields.
	bad := spec(busybox(), "true")
	bad.Containers[0].WorkingDir = "relative"
	bad.Containers[0].Files = []*sandboxv1.FileMount{{Path: "/etc/../x", Content: []byte("x")}}
	_, err = g.sandboxes.CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: bad}}))
	fields := map[string]bool{}
	for _, v := range apierr.Violations(err) {
		fields[v.Field] = true
	}
	if connect.CodeOf(err) != connect.CodeInvalidArgument || apierr.Reason(err) != apierr.InvalidRequest ||
		!fields["sandbox.spec.containers[0].working_dir"] || !fields["sandbox.spec.containers[0].files[0].path"] {
		t.Errorf("invalid spec: %v, violations %v", err, apierr.Violations(err))
	}

	// Discovery asks the runner for its capacity.
	runners, err := g.discovery.ListAvailableRunners(ctx, connect.NewRequest(&sandboxv1.ListAvailableRunnersRequest{View: sandboxv1.RunnerView_RUNNER_VIEW_FULL}))
	if err != nil || len(runners.Msg.Runners) != 1 || runners.Msg.Runners[0].RunnerId != "r1" || runners.Msg.Runners[0].GetResources().GetAvailableMemoryBytes() <= 0 {
		t.Errorf("runners: %v %v", runners, err)
	}

	// Delete, then TERMINATED, and ops fail with NOT_RUNNING.
	del, err := g.sandboxes.DeleteSandbox(ctx, connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: sb.SandboxId, GracePeriodSeconds: 5}))
	if err != nil || del.Msg.GetSandbox().GetStatus().GetState() != sandboxv1.State_STATE_TERMINATING {
		t.Fatalf("delete: %v %v", del, err)
	}
	g.waitState(t, sb.SandboxId, sandboxv1.State_STATE_TERMINATED)
	_, err = g.sandboxes.Exec(ctx, connect.NewRequest(&sandboxv1.ExecRequest{SandboxId: sb.SandboxId, Command: []string{"true"}}))
	if connect.CodeOf(err) != connect.CodeFailedPrecondition || apierr.Reason(err) != apierr.SandboxNotRunning {
		t.Errorf("exec in a terminated sandbox: %v, want CWSANDBOX_SANDBOX_NOT_RUNNING", err)
	}
	if _, err := g.sandboxes.DeleteSandbox(ctx, connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: "nosuchsandbox"})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("delete missing: %v, want NOT_FOUND", err)
	}

	// A main command that exits 0 completes with its exit code present.
	done := g.create(t, spec(busybox(), "true"), "")
	st := g.waitState(t, done.SandboxId, sandboxv1.State_STATE_COMPLETED).GetStatus()
	if st.ExitCode == nil || st.GetExitCode() != 0 {
		t.Errorf("completed: exit code %v", st.ExitCode)
	}
}

// TestSplitProcesses runs `sandboxd runner` and `sandboxd gateway` as two processes that
// share only a PKI directory, and uses the gateway with a plain gRPC client.
func TestSplitProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("builds sandboxd")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "sandboxd")
	build := exec.Command("go", "build", "-o", bin, "github.com/sandboxd/sandboxd/cmd/sandboxd")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	pkiDir := filepath.Join(dir, "pki")
	runnerDir := filepath.Join(dir, "runner")
	gatewayDir := filepath.Join(dir, "gateway")
	const bridge = "sbxsplit"
	subnet := netip.MustParsePrefix("10.93.0.0/16")
	t.Cleanup(func() {
		nw, err := network.New(network.Config{Bridge: bridge, Subnet: subnet, StateDir: filepath.Join(runnerDir, "network"), Table: "sandboxd_" + bridge, Nameservers: []string{}})
		if err == nil {
			err = nw.Cleanup()
		}
		if err != nil {
			t.Errorf("network cleanup: %v", err)
		}
	})

	runnerAddr, runnerMetrics := freeAddr(t), freeAddr(t)
	startProcess(t, bin, "runner r1 listening on", []string{"SANDBOXD_AGENT=" + env.AgentBin},
		"runner", "--data-dir", runnerDir, "--pki-dir", pkiDir, "--listen", runnerAddr, "--runner-id", "r1",
		"--insecure-registry", env.Registry, "--metrics-listen", runnerMetrics,
		"--bridge", bridge, "--subnet", subnet.String(), "--cgroup-parent", "sandboxd-split", "--no-egress")
	gatewayAddr, gatewayMetrics := freeAddr(t), freeAddr(t)
	startProcess(t, bin, "CWSANDBOX_BASE_URL=", nil,
		"gateway", "--data-dir", gatewayDir, "--pki-dir", pkiDir, "--listen", gatewayAddr, "--runner", "r1="+runnerAddr,
		"--metrics-listen", gatewayMetrics)
	cpMetrics := freeAddr(t)
	startProcess(t, bin, "control plane listening on", nil,
		"controlplane", "--data-dir", filepath.Join(dir, "controlplane"), "--listen", freeAddr(t), "--metrics-listen", cpMetrics, "--no-rollout")

	// /livez and /readyz on every process's metrics listener, and on the gateway's API port.
	for _, base := range []string{"http://" + gatewayAddr, "http://" + gatewayMetrics, "http://" + runnerMetrics, "http://" + cpMetrics} {
		for _, path := range []string{"/livez", "/readyz"} {
			res, err := http.Get(base + path)
			if err != nil {
				t.Fatalf("%s%s: %v", base, path, err)
			}
			b, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if res.StatusCode != http.StatusOK || string(b) != "ok\n" {
				t.Errorf("%s%s: %d %q", base, path, res.StatusCode, b)
			}
		}
	}
	key, err := os.ReadFile(filepath.Join(gatewayDir, "admin-api-key"))
	if err != nil {
		t.Fatal(err)
	}
	g := gwClients("http://"+gatewayAddr, strings.TrimSpace(string(key)), "")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sb := g.create(t, sleeperSpec(), "")
	ex, err := g.sandboxes.Exec(ctx, connect.NewRequest(&sandboxv1.ExecRequest{SandboxId: sb.SandboxId, Command: []string{"sh", "-c", "echo 2 + 2 = $((2+2))"}}))
	if err != nil || string(ex.Msg.Stdout) != "2 + 2 = 4\n" {
		t.Fatalf("exec: %v %v", ex, err)
	}
	if got := g.waitState(t, sb.SandboxId, sandboxv1.State_STATE_RUNNING).GetStatus().GetRunnerId(); got != "r1" {
		t.Errorf("runner %q", got)
	}
	if _, err := g.sandboxes.DeleteSandbox(ctx, connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: sb.SandboxId})); err != nil {
		t.Fatal(err)
	}
	g.waitState(t, sb.SandboxId, sandboxv1.State_STATE_TERMINATED)
}

func freeAddr(t *testing.T) string {
	t.Helper()
	a, err := testenv.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// startProcess starts bin with args and waits until its stdout prints a line starting
// with ready; t.Cleanup stops it with SIGTERM.
func startProcess(t *testing.T, bin, ready string, extraEnv []string, args ...string) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), extraEnv...)
	stderr := new(logbuf.Buffer)
	cmd.Stderr = stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("%s stderr:\n%s", args[0], stderr.String())
		}
	})
	readyCh := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stdout)
		seen := false
		for sc.Scan() { // reads to the end so the process never blocks on its stdout
			if !seen && strings.HasPrefix(sc.Text(), ready) {
				seen = true
				close(readyCh)
			}
		}
	}()
	select {
	case <-readyCh:
	case <-exited:
		t.Fatalf("%s exited early:\n%s", args[0], stderr.String())
	case <-time.After(60 * time.Second):
		t.Fatalf("%s did not print %q in time:\n%s", args[0], ready, stderr.String())
	}
}
