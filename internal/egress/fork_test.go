package egress

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"
)

// TestSandboxSecretsFork: a fork's secrets keep the source's CA and placeholders, take
// the values given (by secret name) and the fork's own sandbox ID; the source's are not
// changed; a missing value and a source whose values are lost are refused.
func TestSandboxSecretsFork(t *testing.T) {
	src, err := NewSandboxSecrets("src", "org-a", []Injection{{Host: "api.example.com", Header: "Authorization", Placeholder: "sbx-secret-1", Value: "old", Secret: "prod/api"}}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	f, err := src.Fork("fork1", "org-a", map[string]string{"prod/api": "new"}, time.Now().Add(30*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if f.SandboxID != "fork1" || !bytes.Equal(f.CACertPEM(), src.CACertPEM()) || f.Injections[0].Placeholder != "sbx-secret-1" ||
		f.Injections[0].Value != "new" || src.Injections[0].Value != "old" || len(f.Hosts) != 1 {
		t.Fatalf("fork %+v, source %+v", f, src)
	}
	if leaf, err := f.leaf("api.example.com"); err != nil || leaf.Leaf == nil && len(leaf.Certificate) == 0 {
		t.Fatalf("fork leaf: %v", err)
	}
	if _, err := src.Fork("fork2", "org-a", nil, time.Now()); err == nil || !strings.Contains(err.Error(), "prod/api") {
		t.Fatalf("missing value = %v", err)
	}
	if _, err := LostSecrets("src", "org-a", src.Hosts).Fork("fork3", "org-a", map[string]string{"prod/api": "x"}, time.Now()); err == nil {
		t.Fatal("forked lost secrets")
	}
}

// TestSandboxSecretsForkOutlivesCA: a fork keeps its source's CA, whose expiry counts from
// the source's create; a fork whose lifetime would end after it is refused
// (ErrCAExpiresFirst, naming both times), never made with a CA that expires under it.
func TestSandboxSecretsForkOutlivesCA(t *testing.T) {
	src, err := NewSandboxSecrets("src", "org-a", []Injection{{Host: "api.example.com", Header: "Authorization", Placeholder: "sbx-secret-1", Value: "old", Secret: "prod/api"}}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	notAfter := src.CACert().NotAfter
	until := notAfter.Add(time.Minute)
	_, err = src.Fork("fork1", "org-a", map[string]string{"prod/api": "new"}, until)
	var ce *CAExpiresFirstError
	if !errors.Is(err, ErrCAExpiresFirst) || !errors.As(err, &ce) || !ce.NotAfter.Equal(notAfter) || !ce.Until.Equal(until) ||
		!strings.Contains(err.Error(), notAfter.UTC().Format(time.RFC3339)) || !strings.Contains(err.Error(), until.UTC().Format(time.RFC3339)) {
		t.Fatalf("fork outliving the CA = %v", err)
	}
	if _, err := src.Fork("fork2", "org-a", map[string]string{"prod/api": "new"}, notAfter); err != nil {
		t.Fatalf("fork ending with the CA = %v", err)
	}
}
