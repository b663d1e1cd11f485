package egress

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/egress/egresstest"
)

// injectEnv is a proxyEnv whose granted source gets tValue injected into the
// Authorization header of its requests to api.example.test.
type injectEnv struct {
	*proxyEnv
	ss    *SandboxSecrets
	cur   atomic.Pointer[SandboxSecrets] // what the proxy is given
	audit string
}

func newInjectEnv(t *testing.T) *injectEnv {
	t.Helper()
	ss, err := NewSandboxSecrets("sbx-1", "org-1", []Injection{{
		Host: "api.example.test", Header: "Authorization", Placeholder: tPlace, Value: tValue, Secret: "prod/api#token",
	}, {
		// wrong.example.test resolves to a server with another name's certificate.
		Host: "wrong.example.test", Header: "Authorization", Placeholder: tPlace, Value: tValue, Secret: "prod/api#token",
	}}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	ie := &injectEnv{ss: ss, audit: filepath.Join(t.TempDir(), "egress-audit.jsonl")}
	ie.cur.Store(ss)
	ie.proxyEnv = newProxyEnvWith(t, func(e *proxyEnv) {
		p := e.proxy
		p.Secrets = func(src netip.Addr) *SandboxSecrets {
			if src == granted {
				return ie.cur.Load()
			}
			return nil
		}
		p.Audit = &AuditLog{Path: ie.audit}
		p.UpstreamRoots = e.in.CA.Pool()
		e.grants[granted] = append(e.grants[granted], "wrong.example.test")
		e.in.SetA("wrong.example.test", e.other.Addr.Addr())
	})
	return ie
}

// sandboxTLS is what the sandbox trusts: its CA, and the Internet's (real servers).
func (ie *injectEnv) sandboxTLS(name string) *tls.Config {
	pool := ie.in.CA.Pool()
	pool.AddCert(ie.ss.CACert())
	return &tls.Config{ServerName: name, RootCAs: pool}
}

// request sends raw (a request head and body, host filled in for %s) over TLS to name
// from src and returns the response's status and body, and the server's certificate.
func (ie *injectEnv) request(t *testing.T, src netip.Addr, name, raw string, cfg *tls.Config) (int, string, *x509.Certificate, error) {
	t.Helper()
	c := ie.dial(t, src)
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if cfg == nil {
		cfg = ie.sandboxTLS(name)
	}
	tc := tls.Client(c, cfg)
	if err := tc.Handshake(); err != nil {
		return 0, "", nil, fmt.Errorf("handshake: %w", err)
	}
	if _, err := io.WriteString(tc, raw); err != nil {
		return 0, "", nil, err
	}
	resp, err := http.ReadResponse(bufio.NewReader(tc), nil)
	if err != nil {
		return 0, "", nil, fmt.Errorf("response: %w", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), tc.ConnectionState().PeerCertificates[0], nil
}

func TestInjectSecret(t *testing.T) {
	ie := newInjectEnv(t)
	get := "GET /echo HTTP/1.1\r\nHost: api.example.test\r\nAuthorization: Bearer " + tPlace + "\r\nConnection: close\r\n\r\n"
	code, body, cert, err := ie.request(t, granted, "api.example.test", get, nil)
	if err != nil || code != 200 {
		t.Fatalf("GET: %d %q %v", code, body, err)
	}
	if !strings.Contains(body, "authorization="+egresstest.EchoHash("Bearer "+tValue)) {
		t.Errorf("server saw %q, want the real value", body)
	}
	if !strings.Contains(cert.Issuer.CommonName, "sandboxd egress CA sbx-1") {
		t.Errorf("sandbox saw a certificate from %q, want its own CA", cert.Issuer.CommonName)
	}
	// Keep-alive, pipelined requests with bodies (length and chunked): each one filled.
	raw := "POST /echo HTTP/1.1\r\nHost: api.example.test\r\nAuthorization: " + tPlace + "\r\nContent-Length: 4\r\n\r\nabcd" +
		"POST /echo HTTP/1.1\r\nHost: api.example.test\r\nAuthorization: " + tPlace + "\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nxyz\r\n0\r\n\r\n"
	c := ie.dial(t, granted)
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	tc := tls.Client(c, ie.sandboxTLS("api.example.test"))
	if _, err := io.WriteString(tc, raw); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(tc)
	for i, want := range []string{"body=4", "body=3"} {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("response %d: %v", i, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !strings.Contains(string(b), "authorization="+egresstest.EchoHash(tValue)) || !strings.Contains(string(b), want) {
			t.Errorf("response %d: %q", i, b)
		}
	}
	// HTTP/2 is not offered.
	cfg := ie.sandboxTLS("api.example.test")
	cfg.NextProtos = []string{"h2", "http/1.1"}
	if _, _, _, err := ie.request(t, granted, "api.example.test", get, cfg); err != nil {
		t.Errorf("h2+http/1.1 client: %v", err)
	}
	// The audit log: every use, never the value.
	audit, err := os.ReadFile(ie.audit)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(audit), tValue) {
		t.Fatal("audit log holds the value")
	}
	lines := strings.Split(strings.TrimSpace(string(audit)), "\n")
	if len(lines) != 4 {
		t.Errorf("audit log has %d lines, want 4:\n%s", len(lines), audit)
	}
	var e AuditEntry
	if err := json.Unmarshal([]byte(lines[0]), &e); err != nil || e.Sandbox != "sbx-1" || e.Org != "org-1" || e.Host != "api.example.test" ||
		e.Secret != "prod/api#token" || e.Result != "injected" || e.Header != "Authorization" {
		t.Errorf("audit entry %+v %v", e, err)
	}
}

func TestInjectOtherHostsUntouched(t *testing.T) {
	ie := newInjectEnv(t)
	// Another granted host: spliced, the real server's certificate, placeholder unchanged.
	get := "GET /echo HTTP/1.1\r\nHost: a.svc.example.test\r\nAuthorization: Bearer " + tPlace + "\r\nConnection: close\r\n\r\n"
	code, body, cert, err := ie.request(t, granted, "a.svc.example.test", get, ie.in.ClientConfig("a.svc.example.test"))
	if err != nil || code != 200 {
		t.Fatalf("GET: %d %q %v", code, body, err)
	}
	if !strings.Contains(body, "authorization="+egresstest.EchoHash("Bearer "+tPlace)) {
		t.Errorf("other host saw %q, want the placeholder", body)
	}
	if cert.Issuer.CommonName == ie.ss.CACert().Subject.CommonName {
		t.Error("other host's TLS was terminated")
	}
	// Another sandbox (no secrets) to the injection host: spliced, nothing injected.
	code, body, _, err = ie.request(t, stranger, "api.example.test", "GET / HTTP/1.1\r\nHost: api.example.test\r\nConnection: close\r\n\r\n", ie.in.ClientConfig("api.example.test"))
	if err == nil {
		t.Errorf("ungranted source reached the host: %d %q", code, body)
	}
}

func TestInjectRefusals(t *testing.T) {
	ie := newInjectEnv(t)
	// SNI of the injection host, Host of another granted one: refused, nothing forwarded.
	before := ie.svc.Conns()
	code, body, _, err := ie.request(t, granted, "api.example.test",
		"GET /echo HTTP/1.1\r\nHost: a.svc.example.test\r\nAuthorization: "+tPlace+"\r\n\r\n", nil)
	if err != nil || code != 421 || strings.Contains(body, tValue) {
		t.Errorf("Host mismatch: %d %q %v", code, body, err)
	}
	if ie.svc.Conns() != before {
		t.Error("a Host-mismatched request reached the other host")
	}
	// Absolute-form target naming another host.
	code, _, _, err = ie.request(t, granted, "api.example.test",
		"GET https://a.svc.example.test/echo HTTP/1.1\r\nHost: api.example.test\r\nAuthorization: "+tPlace+"\r\n\r\n", nil)
	if err != nil || code != 400 {
		t.Errorf("absolute form: %d %v", code, err)
	}
	// Second request on a connection switching host: the first served, the second refused.
	c := ie.dial(t, granted)
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	tc := tls.Client(c, ie.sandboxTLS("api.example.test"))
	_, _ = io.WriteString(tc, "GET /echo HTTP/1.1\r\nHost: api.example.test\r\nAuthorization: "+tPlace+"\r\n\r\n"+
		"GET /echo HTTP/1.1\r\nHost: evil.example.test\r\nAuthorization: "+tPlace+"\r\n\r\n")
	br := bufio.NewReader(tc)
	r1, err1 := http.ReadResponse(br, nil)
	if err1 != nil || r1.StatusCode != 200 {
		t.Fatalf("first: %v %v", r1, err1)
	}
	_, _ = io.ReadAll(r1.Body)
	_ = r1.Body.Close()
	r2, err2 := http.ReadResponse(br, nil)
	if err2 != nil || r2.StatusCode != 421 {
		t.Errorf("second: %v %v", r2, err2)
	}
	if r2 != nil {
		_ = r2.Body.Close()
	}
	audit, _ := os.ReadFile(ie.audit)
	if !strings.Contains(string(audit), "refused: Host") || strings.Contains(string(audit), tValue) {
		t.Errorf("audit:\n%s", audit)
	}
	// An upstream whose certificate does not verify: refused before the sandbox's handshake.
	if _, _, _, err := ie.request(t, granted, "wrong.example.test", "GET / HTTP/1.1\r\nHost: wrong.example.test\r\n\r\n", nil); err == nil {
		t.Error("unverified upstream accepted")
	}
	waitLog(t, ie.log, "upstream TLS")
	// Lost secrets (a restarted runner): refused, not spliced with the placeholder.
	ie.cur.Store(LostSecrets("sbx-1", "org-1", []string{"api.example.test"}))
	if _, _, _, err := ie.request(t, granted, "api.example.test", "GET / HTTP/1.1\r\nHost: api.example.test\r\n\r\n", ie.in.ClientConfig("api.example.test")); err == nil {
		t.Error("lost secrets: connection served")
	}
	waitLog(t, ie.log, "secrets lost")
}

// BenchmarkInject: requests to api.example.test from a sandbox with an injected secret
// (TLS terminated and re-originated, each head parsed and rewritten) against the same
// requests spliced (a source without secrets) and direct. "request": GET /echo on a
// kept-alive connection; "connect": a new connection (both handshakes) and one request.
func BenchmarkInject(b *testing.B) {
	ss, err := NewSandboxSecrets("sbx-1", "org-1", []Injection{{Host: "api.example.test", Header: "Authorization", Placeholder: tPlace, Value: tValue, Secret: "s/p"}}, time.Hour)
	if err != nil {
		b.Fatal(err)
	}
	e := newProxyEnvWith(b, func(e *proxyEnv) {
		e.proxy.Log = slog.New(slog.DiscardHandler)
		e.proxy.UpstreamRoots = e.in.CA.Pool()
		e.proxy.Secrets = func(src netip.Addr) *SandboxSecrets {
			if src == granted {
				return ss
			}
			return nil
		}
		e.grants[stranger] = e.grants[granted]
	})
	pool := e.in.CA.Pool()
	pool.AddCert(ss.CACert())
	for _, tc := range []struct {
		name string
		dial func(ctx context.Context) (net.Conn, error)
	}{
		{"direct", func(ctx context.Context) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", e.real.Addr.String())
		}},
		{"spliced", func(ctx context.Context) (net.Conn, error) {
			d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(stranger, 0))}
			return d.DialContext(ctx, "tcp", e.addr)
		}},
		{"injected", func(ctx context.Context) (net.Conn, error) {
			d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(granted, 0))}
			return d.DialContext(ctx, "tcp", e.addr)
		}},
	} {
		for _, mode := range []string{"request", "connect"} {
			b.Run(tc.name+"/"+mode, func(b *testing.B) {
				newClient := func() (*http.Client, *http.Transport) {
					tr := &http.Transport{
						DialContext:     func(ctx context.Context, _, _ string) (net.Conn, error) { return tc.dial(ctx) },
						TLSClientConfig: &tls.Config{ServerName: "api.example.test", RootCAs: pool},
					}
					return &http.Client{Transport: tr}, tr
				}
				get := func(c *http.Client) {
					req, _ := http.NewRequest("GET", "https://api.example.test/echo", nil)
					req.Header.Set("Authorization", "Bearer "+tPlace)
					resp, err := c.Do(req)
					if err != nil {
						b.Fatal(err)
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				c, tr := newClient()
				get(c)
				b.ResetTimer()
				for range b.N {
					if mode == "connect" {
						tr.CloseIdleConnections()
					}
					get(c)
				}
				b.StopTimer()
				tr.CloseIdleConnections()
			})
		}
	}
}
