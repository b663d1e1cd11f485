package edge

import (
	"crypto/x509"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/pki"
)

func TestWildcardCertificateCoversEndpointNames(t *testing.T) {
	ca, err := pki.LoadOrCreateCA(t.TempDir(), "platform CA")
	if err != nil {
		t.Fatal(err)
	}
	get, err := WildcardCertificate(ca, "R1", "edge.test", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	c, err := get(nil)
	if err != nil {
		t.Fatal(err)
	}
	if again, _ := get(nil); again != c {
		t.Error("a fresh certificate was issued again before half its life")
	}
	opts := x509.VerifyOptions{Roots: ca.Pool(), DNSName: Host(8080, sbxA, "r1", "edge.test")}
	if _, err := c.Leaf.Verify(opts); err != nil {
		t.Errorf("endpoint name: %v", err)
	}
	opts.DNSName = "x.8080-" + sbxA + ".r1.edge.test"
	if _, err := c.Leaf.Verify(opts); err == nil {
		t.Error("the certificate covers names deeper than one label")
	}
	if _, err := WildcardCertificate(nil, "r1", "edge.test", 0); err == nil {
		t.Error("no error without a CA")
	}
}
