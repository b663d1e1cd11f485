package security

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/gateway"
	"github.com/sandboxd/sandboxd/internal/pki"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runnerapi"
)

// TestUnmarkedRunnerCertificateServesNothing: a gateway took a runner certificate
// without a runner URI (any certificate of the platform CA with the runner's ID as its
// name) for a platform runner's, which serves every organization. Only the explicit
// mark counts now: a runner presenting such a certificate over real mTLS is refused at
// the handshake, receives not one request (no probe, no create), its owner stays
// unknown, and a create that only it could take is UNAVAILABLE. The same runner with the
// marked certificate a runner holding the CA issues itself (runnerapi.ServerTLSConfig)
// is the platform's (the refusal is not vacuous).
func TestUnmarkedRunnerCertificateServesNothing(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	ca, err := pki.LoadOrCreateCA(filepath.Join(t.TempDir(), "pki"), "unmarked runner test CA")
	if err != nil {
		t.Fatal(err)
	}
	keys, err := auth.OpenKeyring(filepath.Join(t.TempDir(), "keys.json"))
	if err != nil {
		t.Fatal(err)
	}
	start := func(marked bool) (*runnerapi.Client, *atomic.Int64) {
		var hits atomic.Int64
		srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			hits.Add(1)
			http.Error(w, "not a runner", http.StatusNotFound)
		}))
		if marked {
			srv.TLS, err = runnerapi.ServerTLSConfig(ca, "r1", []string{"127.0.0.1"})
			if err != nil {
				t.Fatal(err)
			}
		} else {
			cert, err := ca.IssueServer("sandboxd runner r1", []string{"r1"}, []net.IP{net.IPv4(127, 0, 0, 1)}, time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			srv.TLS = runnerapi.ServerTLSConfigFromCert(cert, ca.Pool())
		}
		srv.EnableHTTP2 = true
		srv.StartTLS()
		t.Cleanup(srv.Close)
		tc, err := runnerapi.ClientTLSConfig(ca, "gw", "r1")
		if err != nil {
			t.Fatal(err)
		}
		c, err := runnerapi.NewClient(runnerapi.ClientConfig{ID: "r1", Addr: strings.TrimPrefix(srv.URL, "https://"), TLS: tc})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		return c, &hits
	}

	c, hits := start(false)
	if _, err := c.List(ctx); err == nil || !strings.Contains(err.Error(), "names no runner") {
		t.Errorf("list on the unmarked runner: %v, want refused at the handshake", err)
	}
	gw, err := gateway.New(gateway.Config{Auth: keys, Runners: []runner.Handle{c}, PlatformOrg: "platform", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(gw.Close)
	as := auth.WithPrincipal(ctx, auth.Principal{KeyID: "k", Org: "org-a", Role: auth.RoleAdmin})
	_, err = gw.CreateSandbox(as, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: &sandboxv1.SandboxSpec{
		Containers: []*sandboxv1.Container{{Image: "python:3.11"}}}}}))
	if connect.CodeOf(err) != connect.CodeUnavailable {
		t.Errorf("create with only the unmarked runner: %v, want UNAVAILABLE", err)
	}
	if n := hits.Load(); n != 0 {
		t.Fatalf("the unmarked runner received %d requests", n)
	}
	if org, known := c.Owner(); known {
		t.Fatalf("the unmarked runner's owner is known: %q", org)
	}

	m, mhits := start(true)
	_, _ = m.List(ctx) // the handshake succeeds; the fake answers 404
	if org, known := m.Owner(); !known || org != "" {
		t.Fatalf("the marked runner: owner %q (known %v), want the platform's", org, known)
	}
	if mhits.Load() == 0 {
		t.Fatal("the marked runner received nothing: the control is vacuous")
	}
}
