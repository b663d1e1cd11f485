package e2e

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	controlplanev1 "github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1/controlplanev1connect"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/connecttest"
	"github.com/sandboxd/sandboxd/internal/controlplane"
	"github.com/sandboxd/sandboxd/internal/enroll"
	"github.com/sandboxd/sandboxd/internal/gateway"
	"github.com/sandboxd/sandboxd/internal/pki"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runnerapi"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/store"
)

// staticPolicies is a gateway policy view that lags behind the control plane: the
// runner's own check is what stops a create then.
type staticPolicies struct{}

func (staticPolicies) Policy(context.Context, string) ([]byte, int64, error) {
	return []byte(`{}`), 1, nil
}

// TestRegistrationControlPlane runs a registered runner behind runnerapi with a separate
// control plane (TLS on loopback): registration with a bootstrap token, heartbeats that
// carry policy changes to the runner, the runner's own check of creates, and the control
// plane stopped and restarted while sandboxes run.
func TestRegistrationControlPlane(t *testing.T) {
	s := startedStack(t)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	dir := t.TempDir()

	// Control plane: store, CA, admin key, one TLS listener.
	st, err := store.Open(ctx, filepath.Join(dir, "sandboxd.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	ca, err := pki.LoadOrCreateCA(filepath.Join(dir, "pki"), "e2e platform CA")
	if err != nil {
		t.Fatal(err)
	}
	if err := controlplane.EnsureOrg(ctx, st, "org-a"); err != nil {
		t.Fatal(err)
	}
	adminKey, err := controlplane.EnsureAdminKey(ctx, st, "org-a")
	if err != nil {
		t.Fatal(err)
	}
	userKey, _, err := auth.IssueKey(ctx, st, "org-a", auth.RoleUser, "user")
	if err != nil {
		t.Fatal(err)
	}
	authn := auth.NewStoreAuthenticator(st, nil)
	t.Cleanup(authn.Wait)
	var (
		cpAddr = "127.0.0.1:0"
		cpSrv  *http.Server
	)
	startCP := func() {
		svc, err := controlplane.New(controlplane.Config{Store: st, Auth: authn, PlatformOrg: "org-a", CA: ca, HeartbeatInterval: 200 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := controlplane.TLSConfig(ca, []string{"127.0.0.1"})
		if err != nil {
			t.Fatal(err)
		}
		var ln net.Listener
		for range 50 {
			if ln, err = net.Listen("tcp", cpAddr); err == nil {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err != nil {
			t.Fatal(err)
		}
		cpAddr = ln.Addr().String()
		cpSrv = &http.Server{Handler: svc.TLSHandler(), TLSConfig: cfg}
		srv := cpSrv
		go func() { _ = srv.ServeTLS(ln, "", "") }()
		t.Cleanup(func() { _ = srv.Close() })
	}
	startCP()
	adminHC := &http.Client{Transport: &http.Transport{TLSClientConfig: pki.ClientTLSConfig(nil, ca.Pool(), "127.0.0.1"), ForceAttemptHTTP2: true}}
	admin := controlplanev1connect.NewRunnerManagementServiceClient(adminHC, "https://"+cpAddr, connect.WithInterceptors(connecttest.Bearer(adminKey)))
	getR1 := func() *controlplanev1.ManagedRunner {
		r, err := admin.GetManagedRunner(ctx, connect.NewRequest(&controlplanev1.GetManagedRunnerRequest{RunnerId: "r1"}))
		if err != nil {
			t.Fatal(err)
		}
		return r.Msg
	}
	setPolicy := func(doc map[string]any) error {
		_, err := admin.UpdateManagedRunner(ctx, connect.NewRequest(&controlplanev1.UpdateManagedRunnerRequest{
			ManagedRunner: &controlplanev1.ManagedRunner{RunnerId: "r1", Policy: mustStructE2E(t, doc)},
			UpdateMask:    &fieldmaskpb.FieldMask{Paths: []string{"policy"}}}))
		return err
	}
	if _, err := admin.CreateManagedRunner(ctx, connect.NewRequest(newRunner("r1", "c-r1", mustStructE2E(t, map[string]any{})))); err != nil {
		t.Fatal(err)
	}
	tok, err := admin.CreateBootstrapToken(ctx, connect.NewRequest(&controlplanev1.CreateBootstrapTokenRequest{RunnerId: "r1"}))
	if err != nil {
		t.Fatal(err)
	}

	// Runner: registers once, serves runnerapi with its own certificate, heartbeats.
	runnerDir := t.TempDir()
	id, registered, err := enroll.LoadOrRegister(ctx, runnerDir, cpAddr, tok.Msg.GetBootstrapToken(), nil)
	if err != nil || !registered {
		t.Fatalf("register: %v", err)
	}
	if _, err := enroll.Register(ctx, t.TempDir(), cpAddr, tok.Msg.GetBootstrapToken(), nil); apierr.Reason(err) != apierr.BootstrapTokenInvalid {
		t.Fatalf("token reuse: %v", err)
	}
	cache, err := enroll.OpenPolicyCache(runnerDir)
	if err != nil {
		t.Fatal(err)
	}
	local := runner.NewLocal("r1", s.Runner)
	hb, err := enroll.NewHeartbeater(enroll.HeartbeatConfig{Identity: id, Cache: cache, Interval: 200 * time.Millisecond, MaxBackoff: 400 * time.Millisecond,
		Status: func(ctx context.Context) (*enroll.Status, error) {
			c, err := local.Capacity(ctx)
			if err != nil {
				return nil, err
			}
			return &enroll.Status{Version: "e2e", Ready: true, Capacity: &controlplanev1.RunnerResources{MilliCpu: c.MilliCPU, MemoryBytes: c.MemoryBytes},
				Usage: &controlplanev1.RunnerResources{MilliCpu: c.UsedMilliCPU, MemoryBytes: c.UsedMemoryBytes, Sandboxes: int64(c.Running)}}, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	hbCtx, stopHB := context.WithCancel(ctx)
	defer stopHB()
	go hb.Run(hbCtx)
	rln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rsrv := runnerapi.NewServer("r1", s.Runner, nil).WithPolicy("r1", cache).HTTPServer(runnerapi.ServerTLSConfigFromCert(id.Cert, id.CAs))
	go func() { _ = rsrv.ServeTLS(rln, "", "") }()
	t.Cleanup(func() { _ = rsrv.Close() })

	// Gateway: reaches the runner over mTLS; its policy view lags (always {}).
	clientTLS, err := runnerapi.ClientTLSConfig(ca, "gw-e2e", "r1")
	if err != nil {
		t.Fatal(err)
	}
	rc, err := runnerapi.NewClient(runnerapi.ClientConfig{ID: "r1", Addr: rln.Addr().String(), TLS: clientTLS})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rc.Close)
	gwSrv, err := gateway.New(gateway.Config{Auth: authn, Runners: []runner.Handle{rc}, Policies: staticPolicies{}})
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: gwSrv.Handler(), Protocols: new(http.Protocols)}
	hs.Protocols.SetHTTP1(true)
	hs.Protocols.SetUnencryptedHTTP2(true)
	gln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = hs.Serve(gln) }()
	t.Cleanup(func() { _ = hs.Close() })
	g := gwClients("http://"+gln.Addr().String(), userKey, "")

	// Heartbeats: CONNECTED, and the policy reached the runner.
	waitUntil(t, "r1 CONNECTED", func() bool {
		return getR1().GetStatus().GetConnection() == controlplanev1.ConnectionStatus_CONNECTED && cache.Revision() == 1
	})

	// A sandbox under the permissive policy.
	sp := sleeperSpec()
	sp.MaxLifetimeSeconds = 300
	sb := g.create(t, sp, "")
	g.waitState(t, sb.SandboxId, sandboxv1.State_STATE_RUNNING)
	if got, _ := s.Runner.Get(sb.SandboxId); got.Spec.Meta[runtime.MetaPolicyRevision] != "1" {
		t.Errorf("policy revision recorded %v", got.Spec.Meta)
	}

	// Tighten it through the admin API: the next heartbeat brings it to the runner, whose
	// check refuses what the (lagging) gateway let through, with the same violations.
	if err := setPolicy(map[string]any{"constraints": map[string]any{"lifetime": map[string]any{"max_seconds": 120}}}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "policy revision 2 at the runner", func() bool { return cache.Revision() == 2 })
	_, err = g.sandboxes.CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: sp}}))
	wantCode(t, "create beyond the runner's new policy", err, connect.CodeInvalidArgument, apierr.PlacementRejected)
	if vs := apierr.Violations(err); len(vs) != 1 || vs[0].Field != "sandbox.spec.max_lifetime_seconds" || !strings.Contains(err.Error(), "runner r1") {
		t.Fatalf("violations %v (%v)", vs, err)
	}

	// Control plane stopped.
	_ = cpSrv.Close()
	adminHC.CloseIdleConnections()
	time.Sleep(time.Second)
	// Running sandboxes keep running and exec works through the gateway.
	ex, err := g.sandboxes.Exec(ctx, connect.NewRequest(&sandboxv1.ExecRequest{SandboxId: sb.SandboxId, Command: []string{"echo", "still here"}}))
	if err != nil || string(ex.Msg.GetStdout()) != "still here\n" {
		t.Fatalf("exec with the control plane down: %v %v", ex, err)
	}
	// New sandboxes still place, under the last-known policy.
	ok := sleeperSpec()
	ok.MaxLifetimeSeconds = 60
	sb2 := g.create(t, ok, "")
	g.waitState(t, sb2.SandboxId, sandboxv1.State_STATE_RUNNING)
	if got, _ := s.Runner.Get(sb2.SandboxId); got.Spec.Meta[runtime.MetaPolicyRevision] != "2" {
		t.Errorf("policy revision recorded %v", got.Spec.Meta)
	}
	_, err = g.sandboxes.CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: sp}}))
	wantCode(t, "create beyond the last-known policy", err, connect.CodeInvalidArgument, apierr.PlacementRejected)
	// A runner restarting now still has that policy (from its data dir).
	if reopened, err := enroll.OpenPolicyCache(runnerDir); err != nil || reopened.Revision() != 2 {
		t.Fatalf("policy cache on disk: %v", err)
	}
	// Admin writes fail clearly.
	err = setPolicy(map[string]any{})
	wantCode(t, "admin write with the control plane down", err, connect.CodeUnavailable, "")

	// Restarted: nothing lost, the runner reconnects by itself.
	startCP()
	waitUntil(t, "r1 CONNECTED after the restart", func() bool {
		r, err := admin.GetManagedRunner(ctx, connect.NewRequest(&controlplanev1.GetManagedRunnerRequest{RunnerId: "r1"}))
		return err == nil && r.Msg.GetStatus().GetConnection() == controlplanev1.ConnectionStatus_CONNECTED &&
			time.Since(r.Msg.GetStatus().GetLastHeartbeatTime().AsTime()) < 300*time.Millisecond
	})
	if r := getR1(); r.GetPolicyRevision() != 2 {
		t.Errorf("after the restart: policy revision %d", r.GetPolicyRevision())
	}
	for _, id := range []string{sb.SandboxId, sb2.SandboxId} {
		g.waitState(t, id, sandboxv1.State_STATE_RUNNING)
		if _, err := g.sandboxes.DeleteSandbox(ctx, connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: id})); err != nil {
			t.Errorf("delete %s: %v", id, err)
		}
	}
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
