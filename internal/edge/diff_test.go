package edge

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// The differential test of the fast path's parsing against net/http's server: the same
// bytes go into the fast path's request reading, strict check and request writing (the
// code serveH1 runs) and into an http.Server whose handler is the net/http path's
// httputil.ReverseProxy with rewrite; both must accept the same requests and forward
// the same ones (method, target, Host, header fields, body).
//
// The fast path is deliberately stricter than net/http in four ways, which RFC 9112
// allows and which it answers with 400: an obs-fold line (§5.2: reject or replace),
// both Content-Length and Transfer-Encoding (§6.1), a duplicated Content-Length even of
// one value (§6.3 lets a recipient reject), and Transfer-Encoding in HTTP/1.0 (§6.1).
// Everywhere else the decisions must be equal.

// forwarded is a request as the sandbox gets it, normalised for comparison.
type forwarded struct {
	Method, Target, Host, Body string
	Header                     http.Header
}

func (f forwarded) String() string {
	var b strings.Builder
	b.WriteString(f.Method + " " + f.Target + " Host=" + f.Host + " body=" + strings.ReplaceAll(f.Body, "\r\n", "\\r\\n") + "\n")
	_ = f.Header.Write(&b)
	return b.String()
}

func normalise(method, target, host string, h http.Header, body []byte) forwarded {
	out := http.Header{}
	for k, vs := range h {
		if k == "Content-Length" || k == "User-Agent" && len(vs) == 1 && vs[0] == "" {
			continue // the framing is compared as the body; net/http's proxy adds an empty UA
		}
		out[k] = vs
	}
	return forwarded{method, target, host, string(body), out}
}

const diffClientIP = "192.0.2.1"

var diffRoute = Route{SandboxID: sbxA, Org: "org", Port: 8080, Kind: KindHTTPS, Auth: AuthToken,
	Backend: netip.MustParseAddrPort("127.0.0.1:1")}

// fastPath runs the bytes through the fast path's reading as serveH1 does and returns
// the requests it forwards and how it stopped: "eof", "incomplete" (a body ended
// early), "handover" (to net/http, which serves the rest), or "reject: why".
func fastPath(in []byte) ([]forwarded, string) {
	e := &Edge{srv: &http.Server{MaxHeaderBytes: 64 << 10}}
	h := &h1conn{e: e}
	h.rec.r = bytes.NewReader(in)
	h.br = bufio.NewReaderSize(&h.rec, h1ReadBuffer)
	var out []forwarded
	for {
		if _, err := h.br.Peek(1); err != nil {
			return out, "eof"
		}
		req, err := h.readRequest()
		if err != nil {
			return out, "handover" // net/http answers what it cannot parse
		}
		if why := h.strict(req); why != "" {
			return out, "reject: " + why
		}
		if !plain(req) {
			return out, "handover"
		}
		var w bytes.Buffer
		bw := bufio.NewWriter(&w)
		writeRequestHead(bw, req, diffRoute, diffClientIP)
		if req.ContentLength > 0 {
			if _, err := io.CopyN(bw, req.Body, req.ContentLength); err != nil {
				return out, "incomplete"
			}
		}
		_ = bw.Flush()
		// What the sandbox reads: parsed back by a plain HTTP/1.1 reader.
		fr, err := http.ReadRequest(bufio.NewReader(&w))
		if err != nil {
			return out, "unparsable forward: " + err.Error()
		}
		body, err := io.ReadAll(fr.Body)
		if err != nil {
			return out, "unparsable forward body: " + err.Error()
		}
		fr.Header.Del("Host")
		out = append(out, normalise(fr.Method, fr.RequestURI, fr.Host, fr.Header, body))
		if w.Len() != 0 {
			return out, "forward longer than one request"
		}
		if req.Close {
			return out, "eof"
		}
	}
}

