package stack

import (
	"context"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/edge"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/runtimetest"
)

type plainAuth struct{}

func (plainAuth) Authenticate(string) (auth.Principal, error) {
	return auth.Principal{}, auth.ErrInvalidKey
}

// TestKeyActivity: a session's key is active while it exists, unrevoked, in the session's
// organization.
func TestKeyActivity(t *testing.T) {
	k, err := auth.OpenKeyring(filepath.Join(t.TempDir(), "keys.json"))
	if err != nil {
		t.Fatal(err)
	}
	_, p, err := k.Create("org-a", auth.RoleUser, "")
	if err != nil {
		t.Fatal(err)
	}
	active := KeyActivity(k)
	ctx := context.Background()
	if err := active(ctx, p.KeyID, "org-a"); err != nil {
		t.Errorf("live key: %v", err)
	}
	if err := active(ctx, p.KeyID, "org-b"); err == nil {
		t.Error("key of org-a active for org-b")
	}
	if err := k.Revoke(p.KeyID); err != nil {
		t.Fatal(err)
	}
	if err := active(ctx, p.KeyID, "org-a"); err == nil {
		t.Error("revoked key still active")
	}
	if KeyActivity(plainAuth{}) != nil {
		t.Error("an authenticator that cannot tell got a KeyActive")
	}
}

// TestRoutesOfShareTokens: a running sandbox's SHARE_TOKEN ports (TokenAuth) carry its
// share token's hash to the edge, its OPEN and passthrough ports none.
func TestRoutesOfShareTokens(t *testing.T) {
	hash := edge.ShareTokenHash("t")
	sb := runner.Sandbox{ID: "abcdefghijklmn23", State: runner.StateRunning, IP: "10.88.0.2", Spec: runtime.Spec{
		ShareTokenHash: hash,
		Services: []runtime.Service{
			{Port: 8080, Endpoint: runtime.EndpointHTTPS, TokenAuth: true},
			{Port: 8081, Endpoint: runtime.EndpointHTTPS, TokenAuth: true, TimeoutSeconds: 60},
			{Port: 8082, Endpoint: runtime.EndpointHTTPS},
			{Port: 8443, Endpoint: runtime.EndpointPassthrough},
		},
	}}
	want := map[int]string{8080: hash, 8081: hash, 8082: "", 8443: ""}
	routes := routesOf(sb)
	if len(routes) != len(want) {
		t.Fatalf("routes %+v", routes)
	}
	for _, rt := range routes {
		if err := rt.Validate(); err != nil || rt.ShareTokenHash != want[rt.Port] || (rt.ShareTokenHash != "") != (rt.Auth == edge.AuthToken) {
			t.Errorf("port %d: route %+v (%v), want share token hash %q", rt.Port, rt, err, want[rt.Port])
		}
	}
}

// TestRoutesOfPaused: a paused sandbox keeps its endpoints published (a request wakes it
// through runner.Runner.Wake), an ending or ended one has none.
func TestRoutesOfPaused(t *testing.T) {
	sb := runner.Sandbox{ID: "abcdefghijklmn23", IP: "10.88.0.2", Spec: runtime.Spec{
		Services: []runtime.Service{{Port: 8080, Endpoint: runtime.EndpointHTTPS}}}}
	for st, want := range map[runner.State]int{runner.StateRunning: 1, runner.StatePaused: 1, runner.StateTerminating: 0, runner.StateCompleted: 0, runner.StateCreating: 0} {
		sb.State = st
		if got := len(routesOf(sb)); got != want {
			t.Errorf("%s: %d routes, want %d", st, got, want)
		}
	}
}

// TestLiveRoutesBeforeSync: a sandbox the runner reports RUNNING has its endpoint found
// by the edge even before syncRoutes copied it into the table (that lag answered 404 to a
// request sent as soon as a client saw RUNNING), and an unknown sandbox or port is not.
func TestLiveRoutesBeforeSync(t *testing.T) {
	be := runtimetest.NewFake()
	t.Cleanup(be.Close)
	rr, err := runner.New(context.Background(), runner.Config{Backend: be, DataDir: t.TempDir(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rr.Close)
	var table edge.Table // never synced here
	l := liveRoutes{&table, rr}
	sb, err := rr.Create(context.Background(), runner.CreateRequest{Spec: runtime.Spec{
		Container: runtime.Container{Image: "busybox"},
		Services:  []runtime.Service{{Port: 8080, Endpoint: runtime.EndpointHTTPS}},
	}, Lifetime: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, _ := rr.Get(sb.ID)
		if got.State == runner.StateRunning {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("state %v", got.State)
		}
		time.Sleep(5 * time.Millisecond)
	}
	rt, ok := l.Lookup(sb.ID, 8080)
	if !ok || rt.Kind != edge.KindHTTPS || rt.SandboxID != sb.ID || rt.Backend.Port() != 8080 {
		t.Fatalf("lookup of a running sandbox's endpoint: %+v %v", rt, ok)
	}
	if _, ok := table.Lookup(sb.ID, 8080); ok {
		t.Fatal("the table was filled: this test no longer shows the fallback")
	}
	if rt, ok := l.Lookup(sb.ID, 8081); ok {
		t.Errorf("a port with no service: %+v", rt)
	}
	if rt, ok := l.Lookup("nosuchsandbox123", 8080); ok {
		t.Errorf("an unknown sandbox: %+v", rt)
	}
	if _, err := rr.Delete(sb.ID, 0); err != nil {
		t.Fatal(err)
	}
	if rt, ok := l.Lookup(sb.ID, 8080); ok {
		t.Errorf("a sandbox being deleted: %+v", rt)
	}
}
