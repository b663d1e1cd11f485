package edge

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/netip"
	"net/textproto"
	"strings"
	"sync"
	"testing"
	"time"
)

// Tests of the HTTP/1.1 fast path (h1.go) and of its hand-over to net/http.

// dump answers with the request as the sandbox got it.
type dumped struct {
	Method, URI, Host, Body string
	Header                  http.Header
	TransferEncoding        []string
}

var dump = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	_ = json.NewEncoder(w).Encode(dumped{r.Method, r.RequestURI, r.Host, string(b), r.Header, r.TransferEncoding})
})

// rawH1 is an HTTP/1.1 client connection through the edge that writes requests as given.
type rawH1 struct {
	t  *testing.T
	c  *tls.Conn
	br *bufio.Reader
}

func (te *testEdge) rawH1(t *testing.T, host string) *rawH1 {
	t.Helper()
	c, err := te.dialTLS(host, te.roots, "http/1.1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	return &rawH1{t, c, bufio.NewReader(c)}
}

func (r *rawH1) send(req string) {
	r.t.Helper()
	if _, err := io.WriteString(r.c, req); err != nil {
		r.t.Fatal(err)
	}
}

// read reads a response to method and its body, past a 100 Continue.
func (r *rawH1) read(method string) (*http.Response, string) {
	r.t.Helper()
	res, err := http.ReadResponse(r.br, &http.Request{Method: method})
	if err == nil && res.StatusCode == http.StatusContinue {
		res, err = http.ReadResponse(r.br, &http.Request{Method: method})
	}
	if err != nil {
		r.t.Fatalf("read response: %v", err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		r.t.Fatalf("read body: %v", err)
	}
	return res, string(b)
}

func decodeDump(t *testing.T, body string) dumped {
	t.Helper()
	var d dumped
	if err := json.Unmarshal([]byte(body), &d); err != nil {
		t.Fatalf("backend answer %q: %v", body, err)
	}
	return d
}

func TestH1KeepAliveReusesBackendConnections(t *testing.T) {
	te := startEdge(t, nil)
	var mu sync.Mutex
	remotes := map[string]bool{}
	url := te.httpRoute(t, sbxA, 8080, AuthOpen, 0, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		remotes[r.RemoteAddr] = true
		mu.Unlock()
		_, _ = io.WriteString(w, "ok")
	}))
	c := te.client("http/1.1")
	var conns sync.Map
	for range 20 {
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
			GotConn: func(i httptrace.GotConnInfo) { conns.Store(i.Conn, true) },
		}))
		res, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusOK || string(b) != "ok" || res.Header.Get("Date") == "" {
			t.Fatalf("got %s %q (Date %q)", res.Status, b, res.Header.Get("Date"))
		}
	}
	n := 0
	conns.Range(func(any, any) bool { n++; return true })
	if n != 1 || len(remotes) != 1 {
		t.Errorf("20 requests in a row used %d client and %d backend connections, want 1 and 1", n, len(remotes))
	}
}

func TestH1RequestAsTheSandboxSeesIt(t *testing.T) {
	te := startEdge(t, nil)
	host := strings.TrimPrefix(te.httpRoute(t, sbxA, 8080, AuthOpen, 0, dump), "https://")
	r := te.rawH1(t, host)
	r.send("POST /a/b%2Fc?x=1&y=%20 HTTP/1.1\r\nHost: " + host + "\r\n" +
		"Connection: keep-alive, X-Hop\r\nX-Hop: drop me\r\nKeep-Alive: timeout=5\r\nProxy-Authorization: Basic x\r\n" +
		"Te: trailers, deflate\r\nX-Forwarded-For: 6.6.6.6\r\nForwarded: for=6.6.6.6\r\nX-Forwarded-Proto: http\r\n" +
		"X-App: one\r\nX-App: two\r\nContent-Length: 5\r\n\r\nhello")
	res, body := r.read(http.MethodPost) //nolint:bodyclose // read closes the body
	if res.StatusCode != http.StatusOK {
		t.Fatalf("%s: %s", res.Status, body)
	}
	d := decodeDump(t, body)
	if d.Method != "POST" || d.URI != "/a/b%2Fc?x=1&y=%20" || d.Host != host || d.Body != "hello" {
		t.Errorf("backend got %s %s Host %s body %q", d.Method, d.URI, d.Host, d.Body)
	}
	want := map[string]string{
		"X-Forwarded-For": "127.0.0.1", "X-Forwarded-Host": host, "X-Forwarded-Proto": "https",
		"Te": "trailers", "X-App": "one", "Content-Length": "5",
		"X-Hop": "", "Keep-Alive": "", "Proxy-Authorization": "", "Forwarded": "", "Connection": "", "User-Agent": "",
	}
	for k, v := range want {
		if got := strings.Join(d.Header[k], ","); got != v && !(k == "X-App" && got == "one,two") {
			t.Errorf("backend got %s: %q, want %q", k, got, v)
		}
	}
	if got := d.Header["X-App"]; len(got) != 2 {
		t.Errorf("X-App: %q, want both values", got)
	}
}

