// Package egresstest gives tests a small "internet": a network namespace joined to the
// host by a veth pair and routed from the host, holding public-looking addresses, a DNS
// server with the A/AAAA records a test sets, and HTTPS servers with certificates from a
// test CA. Everything it creates is removed when the test ends, failed or not.
//
// Each Internet gets a /24 of its own from 198.18.0.0/15 (RFC 2544's benchmarking range:
// not private, not CGNAT, so egress rules treat it as the internet). The host route is
// the lock: adding it fails when another Internet, in this process or another one
// running at the same time, holds the same /24, and the next /24 is tried. Needs root.
//
//	in := egresstest.New(t)
//	a := in.Addr(t)                                 // a fresh address in the namespace
//	in.SetA("api.example.test", a)                  // served by the DNS server at in.DNS
//	srv := in.ServeHTTPS(t, a, "api.example.test")  // srv.Cert is what clients must see
//	cfg := in.ClientConfig("api.example.test")      // trusts in.CA
//	l, _ := in.Listen("tcp", a.String()+":8080")     // any other server, in the namespace
package egresstest

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/sandboxd/sandboxd/internal/pki"
	"github.com/sandboxd/sandboxd/internal/testenv"
)

// namePrefix starts every namespace and interface this package creates.
const namePrefix = "egt"

var (
	counter   atomic.Uint32
	sweepOnce sync.Once
)

// Internet is one such namespace. Its methods are safe for concurrent use.
type Internet struct {
	NS      string       // network namespace name
	Prefix  netip.Prefix // the /24 routed from the host into the namespace
	Gateway netip.Addr   // the host's end of the veth pair (first address of Prefix)
	DNS     netip.AddrPort
	CA      *pki.CA // issues the HTTPS servers' certificates

	hostIf string
	ns     netns.NsHandle

	mu      sync.Mutex
	next    int // last octet of the next address Addr hands out
	records map[string][]netip.Addr
	closers []func()
	queries atomic.Int64
}

// New creates an Internet for t, with its DNS server running on the Prefix's second
// address, port 53. It needs root (testenv.RequireRoot).
func New(t testing.TB) *Internet {
	t.Helper()
	testenv.RequireRoot(t, "egresstest: network namespaces")
	sweepOnce.Do(sweepStale)
	ca, err := pki.LoadOrCreateCA(t.TempDir(), "egresstest CA")
	if err != nil {
		t.Fatal(err)
	}
	n := counter.Add(1)
	pid := os.Getpid()
	in := &Internet{
		NS:      fmt.Sprintf("%s-%d-%d", namePrefix, pid, n),
		CA:      ca,
		hostIf:  fmt.Sprintf("%s%06xh%02x", namePrefix, pid&0xffffff, n&0xff),
		next:    10,
		records: map[string][]netip.Addr{},
		ns:      -1,
	}
	t.Cleanup(in.close)
	if err := in.up(pid, n); err != nil {
		t.Fatalf("egresstest: %v", err)
	}
	dns := netip.AddrPortFrom(in.Prefix.Addr().Next().Next(), 53)
	if err := in.serveDNS(dns); err != nil {
		t.Fatalf("egresstest: DNS server: %v", err)
	}
	in.DNS = dns
	return in
}

func (in *Internet) up(pid int, n uint32) error {
	peer := fmt.Sprintf("%s%06xn%02x", namePrefix, pid&0xffffff, n&0xff)
	for _, args := range [][]string{
		{"netns", "add", in.NS},
		{"link", "add", in.hostIf, "type", "veth", "peer", "name", peer, "netns", in.NS},
		{"-n", in.NS, "link", "set", peer, "name", "eth0"},
		{"-n", in.NS, "link", "set", "eth0", "up"},
		{"-n", in.NS, "link", "set", "lo", "up"},
		{"link", "set", in.hostIf, "up"},
	} {
		if err := ip(args...); err != nil {
			return err
		}
	}
	h, err := netns.GetFromName(in.NS)
	if err != nil {
		return fmt.Errorf("open namespace %s: %w", in.NS, err)
	}
	in.ns = h
	if err := in.claimPrefix(pid, n); err != nil {
		return err
	}
	in.Gateway = in.Prefix.Addr().Next()
	bits := "/" + strconv.Itoa(in.Prefix.Bits())
	for _, args := range [][]string{
		{"addr", "add", in.Gateway.String() + "/32", "dev", in.hostIf},
		{"-n", in.NS, "addr", "add", in.Gateway.Next().String() + bits, "dev", "eth0"},
		{"-n", in.NS, "route", "add", "default", "via", in.Gateway.String(), "dev", "eth0"},
	} {
		if err := ip(args...); err != nil {
			return err
		}
	}
	return nil
}

