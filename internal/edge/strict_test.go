package edge

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// Tests of the edge's strictness against request smuggling and header spoofing, on the
// running edge (the differential test, diff_test.go, covers the parsing itself).

// withHost puts host where a seed says "Host: h".
func withHost(seed, host string) string {
	return strings.ReplaceAll(seed, "Host: h\r\n", "Host: "+host+"\r\n")
}

// readUntilClosed reads what is left on the connection; it fails the test unless the
// edge closes it within a few seconds.
func (r *rawH1) readUntilClosed() string {
	r.t.Helper()
	_ = r.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	b, err := io.ReadAll(r.br)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		r.t.Fatalf("the edge kept the connection open (read %q)", b)
	}
	return string(b)
}

func TestH1RefusesAmbiguousRequests(t *testing.T) {
	te := startEdge(t, nil)
	var hits atomic.Int32
	host := strings.TrimPrefix(te.httpRoute(t, sbxA, 8080, AuthOpen, 0, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		_, _ = io.Copy(io.Discard, r.Body)
	})), "https://")
	for _, seed := range attackSeeds {
		r := te.rawH1(t, host)
		r.send(withHost(seed, host))
		res, body := r.read(http.MethodPost) //nolint:bodyclose // read closes the body
		want := http.StatusBadRequest
		if strings.Contains(seed, "gzip, chunked") || strings.Count(seed, "Transfer-Encoding: chunked") == 2 {
			want = http.StatusNotImplemented // net/http's answer to a coding it does not know
		}
		if res.StatusCode != want {
			t.Errorf("%q: %s %q, want %d", seed, res.Status, body, want)
		}
		if rest := r.readUntilClosed(); rest != "" {
			t.Errorf("%q: after the refusal the edge sent %q", seed, rest)
		}
	}
	if n := hits.Load(); n != 0 {
		t.Errorf("the sandbox got %d of the refused requests", n)
	}
}

func TestMalformedChunkedBodyNeverReachesTheSandbox(t *testing.T) {
	te := startEdge(t, nil)
	var hits atomic.Int32
	host := strings.TrimPrefix(te.httpRoute(t, sbxA, 8080, AuthOpen, 0, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		b, _ := io.ReadAll(r.Body)
		_, _ = fmt.Fprintf(w, "len=%d te=%q body=%s", r.ContentLength, r.TransferEncoding, b)
	})), "https://")
	head := "POST / HTTP/1.1\r\nHost: " + host + "\r\nTransfer-Encoding: chunked\r\n\r\n"
	for _, body := range []string{
		"zz\r\nhello\r\n0\r\n\r\n",                 // chunk size not hex
		"5\r\nhelloXX0\r\n\r\n",                    // no CRLF after the data
		"5\r\nhel",                                 // cut off
		"0\r\nFoo Bar: x\r\n\r\n",                  // trailer name not a token
		"-5\r\nhello\r\n0\r\n\r\n",                 // negative size
		"ffffffffffffffffff\r\nhello\r\n0\r\n\r\n", // overflowing size
	} {
		r := te.rawH1(t, host)
		r.send(head + body)
		if body == "5\r\nhel" {
			_ = r.c.CloseWrite()
		}
		res, msg := r.read(http.MethodPost) //nolint:bodyclose // read closes the body
		if res.StatusCode != http.StatusBadRequest {
			t.Errorf("chunked body %q: %s %q, want 400", body, res.Status, msg)
		}
		r.readUntilClosed()
	}
	if n := hits.Load(); n != 0 {
		t.Errorf("the sandbox got %d requests with malformed bodies", n)
	}
	// A good one goes on, small enough to get a Content-Length.
	r := te.rawH1(t, host)
	r.send(head + "5\r\nhello\r\n0\r\n\r\n")
	res, msg := r.read(http.MethodPost) //nolint:bodyclose // read closes the body
	if res.StatusCode != http.StatusOK || msg != `len=5 te=[] body=hello` {
		t.Errorf("good chunked body: %s %q", res.Status, msg)
	}
}