func TestH1ResponseFraming(t *testing.T) {
	te := startEdge(t, nil)
	host := strings.TrimPrefix(te.httpRoute(t, sbxA, 8080, AuthOpen, 0, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/chunked": // with a trailer and hop-by-hop fields to drop
			w.Header().Set("Trailer", "X-Sum")
			w.Header().Set("Connection", "X-Private")
			w.Header().Set("X-Private", "no")
			w.Header().Set("Keep-Alive", "timeout=1")
			_, _ = io.WriteString(w, "part 1, ")
			w.(http.Flusher).Flush()
			_, _ = io.WriteString(w, "part 2")
			w.Header().Set("X-Sum", "42")
		case "/no-content":
			w.WriteHeader(http.StatusNoContent)
		case "/early-hints":
			w.Header().Set("Link", "</style.css>; rel=preload")
			w.WriteHeader(http.StatusEarlyHints)
			_, _ = io.WriteString(w, "final")
		case "/until-close": // HTTP/1.0 style: the end of the body is the connection's
			conn, brw, err := http.NewResponseController(w).Hijack()
			if err != nil {
				panic(err)
			}
			_, _ = brw.WriteString("HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nto the end")
			_ = brw.Flush()
			conn.Close()
		default:
			w.Header().Set("Content-Length", "5")
			if r.Method != http.MethodHead {
				_, _ = io.WriteString(w, "fixed")
			}
		}
	})), "https://")
	r := te.rawH1(t, host)
	get := func(method, path string) (*http.Response, string) {
		r.send(method + " " + path + " HTTP/1.1\r\nHost: " + host + "\r\n\r\n")
		return r.read(method)
	}
	// All on one client connection: each response must end where the next begins.
	res, body := get("GET", "/chunked") //nolint:bodyclose // read closes the body
	if body != "part 1, part 2" || res.TransferEncoding == nil || res.Trailer.Get("X-Sum") != "42" ||
		res.Header.Get("X-Private") != "" || res.Header.Get("Keep-Alive") != "" || res.Header.Get("Connection") != "" {
		t.Errorf("chunked: %q, TE %v, trailer %v, header %v", body, res.TransferEncoding, res.Trailer, res.Header)
	}
	if res, body = get("HEAD", "/fixed"); res.StatusCode != 200 || res.ContentLength != 5 || body != "" { //nolint:bodyclose // read closes the body
		t.Errorf("HEAD: %s length %d %q", res.Status, res.ContentLength, body)
	}
	if res, body = get("GET", "/fixed"); body != "fixed" || res.ContentLength != 5 { //nolint:bodyclose // read closes the body
		t.Errorf("fixed: %q length %d", body, res.ContentLength)
	}
	if res, body = get("GET", "/no-content"); res.StatusCode != http.StatusNoContent || body != "" { //nolint:bodyclose // read closes the body
		t.Errorf("204: %s %q", res.Status, body)
	}
	// 103 first, then the answer.
	r.send("GET /early-hints HTTP/1.1\r\nHost: " + host + "\r\n\r\n")
	tp := textproto.NewReader(r.br)
	line, err := tp.ReadLine()
	if err != nil || line != "HTTP/1.1 103 Early Hints" {
		t.Fatalf("first line %q, %v; want the 103", line, err)
	}
	h, err := tp.ReadMIMEHeader()
	if err != nil || h.Get("Link") == "" {
		t.Errorf("103 header %v, %v", h, err)
	}
	if res, body = r.read("GET"); res.StatusCode != 200 || body != "final" { //nolint:bodyclose // read closes the body
		t.Errorf("after 103: %s %q", res.Status, body)
	}
	// Read until the sandbox closed, passed on chunked: the client's connection stays.
	if res, body = get("GET", "/until-close"); body != "to the end" || res.Close { //nolint:bodyclose // read closes the body
		t.Errorf("until-close: %q, close %v", body, res.Close)
	}
	if _, body = get("GET", "/fixed"); body != "fixed" { //nolint:bodyclose // read closes the body
		t.Errorf("after until-close: %q", body)
	}
}

