package e2e

import (
	"context"
	"net/http"
	"net/http/httptest"
	"path/filepath"
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
	"github.com/sandboxd/sandboxd/internal/store"
)

// indexStore opens a SQLite store with organization org-a and returns it with a keyring
// holding one user key of org-a.
func indexStore(t *testing.T) (store.Store, *auth.Keyring, string) {
	t.Helper()
	st, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "sandboxd.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	if _, err := st.Orgs().Create(context.Background(), store.Org{ID: "org-a"}); err != nil {
		t.Fatal(err)
	}
	keys, err := auth.OpenKeyring(filepath.Join(t.TempDir(), "keys.json"))
	if err != nil {
		t.Fatal(err)
	}
	key, _, err := keys.Create("org-a", auth.RoleUser, "")
	if err != nil {
		t.Fatal(err)
	}
	return st, keys, key
}

// TestGatewayIndexSurvivesRestart: a gateway that restarts on the same store still serves
// every sandbox it created, deduplicates their request IDs, and lists ended ones.
func TestGatewayIndexSurvivesRestart(t *testing.T) {
	s := startedStack(t)
	ctx := context.Background()
	st, keys, key := indexStore(t)
	local := runner.NewLocal("local", s.Runner)
	serve := func() sandboxv1connect.SandboxServiceClient {
		g, err := gateway.New(gateway.Config{Auth: keys, Runners: []runner.Handle{local}, Index: st.Sandboxes(), Orgs: st.Orgs()})
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(g.Handler())
		t.Cleanup(srv.Close)
		return sandboxv1connect.NewSandboxServiceClient(http.DefaultClient, srv.URL, connect.WithInterceptors(connecttest.Bearer(key)))
	}
	first := serve()
	live, err := first.CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: sleeperSpec()}, RequestId: "keep-1"}))
	if err != nil {
		t.Fatal(err)
	}
	done, err := first.CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: spec(busybox(), "true")}}))
	if err != nil {
		t.Fatal(err)
	}
	g1 := &gw{sandboxes: first}
	g1.waitState(t, done.Msg.SandboxId, sandboxv1.State_STATE_COMPLETED)
	g1.waitState(t, live.Msg.SandboxId, sandboxv1.State_STATE_RUNNING)

	second := serve() // a new gateway process on the same store
	g2 := &gw{sandboxes: second}
	g2.waitState(t, live.Msg.SandboxId, sandboxv1.State_STATE_RUNNING)
	res, err := second.Exec(ctx, connect.NewRequest(&sandboxv1.ExecRequest{SandboxId: live.Msg.SandboxId, Command: []string{"echo", "still here"}}))
	if err != nil || string(res.Msg.Stdout) != "still here\n" {
		t.Errorf("exec after the gateway restarted: %q %v", res.Msg.GetStdout(), err)
	}
	again, err := second.CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: sleeperSpec()}, RequestId: "keep-1"}))
	if err != nil || again.Msg.SandboxId != live.Msg.SandboxId {
		t.Errorf("request_id after restart created %v (%v), want %s", again.Msg.GetSandboxId(), err, live.Msg.SandboxId)
	}
	list, err := second.ListSandboxes(ctx, connect.NewRequest(&sandboxv1.ListSandboxesRequest{ShowTerminated: true}))
	if err != nil || len(list.Msg.Sandboxes) != 2 {
		t.Fatalf("list after restart: %d sandboxes, %v", len(list.Msg.GetSandboxes()), err)
	}
	got := g2.waitState(t, done.Msg.SandboxId, sandboxv1.State_STATE_COMPLETED)
	if got.GetStatus().ExitCode == nil || got.GetStatus().GetExitCode() != 0 {
		t.Errorf("ended sandbox after restart: exit code %v", got.GetStatus().ExitCode)
	}
}

// TestGatewayReplicasShareTheStore: two gateways on one store serve the same sandboxes:
// one creates, the other gets, execs, lists, deduplicates the request ID and deletes.
func TestGatewayReplicasShareTheStore(t *testing.T) {
	s := startedStack(t)
	ctx := context.Background()
	st, keys, key := indexStore(t)
	local := runner.NewLocal("local", s.Runner)
	replica := func() sandboxv1connect.SandboxServiceClient {
		g, err := gateway.New(gateway.Config{Auth: keys, Runners: []runner.Handle{local}, Index: st.Sandboxes(), Orgs: st.Orgs()})
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(g.Handler())
		t.Cleanup(srv.Close)
		return sandboxv1connect.NewSandboxServiceClient(http.DefaultClient, srv.URL, connect.WithInterceptors(connecttest.Bearer(key)))
	}
	a, b := replica(), replica() // both up before anything is created
	created, err := a.CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: sleeperSpec()}, RequestId: "shared-1"}))
	if err != nil {
		t.Fatal(err)
	}
	id := created.Msg.SandboxId
	gb := &gw{sandboxes: b}
	gb.waitState(t, id, sandboxv1.State_STATE_RUNNING)
	res, err := b.Exec(ctx, connect.NewRequest(&sandboxv1.ExecRequest{SandboxId: id, Command: []string{"echo", "via b"}}))
	if err != nil || string(res.Msg.Stdout) != "via b\n" {
		t.Errorf("exec through the other replica: %q %v", res.Msg.GetStdout(), err)
	}
	again, err := b.CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: sleeperSpec()}, RequestId: "shared-1"}))
	if err != nil || again.Msg.SandboxId != id {
		t.Errorf("request_id on the other replica created %v (%v), want %s", again.Msg.GetSandboxId(), err, id)
	}
	list, err := b.ListSandboxes(ctx, connect.NewRequest(&sandboxv1.ListSandboxesRequest{}))
	if err != nil || len(list.Msg.Sandboxes) != 1 || list.Msg.Sandboxes[0].SandboxId != id {
		t.Errorf("list on the other replica: %v %v", list.Msg.GetSandboxes(), err)
	}
	if _, err := b.DeleteSandbox(ctx, connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: id})); err != nil {
		t.Fatal(err)
	}
	(&gw{sandboxes: a}).waitState(t, id, sandboxv1.State_STATE_TERMINATED)
}

