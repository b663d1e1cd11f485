package enroll

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"strings"
	"testing"

	"connectrpc.com/connect"

	controlplanev1 "github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1/controlplanev1connect"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/controlplane"
	"github.com/sandboxd/sandboxd/internal/edge"
	"github.com/sandboxd/sandboxd/internal/pki"
)

// TestEdgeCredentials: a registered runner gets its edge's wildcard certificate from the
// control plane, for its own name under the platform's domain only, and has the control
// plane check TOKEN keys; neither works without the runner's certificate.
func TestEdgeCredentials(t *testing.T) {
	c := startCP(t)
	ctx := t.Context()
	c.createRunner(t, "r1", map[string]any{})
	id, _, err := LoadOrRegister(ctx, t.TempDir(), c.addr, c.token(t, "r1", 0), nil)
	if err != nil {
		t.Fatal(err)
	}

	get, err := EdgeCertificate(ctx, id, controlplane.DefaultEndpointDomain)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := get(&tls.ClientHelloInfo{ServerName: "8080-abc.r1." + controlplane.DefaultEndpointDomain})
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(c.ca.Certificate())
	if _, err := cert.Leaf.Verify(x509.VerifyOptions{Roots: roots, DNSName: "8080-abcdefghijklmnop.r1." + controlplane.DefaultEndpointDomain}); err != nil {
		t.Errorf("edge certificate: %v (names %v)", err, cert.Leaf.DNSNames)
	}
	if _, err := cert.Leaf.Verify(x509.VerifyOptions{Roots: roots, DNSName: "8080-abcdefghijklmnop.r2." + controlplane.DefaultEndpointDomain}); err == nil {
		t.Error("the edge certificate of r1 is valid for r2's names")
	}
	if _, err := EdgeCertificate(ctx, id, "example.com"); err == nil || !strings.Contains(err.Error(), "base_domain") {
		t.Errorf("another domain: %v", err)
	}

	verify := KeyVerifier(id)
	if err := verify(ctx, c.userKey, "org-a"); err != nil {
		t.Errorf("the user's key: %v", err)
	}
	if err := verify(ctx, c.userKey, "org-b"); err == nil || errors.Is(err, edge.ErrUnauthenticated) {
		t.Errorf("the user's key for another organization's sandbox: %v, want forbidden", err)
	}
	if err := verify(ctx, "sbx_0000000000000000_nope", "org-a"); !errors.Is(err, edge.ErrUnauthenticated) {
		t.Errorf("no key: %v, want unauthenticated", err)
	}
	// A login session's key, by ID: active for its organization until revoked.
	active := KeyActivity(id)
	keyID := strings.Split(c.userKey, "_")[1]
	if err := active(ctx, keyID, "org-a"); err != nil {
		t.Errorf("the user's key by ID: %v", err)
	}
	if err := active(ctx, keyID, "org-b"); !errors.Is(err, edge.ErrUnauthenticated) {
		t.Errorf("the user's key for another organization: %v, want unauthenticated", err)
	}
	if err := active(ctx, "0000000000000000", "org-a"); !errors.Is(err, edge.ErrUnauthenticated) {
		t.Errorf("an unknown key ID: %v, want unauthenticated", err)
	}
	if _, err := c.st.APIKeys().Revoke(ctx, "org-a", keyID); err != nil {
		t.Fatal(err)
	}
	if err := active(ctx, keyID, "org-a"); !errors.Is(err, edge.ErrUnauthenticated) {
		t.Errorf("a revoked key by ID: %v, want unauthenticated", err)
	}
	// Without the runner's certificate, neither call is served.
	hc := httpClient(pki.ClientTLSConfig(nil, id.CAs, "127.0.0.1"))
	anon := controlplanev1connect.NewRunnerRegistrationServiceClient(hc, "https://"+c.addr)
	_, err = anon.VerifyApiKey(context.Background(), connect.NewRequest(&controlplanev1.VerifyApiKeyRequest{ApiKey: c.userKey}))
	wantCode(t, "VerifyApiKey without a client certificate", err, connect.CodeUnauthenticated, apierr.Unauthenticated)
	_, err = anon.IssueEdgeCertificate(context.Background(), connect.NewRequest(&controlplanev1.IssueEdgeCertificateRequest{BaseDomain: controlplane.DefaultEndpointDomain}))
	wantCode(t, "IssueEdgeCertificate without a client certificate", err, connect.CodeUnauthenticated, apierr.Unauthenticated)
	_, err = anon.ApiKeyActive(context.Background(), connect.NewRequest(&controlplanev1.ApiKeyActiveRequest{KeyId: keyID, OrganizationId: "org-a"}))
	wantCode(t, "ApiKeyActive without a client certificate", err, connect.CodeUnauthenticated, apierr.Unauthenticated)
}