func TestH1PipelinedRequests(t *testing.T) {
	te := startEdge(t, nil)
	host := strings.TrimPrefix(te.httpRoute(t, sbxA, 8080, AuthOpen, 0, dump), "https://")
	r := te.rawH1(t, host)
	var all string
	for i := range 3 {
		all += fmt.Sprintf("GET /%d HTTP/1.1\r\nHost: %s\r\n\r\n", i, host)
	}
	r.send(all)
	for i := range 3 {
		_, body := r.read("GET") //nolint:bodyclose // read closes the body
		if d := decodeDump(t, body); d.URI != fmt.Sprintf("/%d", i) {
			t.Errorf("response %d is for %s", i, d.URI)
		}
	}
}

// Requests the fast path does not serve go to net/http, with what was already read,
// including after plain requests on the same connection.
func TestH1HandsOverToNetHTTP(t *testing.T) {
	te := startEdge(t, nil)
	host := strings.TrimPrefix(te.httpRoute(t, sbxA, 8080, AuthOpen, 0, dump), "https://")
	for _, tc := range []struct {
		name, req string
		status    int
		check     func(dumped) bool
	}{
		{"chunked upload", "POST /up HTTP/1.1\r\nHost: " + host + "\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
			200, func(d dumped) bool { return d.Body == "hello" && d.Header.Get("X-Forwarded-Proto") == "https" }},
		{"expect continue", "PUT /up HTTP/1.1\r\nHost: " + host + "\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\nhi",
			200, func(d dumped) bool { return d.Body == "hi" }},
		{"header larger than the read buffer (still the fast path's)", "GET /big HTTP/1.1\r\nHost: " + host + "\r\nX-Big: " + strings.Repeat("b", 10<<10) + "\r\n\r\n",
			200, func(d dumped) bool { return len(d.Header.Get("X-Big")) == 10<<10 }},
		{"query ReverseProxy cleans", "GET /q?a=1;b=2 HTTP/1.1\r\nHost: " + host + "\r\n\r\n",
			200, func(d dumped) bool { return !strings.Contains(d.URI, ";") }},
		{"HTTP/1.0", "GET /old HTTP/1.0\r\nHost: " + host + "\r\n\r\n", 200, nil},
		{"header too large", "GET / HTTP/1.1\r\nHost: " + host + "\r\nX-Huge: " + strings.Repeat("h", 80<<10) + "\r\n\r\n",
			http.StatusRequestHeaderFieldsTooLarge, nil},
		{"malformed", "GET / HTTP/1.1\r\nHost: " + host + "\r\nBad Header: x\r\n\r\n", http.StatusBadRequest, nil},
		{"no Host", "GET / HTTP/1.1\r\n\r\n", http.StatusBadRequest, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := te.rawH1(t, host)
			r.send("GET /first HTTP/1.1\r\nHost: " + host + "\r\n\r\n")        // the fast path's
			if _, body := r.read("GET"); decodeDump(t, body).URI != "/first" { //nolint:bodyclose // read closes the body
				t.Fatalf("first request: %s", body)
			}
			r.send(tc.req)
			res, body := r.read("GET") //nolint:bodyclose // read closes the body
			if res.StatusCode != tc.status {
				t.Fatalf("%s: %s", res.Status, body)
			}
			if tc.check != nil && !tc.check(decodeDump(t, body)) {
				t.Errorf("backend got %s", body)
			}
			if tc.status == 200 && !res.Close {
				r.send("GET /after HTTP/1.1\r\nHost: " + host + "\r\n\r\n")
				if _, body := r.read("GET"); decodeDump(t, body).URI != "/after" { //nolint:bodyclose // read closes the body
					t.Errorf("request after the hand-over: %s", body)
				}
			}
		})
	}
}