// netHTTP serves the bytes with an http.Server and the net/http path's reverse proxy,
// recording what the proxy would send to the sandbox.
func netHTTP(t testing.TB, in []byte) []forwarded {
	var (
		mu  sync.Mutex
		out []forwarded
	)
	rp := &httputil.ReverseProxy{
		Rewrite: rewrite,
		Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
			var body []byte
			if r.Body != nil {
				b, err := io.ReadAll(r.Body)
				if err != nil {
					return nil, err
				}
				body = b
			}
			mu.Lock()
			out = append(out, normalise(r.Method, r.URL.RequestURI(), r.Host, r.Header.Clone(), body))
			mu.Unlock()
			return &http.Response{StatusCode: 200, Header: http.Header{}, Body: http.NoBody, ContentLength: 0, Request: r}, nil
		}),
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, _ error) { w.WriteHeader(http.StatusBadGateway) },
		ErrorLog:     nil,
	}
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			rp.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), routeKey{}, diffRoute)))
		}),
		MaxHeaderBytes: 64 << 10,
		ErrorLog:       discardLog,
	}
	c := &memConn{r: bytes.NewReader(in), closed: make(chan struct{})}
	ln := &oneConnListener{c: c}
	go func() { _ = srv.Serve(ln) }()
	select {
	case <-c.closed:
	case <-time.After(5 * time.Second):
		t.Fatalf("net/http did not finish with %q", in)
	}
	_ = srv.Close()
	mu.Lock()
	defer mu.Unlock()
	return out
}

var discardLog = log.New(io.Discard, "", 0)

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// memConn is a connection that reads the given bytes and then EOF.
type memConn struct {
	r      *bytes.Reader
	once   sync.Once
	closed chan struct{}
}

func (c *memConn) Read(p []byte) (int, error)  { return c.r.Read(p) }
func (c *memConn) Write(p []byte) (int, error) { return len(p), nil }
func (c *memConn) Close() error                { c.once.Do(func() { close(c.closed) }); return nil }
func (c *memConn) LocalAddr() net.Addr         { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 443} }
func (c *memConn) RemoteAddr() net.Addr {
	return &net.TCPAddr{IP: net.ParseIP(diffClientIP), Port: 40000}
}
func (c *memConn) SetDeadline(time.Time) error      { return nil }
func (c *memConn) SetReadDeadline(time.Time) error  { return nil }
func (c *memConn) SetWriteDeadline(time.Time) error { return nil }

type oneConnListener struct {
	mu   sync.Mutex
	c    *memConn
	done chan struct{}
}

func (l *oneConnListener) Accept() (net.Conn, error) {
	l.mu.Lock()
	c := l.c
	l.c = nil
	l.mu.Unlock()
	if c != nil {
		l.done = c.closed
		return c, nil
	}
	<-l.done // one connection: done when it is
	return nil, net.ErrClosed
}
func (l *oneConnListener) Close() error   { return nil }
func (l *oneConnListener) Addr() net.Addr { return &net.TCPAddr{} }

// deliberate reports whether why is one of the fast path's documented extra refusals,
// checked on the bytes themselves.
func deliberate(why string, in []byte) bool {
	lower := strings.ToLower(string(in))
	switch why {
	case "reject: obs-fold line":
		return bytes.Contains(in, []byte("\n ")) || bytes.Contains(in, []byte("\n\t"))
	case "reject: both Content-Length and Transfer-Encoding":
		return strings.Contains(lower, "content-length") && strings.Contains(lower, "transfer-encoding")
	case "reject: more than one Content-Length":
		return strings.Count(lower, "content-length") > 1
	case "reject: Transfer-Encoding in an HTTP/1.0 request":
		return strings.Contains(lower, "transfer-encoding") && strings.Contains(lower, "http/1.0")
	}
	return false
}