// A body that stops arriving costs a sandbox connection for a bounded time only, on
// the fast path (Content-Length) and on net/http's (chunked).
func TestStalledBodyReleasesTheSandbox(t *testing.T) {
	const idle = 500 * time.Millisecond
	te := startEdge(t, func(c *Config) { c.HandshakeTimeout = idle })
	var opened, closed atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		switch s {
		case http.StateNew:
			opened.Add(1)
		case http.StateClosed, http.StateHijacked:
			closed.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	te.rm.add(Route{SandboxID: sbxA, Org: "o", Port: 8080, Kind: KindHTTPS, Auth: AuthOpen, Backend: addrPort(t, srv.Listener.Addr())})
	host := Host(8080, sbxA, testRunner, testDomain)
	// 3000 bytes announced, 2000 sent: more than the edge buffers, so the head goes on.
	for _, tc := range []struct{ name, req string }{
		{"Content-Length", "POST / HTTP/1.1\r\nHost: " + host + "\r\nContent-Length: 30000\r\n\r\n" + strings.Repeat("a", 20000)},
		{"chunked", "POST / HTTP/1.1\r\nHost: " + host + "\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n"},
	} {
		r := te.rawH1(t, host)
		start := time.Now()
		r.send(tc.req)
		rest := r.readUntilClosed()
		if d := time.Since(start); d > 4*idle {
			t.Errorf("%s: a stalled body held the connection for %s", tc.name, d)
		}
		if tc.name == "chunked" && !strings.HasPrefix(rest, "HTTP/1.1 400") { // prefetched: nothing went on
			t.Errorf("%s: got %q, want 400", tc.name, rest)
		}
	}
	deadline := time.Now().Add(3 * time.Second)
	for closed.Load() != opened.Load() && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if o, c := opened.Load(), closed.Load(); o != 1 || c != 1 {
		t.Errorf("sandbox connections: %d opened, %d closed; want the one the stalled upload used closed, none for the chunked one", o, c)
	}
}

// rawBackend is a sandbox port speaking HTTP/1.1 by hand: answer gets the n-th request
// (from 1) over all connections and writes its response.
func rawBackend(t *testing.T, answer func(n int, req *http.Request, w io.Writer)) (net.Addr, *atomic.Int32) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var n atomic.Int32
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					_, _ = io.Copy(io.Discard, req.Body)
					answer(int(n.Add(1)), req, c)
				}
			}()
		}
	}()
	return ln.Addr(), &n
}