// A sandbox closes idle keep-alive connections; the edge must not send a request into
// one of them, or must retry it if it can.
func TestH1SandboxClosesIdleConnections(t *testing.T) {
	te := startEdge(t, nil)
	srv := httptest.NewUnstartedServer(dump)
	srv.Config.IdleTimeout = 50 * time.Millisecond
	srv.Start()
	t.Cleanup(srv.Close)
	te.rm.add(Route{SandboxID: sbxA, Port: 8080, Kind: KindHTTPS, Backend: addrPort(t, srv.Listener.Addr())})
	url := "https://" + Host(8080, sbxA, testRunner, testDomain)
	c := te.client("http/1.1")
	for i := range 3 {
		res, err := c.Post(url, "text/plain", strings.NewReader("not idempotent"))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusOK || decodeDump(t, string(b)).Body != "not idempotent" {
			t.Fatalf("POST %d after the sandbox closed the idle connection: %s %s", i, res.Status, b)
		}
		time.Sleep(200 * time.Millisecond) // past the sandbox's idle timeout
	}
}

// A sandbox that closes a keep-alive connection when the next request arrives: a GET is
// sent again on a new connection.
func TestH1RetriesIdempotentRequestOnStaleConnection(t *testing.T) {
	te := startEdge(t, nil)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { // one response per connection, then close on the next request
				defer c.Close()
				br := bufio.NewReader(c)
				if _, err := http.ReadRequest(br); err != nil {
					return
				}
				_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
				_, _ = http.ReadRequest(br)
			}()
		}
	}()
	te.rm.add(Route{SandboxID: sbxA, Port: 8080, Kind: KindHTTPS, Backend: addrPort(t, ln.Addr())})
	host := Host(8080, sbxA, testRunner, testDomain)
	r := te.rawH1(t, host)
	for i := range 3 {
		r.send("GET / HTTP/1.1\r\nHost: " + host + "\r\n\r\n")
		if res, body := r.read("GET"); res.StatusCode != 200 || body != "ok" { //nolint:bodyclose // read closes the body
			t.Fatalf("GET %d: %s %q", i, res.Status, body)
		}
	}
}

func TestH1ShutdownClosesIdleAndFinishesActive(t *testing.T) {
	te := startEdge(t, nil)
	started := make(chan struct{})
	host := strings.TrimPrefix(te.httpRoute(t, sbxA, 8080, AuthOpen, 0, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			close(started)
			time.Sleep(300 * time.Millisecond)
		}
		_, _ = io.WriteString(w, "done")
	})), "https://")
	idle, active := te.rawH1(t, host), te.rawH1(t, host)
	idle.send("GET / HTTP/1.1\r\nHost: " + host + "\r\n\r\n")
	idle.read("GET") //nolint:bodyclose // read closes the body
	active.send("GET /slow HTTP/1.1\r\nHost: " + host + "\r\n\r\n")
	<-started
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	shut := make(chan error, 1)
	go func() { shut <- te.Shutdown(ctx) }()
	if _, err := idle.br.ReadByte(); err == nil {
		t.Error("the idle connection got data, want it closed")
	}
	res, body := active.read("GET") //nolint:bodyclose // read closes the body
	if body != "done" || !res.Close {
		t.Errorf("request in flight during Shutdown: %q, Connection: close %v", body, res.Close)
	}
	if err := <-shut; err != nil {
		t.Errorf("Shutdown: %v", err)
	}
}