// diffSeeds are the attack cases and their ordinary neighbours.
var diffSeeds = []string{
	"GET / HTTP/1.1\r\nHost: h\r\n\r\n",
	"GET /a?b=1 HTTP/1.1\r\nHost: h\r\nX-A: 1\r\nx-a: 2\r\nCookie: a=1\r\n\r\nGET /2 HTTP/1.1\r\nHost: h\r\n\r\n",
	"POST /p HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nhelloGET /after HTTP/1.1\r\nHost: h\r\n\r\n",
	"POST /p HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nhel",
	// names that are not tokens
	"GET / HTTP/1.1\r\nHost: h\r\nFoo Bar: x\r\n\r\n",
	"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding : chunked\r\nContent-Length: 35\r\n\r\n0\r\n\r\nGET /hidden HTTP/1.1\r\nHost: h\r\n\r\n",
	"POST / HTTP/1.1\r\nHost: h\r\nContent-Length : 5\r\n\r\nhello",
	"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 30\r\nFoo Bar: x\r\n\r\nGET /hidden HTTP/1.1\r\nHost: h\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: h\r\nAuthorization : Bearer key\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: h\r\nCookie : __Host-sandboxd=s\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: h\r\n: empty\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: h\r\nX(: y\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: h\r\nX\x00: y\r\n\r\n",
	// obs-fold, bare CR, NUL, control characters
	"GET / HTTP/1.1\r\nHost: h\r\nX-A: 1\r\n Transfer-Encoding: chunked\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: h\r\nX-A: 1\r\n\tmore\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: h\r\nX-A: 1\rContent-Length: 5\r\n\r\nhello",
	"GET / HTTP/1.1\r\nHost: h\r\nX-A: a\x00b\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: h\r\nX-A: a\x7fb\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: h\r\nX-A: a\x01b\r\n\r\n",
	"GET /\x00 HTTP/1.1\r\nHost: h\r\n\r\n",
	"GET / HTTP/1.1\nHost: h\nX-A: lf only\n\n",
	"GET / HTTP/1.1\r\nHost: h\r\nX-A: \xff\xfeobs-text\r\n\r\n",
	// framing
	"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello",
	"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
	"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5, 5\r\n\r\nhello",
	"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: +5\r\n\r\nhello",
	"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: -1\r\n\r\n",
	"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 0x5\r\n\r\nhello",
	"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
	"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n",
	"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
	"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
	"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n",
	"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
	"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: xchunked\r\n\r\n0\r\n\r\n",
	"POST / HTTP/1.0\r\nHost: h\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\nabc",
	"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n",
	// Host
	"GET / HTTP/1.1\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: h\r\nHost: other\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: h h\r\n\r\n",
	"GET http://other/ HTTP/1.1\r\nHost: h\r\n\r\n",
	// forwarding fields and credentials
	"GET / HTTP/1.1\r\nHost: h\r\nX-Real-IP: 1.1.1.1\r\nTrue-Client-IP: 1.1.1.1\r\nX-Original-URL: /admin\r\nX-Rewrite-URL: /admin\r\n" +
		"X-Forwarded-Port: 1\r\nX-Forwarded-Host: evil\r\nX-Forwarded-For: 6.6.6.6\r\nX-Forwarded-Proto: http\r\nForwarded: for=x\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: h\r\nauthorization: bearer key\r\ncookie: a=1; __Host-sandboxd=s; b=2\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: h\r\nCookie: __Host-sandboxd =s; a=1\r\nCookie: __host-SANDBOXD=t\r\n\r\n",
	// hop-by-hop
	"GET / HTTP/1.1\r\nHost: h\r\nConnection: X-A, close\r\nX-A: 1\r\nTe: trailers\r\n\r\nGET /never HTTP/1.1\r\nHost: h\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\n\r\n",
	"GET / HTTP/1.0\r\nHost: h\r\n\r\n",
	"GET / HTTP/2.0\r\nHost: h\r\n\r\n",
	"G@T / HTTP/1.1\r\nHost: h\r\n\r\n",
	"GET  / HTTP/1.1\r\nHost: h\r\n\r\n",
	"GET / HTTP/1.1 \r\nHost: h\r\n\r\n",
}

func FuzzH1Differential(f *testing.F) {
	for _, s := range diffSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		fast, end := fastPath(in)
		slow := netHTTP(t, in)
		switch {
		case strings.HasPrefix(end, "unparsable") || strings.HasPrefix(end, "forward longer"):
			t.Fatalf("%q: the fast path forwarded what no server reads as one request: %s", in, end)
		case end == "handover":
			// net/http serves the request that stopped the fast path and the rest.
			if len(slow) < len(fast) || !slices.EqualFunc(fast, slow[:len(fast)], sameForward) {
				t.Fatalf("%q: before the hand-over the fast path forwarded\n%v\nnet/http\n%v", in, fast, slow)
			}
		case strings.HasPrefix(end, "reject"):
			if len(slow) < len(fast) || !slices.EqualFunc(fast, slow[:len(fast)], sameForward) {
				t.Fatalf("%q: the fast path forwarded\n%v\nnet/http\n%v", in, fast, slow)
			}
			if len(slow) > len(fast) && !deliberate(end, in) {
				t.Fatalf("%q: the fast path refused (%s) what net/http forwards:\n%v", in, end, slow[len(fast):])
			}
		default: // eof, incomplete
			if !slices.EqualFunc(fast, slow, sameForward) {
				t.Fatalf("%q (%s): the fast path forwarded\n%v\nnet/http\n%v", in, end, fast, slow)
			}
		}
	})
}

func sameForward(a, b forwarded) bool { return a.String() == b.String() }