// claimPrefix routes a free /24 of 198.18.0.0/15 to the veth.
func (in *Internet) claimPrefix(pid int, n uint32) error {
	start := (pid*31 + int(n)*7) % 512
	for i := range 512 {
		k := (start + i) % 512
		p := netip.PrefixFrom(netip.AddrFrom4([4]byte{198, byte(18 + k/256), byte(k % 256), 0}), 24)
		err := ip("route", "add", p.String(), "dev", in.hostIf)
		if err == nil {
			in.Prefix = p
			return nil
		}
		if !strings.Contains(err.Error(), "File exists") {
			return err
		}
	}
	return errors.New("no free /24 in 198.18.0.0/15")
}

// close undoes New: listeners first (their sockets keep the namespace alive), then the
// veth pair (which takes the route with it) and the namespace.
func (in *Internet) close() {
	in.mu.Lock()
	closers := in.closers
	in.closers = nil
	in.mu.Unlock()
	for i := len(closers) - 1; i >= 0; i-- {
		closers[i]()
	}
	if in.ns >= 0 {
		_ = in.ns.Close()
	}
	_ = ip("link", "del", in.hostIf)
	_ = ip("netns", "del", in.NS)
}

// sweepStale removes the namespaces of test processes that died without cleaning up
// (killed by a timeout, say).
func sweepStale() {
	names, _ := filepath.Glob("/run/netns/" + namePrefix + "-*")
	for _, p := range names {
		name := filepath.Base(p)
		parts := strings.Split(name, "-")
		if len(parts) != 3 {
			continue
		}
		pid, err := strconv.Atoi(parts[1])
		if err != nil || syscall.Kill(pid, 0) == nil || pid == os.Getpid() {
			continue // alive (or not ours to judge)
		}
		n, _ := strconv.Atoi(parts[2])
		_ = ip("link", "del", fmt.Sprintf("%s%06xh%02x", namePrefix, pid&0xffffff, n&0xff))
		_ = ip("netns", "del", name)
	}
}

func ip(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Addr adds a fresh address of Prefix to the namespace and returns it.
func (in *Internet) Addr(t testing.TB) netip.Addr {
	t.Helper()
	in.mu.Lock()
	last := in.next
	in.next++
	in.mu.Unlock()
	if last > 254 {
		t.Fatal("egresstest: out of addresses")
	}
	a := in.Prefix.Addr().As4()
	a[3] = byte(last)
	addr := netip.AddrFrom4(a)
	if err := ip("-n", in.NS, "addr", "add", addr.String()+"/32", "dev", "eth0"); err != nil {
		t.Fatalf("egresstest: %v", err)
	}
	return addr
}

// Do runs f on an OS thread that has entered the namespace; sockets f creates live
// there (and keep working from any goroutine afterwards).
func (in *Internet) Do(f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- fmt.Errorf("current namespace: %w", err)
			return // still locked: the thread exits with the goroutine
		}
		defer func() { _ = orig.Close() }()
		if err := netns.Set(in.ns); err != nil {
			errc <- fmt.Errorf("enter %s: %w", in.NS, err)
			return
		}
		ferr := f()
		if err := netns.Set(orig); err == nil {
			runtime.UnlockOSThread() // back home: the thread may serve other goroutines again
		}
		errc <- ferr
	}()
	return <-errc
}

