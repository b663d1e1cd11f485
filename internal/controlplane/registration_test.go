package controlplane

import (
	"net/url"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/pki"
)

func TestBootstrapTokenRoundTrip(t *testing.T) {
	ca, err := pki.LoadOrCreateCA(t.TempDir(), "test CA")
	if err != nil {
		t.Fatal(err)
	}
	s, tok, err := NewBootstrapToken(ca.Certificate())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(s, tokenPrefix) || tok.CAPin != CAPin(ca.Certificate()) {
		t.Fatalf("token %q pin %q", s, tok.CAPin)
	}
	back, err := ParseBootstrapToken(" " + s + "\n")
	if err != nil || back != tok || back.Hash() != tok.Hash() {
		t.Fatalf("parse: %+v %v, want %+v", back, err, tok)
	}
	if strings.Contains(tok.Hash(), tok.Secret) || len(tok.Hash()) != 64 {
		t.Errorf("hash %q", tok.Hash())
	}
	s2, tok2, _ := NewBootstrapToken(nil)
	if tok2.CAPin != "" || tok2.Hash() == tok.Hash() || strings.Contains(s2, ".") {
		t.Errorf("second token %q", s2)
	}
	if p, err := ParseBootstrapToken(s2); err != nil || p.CAPin != "" {
		t.Errorf("unpinned: %+v %v", p, err)
	}
	for _, bad := range []string{"", "abc", tokenPrefix, tokenPrefix + "short", tokenPrefix + tok.Secret + ".zz", tokenPrefix + tok.Secret + ".abcd", "x" + s} {
		if _, err := ParseBootstrapToken(bad); err == nil {
			t.Errorf("ParseBootstrapToken(%q) accepted", bad)
		}
	}
}

func TestRunnerIdentity(t *testing.T) {
	ca, err := pki.LoadOrCreateCA(t.TempDir(), "test CA")
	if err != nil {
		t.Fatal(err)
	}
	c, err := ca.IssueClient("x", nil, 0)
	if err == nil {
		t.Fatal("issue without identity accepted")
	}
	_ = c
	u := RunnerURI("org-a", "r1")
	if u.String() != "spiffe://sandboxd/runner/org-a/r1" {
		t.Fatalf("uri %s", u)
	}
	cert, err := ca.IssueClient("runner", []*urlT{u}, 3600e9)
	if err != nil {
		t.Fatal(err)
	}
	org, id, ok := RunnerIdentity(cert.Leaf)
	if !ok || org != "org-a" || id != "r1" {
		t.Errorf("identity %q %q %v", org, id, ok)
	}
	gw, _ := ca.IssueClient("gw", []*urlT{{Scheme: "spiffe", Host: "sandboxd", Path: "/gateway/g"}}, 3600e9)
	if _, _, ok := RunnerIdentity(gw.Leaf); ok {
		t.Error("gateway certificate taken for a runner's")
	}
}

type urlT = url.URL
