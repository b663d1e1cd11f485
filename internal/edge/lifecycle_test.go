package edge

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/sni/snitest"
)

func TestSlowClientHelloIsCutOff(t *testing.T) {
	te := startEdge(t, func(c *Config) { c.HandshakeTimeout = 200 * time.Millisecond })
	hello := snitest.ClientHello(t, &tls.Config{ServerName: Host(8080, sbxA, testRunner, testDomain)})
	c, err := net.Dial("tcp", te.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write(hello[:10]); err != nil { // and then nothing
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	start := time.Now()
	if n, err := c.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Fatalf("read %d, %v; want EOF: the edge must close a peer that stalls", n, err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("closed after %v, want about 200ms", d)
	}
}

func TestConnectionLimit(t *testing.T) {
	te := startEdge(t, func(c *Config) { c.MaxConns = 1 })
	host := Host(8080, sbxA, testRunner, testDomain)
	te.httpRoute(t, sbxA, 8080, AuthOpen, 0, echo)
	first, err := te.dialTLS(host, te.roots)
	if err != nil {
		t.Fatal(err)
	}
	// The second connection waits in the accept queue while the first holds the slot.
	raw, err := net.Dial("tcp", te.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	_ = raw.SetDeadline(time.Now().Add(300 * time.Millisecond))
	second := tls.Client(raw, &tls.Config{ServerName: host, RootCAs: te.roots})
	if err := second.Handshake(); err == nil {
		t.Fatal("a second connection was served over MaxConns = 1")
	}
	raw.Close()
	first.Close()
	third, err := te.dialTLS(host, te.roots)
	if err != nil {
		t.Fatalf("after the first closed: %v", err)
	}
	third.Close()
}

func TestShutdownWaitsForSplicedConnectionsThenCloses(t *testing.T) {
	te := startEdge(t, nil)
	host := Host(5432, sbxB, testRunner, testDomain)
	w := startWorkload(t, host)
	te.rm.add(Route{SandboxID: sbxB, Port: 5432, Kind: KindPassthrough, Backend: addrPort(t, w.addr)})
	c, err := te.dialTLS(host, w.ca.Pool())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := te.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Shutdown with a spliced connection open: %v, want the context's deadline", err)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Error("the spliced connection is still open after Shutdown")
	}
	if _, err := net.DialTimeout("tcp", te.addr, time.Second); err == nil {
		t.Error("the listener still accepts after Shutdown")
	}
	if err := te.Serve(newClosedListener()); !errors.Is(err, http.ErrServerClosed) {
		t.Errorf("Serve after Shutdown: %v, want http.ErrServerClosed", err)
	}
}

func TestShutdownLetsRequestsFinish(t *testing.T) {
	te := startEdge(t, nil)
	started := make(chan struct{})
	url := te.httpRoute(t, sbxA, 8080, AuthOpen, 0, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(started)
		time.Sleep(200 * time.Millisecond)
		_, _ = io.WriteString(w, "finished")
	}))
	type result struct {
		body string
		err  error
	}
	done := make(chan result, 1)
	go func() {
		res, err := te.client("h2").Get(url)
		if err != nil {
			done <- result{"", err}
			return
		}
		defer res.Body.Close()
		b, err := io.ReadAll(res.Body)
		done <- result{string(b), err}
	}()
	<-started
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := te.Shutdown(ctx); err != nil {
		t.Errorf("Shutdown: %v", err)
	}
	if r := <-done; r.err != nil || r.body != "finished" {
		t.Errorf("request in flight during Shutdown: %q, %v", r.body, r.err)
	}
}

func newClosedListener() net.Listener {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	ln.Close()
	return ln
}
