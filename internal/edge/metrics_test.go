package edge

import (
	"bytes"
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/sandboxd/sandboxd/internal/metrics/counters"
	"github.com/sandboxd/sandboxd/internal/pki"
)

// TestEdgeRequestMetrics: each request an HTTPS endpoint answers counts once by status
// class, over HTTP/1.1 (the fast path) and HTTP/2 (net/http), whether the sandbox
// answered or the edge refused it (an unknown endpoint's 404).
func TestEdgeRequestMetrics(t *testing.T) {
	te := startEdge(t, nil)
	url := te.httpRoute(t, sbxA, 8080, AuthOpen, 0, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/teapot" {
			w.WriteHeader(http.StatusTeapot)
			return
		}
		_, _ = io.WriteString(w, "ok")
	}))
	key := func(class string) string {
		return `cwsandbox_edge_requests_total{code_class="` + class + `",kind="https"}`
	}
	for _, proto := range []string{"http/1.1", "h2"} {
		c := te.client(proto)
		for _, tc := range []struct {
			url   string
			class string
		}{
			{url + "/", "2xx"},
			{url + "/teapot", "4xx"},
			{"https://" + Host(8081, sbxA, testRunner, testDomain) + "/", "4xx"}, // no such endpoint: the edge's 404
		} {
			before := counters.Values()
			resp, err := c.Get(tc.url)
			if err != nil {
				t.Fatalf("%s %s: %v", proto, tc.url, err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if got := resp.Proto; proto == "h2" && got != "HTTP/2.0" {
				t.Fatalf("%s: got %s", proto, got)
			}
			after := counters.Values()
			for _, class := range []string{"2xx", "4xx", "5xx"} {
				want := 0.0
				if class == tc.class {
					want = 1
				}
				if got := after[key(class)] - before[key(class)]; got != want {
					t.Errorf("%s %s (%d): %s grew by %v, want %v", proto, tc.url, resp.StatusCode, class, got, want)
				}
			}
		}
	}
}

// TestEdgePassthroughMetrics: a TLS_PASSTHROUGH connection counts once, spliced when the
// sandbox's port answers, unreachable when it does not.
func TestEdgePassthroughMetrics(t *testing.T) {
	te := startEdge(t, nil)
	host := Host(5432, sbxB, testRunner, testDomain)
	w := startWorkload(t, host)
	te.rm.add(Route{SandboxID: sbxB, Port: 5432, Kind: KindPassthrough, Backend: addrPort(t, w.addr)})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr()
	ln.Close()
	te.rm.add(Route{SandboxID: sbxB, Port: 5433, Kind: KindPassthrough, Backend: addrPort(t, closed)})
	key := func(r string) string { return `cwsandbox_edge_passthrough_connections_total{result="` + r + `"}` }

	before := counters.Values()
	c, err := te.dialTLS(host, w.ca.Pool())
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if _, err := te.dialTLS(Host(5433, sbxB, testRunner, testDomain), te.roots); err == nil {
		t.Fatal("handshake succeeded with nothing listening behind the edge")
	}
	after := counters.Values()
	for r, want := range map[string]float64{counters.EdgeSpliced: 1, counters.EdgeUnreachable: 1} {
		if got := after[key(r)] - before[key(r)]; got != want {
			t.Errorf("%s grew by %v, want %v", r, got, want)
		}
	}
}

// bytesKey is a series of cwsandbox_edge_bytes_total.
func bytesKey(kind, dir string) string {
	return `cwsandbox_edge_bytes_total{direction="` + dir + `",kind="` + kind + `"}`
}

// TestEdgeHTTPSBytesMetrics: an HTTPS endpoint's request and response body bytes count
// exactly, as read from the client and written to it, over HTTP/1.1 (the fast path) and
// HTTP/2 (net/http), the edge's own answers included; nothing counts as passthrough.
func TestEdgeHTTPSBytesMetrics(t *testing.T) {
	te := startEdge(t, nil)
	const respSize = 200<<10 + 7 // more than one copy buffer
	url := te.httpRoute(t, sbxA, 8080, AuthOpen, 0, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, err := io.Copy(io.Discard, r.Body)
		if err != nil || n != 100<<10+3 {
			http.Error(w, "short body", http.StatusBadRequest)
			return
		}
		_, _ = w.Write(bytes.Repeat([]byte("x"), respSize))
	}))
	notFound := int64(len(notFoundBody) + 1) // http.Error adds a newline
	for _, proto := range []string{"http/1.1", "h2"} {
		c := te.client(proto)
		for _, tc := range []struct {
			name    string
			url     string
			body    int64
			in, out int64
		}{
			{"proxied", url + "/upload", 100<<10 + 3, 100<<10 + 3, respSize},
			{"no such endpoint", "https://" + Host(8081, sbxA, testRunner, testDomain) + "/", 10, 0, notFound},
		} {
			before := counters.Values()
			resp, err := c.Post(tc.url, "application/octet-stream", bytes.NewReader(make([]byte, tc.body)))
			if err != nil {
				t.Fatalf("%s %s: %v", proto, tc.name, err)
			}
			n, _ := io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if n != tc.out {
				t.Fatalf("%s %s: got %d bytes (%s), want %d", proto, tc.name, n, resp.Status, tc.out)
			}
			after := counters.Values()
			for key, want := range map[string]int64{
				bytesKey(counters.EdgeKindHTTPS, counters.DirIn):        tc.in,
				bytesKey(counters.EdgeKindHTTPS, counters.DirOut):       tc.out,
				bytesKey(counters.EdgeKindPassthrough, counters.DirIn):  0,
				bytesKey(counters.EdgeKindPassthrough, counters.DirOut): 0,
			} {
				if got := after[key] - before[key]; got != float64(want) {
					t.Errorf("%s %s: %s grew by %v, want %d", proto, tc.name, key, got, want)
				}
			}
		}
	}
}

