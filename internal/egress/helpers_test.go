package egress

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/egress/egresstest"
	"github.com/sandboxd/sandboxd/internal/sni/snitest"
	"github.com/sandboxd/sandboxd/internal/testenv/logbuf"
)

// Sources of test connections: loopback addresses standing in for sandboxes.
var (
	granted  = netip.MustParseAddr("127.0.0.2")
	stranger = netip.MustParseAddr("127.0.0.3")
)

// proxyEnv is a Proxy on loopback in front of an egresstest Internet holding:
//
//	api.example.test, mixed.example.test  → real (a server for both names)
//	*.svc.example.test, svc.example.test  → svc
//	other.example.test                    → other
//	meta.example.test                     → 169.254.169.254, 127.0.0.1
//	mixed.example.test                    → 127.0.0.1, then real
//	dead.example.test                     → an address where nothing listens
type proxyEnv struct {
	in               *egresstest.Internet
	proxy            *Proxy
	addr             string // the proxy's listener
	real, svc, other *egresstest.Server
	evil             *egresstest.Server // also has a certificate for api.example.test
	log              *logbuf.Buffer
	grants           map[netip.Addr][]string
	serveErr         chan error

	mu    sync.Mutex
	dials []string
}

func newProxyEnv(t testing.TB, mod func(*Proxy)) *proxyEnv {
	t.Helper()
	return newProxyEnvWith(t, func(e *proxyEnv) {
		if mod != nil {
			mod(e.proxy)
		}
	})
}

// newProxyEnvWith is newProxyEnv with mod given the whole environment (before Serve).
func newProxyEnvWith(t testing.TB, mod func(*proxyEnv)) *proxyEnv {
	t.Helper()
	in := egresstest.New(t)
	e := &proxyEnv{in: in, log: new(logbuf.Buffer), serveErr: make(chan error, 1)}
	realA, svcA, otherA, evilA, deadA := in.Addr(t), in.Addr(t), in.Addr(t), in.Addr(t), in.Addr(t)
	e.real = in.ServeHTTPS(t, realA, "api.example.test", "mixed.example.test")
	e.svc = in.ServeHTTPS(t, svcA, "*.svc.example.test", "svc.example.test", "a.b.svc.example.test")
	e.other = in.ServeHTTPS(t, otherA, "other.example.test")
	e.evil = in.ServeHTTPS(t, evilA, "api.example.test")
	in.SetA("api.example.test", realA)
	for _, n := range []string{"svc.example.test", "a.svc.example.test", "b.svc.example.test", "a.b.svc.example.test"} {
		in.SetA(n, svcA)
	}
	in.SetA("other.example.test", otherA)
	in.SetA("meta.example.test", netip.MustParseAddr("169.254.169.254"), netip.MustParseAddr("127.0.0.1"))
	in.SetA("mixed.example.test", netip.MustParseAddr("127.0.0.1"), realA)
	in.SetA("dead.example.test", deadA)
	grantedNames := []string{
		"api.example.test", "*.svc.example.test", "meta.example.test", "mixed.example.test",
		"dead.example.test", "gone.example.test",
		realA.String(), "10.1", // not valid patterns, but the proxy must refuse such SNIs even if granted
	}
	e.grants = map[netip.Addr][]string{granted: grantedNames, in.Gateway: grantedNames}
	e.proxy = &Proxy{
		Grants:   func(src netip.Addr) []string { return e.grants[src] },
		Resolver: in.Resolver(),
		Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			e.mu.Lock()
			e.dials = append(e.dials, addr)
			e.mu.Unlock()
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		},
		Log:              slog.New(slog.NewTextHandler(e.log, &slog.HandlerOptions{Level: slog.LevelDebug})),
		HandshakeTimeout: 2 * time.Second,
	}
	if mod != nil {
		mod(e)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e.addr = l.Addr().String()
	go func() { e.serveErr <- e.proxy.Serve(l) }()
	t.Cleanup(func() {
		_ = e.proxy.Close()
		// ErrClosed: Close came before the Serve goroutine got going.
		if err := <-e.serveErr; err != nil && !errors.Is(err, net.ErrClosed) {
			t.Errorf("Serve: %v", err)
		}
	})
	return e
}

// takeDials returns the upstream addresses dialled since the last call.
func (e *proxyEnv) takeDials() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	d := e.dials
	e.dials = nil
	return d
}

// dial connects to the proxy from src.
func (e *proxyEnv) dial(t testing.TB, src netip.Addr) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(src, 0)), Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", e.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// get makes a TLS connection from src through the proxy with cfg and GETs / on it; it
// returns the body and the certificate the server presented.
func (e *proxyEnv) get(t testing.TB, src netip.Addr, cfg *tls.Config) (string, *x509.Certificate, error) {
	t.Helper()
	c := e.dial(t, src)
	return getOver(c, cfg)
}

func getOver(c net.Conn, cfg *tls.Config) (string, *x509.Certificate, error) {
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	tc := tls.Client(c, cfg)
	if err := tc.Handshake(); err != nil {
		return "", nil, fmt.Errorf("handshake: %w", err)
	}
	host := cfg.ServerName
	if _, err := fmt.Fprintf(tc, "GET / HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", host); err != nil {
		return "", nil, err
	}
	resp, err := http.ReadResponse(bufio.NewReader(tc), nil)
	if err != nil {
		return "", nil, fmt.Errorf("response: %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", nil, err
	}
	return string(b), tc.ConnectionState().PeerCertificates[0], nil
}

// helloWithName is a ClientHello whose server_name is name, even one crypto/tls would
// not send (an IP literal): a hello for a placeholder of the same length, rewritten.
func helloWithName(t testing.TB, name string) []byte {
	t.Helper()
	placeholder := strings.Repeat("q", len(name))
	h := snitest.ClientHello(t, &tls.Config{ServerName: placeholder})
	if bytes.Count(h, []byte(placeholder)) != 1 {
		t.Fatalf("placeholder %q not once in the hello", placeholder)
	}
	return bytes.Replace(h, []byte(placeholder), []byte(name), 1)
}

// readAllUntilClosed reads what the peer sends until it closes (io.EOF or a reset).
func readAllUntilClosed(c net.Conn, timeout time.Duration) ([]byte, error) {
	_ = c.SetReadDeadline(time.Now().Add(timeout))
	var out []byte
	buf := make([]byte, 4096)
	for {
		n, err := c.Read(buf)
		out = append(out, buf[:n]...)
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || strings.Contains(err.Error(), "reset") {
				return out, nil
			}
			return out, err
		}
	}
}

// waitFor polls cond for up to 5 s.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(5 * time.Second); !cond(); {
		if time.Now().After(end) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitLog waits until log has a line containing all of parts.
func waitLog(t testing.TB, log *logbuf.Buffer, parts ...string) {
	t.Helper()
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		for _, line := range strings.Split(log.String(), "\n") {
			if !slices.ContainsFunc(parts, func(p string) bool { return !strings.Contains(line, p) }) {
				return
			}
		}
		if time.Now().After(end) {
			t.Fatalf("no log line with %q in:\n%s", parts, log.String())
		}
	}
}