// A client that goes away while the sandbox is still working: the sandbox sees its
// request cancelled, as with net/http, and the edge's connection is not left waiting.
func TestH1ClientGoneCancelsSandboxRequest(t *testing.T) {
	te := startEdge(t, nil)
	started, cancelled := make(chan struct{}), make(chan struct{})
	host := strings.TrimPrefix(te.httpRoute(t, sbxA, 8080, AuthOpen, 0, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(started)
		select {
		case <-r.Context().Done():
			close(cancelled)
		case <-time.After(10 * time.Second):
		}
	})), "https://")
	r := te.rawH1(t, host)
	r.send("GET /long-poll HTTP/1.1\r\nHost: " + host + "\r\n\r\n")
	<-started
	time.Sleep(2 * watchAfter)
	r.c.Close()
	select {
	case <-cancelled:
	case <-time.After(5 * time.Second):
		t.Fatal("the sandbox's request was not cancelled after the client went away")
	}
}

// The watch of a slow response's client must not get in the way, nor eat a request the
// client sends meanwhile (pipelined).
func TestH1SlowResponseWithPipelinedRequest(t *testing.T) {
	te := startEdge(t, nil)
	host := strings.TrimPrefix(te.httpRoute(t, sbxA, 8080, AuthOpen, 0, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			time.Sleep(3 * watchAfter)
		}
		_, _ = io.WriteString(w, r.URL.Path)
	})), "https://")
	r := te.rawH1(t, host)
	r.send("GET /slow HTTP/1.1\r\nHost: " + host + "\r\n\r\n")
	time.Sleep(2 * watchAfter) // the watch runs now
	r.send("GET /next HTTP/1.1\r\nHost: " + host + "\r\n\r\n")
	for _, want := range []string{"/slow", "/next"} {
		if _, body := r.read("GET"); body != want { //nolint:bodyclose // read closes the body
			t.Errorf("got %q, want %q", body, want)
		}
	}
	// And a slow one alone, then keep-alive goes on.
	for _, path := range []string{"/slow", "/after"} {
		r.send("GET " + path + " HTTP/1.1\r\nHost: " + host + "\r\n\r\n")
		if _, body := r.read("GET"); body != path { //nolint:bodyclose // read closes the body
			t.Errorf("got %q, want %q", body, path)
		}
	}
}

func TestH1ConnectionClose(t *testing.T) {
	te := startEdge(t, nil)
	host := strings.TrimPrefix(te.httpRoute(t, sbxA, 8080, AuthOpen, 0, dump), "https://")
	r := te.rawH1(t, host)
	r.send("GET /bye HTTP/1.1\r\nHost: " + host + "\r\nConnection: close\r\n\r\n")
	res, body := r.read("GET") //nolint:bodyclose // read closes the body
	if !res.Close || decodeDump(t, body).Header.Get("Connection") != "" {
		t.Errorf("Connection: close %v; the sandbox saw %s", res.Close, body)
	}
	if _, err := r.br.ReadByte(); err == nil {
		t.Error("the connection is still open after Connection: close")
	}
}

func TestBackendPoolReapsAndBounds(t *testing.T) {
	var p backendPool
	addr := netip.MustParseAddrPort("127.0.0.1:1")
	var closed []net.Conn
	conn := func() *backendConn {
		a, b := net.Pipe()
		closed = append(closed, b)
		return &backendConn{Conn: a}
	}
	for range maxIdlePerBackend + 1 {
		p.put(addr, conn())
	}
	if n := len(p.idle[addr]); n != maxIdlePerBackend {
		t.Errorf("%d idle connections kept, want at most %d", n, maxIdlePerBackend)
	}
	p.reap(time.Now().Add(backendIdleTimeout))
	if len(p.idle) != 0 {
		t.Errorf("%d backends still have idle connections after their idle timeout", len(p.idle))
	}
	for i, c := range closed { // the far ends see the close
		_ = c.SetReadDeadline(time.Now().Add(time.Second))
		if _, err := c.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
			t.Fatalf("connection %d: %v, want EOF: not closed", i, err)
		}
	}
	p.close()
	p.put(addr, conn())
	if len(p.idle) != 0 {
		t.Error("a closed pool kept a connection")
	}
}