// TestEdgeWebSocketBytesMetrics: an upgraded connection's bytes count both ways: each
// message with its few bytes of framing.
func TestEdgeWebSocketBytesMetrics(t *testing.T) {
	te := startEdge(t, nil)
	url := te.httpRoute(t, sbxA, 8080, AuthOpen, 0, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer ws.CloseNow()
		for {
			typ, msg, err := ws.Read(r.Context())
			if err != nil || ws.Write(r.Context(), typ, msg) != nil {
				return
			}
		}
	}))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	before := counters.Values()
	ws, _, err := websocket.Dial(ctx, "wss"+strings.TrimPrefix(url, "https"), &websocket.DialOptions{HTTPClient: te.client("http/1.1")}) //nolint:bodyclose // the upgraded connection is ws
	if err != nil {
		t.Fatal(err)
	}
	defer ws.CloseNow()
	const size, count = 1000, 3
	for i := range count {
		if err := ws.Write(ctx, websocket.MessageBinary, make([]byte, size)); err != nil {
			t.Fatal(err)
		}
		if _, got, err := ws.Read(ctx); err != nil || len(got) != size {
			t.Fatalf("echo %d: %d bytes, %v", i, len(got), err)
		}
	}
	after := counters.Values()
	in := after[bytesKey(counters.EdgeKindHTTPS, counters.DirIn)] - before[bytesKey(counters.EdgeKindHTTPS, counters.DirIn)]
	out := after[bytesKey(counters.EdgeKindHTTPS, counters.DirOut)] - before[bytesKey(counters.EdgeKindHTTPS, counters.DirOut)]
	// Client frames are masked (8 bytes of header for 1000 bytes); the server's are not
	// (4). The last echo's write may still be counting as the client reads it.
	if in != count*(size+8) {
		t.Errorf("in grew by %v, want %d (%d masked frames of %d bytes)", in, count*(size+8), count, size)
	}
	if out < (count-1)*(size+4) || out > count*(size+4) {
		t.Errorf("out grew by %v, want %d to %d", out, (count-1)*(size+4), count*(size+4))
	}
}

// TestEdgePassthroughBytesMetrics: a TLS_PASSTHROUGH connection's bytes count exactly
// each way, the ClientHello the edge read included: what the sandbox's socket read is
// in, what it wrote is out.
func TestEdgePassthroughBytesMetrics(t *testing.T) {
	te := startEdge(t, nil)
	host := Host(5432, sbxB, testRunner, testDomain)
	ca, err := pki.LoadOrCreateCA(t.TempDir(), "workload CA")
	if err != nil {
		t.Fatal(err)
	}
	cert, err := ca.IssueServer(host, []string{host}, nil, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	type sums struct{ read, written int64 }
	server := make(chan sums, 1)
	go func() {
		raw, err := ln.Accept()
		if err != nil {
			return
		}
		rc := &rawCount{Conn: raw}
		c := tls.Server(rc, &tls.Config{Certificates: []tls.Certificate{cert}})
		_, _ = io.Copy(io.Discard, c)  // to the client's close_notify
		_, _ = io.Copy(io.Discard, rc) // and its FIN, which the edge passes on once it counted that way
		_, _ = c.Write(make([]byte, 50<<10))
		_ = c.Close()
		server <- sums{rc.read, rc.written}
	}()
	te.rm.add(Route{SandboxID: sbxB, Port: 5432, Kind: KindPassthrough, Backend: addrPort(t, ln.Addr())})

	before := counters.Values()
	c, err := te.dialTLS(host, ca.Pool())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write(make([]byte, 300<<10)); err != nil { // more than a splice chunk
		t.Fatal(err)
	}
	if err := c.CloseWrite(); err != nil { // close_notify
		t.Fatal(err)
	}
	_ = c.NetConn().(*net.TCPConn).CloseWrite()
	if n, err := io.Copy(io.Discard, c); err != nil || n != 50<<10 {
		t.Fatalf("read %d bytes (%v), want %d", n, err, 50<<10)
	}
	// The TLS EOF above is the server's close_notify, which the edge relays while its
	// copy is still under way (a clean CI run read the counter before the edge added to
	// it); the TCP EOF is the edge's half-close, passed on only after that direction
	// was counted (the server wrote only once it had read to the client's end).
	if n, err := io.Copy(io.Discard, c.NetConn()); err != nil || n != 0 {
		t.Fatalf("after close_notify: %d more bytes (%v)", n, err)
	}
	s := <-server
	after := counters.Values()
	for key, want := range map[string]int64{
		bytesKey(counters.EdgeKindPassthrough, counters.DirIn):  s.read,
		bytesKey(counters.EdgeKindPassthrough, counters.DirOut): s.written,
		bytesKey(counters.EdgeKindHTTPS, counters.DirIn):        0,
		bytesKey(counters.EdgeKindHTTPS, counters.DirOut):       0,
	} {
		if got := after[key] - before[key]; got != float64(want) {
			t.Errorf("%s grew by %v, want %d", key, got, want)
		}
	}
	if s.read < 300<<10 || s.written < 50<<10 {
		t.Errorf("the sandbox read %d and wrote %d bytes", s.read, s.written)
	}
}

// rawCount counts a connection's bytes, read and written (one goroutine at a time).
type rawCount struct {
	net.Conn
	read, written int64
}

func (c *rawCount) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.read += int64(n)
	return n, err
}

func (c *rawCount) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.written += int64(n)
	return n, err
}
