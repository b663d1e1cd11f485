package kubernetes

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	corev1 "k8s.io/api/core/v1"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1/agentv1connect"
	"github.com/sandboxd/sandboxd/internal/agent"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes/gate"
)

// startTestGate runs a gate (TLS, the runner's client certificate pinned) in front of an
// agent listener with an identity; each accepted agent connection is written its number.
// It returns the gate's address and a sandbox "x" with the matching certificates.
func startTestGate(t *testing.T, ctx context.Context) (string, *sandbox) {
	t.Helper()
	dir := t.TempDir()
	client, server := gateCerts(t, dir)
	id := agent.NewIdentity("x")
	aln := agentListener(t, filepath.Join(dir, "primary.sock"), id)
	t.Cleanup(func() { aln.Close() })
	var accepted atomic.Int32
	go func() {
		for {
			c, err := aln.Accept()
			if err != nil {
				return
			}
			n := accepted.Add(1)
			go func() {
				defer c.Close()
				_, _ = c.Write([]byte{byte('0' + n)})
			}()
		}
	}()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	go func() {
		_ = gate.Serve(ctx, gate.ServeOptions{
			Listen: addr, CertFile: filepath.Join(dir, "tls.crt"), KeyFile: filepath.Join(dir, "tls.key"),
			ClientCertFile: filepath.Join(dir, "client.crt"), Upstream: filepath.Join(dir, "primary.sock"),
			DialTimeout: time.Second,
		})
	}()
	s := &sandbox{
		id: "x", spec: runtime.Spec{ID: "x", Container: runtime.Container{Image: "i"}},
		client: client, server: server.Certificate[0], ident: id,
		changed: make(chan struct{}), done: make(chan struct{}),
	}
	return addr, s
}

// gateBackend is a Backend with sandbox s whose dials go to the gate at addr, and its
// count of them.
func gateBackend(addr string, s *sandbox) (*Backend, *atomic.Int32) {
	dials := new(atomic.Int32)
	return &Backend{
		cfg: Config{Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
			dials.Add(1)
			return dialRetrying(ctx, addr)
		}},
		log:       slog.New(slog.DiscardHandler),
		sandboxes: map[string]*sandbox{s.id: s},
	}, dials
}

// TestPingKeepsConnection: the create's ping through the gate verifies one connection
// (TLS, the agent's identity) and the sandbox's first agent dial gets that connection
// instead of dialing again; later dials dial. A kept connection is for the IP it was
// made to only.
func TestPingKeepsConnection(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addr, s := startTestGate(t, ctx)
	s.pod = &corev1.Pod{Status: corev1.PodStatus{PodIP: "10.0.0.1"}}
	b, dials := gateBackend(addr, s)
	read := func() string {
		t.Helper()
		dctx, dcancel := context.WithTimeout(ctx, 5*time.Second)
		defer dcancel()
		c, err := b.DialAgent(dctx, "x", "")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		out, err := io.ReadAll(c)
		if err != nil {
			t.Fatal(err)
		}
		return string(out)
	}

	if err := b.pingUntil(ctx, s, "10.0.0.1"); err != nil {
		t.Fatal(err)
	}
	if n := dials.Load(); n != 1 {
		t.Fatalf("the ping dialed %d times, want 1", n)
	}
	if got := read(); got != "1" || dials.Load() != 1 {
		t.Errorf("first agent dial: connection %q after %d dials; want the ping's (1) without a new dial", got, dials.Load())
	}
	if got := read(); got != "2" || dials.Load() != 2 {
		t.Errorf("second agent dial: connection %q after %d dials; want a new one (2, 2 dials)", got, dials.Load())
	}

	// A connection kept for another IP (the Pod was replaced) is not handed out.
	if err := b.pingAgent(ctx, s, "10.0.0.2"); err != nil {
		t.Fatal(err)
	}
	if got := read(); got != "4" || dials.Load() != 4 {
		t.Errorf("agent dial after a ping of another IP: connection %q after %d dials; want a new one (4, 4 dials)", got, dials.Load())
	}
	b.mu.Lock()
	left := s.spare
	b.mu.Unlock()
	if left != nil {
		t.Error("a connection to another IP stayed kept")
	}
}

