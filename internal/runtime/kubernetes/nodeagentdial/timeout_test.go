package nodeagentdial_test

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/sandboxd/sandboxd/internal/nodeagent"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes/nodeagentdial"
)

// within fails unless f returns within d; its error.
func within(t *testing.T, what string, d time.Duration, f func() error) error {
	t.Helper()
	ch := make(chan error, 1)
	start := time.Now()
	go func() { ch <- f() }()
	select {
	case err := <-ch:
		t.Logf("%s: %v after %v", what, err, time.Since(start).Round(time.Millisecond))
		return err
	case <-time.After(d):
		t.Fatalf("%s: no answer in %v", what, d)
		return nil
	}
}

// silentAgent serves an agent (serveHandler) that takes every call and answers none
// until the call is given up or the test ends: its address, joinRunner's client TLS
// configuration, and reached, which gets a value for each call that reached it (up to 16).
func silentAgent(t *testing.T) (addr string, tc *tls.Config, reached <-chan struct{}) {
	t.Helper()
	calls := make(chan struct{}, 16)
	done := make(chan struct{})
	addr, tc = serveHandler(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls <- struct{}{}
		select {
		case <-r.Context().Done():
		case <-done:
		}
	}))
	t.Cleanup(func() { close(done) })
	return addr, tc, calls
}

// TestBackendAgentTimeouts: an agent that takes the call and never answers fails
// Checkpoint after Options.CheckpointTimeout and DeleteCheckpoint after DeleteTimeout
// (here short), even when the caller's context has no deadline.
func TestBackendAgentTimeouts(t *testing.T) {
	addr, tc, reached := silentAgent(t)
	c, err := nodeagent.NewClient(addr, tc)
	if err != nil {
		t.Fatal(err)
	}
	a := nodeagentdial.BackendAgent(c, "node-1", nodeagentdial.Options{RunnerID: joinRunner, CheckpointTimeout: 300 * time.Millisecond, DeleteTimeout: 200 * time.Millisecond})
	ctx := context.Background() // no deadline of the caller's
	err = within(t, "checkpoint", 10*time.Second, func() error { _, err := a.Checkpoint(ctx, joinReq(false)); return err })
	if connect.CodeOf(nodeagentdial.Cause(err)) != connect.CodeDeadlineExceeded || !errors.Is(err, runtime.ErrNodeAgentUnavailable) {
		t.Errorf("checkpoint of a silent agent: %v, want DeadlineExceeded", err)
	}
	err = within(t, "delete", 10*time.Second, func() error { return a.DeleteCheckpoint(ctx, "c-00000000-00000000000000000000") })
	if connect.CodeOf(nodeagentdial.Cause(err)) != connect.CodeDeadlineExceeded || !errors.Is(err, runtime.ErrNodeAgentUnavailable) {
		t.Errorf("delete at a silent agent: %v, want DeadlineExceeded", err)
	}
	if len(reached) != 2 {
		t.Errorf("%d calls reached the agent, want 2", len(reached))
	}
	if nodeagentdial.DefaultCheckpointTimeout <= nodeagent.DefaultCheckpointTimeout {
		t.Errorf("the runner's checkpoint bound %v is not above the agent's %v", nodeagentdial.DefaultCheckpointTimeout, nodeagent.DefaultCheckpointTimeout)
	}
}

// TestClientHandshakeTimeout: an address that accepts TCP and never speaks TLS fails a
// call after the client's TLSHandshakeTimeout, not at the call's (long) deadline.
func TestClientHandshakeTimeout(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c) // held open, never answered
			mu.Unlock()
		}
	}()
	_, tc := serveHandler(t, http.NotFoundHandler())
	c, err := nodeagent.NewClientWith(ln.Addr().String(), tc, nodeagent.ClientOptions{TLSHandshakeTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	a := nodeagentdial.BackendAgent(c, "node-1", nodeagentdial.Options{RunnerID: joinRunner, CheckpointTimeout: time.Minute})
	err = within(t, "checkpoint", 10*time.Second, func() error { _, err := a.Checkpoint(context.Background(), joinReq(false)); return err })
	if err == nil || !strings.Contains(nodeagentdial.Cause(err).Error(), "handshake timeout") || !errors.Is(err, runtime.ErrNodeAgentUnavailable) {
		t.Errorf("silent TLS peer: %v, want a TLS handshake timeout", err)
	}
}

// freezer forwards TCP to target until frozen, then drops everything both ways (a peer
// that vanished without a FIN or RST: a node powered off, a dropped route).
type freezer struct {
	ln     net.Listener
	frozen atomic.Bool
}

func newFreezer(t *testing.T, target string) *freezer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &freezer{ln: ln}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", target)
			if err != nil {
				_ = c.Close()
				continue
			}
			t.Cleanup(func() { _ = c.Close(); _ = u.Close() })
			go f.pipe(u, c)
			go f.pipe(c, u)
		}
	}()
	return f
}

func (f *freezer) pipe(dst io.Writer, src io.Reader) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !f.frozen.Load() {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// TestClientPingTimeout: when the agent's connection goes silent mid-call (frozen after
// the call reached the agent), the client's HTTP/2 PING goes unanswered and the call
// fails in about PingInterval+PingTimeout, long before its own deadline.
func TestClientPingTimeout(t *testing.T) {
	addr, tc, reached := silentAgent(t)
	f := newFreezer(t, addr)
	c, err := nodeagent.NewClientWith(f.ln.Addr().String(), tc, nodeagent.ClientOptions{PingInterval: 200 * time.Millisecond, PingTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	a := nodeagentdial.BackendAgent(c, "node-1", nodeagentdial.Options{RunnerID: joinRunner, CheckpointTimeout: time.Minute})
	go func() {
		<-reached
		f.frozen.Store(true)
	}()
	err = within(t, "checkpoint", 15*time.Second, func() error { _, err := a.Checkpoint(context.Background(), joinReq(false)); return err })
	if cause := nodeagentdial.Cause(err); err == nil || connect.CodeOf(cause) == connect.CodeDeadlineExceeded || errors.Is(cause, context.DeadlineExceeded) || !errors.Is(err, runtime.ErrNodeAgentUnavailable) {
		t.Errorf("call over a frozen connection: %v, want the connection's failure", err)
	}
	if !f.frozen.Load() {
		t.Errorf("the call failed before it reached the agent: %v", err)
	}
}