// Listen listens in the namespace; the listener is closed when the test ends.
func (in *Internet) Listen(network, addr string) (net.Listener, error) {
	var l net.Listener
	err := in.Do(func() (err error) {
		l, err = net.Listen(network, addr)
		return err
	})
	if err != nil {
		return nil, err
	}
	in.onClose(func() { _ = l.Close() })
	return l, nil
}

// ListenPacket is Listen for datagram sockets.
func (in *Internet) ListenPacket(network, addr string) (net.PacketConn, error) {
	var pc net.PacketConn
	err := in.Do(func() (err error) {
		pc, err = net.ListenPacket(network, addr)
		return err
	})
	if err != nil {
		return nil, err
	}
	in.onClose(func() { _ = pc.Close() })
	return pc, nil
}

func (in *Internet) onClose(f func()) {
	in.mu.Lock()
	in.closers = append(in.closers, f)
	in.mu.Unlock()
}

// Resolver resolves through the Internet's DNS server only.
func (in *Internet) Resolver() *net.Resolver {
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, in.DNS.String())
	}}
}

// Server is an HTTPS server in the Internet.
type Server struct {
	Addr  netip.AddrPort
	Cert  *x509.Certificate // the certificate it presents
	conns atomic.Int64
}

// Conns is how many TCP connections the server has accepted.
func (s *Server) Conns() int64 { return s.conns.Load() }

// ServeHTTPS starts an HTTPS server on addr port 443 with a certificate for names.
// GET / answers "server=<addr> host=<Host>"; GET /zero?n=N answers N zero bytes; /echo
// answers (hashes of) the request's Authorization and X-Api-Key fields.
func (in *Internet) ServeHTTPS(t testing.TB, addr netip.Addr, names ...string) *Server {
	t.Helper()
	cert, err := in.CA.IssueServer("egresstest "+addr.String(), names, nil, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{Addr: netip.AddrPortFrom(addr, 443), Cert: cert.Leaf}
	l, err := in.Listen("tcp", s.Addr.String())
	if err != nil {
		t.Fatalf("egresstest: %v", err)
	}
	srv := &http.Server{
		Handler:   serverHandler(addr),
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}},
		ConnState: func(_ net.Conn, st http.ConnState) {
			if st == http.StateNew {
				s.conns.Add(1)
			}
		},
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          log.New(io.Discard, "", 0), // handshakes the tests break on purpose
	}
	go func() { _ = srv.ServeTLS(l, "", "") }()
	in.onClose(func() { _ = srv.Close() })
	return s
}

var zeros [64 << 10]byte

func serverHandler(addr netip.Addr) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		_, _ = fmt.Fprintf(w, "server=%s host=%s", addr, r.Host)
	})
	// /echo answers the request's method, Host, the SHA-256 of its Authorization and
	// X-Api-Key fields (EchoHash: a client learns whether a secret arrived, never the
	// secret) and its body's length (secret injection tests).
	mux.HandleFunc("/echo", func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		_, _ = fmt.Fprintf(w, "method=%s host=%s authorization=%s x-api-key=%s body=%d", r.Method, r.Host,
			EchoHash(r.Header.Get("Authorization")), EchoHash(r.Header.Get("X-Api-Key")), n)
	})
	mux.HandleFunc("GET /zero", func(w http.ResponseWriter, r *http.Request) {
		n, err := strconv.ParseInt(r.URL.Query().Get("n"), 10, 64)
		if err != nil || n < 0 {
			http.Error(w, "n: want a byte count", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
		for n > 0 {
			k := min(n, int64(len(zeros)))
			if _, err := w.Write(zeros[:k]); err != nil {
				return
			}
			n -= k
		}
	})
	return mux
}

// EchoHash is how /echo shows a header's value: the first 16 hex digits of its SHA-256.
func EchoHash(v string) string {
	sum := sha256.Sum256([]byte(v))
	return hex.EncodeToString(sum[:8])
}

// ClientConfig is a TLS client configuration trusting the Internet's CA, for name.
func (in *Internet) ClientConfig(name string) *tls.Config {
	return &tls.Config{ServerName: name, RootCAs: in.CA.Pool()}
}
