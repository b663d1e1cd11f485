package edge

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/pki"
)

const (
	testRunner = "r1"
	testDomain = "edge.test"
	sbxA       = "abcdefghijklmn23" // has routes
	sbxB       = "zzzzzzzzzzzzzz77" // has routes
	sbxNone    = "qqqqqqqqqqqqqq22" // does not exist
)

// routeMap is a Routes without Table's validation, so tests can use timeouts below the
// 15 s minimum.
type routeMap struct {
	mu sync.Mutex
	m  map[tableKey]Route
}

func (rm *routeMap) Lookup(id string, port int) (Route, bool) {
	rm.mu.Lock()
	defer rm.mu.Unlock()
	r, ok := rm.m[tableKey{id, port}]
	return r, ok
}

func (rm *routeMap) add(r Route) {
	rm.mu.Lock()
	defer rm.mu.Unlock()
	if rm.m == nil {
		rm.m = make(map[tableKey]Route)
	}
	rm.m[tableKey{r.SandboxID, r.Port}] = r
}

// testEdge is an edge serving on loopback with a fresh platform CA.
type testEdge struct {
	*Edge
	addr  string
	roots *x509.CertPool // verifies the wildcard certificate
	rm    *routeMap
}

func startEdge(t testing.TB, edit func(*Config)) *testEdge {
	t.Helper()
	logs := newTestWriter(t) // registered first: its cleanup runs last
	ca, err := pki.LoadOrCreateCA(t.TempDir(), "platform CA")
	if err != nil {
		t.Fatal(err)
	}
	get, err := WildcardCertificate(ca, testRunner, testDomain, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	rm := &routeMap{}
	cfg := Config{
		RunnerID: testRunner, BaseDomain: testDomain, Routes: rm, GetCertificate: get,
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	if edit != nil {
		edit(&cfg)
	}
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- e.Serve(ln) }()
	t.Cleanup(func() {
		_ = e.Close()
		if err := <-served; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("Serve returned %v, want http.ErrServerClosed", err)
		}
	})
	return &testEdge{Edge: e, addr: ln.Addr().String(), roots: ca.Pool(), rm: rm}
}

// client is an HTTPS client that reaches every name through the edge, offering protos by ALPN.
func (te *testEdge) client(protos ...string) *http.Client {
	p := new(http.Protocols)
	for _, proto := range protos {
		switch proto {
		case "h2":
			p.SetHTTP2(true)
		case "http/1.1":
			p.SetHTTP1(true)
		}
	}
	tr := &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: te.roots},
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "tcp", te.addr)
		},
		Protocols: p,
	}
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

// dialTLS makes a TLS connection through the edge with the given SNI ("" for none).
func (te *testEdge) dialTLS(sni string, roots *x509.CertPool, protos ...string) (*tls.Conn, error) {
	raw, err := net.DialTimeout("tcp", te.addr, 5*time.Second)
	if err != nil {
		return nil, err
	}
	_ = raw.SetDeadline(time.Now().Add(5 * time.Second))
	c := tls.Client(raw, &tls.Config{ServerName: sni, RootCAs: roots, NextProtos: protos, InsecureSkipVerify: sni == ""})
	if err := c.Handshake(); err != nil {
		raw.Close()
		return nil, err
	}
	_ = raw.SetDeadline(time.Time{})
	return c, nil
}

// httpRoute adds an HTTPS route to h, served on loopback for the test.
func (te *testEdge) httpRoute(t testing.TB, id string, port int, auth Auth, timeout time.Duration, h http.Handler) string {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	te.rm.add(Route{SandboxID: id, Org: "org-" + id, Port: port, Kind: KindHTTPS, Auth: auth, Timeout: timeout, Backend: addrPort(t, srv.Listener.Addr())})
	return "https://" + Host(port, id, testRunner, testDomain)
}

func addrPort(t testing.TB, a net.Addr) netip.AddrPort {
	t.Helper()
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		t.Fatal(err)
	}
	return ap
}

// testWriter logs to t until the test ends; goroutines may still log after that,
// which t.Log does not allow.
type testWriter struct {
	t    testing.TB
	done *atomic.Bool
}

func newTestWriter(t testing.TB) testWriter {
	w := testWriter{t: t, done: new(atomic.Bool)}
	t.Cleanup(func() { w.done.Store(true) })
	return w
}

func (w testWriter) Write(p []byte) (int, error) {
	if !w.done.Load() {
		w.t.Log(strings.TrimSpace(string(p)))
	}
	return len(p), nil
}
