package pki

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

const serverName = "runner.sandboxd.internal"

func testCA(t *testing.T, name string) *CA {
	t.Helper()
	ca, err := LoadOrCreateCA(t.TempDir(), name)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func mustURL(t *testing.T, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// at runs f with the package clock set to time.Now()+d.
func at(d time.Duration, f func()) {
	old := now
	now = func() time.Time { return time.Now().Add(d) }
	defer func() { now = old }()
	f()
}

func mode(t *testing.T, p string) os.FileMode {
	t.Helper()
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode().Perm()
}

func TestLoadOrCreateCA(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	ca, err := LoadOrCreateCA(dir, "sandboxd dev CA")
	if err != nil {
		t.Fatal(err)
	}
	c := ca.Certificate()
	switch {
	case !c.IsCA || !c.BasicConstraintsValid || c.MaxPathLen != 1:
		t.Fatalf("basic constraints: ca %v valid %v maxpath %d", c.IsCA, c.BasicConstraintsValid, c.MaxPathLen)
	case c.KeyUsage != x509.KeyUsageCertSign|x509.KeyUsageCRLSign:
		t.Fatalf("key usage %v", c.KeyUsage)
	case len(c.SubjectKeyId) == 0:
		t.Fatal("no SubjectKeyId")
	case c.Subject.CommonName != "sandboxd dev CA":
		t.Fatalf("CN %q", c.Subject.CommonName)
	case c.NotAfter.Sub(c.NotBefore) < CAValidity:
		t.Fatalf("validity %v", c.NotAfter.Sub(c.NotBefore))
	case c.PublicKeyAlgorithm != x509.ECDSA || c.PublicKey.(*ecdsa.PublicKey).Curve != elliptic.P256():
		t.Fatalf("key %v", c.PublicKeyAlgorithm)
	}
	if m := mode(t, filepath.Join(dir, "ca-key.pem")); m != 0o600 {
		t.Fatalf("ca-key.pem mode %o", m)
	}
	if m := mode(t, dir); m != 0o700 {
		t.Fatalf("dir mode %o", m)
	}
	onDisk, _ := os.ReadFile(filepath.Join(dir, "ca.pem"))
	if !bytes.Equal(onDisk, ca.CertPEM()) {
		t.Fatal("ca.pem differs from CertPEM")
	}

	// Reloaded identically (the name of an existing CA is not changed), also concurrently.
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			again, err := LoadOrCreateCA(dir, "other name")
			if err != nil {
				t.Error(err)
				return
			}
			if !bytes.Equal(again.CertPEM(), ca.CertPEM()) || !again.key.Equal(ca.key) {
				t.Error("reloaded CA differs")
			}
		})
	}
	wg.Wait()

	// A certificate issued before the reload verifies against the reloaded pool.
	leaf, err := ca.IssueServer("s", []string{serverName}, nil, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	again, _ := LoadOrCreateCA(dir, "x")
	if _, err := leaf.Leaf.Verify(x509.VerifyOptions{Roots: again.Pool(), DNSName: serverName}); err != nil {
		t.Fatal(err)
	}
}

