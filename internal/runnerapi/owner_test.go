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
// names (from registration; none: the platform's), it must name this runner, and the
// first verified owner is kept: a later certificate naming another organization, or
// none (a tenant's runner claiming to be the platform's), is refused at the handshake.
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
		"no organization":      certWith(),
		"a gateway's URI only": certWith(GatewayURI("g")),
	} {
		if err := p.verify(cs); err == nil || !strings.Contains(err.Error(), "earlier") {
			t.Errorf("%s after org-b: %v, want refused", name, err)
		}
		if org, _ := p.get(); org != "org-b" {
			t.Fatalf("%s: owner now %q, want org-b kept", name, org)
		}
	}

	for name, cs := range map[string]tls.ConnectionState{
		"another runner's":   certWith(pki.RunnerURI("org-b", "r2")),
		"malformed":          certWith(&url.URL{Scheme: "spiffe", Host: "sandboxd", Path: "/runner/org-b"}),
		"two runner URIs":    certWith(pki.RunnerURI("platform", "r1"), pki.RunnerURI("org-b", "r1")),
		"no certificate":     {},
		"empty organization": certWith(&url.URL{Scheme: "spiffe", Host: "sandboxd", Path: "/runner//r1"}),
	} {
		fresh := &ownerPin{runnerID: "r1"}
		if err := fresh.verify(cs); err == nil {
			t.Errorf("%s certificate: accepted", name)
		}
		if _, known := fresh.get(); known {
			t.Errorf("%s certificate: owner known", name)
		}
	}

	// A certificate without a runner URI (issued by the platform CA to a runner that holds
	// it: the operator's) is the platform's.
	op := &ownerPin{runnerID: "r1"}
	if err := op.verify(certWith()); err != nil {
		t.Fatal(err)
	}
	if org, known := op.get(); !known || org != "" {
		t.Fatalf("operator's runner: owner %q (known %v), want the platform's", org, known)
	}
}