// TestDiffSeedsDecide pins the decisions on the attack seeds, so that the differential
// test cannot pass by both sides accepting them: neither path forwards anything.
func TestDiffSeedsDecide(t *testing.T) {
	for _, in := range attackSeeds {
		fast, end := fastPath([]byte(in))
		if len(fast) != 0 || !strings.HasPrefix(end, "reject") && end != "handover" {
			t.Errorf("%q: fast path %s after %d requests, want a refusal before any", in, end, len(fast))
		}
		if slow := netHTTP(t, []byte(in)); end == "handover" && len(slow) != 0 {
			t.Errorf("%q: net/http forwarded %v", in, slow)
		}
	}
	fast, end := fastPath([]byte(spoofSeed))
	if end != "eof" || len(fast) != 1 {
		t.Fatalf("forwarding fields: %s, %d requests", end, len(fast))
	}
	for k := range fast[0].Header {
		if k != "X-Forwarded-For" && k != "X-Forwarded-Host" && k != "X-Forwarded-Proto" {
			t.Errorf("forwarded %s: %q", k, fast[0].Header[k])
		}
	}
	if h := fast[0].Header; h.Get("X-Forwarded-For") != diffClientIP || h.Get("X-Forwarded-Host") != "h" || h.Get("X-Forwarded-Proto") != "https" {
		t.Errorf("forwarding fields set: %q", h)
	}
	for _, in := range credentialSeeds {
		fast, end := fastPath([]byte(in))
		if end != "eof" || len(fast) != 1 {
			t.Fatalf("%q: %s, %d requests", in, end, len(fast))
		}
		if fast[0].Header["Authorization"] != nil || containsFold(strings.Join(fast[0].Header["Cookie"], ";"), sessionCookie) {
			t.Errorf("%q: credentials forwarded: %q", in, fast[0].Header)
		}
		if c := strings.Join(fast[0].Header["Cookie"], ";"); !strings.Contains(c, "a=1") {
			t.Errorf("%q: the workload's own cookies lost: %q", in, c)
		}
	}
}

// attackSeeds are refused by both paths; credentialSeeds and spoofSeed are forwarded
// without the credentials and forwarding fields.
var (
	attackSeeds = []string{
		"GET / HTTP/1.1\r\nHost: h\r\nFoo Bar: x\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding : chunked\r\nContent-Length: 35\r\n\r\n0\r\n\r\nGET /hidden HTTP/1.1\r\nHost: h\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: h\r\nContent-Length : 5\r\n\r\nhello",
		"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 30\r\nFoo Bar: x\r\n\r\nGET /hidden HTTP/1.1\r\nHost: h\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: h\r\nAuthorization : Bearer key\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: h\r\nCookie : __Host-sandboxd=s\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: h\r\nX-A: 1\r\n Transfer-Encoding: chunked\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: h\r\nX-A: 1\rContent-Length: 5\r\n\r\nhello",
		"GET / HTTP/1.1\r\nHost: h\r\nX-A: a\x00b\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello",
		"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
		"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
		"POST / HTTP/1.0\r\nHost: h\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\nabc",
		"GET / HTTP/1.1\r\nHost: h\r\nHost: other\r\n\r\n",
		"GET / HTTP/1.1\r\n\r\n",
	}
	spoofSeed = "GET / HTTP/1.1\r\nHost: h\r\nX-Real-IP: 1.1.1.1\r\nTrue-Client-IP: 1.1.1.1\r\nX-Original-URL: /admin\r\nX-Rewrite-URL: /admin\r\n" +
		"X-Forwarded-Port: 1\r\nX-Forwarded-Host: evil\r\nX-Forwarded-For: 6.6.6.6\r\nX-Forwarded-Proto: http\r\nForwarded: for=x\r\n" +
		"X-Forwarded-Server: evil\r\nX-Client-IP: 1.1.1.1\r\nCF-Connecting-IP: 1.1.1.1\r\n\r\n"
	credentialSeeds = []string{
		"GET / HTTP/1.1\r\nHost: h\r\nauthorization: bearer key\r\ncookie: a=1; __Host-sandboxd=s; b=2\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: h\r\nAUTHORIZATION: Bearer key\r\nCookie: __Host-sandboxd =s; a=1\r\nCookie: __host-SANDBOXD=t\r\n\r\n",
	}
)

func init() {
	diffSeeds = append(diffSeeds, attackSeeds...)
	diffSeeds = append(diffSeeds, credentialSeeds...)
	diffSeeds = append(diffSeeds, spoofSeed)
}
