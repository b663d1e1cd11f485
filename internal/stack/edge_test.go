package stack

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/edge"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
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
