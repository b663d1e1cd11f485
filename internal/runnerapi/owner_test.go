package runnerapi

import (
	"crypto/tls"
	"crypto/x509"
	"net/url"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/pki"
)

func certWith(uris ...*url.URL) tls.ConnectionState {
	return tls.ConnectionState{PeerCertificates: []*x509.Certificate{{URIs: uris}}}
}

// TestOwnerPin: a runner's owner is the organization its certificate's runner URI SAN
// names (from registration), or the platform for an explicit platform-runner URI; it
// must name this runner, and the first verified owner is kept: a later certificate
// naming another owner, or none, is refused at the handshake. A certificate naming no
// runner belongs to nobody: refused, never taken for the platform's.
func TestOwnerPin(t *testing.T) {
	p := &ownerPin{runnerID: "r1"}
	if _, known := p.get(); known {
		t.Fatal("owner known before any handshake")
	}
	if err := p.verify(certWith(pki.RunnerURI("org-b", "r1"))); err != nil {
		t.Fatal(err)
	}
	if org, known := p.get(); !known || org != "org-b" {
		t.Fatalf("owner %q (known %v), want org-b", org, known)
	}
	if err := p.verify(certWith(pki.RunnerURI("org-b", "r1"))); err != nil {
		t.Fatalf("the same owner again: %v", err)
	}
	for name, cs := range map[string]tls.ConnectionState{
		"another organization": certWith(pki.RunnerURI("org-c", "r1")),
		"the platform's mark":  certWith(pki.PlatformRunnerURI("r1")),
	} {
		if err := p.verify(cs); err == nil || !strings.Contains(err.Error(), "earlier") {
			t.Errorf("%s after org-b: %v, want refused", name, err)
		}
		if org, _ := p.get(); org != "org-b" {
			t.Fatalf("%s: owner now %q, want org-b kept", name, org)
		}
	}
	for name, cs := range map[string]tls.ConnectionState{
		"no organization":      certWith(),
		"a gateway's URI only": certWith(GatewayURI("g")),
	} {
		if err := p.verify(cs); err == nil {
			t.Errorf("%s after org-b: accepted", name)
		}
		if org, _ := p.get(); org != "org-b" {
			t.Fatalf("%s: owner now %q, want org-b kept", name, org)
		}
	}

	for name, cs := range map[string]tls.ConnectionState{
		"another runner's":                certWith(pki.RunnerURI("org-b", "r2")),
		"another platform runner's":       certWith(pki.PlatformRunnerURI("r2")),
		"malformed":                       certWith(&url.URL{Scheme: "spiffe", Host: "sandboxd", Path: "/runner/org-b"}),
		"malformed platform mark":         certWith(&url.URL{Scheme: "spiffe", Host: "sandboxd", Path: "/platform-runner/"}),
		"two runner URIs":                 certWith(pki.RunnerURI("platform", "r1"), pki.RunnerURI("org-b", "r1")),
		"a runner URI and the platform's": certWith(pki.RunnerURI("org-b", "r1"), pki.PlatformRunnerURI("r1")),
		"no certificate":                  {},
		"empty organization":              certWith(&url.URL{Scheme: "spiffe", Host: "sandboxd", Path: "/runner//r1"}),
		// No runner URI at all (the old code took it for the platform's: a runner
		// holding the platform CA); it belongs to nobody.
		"no runner URI":        certWith(),
		"a gateway's URI only": certWith(GatewayURI("r1")),
	} {
		fresh := &ownerPin{runnerID: "r1"}
		if err := fresh.verify(cs); err == nil {
			t.Errorf("%s certificate: accepted", name)
		}
		if _, known := fresh.get(); known {
			t.Errorf("%s certificate: owner known", name)
		}
	}

	// Only the explicit mark (a runner holding the platform CA issues itself
	// PlatformRunnerURI: ServerTLSConfig) makes a platform runner.
	op := &ownerPin{runnerID: "r1"}
	if err := op.verify(certWith(pki.PlatformRunnerURI("r1"))); err != nil {
		t.Fatal(err)
	}
	if org, known := op.get(); !known || org != "" {
		t.Fatalf("operator's runner: owner %q (known %v), want the platform's", org, known)
	}
	if err := op.verify(certWith(pki.RunnerURI("org-b", "r1"))); err == nil {
		t.Error("an organization's certificate after the platform's: accepted")
	}
}

// TestServerTLSConfigMarksPlatform: the certificate a runner holding the platform CA
// serves carries the platform-runner mark, so gateways take it for the platform's.
func TestServerTLSConfigMarksPlatform(t *testing.T) {
	ca, err := pki.LoadOrCreateCA(t.TempDir(), "test")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := ServerTLSConfig(ca, "r1", []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	cert, err := cfg.GetCertificate(nil)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	org, id, platform, err := pki.RunnerOwner(leaf)
	if err != nil || !platform || org != "" || id != "r1" {
		t.Fatalf("RunnerOwner = %q, %q, %v, %v; want the platform's r1", org, id, platform, err)
	}
}