func TestLoadOrCreateCABadState(t *testing.T) {
	other := testCA(t, "other")
	otherKey, _ := encodeKey(other.key)
	cases := []struct {
		name    string
		files   map[string][]byte // written before LoadOrCreateCA
		wantErr string            // "" = success
	}{
		{"empty dir creates", nil, ""},
		{"stray key without cert is replaced", map[string][]byte{"ca-key.pem": otherKey}, ""},
		{"cert without key", map[string][]byte{"ca.pem": other.CertPEM()}, "does not"},
		{"garbage cert", map[string][]byte{"ca.pem": []byte("nope"), "ca-key.pem": otherKey}, "no PEM certificate"},
		{"key does not match", map[string][]byte{"ca.pem": testCA(t, "third").CertPEM(), "ca-key.pem": otherKey}, "does not match"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for n, b := range tc.files {
				if err := os.WriteFile(filepath.Join(dir, n), b, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			ca, err := LoadOrCreateCA(dir, "ca")
			if tc.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				if ca.key.Equal(other.key) {
					t.Fatal("stray key reused")
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("err = %v, want %q", err, tc.wantErr)
			}
		})
	}
}

func TestIssueAndVerify(t *testing.T) {
	ca, other := testCA(t, "ca"), testCA(t, "other")
	runner := mustURL(t, "spiffe://sandboxd/runner/r-1")
	srv, err := ca.IssueServer("runner r-1", []string{serverName}, []net.IP{net.ParseIP("127.0.0.1")}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cli, err := ca.IssueClient("runner r-1", []*url.URL{runner}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if u := cli.Leaf.URIs; len(u) != 1 || u[0].String() != runner.String() {
		t.Fatalf("URIs %v", u)
	}
	if !bytes.Equal(srv.Leaf.AuthorityKeyId, ca.Certificate().SubjectKeyId) {
		t.Fatal("AuthorityKeyId does not name the CA")
	}
	cases := []struct {
		name  string
		leaf  *x509.Certificate
		roots *x509.CertPool
		opts  x509.VerifyOptions
		ok    bool
	}{
		{"server by name", srv.Leaf, ca.Pool(), x509.VerifyOptions{DNSName: serverName}, true},
		{"server by IP", srv.Leaf, ca.Pool(), x509.VerifyOptions{DNSName: "127.0.0.1"}, true},
		{"server wrong name", srv.Leaf, ca.Pool(), x509.VerifyOptions{DNSName: "evil.example"}, false},
		{"server other CA", srv.Leaf, other.Pool(), x509.VerifyOptions{DNSName: serverName}, false},
		{"server cert as client", srv.Leaf, ca.Pool(), x509.VerifyOptions{KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}, false},
		{"client", cli.Leaf, ca.Pool(), x509.VerifyOptions{KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}, true},
		{"client cert as server", cli.Leaf, ca.Pool(), x509.VerifyOptions{}, false},
		{"client other CA", cli.Leaf, other.Pool(), x509.VerifyOptions{KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.opts.Roots = tc.roots
			_, err := tc.leaf.Verify(tc.opts)
			if (err == nil) != tc.ok {
				t.Fatalf("verify: %v, want ok=%v", err, tc.ok)
			}
		})
	}
}

func TestIssueErrors(t *testing.T) {
	ca := testCA(t, "ca")
	u := mustURL(t, "spiffe://sandboxd/runner/r")
	cases := []struct {
		name string
		fn   func() error
	}{
		{"zero ttl", func() error { _, err := ca.IssueServer("s", []string{"a"}, nil, 0); return err }},
		{"negative ttl", func() error { _, err := ca.IssueClient("c", []*url.URL{u}, -time.Hour); return err }},
		{"server without SANs", func() error { _, err := ca.IssueServer("s", nil, nil, time.Hour); return err }},
		{"client nil URI", func() error { _, err := ca.IssueClient("c", []*url.URL{nil}, time.Hour); return err }},
		{"client relative URI", func() error { _, err := ca.IssueClient("c", []*url.URL{{Path: "runner/x"}}, time.Hour); return err }},
		{"expired CA", func() (err error) {
			at(CAValidity+time.Hour, func() { _, err = ca.IssueServer("s", []string{"a"}, nil, time.Hour) })
			return err
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.fn(); err == nil {
				t.Fatal("no error")
			} else {
				t.Log(err)
			}
		})
	}
	// A lifetime past the CA's end is capped.
	c, err := ca.IssueServer("s", []string{"a"}, nil, 20*CAValidity)
	if err != nil || c.Leaf.NotAfter.After(ca.Certificate().NotAfter) {
		t.Fatalf("cap: %v %v", err, c.Leaf)
	}
}

// handshake runs one TLS handshake over loopback and a one-message exchange, and
// returns the server's view of the connection.
func handshake(t *testing.T, srvCfg, cliCfg *tls.Config) (state tls.ConnectionState, srvErr, cliErr error) {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", srvCfg)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		c, err := ln.Accept()
		if err != nil {
			srvErr = err
			return
		}
		defer c.Close()
		tc := c.(*tls.Conn)
		_ = tc.SetDeadline(time.Now().Add(5 * time.Second))
		if srvErr = tc.Handshake(); srvErr == nil {
			state = tc.ConnectionState()
			_, srvErr = tc.Write([]byte("ok"))
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	d := tls.Dialer{Config: cliCfg}
	c, err := d.DialContext(ctx, "tcp", ln.Addr().String())
	if err != nil {
		cliErr = err
	} else {
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		buf := make([]byte, 2)
		// TLS 1.3: a rejected client certificate shows up on the first read.
		if _, cliErr = io.ReadFull(c, buf); cliErr == nil && string(buf) != "ok" {
			cliErr = io.ErrUnexpectedEOF
		}
		c.Close()
	}
	<-done
	return state, srvErr, cliErr
}

func TestMTLSHandshake(t *testing.T) {
	ca, other := testCA(t, "ca"), testCA(t, "other")
	runner := mustURL(t, "spiffe://sandboxd/runner/r-1")
	issueS := func(ca *CA, ttl time.Duration) tls.Certificate {
		c, err := ca.IssueServer("gw", []string{serverName}, []net.IP{net.IPv4(127, 0, 0, 1)}, ttl)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	issueC := func(ca *CA) tls.Certificate {
		c, err := ca.IssueClient("runner", []*url.URL{runner}, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	var expiredS, expiredC tls.Certificate
	at(-48*time.Hour, func() { expiredS, expiredC = issueS(ca, time.Hour), issueC(ca) })
	good, goodC := issueS(ca, time.Hour), issueC(ca)
	cases := []struct {
		name    string
		server  tls.Certificate
		client  *tls.Certificate
		require bool
		sni     string
		ok      bool
	}{
		{"mutual", good, &goodC, true, serverName, true},
		{"by IP", good, &goodC, true, "127.0.0.1", true},
		{"no client cert, required", good, nil, true, serverName, false},
		{"no client cert, optional", good, nil, false, serverName, true},
		{"client cert from another CA", good, ptr(issueC(other)), true, serverName, false},
		// The client offers no certificate the server's CAs accept, so it connects anonymously.
		{"client cert from another CA, optional", good, ptr(issueC(other)), false, serverName, true},
		{"server cert from another CA", issueS(other, time.Hour), &goodC, true, serverName, false},
		{"expired client cert", good, &expiredC, true, serverName, false},
		{"expired server cert", expiredS, &goodC, true, serverName, false},
		{"wrong server name", good, &goodC, true, "other.internal", false},
		{"server cert used as client cert", good, &good, true, serverName, false},
		{"client cert used as server cert", goodC, &goodC, true, serverName, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			st, srvErr, cliErr := handshake(t,
				ServerTLSConfig(tc.server, ca.Pool(), tc.require),
				ClientTLSConfig(tc.client, ca.Pool(), tc.sni))
			ok := srvErr == nil && cliErr == nil
			if ok != tc.ok {
				t.Fatalf("ok=%v want %v (server: %v; client: %v)", ok, tc.ok, srvErr, cliErr)
			}
			if !ok {
				t.Logf("server: %v; client: %v", srvErr, cliErr)
				return
			}
			if st.Version != tls.VersionTLS13 || st.NegotiatedProtocol != "h2" {
				t.Fatalf("version %x alpn %q", st.Version, st.NegotiatedProtocol)
			}
			wantPeer := tc.client != nil && tc.client.Leaf.Issuer.CommonName == "ca"
			if !wantPeer && len(st.PeerCertificates) != 0 {
				t.Fatalf("unexpected peer certificate %v", st.PeerCertificates[0].Subject)
			}
			if wantPeer {
				if len(st.PeerCertificates) == 0 || len(st.PeerCertificates[0].URIs) != 1 || st.PeerCertificates[0].URIs[0].String() != runner.String() {
					t.Fatalf("peer identity %v", st.PeerCertificates)
				}
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

func TestServerTLSConfigVersion(t *testing.T) {
	ca := testCA(t, "ca")
	srv, _ := ca.IssueServer("s", []string{serverName}, nil, time.Hour)
	cli := ClientTLSConfig(nil, ca.Pool(), serverName)
	cli.MinVersion, cli.MaxVersion = tls.VersionTLS12, tls.VersionTLS12
	if _, srvErr, cliErr := handshake(t, ServerTLSConfig(srv, nil, false), cli); srvErr == nil || cliErr == nil {
		t.Fatalf("TLS 1.2 accepted: %v %v", srvErr, cliErr)
	}
}

func csrDER(t *testing.T, key any, cn string) []byte {
	t.Helper()
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject:  pkix.Name{CommonName: cn},
		DNSNames: []string{"requested.example"},
	}, key)
	if err != nil {
		t.Fatal(err)
	}
	return der
}

func TestSignCSR(t *testing.T) {
	ca := testCA(t, "ca")
	p256, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	p384, _ := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	_, edKey, _ := ed25519.GenerateKey(rand.Reader)
	sandbox := mustURL(t, "spiffe://sandboxd/sandbox/sb-1")
	identity := func(c *x509.Certificate) {
		c.Subject = pkix.Name{CommonName: "sb-1"}
		c.URIs = []*url.URL{sandbox}
	}

	valid := csrDER(t, p256, "victim")
	badSig := bytes.Clone(valid)
	badSig[len(badSig)-1] ^= 0x01 // last byte of the signature's s
	badSubject := bytes.Replace(bytes.Clone(valid), []byte("victim"), []byte("attack"), 1)

	cases := []struct {
		name    string
		der     []byte
		tmpl    func(*x509.Certificate)
		wantErr string
	}{
		{"P-256", valid, identity, ""},
		{"tmpl cannot make a CA", valid, func(c *x509.Certificate) { identity(c); c.IsCA = true; c.KeyUsage |= x509.KeyUsageCertSign }, ""},
		{"RSA", csrDER(t, rsaKey, "r"), identity, "only ECDSA P-256"},
		{"P-384", csrDER(t, p384, "p"), identity, "only ECDSA P-256"},
		{"Ed25519", csrDER(t, edKey, "e"), identity, "only ECDSA P-256"},
		{"tampered signature", badSig, identity, "signature invalid"},
		{"tampered subject", badSubject, identity, "signature invalid"},
		{"no tmpl", valid, nil, "tmpl"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			csr, err := x509.ParseCertificateRequest(tc.der)
			if err != nil {
				t.Fatalf("parse: %v", err)
			}
			cert, err := ca.SignCSR(csr, tc.tmpl, time.Hour)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if cert.IsCA || len(cert.DNSNames) != 0 || cert.Subject.CommonName != "sb-1" || len(cert.URIs) != 1 || cert.URIs[0].String() != sandbox.String() {
				t.Fatalf("cert: ca=%v dns=%v cn=%q uris=%v", cert.IsCA, cert.DNSNames, cert.Subject.CommonName, cert.URIs)
			}
			if !p256.PublicKey.Equal(cert.PublicKey) {
				t.Fatal("not the CSR's key")
			}
			if _, err := cert.Verify(x509.VerifyOptions{Roots: ca.Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
				t.Fatal(err)
			}
		})
	}
	if _, err := ca.SignCSR(nil, identity, time.Hour); err == nil {
		t.Fatal("nil CSR accepted")
	}
}

func TestKeyPairFiles(t *testing.T) {
	ca := testCA(t, "ca")
	dir := filepath.Join(t.TempDir(), "certs")
	srv, err := ca.IssueServer("s", []string{serverName}, nil, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 { // the second write replaces the first
		if err := WriteKeyPair(dir, "gateway", srv); err != nil {
			t.Fatal(err)
		}
	}
	if m := mode(t, filepath.Join(dir, "gateway-key.pem")); m != 0o600 {
		t.Fatalf("key mode %o", m)
	}
	if m := mode(t, filepath.Join(dir, "gateway.pem")); m != 0o644 {
		t.Fatalf("cert mode %o", m)
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 2 {
		t.Fatalf("leftover files: %v", ents)
	}
	got, err := LoadKeyPair(dir, "gateway")
	if err != nil {
		t.Fatal(err)
	}
	if got.Leaf == nil || !bytes.Equal(got.Leaf.Raw, srv.Leaf.Raw) || !srv.PrivateKey.(*ecdsa.PrivateKey).Equal(got.PrivateKey) {
		t.Fatal("key pair differs after reload")
	}
	if _, err := LoadKeyPair(dir, "missing"); err == nil {
		t.Fatal("missing pair loaded")
	}
	if err := WriteKeyPair(dir, "empty", tls.Certificate{}); err == nil {
		t.Fatal("empty pair written")
	}
}

func TestSplitHosts(t *testing.T) {
	dns, ips := SplitHosts([]string{"r1"}, []string{"127.0.0.1", "", "runner.example", "::1"})
	if strings.Join(dns, ",") != "r1,runner.example" || len(ips) != 2 || !ips[0].Equal(net.ParseIP("127.0.0.1")) || !ips[1].Equal(net.ParseIP("::1")) {
		t.Errorf("SplitHosts = %v %v", dns, ips)
	}
}

func TestRenewing(t *testing.T) {
	ca, err := LoadOrCreateCA(t.TempDir(), "test CA")
	if err != nil {
		t.Fatal(err)
	}
	issued := 0
	ttl := time.Hour
	fail := false
	get := Renewing(func() (tls.Certificate, error) {
		if fail {
			return tls.Certificate{}, errors.New("CA unavailable")
		}
		issued++
		return ca.IssueServer("x", []string{"x"}, nil, ttl)
	})
	first, err := get()
	if err != nil {
		t.Fatal(err)
	}
	if again, _ := get(); again != first || issued != 1 {
		t.Errorf("a young certificate was reissued (%d issues)", issued)
	}
	// Past half of its life (the 5-minute backdating counts): reissued; if that fails,
	// the still valid one is served.
	ttl = time.Minute
	get = Renewing(func() (tls.Certificate, error) {
		if fail {
			return tls.Certificate{}, errors.New("CA unavailable")
		}
		issued++
		return ca.IssueServer("x", []string{"x"}, nil, ttl)
	})
	short, err := get()
	if err != nil {
		t.Fatal(err)
	}
	fail = true
	if kept, err := get(); err != nil || kept != short {
		t.Errorf("renewal failure: %v, %v; want the valid certificate kept", kept, err)
	}
	fail = false
	if renewed, err := get(); err != nil || renewed == short {
		t.Errorf("aged certificate not renewed: %v", err)
	}
}

// TestNewParseCA: NewCA's certificate and key read back with ParseCA are the same CA (it
// issues what verifies against the first's pool); a key of another CA, a leaf certificate
// and bad PEM are refused naming what is wrong; EncodeKeyPair reads back with
// tls.X509KeyPair.
func TestNewParseCA(t *testing.T) {
	ca, keyPEM, err := NewCA("test")
	if err != nil {
		t.Fatal(err)
	}
	back, err := ParseCA(ca.CertPEM(), keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	c, err := back.IssueServer("s", []string{"s.example"}, nil, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Leaf.Verify(x509.VerifyOptions{DNSName: "s.example", Roots: ca.Pool()}); err != nil {
		t.Errorf("a certificate of the parsed CA: %v", err)
	}
	chain, key, err := EncodeKeyPair(c)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tls.X509KeyPair(chain, key); err != nil {
		t.Errorf("EncodeKeyPair: %v", err)
	}
	_, otherKey, _ := NewCA("other")
	for _, tc := range []struct {
		cert, key []byte
		want      string
	}{
		{ca.CertPEM(), otherKey, "the CA key does not match the CA certificate"},
		{chain, key, "the CA certificate is not a CA certificate"},
		{[]byte("x"), keyPEM, "the CA certificate: no PEM certificate"},
		{ca.CertPEM(), []byte("x"), "the CA key: no PEM private key"},
	} {
		if _, err := ParseCA(tc.cert, tc.key); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseCA: %v, want %q", err, tc.want)
		}
	}
	if _, _, err := NewCA(""); err == nil {
		t.Error("NewCA without a name")
	}
}
