package edgebench

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/edge"
	"github.com/sandboxd/sandboxd/internal/pki"
)

const (
	runnerID   = "r1"
	baseDomain = "bench.test"
	sandboxID  = "abcdefghijklmn23"
	httpPort   = 8080 // the HTTPS route
	tlsPort    = 5432 // the passthrough route
)

// target is one proxy under test: where to connect for each job.
type target struct {
	name      string
	httpsAddr string // TLS terminated, proxied to the HTTP backend
	tlsAddr   string // TLS passthrough to the TLS backend
	pid       int    // the proxy's process, for its CPU time
}

// env is what every benchmark shares: the backends, the edge and HAProxy in front of them.
type env struct {
	httpsHost, tlsHost string
	platformRoots      *x509.CertPool // verifies the edge's and HAProxy's certificate
	workloadRoots      *x509.CertPool // verifies the passthrough backend's
	targets            []target       // edge first, then haproxy
}

var (
	setupOnce sync.Once
	shared    *env
	setupErr  error
	cleanups  []func()
)

func TestMain(m *testing.M) {
	if cfg := os.Getenv(childEnv); cfg != "" {
		if err := runChild(cfg); err != nil {
			fmt.Fprintln(os.Stderr, "edge-bench child:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	code := m.Run()
	for i := len(cleanups) - 1; i >= 0; i-- {
		cleanups[i]()
	}
	os.Exit(code)
}

// setup starts everything once per process; a benchmark calls it and skips without haproxy.
func setup(b *testing.B) *env {
	b.Helper()
	if _, err := exec.LookPath("haproxy"); err != nil {
		b.Skip("haproxy not found on PATH: install it (apt-get install -y haproxy) to compare the edge with it")
	}
	setupOnce.Do(func() { shared, setupErr = newEnv() })
	if setupErr != nil {
		b.Fatal(setupErr)
	}
	return shared
}

func newEnv() (*env, error) {
	dir, err := os.MkdirTemp("", "bench-edge-")
	if err != nil {
		return nil, err
	}
	cleanups = append(cleanups, func() { os.RemoveAll(dir) })
	platform, err := pki.LoadOrCreateCA(filepath.Join(dir, "platform"), "platform CA")
	if err != nil {
		return nil, err
	}
	workload, err := pki.LoadOrCreateCA(filepath.Join(dir, "workload"), "workload CA")
	if err != nil {
		return nil, err
	}
	e := &env{
		httpsHost:     edge.Host(httpPort, sandboxID, runnerID, baseDomain),
		tlsHost:       edge.Host(tlsPort, sandboxID, runnerID, baseDomain),
		platformRoots: platform.Pool(),
		workloadRoots: workload.Pool(),
	}
	httpBackend, err := serveHTTPBackend()
	if err != nil {
		return nil, err
	}
	tlsBackend, err := serveTLSBackend(workload, e.tlsHost)
	if err != nil {
		return nil, err
	}
	ours, err := startEdge(filepath.Join(dir, "platform"), httpBackend, tlsBackend)
	if err != nil {
		return nil, err
	}
	theirs, err := startHAProxy(dir, platform, httpBackend, tlsBackend)
	if err != nil {
		return nil, err
	}
	e.targets = []target{ours, theirs}
	return e, nil
}

// body is what the HTTP backend answers: a small JSON-sized payload, so the figure is
// about proxying, not about copying bytes.
var body = []byte(`{"status":"ok","message":"hello from the sandbox","padding":"................................"}`)

func serveHTTPBackend() (netip.AddrPort, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return netip.AddrPort{}, err
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body)
	})}
	go func() { _ = srv.Serve(ln) }()
	cleanups = append(cleanups, func() { srv.Close() })
	return netip.MustParseAddrPort(ln.Addr().String()), nil
}

// serveTLSBackend is a workload with its own certificate that, once a client connects,
// writes data until the client goes away.
func serveTLSBackend(ca *pki.CA, host string) (netip.AddrPort, error) {
	cert, err := ca.IssueServer(host, []string{host}, nil, time.Hour)
	if err != nil {
		return netip.AddrPort{}, err
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}})
	if err != nil {
		return netip.AddrPort{}, err
	}
	cleanups = append(cleanups, func() { ln.Close() })
	chunk := make([]byte, 64<<10)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				for {
					if _, err := c.Write(chunk); err != nil {
						return
					}
				}
			}()
		}
	}()
	return netip.MustParseAddrPort(ln.Addr().String()), nil
}

// waitListening waits until addr accepts connections.
func waitListening(addr string, d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
		if err == nil {
			c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not listening after %v: %w", addr, d, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