// TestWaitRunningHello: waitRunning pings the IP a hello named before the kubelet reports
// one; and when the kubelet then reports a different IP, the ping moves there (a hello
// IP that does not answer does not hold the create until StartTimeout).
func TestWaitRunningHello(t *testing.T) {
	for _, tc := range []struct {
		name           string
		hello, kubelet string // kubelet: the PodIP reported after the hello ("": none)
	}{
		{name: "hello before the kubelet", hello: "10.0.0.2"},
		{name: "kubelet reports a different IP", hello: "10.0.0.66", kubelet: "10.0.0.2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			addr, s := startTestGate(t, ctx)
			var mu sync.Mutex
			var dialed []string
			b := &Backend{
				cfg: Config{StartTimeout: 5 * time.Second, Dial: func(ctx context.Context, _, a string) (net.Conn, error) {
					host, _, _ := net.SplitHostPort(a)
					mu.Lock()
					dialed = append(dialed, host)
					mu.Unlock()
					if host != "10.0.0.2" { // an address that does not answer
						<-ctx.Done()
						return nil, ctx.Err()
					}
					return dialRetrying(ctx, addr)
				}},
				log:       slog.New(slog.DiscardHandler),
				sandboxes: map[string]*sandbox{"x": s},
			}
			s.pod = &corev1.Pod{}
			s.helloIP = tc.hello // as takeHello leaves it
			if tc.kubelet != "" {
				go func() {
					time.Sleep(200 * time.Millisecond)
					b.mu.Lock()
					s.pod = &corev1.Pod{Status: corev1.PodStatus{PodIP: tc.kubelet}}
					close(s.changed)
					s.changed = make(chan struct{})
					b.mu.Unlock()
				}()
			}
			start := time.Now()
			if _, err := b.waitRunning(ctx, s); err != nil {
				t.Fatal(err)
			}
			if d := time.Since(start); d > 4*time.Second {
				t.Errorf("waitRunning took %s", d)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(dialed) == 0 || dialed[0] != tc.hello || dialed[len(dialed)-1] != "10.0.0.2" {
				t.Errorf("dialed %v: want the hello's IP %s first, 10.0.0.2 last", dialed, tc.hello)
			}
			if sp := b.takeSpare(s, "10.0.0.2"); sp == nil {
				t.Error("no verified connection kept for 10.0.0.2")
			} else {
				sp.Close()
			}
		})
	}
}

// TestSpareClosedOnEnd: the ping's kept connection is closed at once when its sandbox is
// destroyed or ends (not only after spareTTL), and one kept after the end is closed.
func TestSpareClosedOnEnd(t *testing.T) {
	closed := func(c net.Conn) bool {
		_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
		_, err := c.Read(make([]byte, 1))
		return errors.Is(err, io.EOF) || errors.Is(err, io.ErrClosedPipe)
	}
	b, _ := newFakeBackend(t, Config{})
	for _, how := range []string{"destroy", "end", "kept after the end"} {
		t.Run(how, func(t *testing.T) {
			s := &sandbox{id: "sp1", pod: &corev1.Pod{}, changed: make(chan struct{}), done: make(chan struct{})}
			b.mu.Lock()
			b.sandboxes["sp1"] = s
			b.mu.Unlock()
			defer func() { b.mu.Lock(); delete(b.sandboxes, "sp1"); b.mu.Unlock() }()
			mine, peer := net.Pipe()
			defer peer.Close()
			if how != "kept after the end" {
				b.keepSpare(s, "10.0.0.1", mine)
			}
			switch how {
			case "destroy":
				if err := b.Destroy(t.Context(), "sp1"); err != nil {
					t.Fatal(err)
				}
			default:
				b.mu.Lock()
				s.pod = &corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodFailed}}
				b.evaluateLocked(s)
				b.mu.Unlock()
				if how == "kept after the end" {
					b.keepSpare(s, "10.0.0.1", mine)
				}
			}
			if !closed(peer) {
				t.Error("the kept connection is still open")
			}
		})
	}
}

// closeCounted is a dialed connection that counts its Close calls.
type closeCounted struct {
	net.Conn
	closes *atomic.Int32
}

func (c *closeCounted) Close() error {
	c.closes.Add(1)
	return c.Conn.Close()
}