// TestGatewayMarksLostSandboxes: when a runner comes back without a sandbox the gateway
// still believes running (its state was wiped), the sandbox is reported FAILED with reason
// Lost instead of RUNNING forever.
func TestGatewayMarksLostSandboxes(t *testing.T) {
	dir := t.TempDir()
	first := newStack(t, dir)
	ctx := context.Background()
	st, keys, key := indexStore(t)
	serve := func(s *stack.Stack) sandboxv1connect.SandboxServiceClient {
		g, err := gateway.New(gateway.Config{Auth: keys, Runners: []runner.Handle{runner.NewLocal("local", s.Runner)}, Index: st.Sandboxes(), Orgs: st.Orgs()})
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(g.Handler())
		t.Cleanup(srv.Close)
		return sandboxv1connect.NewSandboxServiceClient(http.DefaultClient, srv.URL, connect.WithInterceptors(connecttest.Bearer(key)))
	}
	c1 := serve(first)
	created, err := c1.CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: sleeperSpec()}}))
	if err != nil {
		t.Fatal(err)
	}
	id := created.Msg.SandboxId
	(&gw{sandboxes: c1}).waitState(t, id, sandboxv1.State_STATE_RUNNING)
	// The runner goes away, and its sandbox with it, behind the gateway's back.
	first.Close()
	if err := first.Backend.Destroy(ctx, id); err != nil {
		t.Fatal(err)
	}
	second := newStack(t, dir)
	t.Cleanup(func() { finish(t, second, dir) })
	got, err := serve(second).GetSandbox(ctx, connect.NewRequest(&sandboxv1.GetSandboxRequest{SandboxId: id}))
	if err != nil {
		t.Fatal(err)
	}
	if st := got.Msg.GetStatus(); st.GetState() != sandboxv1.State_STATE_FAILED || !strings.HasPrefix(st.GetStateReason(), gateway.ReasonLost) {
		t.Errorf("lost sandbox reported %s (%s), want FAILED/%s", st.GetState(), st.GetStateReason(), gateway.ReasonLost)
	}
}

// TestGatewayReconcilesOrphans: a live sandbox no gateway recorded (here: created on the
// runner directly) is deleted once older than the grace period; the gateway's own are kept.
func TestGatewayReconcilesOrphans(t *testing.T) {
	s := startedStack(t)
	ctx := context.Background()
	st, keys, key := indexStore(t)
	local := runner.NewLocal("local", s.Runner)
	newGateway := func(grace time.Duration) *gateway.Server {
		g, err := gateway.New(gateway.Config{Auth: keys, Runners: []runner.Handle{local}, Index: st.Sandboxes(), Orgs: st.Orgs(), OrphanGrace: grace})
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	patient, eager := newGateway(time.Hour), newGateway(time.Millisecond)
	srv := httptest.NewServer(eager.Handler())
	t.Cleanup(srv.Close)
	client := sandboxv1connect.NewSandboxServiceClient(http.DefaultClient, srv.URL, connect.WithInterceptors(connecttest.Bearer(key)))
	known, err := client.CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: sleeperSpec()}}))
	if err != nil {
		t.Fatal(err)
	}
	orphan := create(t, s, runner.CreateRequest{Spec: sleeper(busybox())})
	waitState(t, s, orphan.ID, runner.StateRunning, 30*time.Second)
	if n := patient.Reconcile(ctx); n != 0 {
		t.Errorf("reconcile within the grace period deleted %d sandboxes", n)
	}
	if n := eager.Reconcile(ctx); n != 1 {
		t.Errorf("reconcile deleted %d sandboxes, want the orphan", n)
	}
	ctx2, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if end, err := s.Runner.WaitTerminal(ctx2, orphan.ID); err != nil || end.State != runner.StateTerminated {
		t.Errorf("orphan ended %v (%v), want TERMINATED", end.State, err)
	}
	if sb, err := s.Runner.Get(known.Msg.SandboxId); err != nil || sb.State.Terminal() {
		t.Errorf("the gateway's own sandbox was touched: %v %v", sb.State, err)
	}
}
