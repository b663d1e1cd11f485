package acme

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/libdns/libdns"
	"github.com/miekg/dns"

	"github.com/sandboxd/sandboxd/internal/edge"
	"github.com/sandboxd/sandboxd/internal/testenv/logbuf"
)

const (
	testZone   = "sbx.test."
	testKey    = "acme-key."
	testSecret = "c2FuZGJveGQgdGVzdCB0c2lnIHNlY3JldCAzMiBieXRlcw==" // base64
)

// zone is a small authoritative DNS server for testZone that takes RFC 2136 updates
// signed with testKey: the DNS a platform operator would point the runner at.
type zone struct {
	addr string

	mu      sync.Mutex
	txt     map[string][]string // fqdn → texts
	updates int
	refused int
}

func startZone(t *testing.T) *zone {
	t.Helper()
	z := &zone{txt: map[string][]string{}}
	var pc net.PacketConn
	var ln net.Listener
	for range 20 { // UDP and TCP on one port
		var err error
		if pc, err = net.ListenPacket("udp", "127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
		if ln, err = net.Listen("tcp", pc.LocalAddr().String()); err == nil {
			break
		}
		pc.Close()
		pc = nil
	}
	if pc == nil {
		t.Fatal("no port free for both UDP and TCP")
	}
	z.addr = pc.LocalAddr().String()
	secrets := map[string]string{testKey: testSecret}
	// miekg/dns answers NOTIMP to UPDATE unless told to let it through.
	accept := func(h dns.Header) dns.MsgAcceptAction {
		if int(h.Bits>>11)&0xF == dns.OpcodeUpdate {
			return dns.MsgAccept
		}
		return dns.DefaultMsgAcceptFunc(h)
	}
	udp := &dns.Server{PacketConn: pc, Handler: z, TsigSecret: secrets, MsgAcceptFunc: accept}
	tcp := &dns.Server{Listener: ln, Handler: z, TsigSecret: secrets, MsgAcceptFunc: accept}
	go func() { _ = udp.ActivateAndServe() }()
	go func() { _ = tcp.ActivateAndServe() }()
	t.Cleanup(func() { _ = udp.Shutdown(); _ = tcp.Shutdown() })
	return z
}

func (z *zone) soa() *dns.SOA {
	return &dns.SOA{Hdr: dns.RR_Header{Name: testZone, Rrtype: dns.TypeSOA, Class: dns.ClassINET, Ttl: 60},
		Ns: "ns." + testZone, Mbox: "hostmaster." + testZone, Serial: 1, Refresh: 60, Retry: 60, Expire: 600, Minttl: 1}
}

func (z *zone) ServeDNS(w dns.ResponseWriter, r *dns.Msg) {
	m := new(dns.Msg)
	m.SetReply(r)
	m.Authoritative = true
	defer func() {
		if r.IsTsig() != nil && w.TsigStatus() == nil {
			m.SetTsig(testKey, dns.HmacSHA256, 300, time.Now().Unix())
		}
		_ = w.WriteMsg(m)
	}()
	if len(r.Question) != 1 || !dns.IsSubDomain(testZone, r.Question[0].Name) {
		m.Rcode = dns.RcodeRefused
		return
	}
	z.mu.Lock()
	defer z.mu.Unlock()
	if r.Opcode == dns.OpcodeUpdate {
		if r.IsTsig() == nil || w.TsigStatus() != nil {
			z.refused++
			m.Rcode = dns.RcodeNotAuth
			return
		}
		z.updates++
		for _, rr := range r.Ns {
			txt, ok := rr.(*dns.TXT)
			if !ok {
				continue
			}
			name, text := strings.ToLower(txt.Hdr.Name), strings.Join(txt.Txt, "")
			switch txt.Hdr.Class {
			case dns.ClassINET:
				z.txt[name] = append(z.txt[name], text)
			case dns.ClassNONE:
				var kept []string
				for _, v := range z.txt[name] {
					if v != text {
						kept = append(kept, v)
					}
				}
				z.txt[name] = kept
			}
		}
		return
	}
	q := r.Question[0]
	name := strings.ToLower(q.Name)
	switch {
	case q.Qtype == dns.TypeSOA && name == testZone:
		m.Answer = append(m.Answer, z.soa())
	case q.Qtype == dns.TypeTXT && len(z.txt[name]) > 0:
		for _, v := range z.txt[name] {
			m.Answer = append(m.Answer, &dns.TXT{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeTXT, Class: dns.ClassINET, Ttl: 1}, Txt: []string{v}})
		}
	default:
		m.Ns = append(m.Ns, z.soa())
	}
}

func (z *zone) records(name string) []string {
	z.mu.Lock()
	defer z.mu.Unlock()
	return append([]string(nil), z.txt[dns.Fqdn(name)]...)
}