func TestUnexpected101IsNotReplayed(t *testing.T) {
	te := startEdge(t, nil)
	addr, n := rawBackend(t, func(i int, _ *http.Request, w io.Writer) {
		if i == 1 {
			_, _ = io.WriteString(w, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
			return
		}
		_, _ = io.WriteString(w, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: Upgrade\r\n\r\n")
	})
	te.rm.add(Route{SandboxID: sbxA, Org: "o", Port: 8080, Kind: KindHTTPS, Auth: AuthOpen, Backend: addrPort(t, addr)})
	host := Host(8080, sbxA, testRunner, testDomain)
	r := te.rawH1(t, host)
	r.send("GET /1 HTTP/1.1\r\nHost: " + host + "\r\n\r\n")
	if res, body := r.read(http.MethodGet); res.StatusCode != http.StatusOK { //nolint:bodyclose // read closes the body
		t.Fatalf("first GET: %s %q", res.Status, body)
	}
	r.send("GET /2 HTTP/1.1\r\nHost: " + host + "\r\n\r\n")                           // on the pooled connection
	if res, body := r.read(http.MethodGet); res.StatusCode != http.StatusBadGateway { //nolint:bodyclose // read closes the body
		t.Errorf("GET answered 101: %s %q, want 502", res.Status, body)
	}
	time.Sleep(100 * time.Millisecond)
	if got := n.Load(); got != 2 {
		t.Errorf("the sandbox got %d requests, want 2: a request it answered was sent again", got)
	}
}

func TestForwardingFieldsAndCredentialsNeverReachTheSandbox(t *testing.T) {
	te := startEdge(t, func(c *Config) { c.Authorize = loginAuthorizer })
	base := te.httpRoute(t, sbxA, 8080, AuthToken, 0, dump)
	spoof := []string{
		"X-Real-IP", "True-Client-IP", "X-Original-URL", "X-Rewrite-URL", "X-Forwarded-Port",
		"X-Forwarded-Host", "X-Forwarded-For", "X-Forwarded-Proto", "Forwarded", "X-Forwarded-Server",
		"X-Client-IP", "CF-Connecting-IP", "X-Original-Host",
	}
	for _, proto := range []string{"http/1.1", "h2"} {
		for _, auth := range []string{"Bearer key-a", "bearer key-a", "BEARER key-a"} {
			req, _ := http.NewRequest(http.MethodGet, base+"/x", nil)
			for _, k := range spoof {
				req.Header.Set(k, "6.6.6.6")
			}
			req.Header.Set("Authorization", auth)
			req.Header.Set("Cookie", "a=1; "+sessionCookie+"=forged; __host-SANDBOXD=x; b=2")
			res, err := te.client(proto).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if res.StatusCode != http.StatusOK {
				t.Fatalf("%s %q: %s %s", proto, auth, res.Status, b)
			}
			d := decodeDump(t, string(b))
			for _, k := range spoof {
				if v := d.Header.Get(k); v == "6.6.6.6" || strings.Contains(v, "6.6.6.6") {
					t.Errorf("%s: the client's %s reached the sandbox: %q", proto, k, v)
				}
			}
			if h := d.Header; h.Get("X-Forwarded-For") != "127.0.0.1" || h.Get("X-Forwarded-Proto") != "https" || h.Get("X-Forwarded-Host") != strings.TrimPrefix(base, "https://") {
				t.Errorf("%s: the edge's own forwarding fields: %q", proto, h)
			}
			if d.Header["Authorization"] != nil || containsFold(strings.Join(d.Header["Cookie"], ";"), sessionCookie) {
				t.Errorf("%s %q: credentials reached the sandbox: %q %q", proto, auth, d.Header["Authorization"], d.Header["Cookie"])
			}
			if c := strings.Join(d.Header["Cookie"], "; "); c != "a=1; b=2" {
				t.Errorf("%s: the workload's cookies: %q, want a=1; b=2", proto, c)
			}
		}
	}
}

func TestLoginNextStaysOnTheHost(t *testing.T) {
	te := startEdge(t, func(c *Config) { c.Authorize = loginAuthorizer })
	base := te.httpRoute(t, sbxA, 8080, AuthToken, 0, cookieEcho)
	for _, next := range []string{"/%09/evil.example/phish", "/%0d%0a/evil.example", "/%5Cevil.example", "//evil.example", "/%00x", "/%7F", "/%20/evil.example", "https://evil.example/"} {
		c := browser(t, te, "http/1.1")
		res, page := do(t, c, http.MethodGet, base+"/.sandboxd/login?next="+next, nil) //nolint:bodyclose // do closes
		if res.StatusCode != http.StatusOK || !strings.Contains(page, `name="next" value="/"`) {
			t.Errorf("login page for next=%s: %s, next field not /: %s", next, res.Status, page)
		}
		dec, _ := url.QueryUnescape(next)
		res, _ = do(t, c, http.MethodPost, base+"/.sandboxd/login", url.Values{"key": {"key-a"}, "next": {dec}}) //nolint:bodyclose // do closes
		if res.StatusCode != http.StatusSeeOther || res.Header.Get("Location") != "/" {
			t.Errorf("login with next=%q: %s Location %q, want 303 to /", dec, res.Status, res.Header.Get("Location"))
		}
	}
}

// A pooled connection on which the sandbox sent something while it was idle (the
// response to a request it found hidden in another) is out of step: it is never used
// again, however soon the next request comes.
func TestUnsolicitedResponseIsNeverHandedOn(t *testing.T) {
	te := startEdge(t, nil)
	addr, _ := rawBackend(t, func(i int, req *http.Request, w io.Writer) {
		_, _ = fmt.Fprintf(w, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(req.URL.Path), req.URL.Path)
		if i == 1 {
			time.Sleep(10 * time.Millisecond)
			_, _ = io.WriteString(w, "HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\nsmuggled")
		}
	})
	te.rm.add(Route{SandboxID: sbxA, Org: "o", Port: 8080, Kind: KindHTTPS, Auth: AuthOpen, Backend: addrPort(t, addr)})
	host := Host(8080, sbxA, testRunner, testDomain)
	r := te.rawH1(t, host)
	r.send("GET /first HTTP/1.1\r\nHost: " + host + "\r\n\r\n")
	if _, body := r.read(http.MethodGet); body != "/first" { //nolint:bodyclose // read closes the body
		t.Fatalf("first: %q", body)
	}
	time.Sleep(40 * time.Millisecond) // the stray response has arrived on the idle connection
	r.send("GET /second HTTP/1.1\r\nHost: " + host + "\r\n\r\n")
	if _, body := r.read(http.MethodGet); body != "/second" { //nolint:bodyclose // read closes the body
		t.Errorf("second request got %q", body)
	}
}