// TestClaimSpareKeptOnlyOnSuccess: a warm claim's spare (claimSpare, through a real
// gate) becomes the sandbox's kept connection when the claim succeeds (keep), never when
// it fails (drop, also before its dial ended: the dialed connection is closed, not left
// open); a sandbox without an agent identity gets no dial at all.
func TestClaimSpareKeptOnlyOnSuccess(t *testing.T) {
	for _, how := range []string{"keep", "drop", "no identity"} {
		t.Run(how, func(t *testing.T) {
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			addr, s := startTestGate(t, ctx)
			if how == "no identity" {
				s.ident = nil
			}
			b, dials := gateBackend(addr, s)
			// Every dialed connection counts its Closes (the TLS connection's Close closes it).
			var closes atomic.Int32
			dial := b.cfg.Dial
			b.cfg.Dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
				c, err := dial(ctx, network, addr)
				if err != nil {
					return nil, err
				}
				return &closeCounted{Conn: c, closes: &closes}, nil
			}
			sp := b.claimSpare(ctx, s, "10.0.0.1")
			switch how {
			case "keep":
				sp.keep()
			default:
				sp.drop()
			}
			sp.drop() // after keep or drop: nothing
			if sp.done != nil {
				select {
				case <-sp.done:
				case <-time.After(5 * time.Second):
					t.Fatal("the spare's dial did not end")
				}
			}
			// The dial has ended: a dropped claim's connection is closed by now, a kept one not.
			if want := map[string]int32{"keep": 0, "drop": 1, "no identity": 0}[how]; closes.Load() != want {
				t.Errorf("%d connections closed, want %d", closes.Load(), want)
			}
			c := b.takeSpare(s, "10.0.0.1")
			if c != nil {
				defer c.Close()
			}
			switch {
			case how == "keep" && c == nil:
				t.Error("a kept claim's spare was not handed over")
			case how == "keep":
				_ = c.SetDeadline(time.Now().Add(5 * time.Second))
				if out, err := io.ReadAll(c); string(out) != "1" {
					t.Errorf("the spare reads %q, %v: want the agent's first connection", out, err)
				}
			case c != nil:
				t.Errorf("%s: a spare was kept", how)
			}
			if want := map[string]int32{"keep": 1, "drop": 1, "no identity": 0}[how]; dials.Load() != want {
				t.Errorf("%d dials, want %d", dials.Load(), want)
			}
		})
	}
}

// statusAgent is an agent that answers Status and counts the calls.
type statusAgent struct {
	agentv1connect.UnimplementedAgentServiceHandler
	calls atomic.Int32
}

func (a *statusAgent) Status(context.Context, *connect.Request[agentv1.StatusRequest]) (*connect.Response[agentv1.StatusResponse], error) {
	a.calls.Add(1)
	return connect.NewResponse(&agentv1.StatusResponse{}), nil
}

// TestPingWithoutIdentityAsksStatus: a sandbox without an agent identity (verifiedSpare
// refuses it: errNoIdentity) is pinged by a Status through the gate, and keeps no spare.
func TestPingWithoutIdentityAsksStatus(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	dir := t.TempDir()
	client, server := gateCerts(t, dir)
	a := &statusAgent{}
	mux := http.NewServeMux()
	mux.Handle(agentv1connect.NewAgentServiceHandler(a))
	srv := &http.Server{Handler: mux, Protocols: new(http.Protocols)}
	srv.Protocols.SetUnencryptedHTTP2(true)
	ln, err := net.Listen("unix", filepath.Join(dir, "primary.sock"))
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	gdial := startGate(t, ctx, dir, gate.ServeOptions{})
	var dials atomic.Int32
	s := &sandbox{
		id: "x", spec: runtime.Spec{ID: "x", Container: runtime.Container{Image: "i"}},
		client: client, server: server.Certificate[0],
		changed: make(chan struct{}), done: make(chan struct{}),
	}
	b := &Backend{
		cfg: Config{Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
			dials.Add(1)
			return gdial(ctx, network, "")
		}},
		log:       slog.New(slog.DiscardHandler),
		sandboxes: map[string]*sandbox{s.id: s},
	}
	if err := b.pingAgent(ctx, s, "10.0.0.1"); err != nil {
		t.Fatal(err)
	}
	if a.calls.Load() != 1 || dials.Load() != 1 {
		t.Errorf("the ping made %d Status calls in %d dials, want 1 in 1", a.calls.Load(), dials.Load())
	}
	if c := b.takeSpare(s, "10.0.0.1"); c != nil {
		c.Close()
		t.Error("a sandbox without an agent identity kept a spare")
	}
}