// pebble is Let's Encrypt's test ACME server, resolving through a zone.
type pebble struct {
	directory string
	roots     *x509.CertPool // for its API's TLS
	mgmt      string         // management API base URL
	client    *http.Client
}

func startPebble(t *testing.T, dnsAddr string) *pebble {
	t.Helper()
	bin := os.Getenv("SANDBOXD_PEBBLE")
	if bin == "" {
		out, err := exec.Command("bash", "../../scripts/build-pebble.sh").Output()
		if err != nil && testing.Short() {
			// The unit tier needs no network: building pebble takes the Go module proxy.
			t.Skipf("pebble is not built (make pebble): %v", err)
		}
		if err != nil {
			t.Fatalf("build pebble: %v", err)
		}
		bin = strings.TrimSpace(string(out))
	}
	dir := t.TempDir()
	certPEM, keyPEM, roots := selfSigned(t, "127.0.0.1")
	writeFile(t, filepath.Join(dir, "cert.pem"), certPEM)
	writeFile(t, filepath.Join(dir, "key.pem"), keyPEM)
	listen, mgmt := freePort(t), freePort(t)
	cfg := map[string]any{"pebble": map[string]any{
		"listenAddress": listen, "managementListenAddress": mgmt,
		"certificate": filepath.Join(dir, "cert.pem"), "privateKey": filepath.Join(dir, "key.pem"),
		"httpPort": 5002, "tlsPort": 5001, "ocspResponderURL": "", "externalAccountBindingRequired": false,
	}}
	b, _ := json.Marshal(cfg)
	writeFile(t, filepath.Join(dir, "pebble.json"), b)
	cmd := exec.Command(bin, "-config", filepath.Join(dir, "pebble.json"), "-dnsserver", dnsAddr)
	cmd.Env = append(os.Environ(), "PEBBLE_VA_NOSLEEP=1", "PEBBLE_WFE_NONCEREJECT=0")
	logf, err := os.Create(filepath.Join(dir, "pebble.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("pebble log:\n%s", b)
		}
		logf.Close()
	})
	p := &pebble{directory: "https://" + listen + "/dir", roots: roots, mgmt: "https://" + mgmt,
		client: &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}, Timeout: 5 * time.Second}}
	deadline := time.Now().Add(20 * time.Second)
	for {
		res, err := p.client.Get(p.directory)
		if err == nil {
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				return p
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("pebble did not come up: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// issuingRoots are the roots pebble signs certificates with (made afresh at each start).
func (p *pebble) issuingRoots(t *testing.T) *x509.CertPool {
	t.Helper()
	res, err := p.client.Get(p.mgmt + "/roots/0")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		t.Fatalf("pebble roots: %s", b)
	}
	return pool
}

func TestWildcardFromACME(t *testing.T) {
	z := startZone(t)
	p := startPebble(t, z.addr)
	var logs logbuf.Buffer
	cfg := Config{
		Directory: p.directory, RootCAs: p.roots, Email: "ops@sbx.test",
		DNS:        &RFC2136{Server: z.addr, KeyName: testKey, KeySecret: testSecret},
		StorageDir: t.TempDir(),
		Logger:     slog.New(slog.NewTextHandler(&logs, nil)),
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	m, err := Wildcard(ctx, cfg, "runner-1.sbx.test")
	if err != nil {
		t.Fatal(err)
	}
	defer m.Stop()

	leaf, err := m.Leaf()
	if err != nil {
		t.Fatal(err)
	}
	if len(leaf.DNSNames) != 1 || leaf.DNSNames[0] != "*.runner-1.sbx.test" {
		t.Fatalf("certificate names %v, want [*.runner-1.sbx.test]", leaf.DNSNames)
	}
	// The challenge record was written by a signed update, and removed afterwards.
	if z.updates < 2 {
		t.Errorf("%d signed updates, want at least 2 (add, delete)", z.updates)
	}
	if recs := z.records("_acme-challenge.runner-1.sbx.test"); len(recs) != 0 {
		t.Errorf("challenge records left behind: %v", recs)
	}

	// A TLS client trusting the CA's root accepts it for an endpoint name.
	roots := p.issuingRoots(t)
	for _, host := range []string{"8080-abc.runner-1.sbx.test", "x.runner-1.sbx.test"} {
		if err := handshake(m, host, roots); err != nil {
			t.Errorf("%s: %v", host, err)
		}
	}
	// Names the wildcard does not cover fail verification.
	for _, host := range []string{"a.b.runner-1.sbx.test", "runner-1.sbx.test", "8080-abc.runner-2.sbx.test"} {
		if err := handshake(m, host, roots); err == nil {
			t.Errorf("%s: handshake verified, want a name mismatch", host)
		}
	}

	// Behind a runner's edge: an HTTPS endpoint answers with the ACME certificate.
	endpointThroughEdge(t, m, roots)

	// A second start loads the certificate from storage instead of asking again.
	before := z.updates
	m2, err := Wildcard(ctx, cfg, "runner-1.sbx.test")
	if err != nil {
		t.Fatal(err)
	}
	m2.Stop()
	if z.updates != before {
		t.Errorf("restart made %d more updates, want 0 (certificate from storage)", z.updates-before)
	}
}

func TestWrongTSIGKeyFailsClearly(t *testing.T) {
	z := startZone(t)
	p := startPebble(t, z.addr)
	wrong := base64.StdEncoding.EncodeToString([]byte("not the secret the zone knows at all"))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := Wildcard(ctx, Config{
		Directory: p.directory, RootCAs: p.roots,
		DNS:        &RFC2136{Server: z.addr, KeyName: testKey, KeySecret: wrong},
		StorageDir: t.TempDir(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}, "runner-1.sbx.test")
	if err == nil || !strings.Contains(err.Error(), "runner-1.sbx.test") {
		t.Fatalf("err = %v, want a failure naming the certificate", err)
	}
	if z.updates != 0 || z.refused == 0 {
		t.Errorf("updates %d refused %d: the zone must refuse the unsigned-to-it update", z.updates, z.refused)
	}
}

func TestRFC2136AddDelete(t *testing.T) {
	z := startZone(t)
	p := &RFC2136{Server: z.addr, KeyName: testKey, KeySecret: testSecret}
	ctx := context.Background()
	long := strings.Repeat("x", 300) // more than one TXT string
	recs := []libdns.Record{libdns.TXT{Name: "_acme-challenge.r1", TTL: time.Minute, Text: "token-1"}, libdns.TXT{Name: "_acme-challenge.r1", Text: long}}
	if _, err := p.AppendRecords(ctx, testZone, recs); err != nil {
		t.Fatal(err)
	}
	if got := z.records("_acme-challenge.r1.sbx.test"); strings.Join(got, ",") != "token-1,"+long {
		t.Fatalf("after append: %q", got)
	}
	if _, err := p.DeleteRecords(ctx, testZone, recs[:1]); err != nil {
		t.Fatal(err)
	}
	if got := z.records("_acme-challenge.r1.sbx.test"); strings.Join(got, ",") != long {
		t.Fatalf("after delete: %q", got)
	}
	unsigned := &RFC2136{Server: z.addr}
	if _, err := unsigned.AppendRecords(ctx, testZone, recs[:1]); err == nil || !strings.Contains(err.Error(), "NOTAUTH") {
		t.Fatalf("unsigned update: %v, want NOTAUTH", err)
	}
}

func handshake(m *Manager, host string, roots *x509.CertPool) error {
	srv, cli := net.Pipe()
	defer srv.Close()
	defer cli.Close()
	go func() {
		_ = tls.Server(srv, &tls.Config{GetCertificate: m.GetCertificate}).Handshake()
		srv.Close()
	}()
	_ = cli.SetDeadline(time.Now().Add(5 * time.Second))
	return tls.Client(cli, &tls.Config{ServerName: host, RootCAs: roots}).Handshake()
}

func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func writeFile(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// selfSigned makes a certificate for pebble's own API.
func selfSigned(t *testing.T, ip string) (certPEM, keyPEM []byte, roots *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "pebble test API"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP(ip)}, DNSNames: []string{"localhost"},
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IsCA: true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	roots = x509.NewCertPool()
	roots.AddCert(c)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), roots
}

// endpointThroughEdge serves an HTTPS route on a real edge with m's certificate and
// fetches it as a client that trusts only the ACME CA's root.
func endpointThroughEdge(t *testing.T, m *Manager, roots *x509.CertPool) {
	t.Helper()
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "hello from "+r.Host) }))
	defer app.Close()
	var table edge.Table
	if err := table.Set("abcdefghijklmnop", []edge.Route{{SandboxID: "abcdefghijklmnop", Org: "o", Port: 8080, Kind: edge.KindHTTPS,
		Backend: netip.MustParseAddrPort(app.Listener.Addr().String())}}); err != nil {
		t.Fatal(err)
	}
	e, err := edge.New(edge.Config{RunnerID: "runner-1", BaseDomain: "sbx.test", Routes: &table, GetCertificate: m.GetCertificate,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = e.Serve(ln) }()
	defer e.Close()
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: roots},
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "tcp", ln.Addr().String())
		},
	}}
	res, err := c.Get("https://8080-abcdefghijklmnop.runner-1.sbx.test/")
	if err != nil {
		t.Fatalf("endpoint through the edge: %v", err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	if res.StatusCode != http.StatusOK || string(b) != "hello from 8080-abcdefghijklmnop.runner-1.sbx.test" {
		t.Fatalf("endpoint through the edge: %s %q", res.Status, b)
	}
}
