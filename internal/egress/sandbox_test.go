package egress

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestBuild: one placeholder per rule (by its variable), the values in the injections,
// a CA of the sandbox's own; a rule without its value is ErrNoValue.
func TestBuild(t *testing.T) {
	rules := []Rule{{Host: "a.test", Header: "Authorization", Secret: "s/a", EnvVar: "A"}, {Host: "b.test", Header: "X-Key", Secret: "s/b", EnvVar: "B"}}
	ss, ph, err := Build("sb-1", "org", rules, map[string]string{"s/a": "va", "s/b": "vb"})
	if err != nil {
		t.Fatal(err)
	}
	if len(ph) != 2 || ph["A"] == ph["B"] || !strings.HasPrefix(ph["A"], "sbx-secret-") {
		t.Fatalf("placeholders %v", ph)
	}
	if len(ss.Injections) != 2 || ss.Injections[0].Value != "va" || ss.Injections[0].Placeholder != ph["A"] || ss.Injections[1].Header != "X-Key" || ss.Injections[1].Host != "b.test" {
		t.Fatalf("injections %+v", ss.Injections)
	}
	blk, _ := pem.Decode(ss.CACertPEM())
	if blk == nil {
		t.Fatal("no CA certificate")
	}
	cert, err := x509.ParseCertificate(blk.Bytes)
	if err != nil || !cert.IsCA || cert.NotAfter.Sub(cert.NotBefore) < CATTL-1e9*3600 {
		t.Fatalf("CA %v: IsCA %v, %v..%v", err, cert != nil && cert.IsCA, cert.NotBefore, cert.NotAfter)
	}
	ss2, ph2, err := Build("sb-2", "org", rules[:1], map[string]string{"s/a": "va"})
	if err != nil || ph2["A"] == ph["A"] || bytes.Equal(ss2.CACertPEM(), ss.CACertPEM()) {
		t.Fatalf("a second sandbox shares a placeholder or the CA: %v", err)
	}
	if _, _, err := Build("sb-3", "org", rules, map[string]string{"s/a": "va"}); !errors.Is(err, ErrNoValue) {
		t.Fatalf("missing value: %v", err)
	}
}

// TestContainerEnv: placeholders and the trust variables are added; a trust variable the
// secret env or the container's own environment sets wins; env itself is not changed.
func TestContainerEnv(t *testing.T) {
	env := map[string]string{"CURL_CA_BUNDLE": "/mine.pem"}
	out := ContainerEnv(env, func(k string) bool { return k == "SSL_CERT_FILE" }, map[string]string{"API": "sbx-secret-x"})
	if out["API"] != "sbx-secret-x" || out["CURL_CA_BUNDLE"] != "/mine.pem" || out["REQUESTS_CA_BUNDLE"] != CAMount+"/bundle.pem" || out["NODE_EXTRA_CA_CERTS"] != CAMount+"/ca.pem" {
		t.Fatalf("env %v", out)
	}
	if _, ok := out["SSL_CERT_FILE"]; ok {
		t.Fatalf("SSL_CERT_FILE overrides the container's own: %v", out)
	}
	if len(env) != 1 {
		t.Fatalf("env changed: %v", env)
	}
	if out := ContainerEnv(nil, nil, nil); out["SSL_CERT_FILE"] != CAMount+"/bundle.pem" {
		t.Fatalf("nil env: %v", out)
	}
}

// TestReadRoots: a named file is read (missing: an error), bounded; "" tries the
// defaults.
func TestReadRoots(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "r.pem")
	if err := os.WriteFile(f, []byte("ROOTS"), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, err := ReadRoots(f); err != nil || string(b) != "ROOTS" {
		t.Fatalf("ReadRoots: %q %v", b, err)
	}
	if _, err := ReadRoots(filepath.Join(dir, "none")); err == nil {
		t.Fatal("a missing named file: no error")
	}
	big := filepath.Join(dir, "big.pem")
	if err := os.WriteFile(big, make([]byte, MaxRootsBytes+1), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadRoots(big); err == nil {
		t.Fatal("an oversize bundle: no error")
	}
	old := DefaultRootsFiles
	t.Cleanup(func() { DefaultRootsFiles = old })
	DefaultRootsFiles = []string{filepath.Join(dir, "none"), f}
	if b, err := ReadRoots(""); err != nil || string(b) != "ROOTS" {
		t.Fatalf("defaults: %q %v", b, err)
	}
	DefaultRootsFiles = []string{filepath.Join(dir, "none")}
	if b, err := ReadRoots(""); err != nil || b != nil {
		t.Fatalf("no default: %q %v", b, err)
	}
}

// TestReadUpstreamRoots: "" is nil (the system roots); a PEM file is its pool; a missing
// file or one with no PEM certificate is refused naming the flag and the file (a
// Kubernetes runner's chart mounts egress.upstreamCA there: the runner's log says it).
func TestReadUpstreamRoots(t *testing.T) {
	if pool, err := ReadUpstreamRoots(""); pool != nil || err != nil {
		t.Fatalf(`"": %v %v, want nil, nil`, pool, err)
	}
	dir := t.TempDir()
	good := filepath.Join(dir, "ca.pem")
	ss, _, err := Build("sb-1", "org", []Rule{{Host: "a.test", Header: "Authorization", Secret: "s", EnvVar: "A"}}, map[string]string{"s": "v"})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(good, ss.CACertPEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	if pool, err := ReadUpstreamRoots(good); err != nil || pool == nil || !pool.Equal(certPool(t, ss.CACertPEM())) {
		t.Fatalf("a PEM file: %v %v", pool, err)
	}
	bad := filepath.Join(dir, "upstream-ca.pem")
	if err := os.WriteFile(bad, []byte("not a certificate\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for f, want := range map[string]string{
		bad:                        "egress upstream CA (--egress-upstream-ca) " + bad + " holds no PEM certificate",
		filepath.Join(dir, "none"): "egress upstream CA (--egress-upstream-ca): open " + filepath.Join(dir, "none"),
	} {
		if pool, err := ReadUpstreamRoots(f); pool != nil || err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v %v, want the error %q", f, pool, err, want)
		}
	}
}

func certPool(t *testing.T, pemData []byte) *x509.CertPool {
	t.Helper()
	p := x509.NewCertPool()
	if !p.AppendCertsFromPEM(pemData) {
		t.Fatal("no PEM certificate")
	}
	return p
}

// TestBundle: roots, a newline when they lack one, then the CA.
func TestBundle(t *testing.T) {
	for _, c := range []struct{ roots, ca, want string }{
		{"R", "C\n", "R\nC\n"}, {"R\n", "C\n", "R\nC\n"}, {"", "C\n", "C\n"},
	} {
		if got := string(Bundle([]byte(c.roots), []byte(c.ca))); got != c.want {
			t.Errorf("Bundle(%q, %q) = %q, want %q", c.roots, c.ca, got, c.want)
		}
	}
}
