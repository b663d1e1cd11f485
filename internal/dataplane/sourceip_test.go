package dataplane

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"strings"
	"sync"
	"testing"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"

	"github.com/sandboxd/sandboxd/internal/apierr"
)

type testPolicy struct {
	mu  sync.Mutex
	doc string
}

func (p *testPolicy) set(doc string) { p.mu.Lock(); p.doc = doc; p.mu.Unlock() }
func (p *testPolicy) Policy(context.Context, string) ([]byte, int64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return []byte(p.doc), 1, nil
}

// TestDirectSourceIP: the runner's own policy's source-IP allowlist holds on the direct
// data path too, judged by the TCP peer (a valid certificate from a refused address is
// refused; X-Forwarded-For is never read), and follows policy changes.
func TestDirectSourceIP(t *testing.T) {
	pol := &testPolicy{doc: `{"control_plane_access": {"source_ip_allowlist": ["127.0.0.1"]}}`}
	f := newFixtureWith(t, pol)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	der, _ := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	csr, _ := x509.ParseCertificateRequest(der)
	chain, _, err := f.issuer.Issue(csr, "acme", "sb1", "main", []sandboxv1.SandboxDataPermission{permExec})
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(chain, mustPKCS8(t, key))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if out, err := exec(ctx, f.clientFrom(&cert, "127.0.0.1"), "sb1"); err != nil || out != "echo hi" {
		t.Fatalf("allowed address: %q %v", out, err)
	}
	from2 := f.clientFrom(&cert, "127.0.0.2")
	_, err = exec(ctx, from2, "sb1")
	if connect.CodeOf(err) != connect.CodePermissionDenied || apierr.Reason(err) != apierr.SourceIPNotAllowed || !strings.Contains(err.Error(), "127.0.0.2") {
		t.Fatalf("refused address: %v", err)
	}
	// A spoofed header changes nothing.
	req := connect.NewRequest(&sandboxv1.ExecRequest{SandboxId: "sb1", Command: []string{"true"}})
	req.Header().Set("X-Forwarded-For", "127.0.0.1")
	if _, err := from2.Exec(ctx, req); apierr.Reason(err) != apierr.SourceIPNotAllowed {
		t.Fatalf("X-Forwarded-For believed: %v", err)
	}
	pol.set(`{}`)
	if _, err := exec(ctx, from2, "sb1"); err != nil {
		t.Fatalf("without an allowlist: %v", err)
	}
	pol.set(`{"control_plane_access": {"source_ip_allowlist": []}}`)
	if _, err := exec(ctx, f.clientFrom(&cert, "127.0.0.1"), "sb1"); apierr.Reason(err) != apierr.SourceIPNotAllowed {
		t.Fatalf("empty allowlist: %v", err)
	}
}
