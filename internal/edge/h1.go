package edge

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/internal/metrics/counters"
)

// The HTTP/1.1 fast path. A terminated connection that did not negotiate h2 is served
// here, in the goroutine that routed it, by a plain keep-alive loop: read a request
// (bufio + http.ReadRequest), write it to a pooled connection to the sandbox port, read
// the response (http.ReadResponse) and copy it back. net/http's server and Transport
// cost two to three goroutines and several channel hand-offs per request, a cancellable
// context, a request clone and a background read per request; this loop costs none of
// them, and the edge's CPU per keep-alive request is what its throughput is bound by.
//
// Only plain requests take it: HTTP/1.1, origin-form target, a Host header, no body or
// a Content-Length one, no Upgrade, no Expect, no Transfer-Encoding. Anything else — a
// WebSocket upgrade, a chunked upload, a malformed request, a header over
// MaxHeaderBytes — and the connection is handed, from that request on, to the edge's
// http.Server with the bytes already read replayed (replayConn), and served there as
// before, errors included. Routing, auth and the error answers are the same code
// (admit, proxyFailure) on both paths.
//
// Strictness (request smuggling): the fast path accepts exactly what a strict RFC
// 9110/9112 parser does. http.ReadRequest alone is more lenient than net/http's server
// (it keeps field names with a space, folds obs-fold lines), and a backend that reads
// such a head differently (Python's http.server stops at "Foo Bar: x") would take the
// body for a second request whose response the next client on the pooled connection
// gets. So every head is checked on its raw bytes (strict): field names tokens, values
// without control characters, no bare CR, no obs-fold, at most one Content-Length and
// not with Transfer-Encoding, one Host; a request that fails gets 400 and the
// connection closes. What goes to the sandbox is normalised: canonical names, framing
// written by the edge. A backend connection is reused only when its response was
// framed and nothing more came (and nothing arrived while it was idle), and a request
// is sent again only if the sandbox answered nothing at all. A request body must keep
// arriving: each read waits HandshakeTimeout at most, then the request and its sandbox
// connection are given up. FuzzH1Differential checks the parsing against net/http's.
//
// A client that goes away while the sandbox computes a response is noticed as net/http
// would (the connection to the sandbox is closed, so the sandbox sees it), but only once
// the response has taken watchAfter: quicker ones cost no watching. A response without
// Content-Type gets none here (net/http would sniff one).

const (
	h1ReadBuffer = 4 << 10 // the client connection's read buffer, as net/http's
	// maxDiscard is how much of an unread request body (the request was refused) is read
	// and dropped to keep the connection; more, and the connection is closed.
	maxDiscard = 256 << 10
	// watchAfter: a request whose response headers take longer gets its client watched.
	watchAfter = 200 * time.Millisecond
)

// aLongTimeAgo is a deadline that ends a blocked read at once.
var aLongTimeAgo = time.Unix(1, 0)

// h1conn is one client connection on the fast path.
type h1conn struct {
	e        *Edge
	c        *conn
	tc       *tls.Conn
	rec      recorder
	br       *bufio.Reader
	snap     []byte // the bytes buffered when the current request began
	head     []byte // scratch for strict
	clientIP string // for X-Forwarded-For
	local    localResponse
	watcher  clientWatch
}

// clientWatch reads from the client while a slow response is awaited, and closes the
// sandbox connection if the client closes.
type clientWatch struct {
	timer  *time.Timer   // runs watchClient after watchAfter
	exited chan struct{} // watchClient is done
	mu     sync.Mutex
	bc     *backendConn
	over   bool // the response came: stop watching
	gone   bool // the client went away
}

// watchFor arms the watch for the request in flight to bc.
func (h *h1conn) watchFor(bc *backendConn) {
	w := &h.watcher
	w.mu.Lock()
	w.bc, w.over, w.gone = bc, false, false
	w.mu.Unlock()
	if w.timer == nil {
		w.exited = make(chan struct{}, 1)
		w.timer = time.AfterFunc(watchAfter, h.watchClient)
	} else {
		w.timer.Reset(watchAfter)
	}
}

// unwatch ends the watch, waiting for watchClient if it runs; true if the client went away.
func (h *h1conn) unwatch() (gone bool) {
	w := &h.watcher
	if w.timer.Stop() {
		return false // never ran
	}
	w.mu.Lock()
	w.over = true
	_ = h.tc.SetReadDeadline(aLongTimeAgo) // ends watchClient's read; the loop sets the next
	w.mu.Unlock()
	<-w.exited
	return w.gone
}

// watchClient waits for the client to send or close. Data (a pipelined request) stays in
// br for the loop; a close or error closes the sandbox connection, failing the wait for
// its response.
func (h *h1conn) watchClient() {
	w := &h.watcher
	defer func() { w.exited <- struct{}{} }()
	w.mu.Lock()
	if w.over {
		w.mu.Unlock()
		return
	}
	_ = h.tc.SetReadDeadline(time.Time{}) // the header's deadline is not the client's fault
	w.mu.Unlock()
	_, err := h.br.Peek(1)
	w.mu.Lock()
	defer w.mu.Unlock()
	if err != nil && !w.over {
		w.gone = true
		_ = w.bc.Close()
	}
}

// serveH1 serves c, whose TLS handshake (tc) is done, until either closes or a request
// goes to net/http.
func (e *Edge) serveH1(c *conn, tc *tls.Conn) {
	h := &h1conn{e: e, c: c, tc: tc}
	h.rec.r = tc
	h.br = bufio.NewReaderSize(&h.rec, h1ReadBuffer)
	if ip, _, err := net.SplitHostPort(c.RemoteAddr().String()); err == nil {
		h.clientIP = ip
	}
	wait := e.cfg.HandshakeTimeout // for the first request, as net/http's ReadHeaderTimeout
	for {
		_ = tc.SetReadDeadline(time.Now().Add(wait))
		if _, err := h.br.Peek(1); err != nil {
			break // closed by the client or by Shutdown, or idle for too long
		}
		if c.state.Swap(stateActive) == stateClosing {
			break
		}
		_ = tc.SetReadDeadline(time.Now().Add(e.cfg.HandshakeTimeout))
		req, err := h.readRequest()
		if err != nil && h.rec.err != nil {
			break // the connection failed or timed out mid-header; net/http closes too
		}
		if err == nil {
			if why := h.strict(req); why != "" {
				h.badRequest(why) // and close: the framing of what follows is unknown
				break
			}
		}
		if err != nil || !plain(req) { // net/http answers what it cannot parse
			h.handOver()
			return
		}
		if !h.serve(req) {
			break
		}
		// Idle, then check for Shutdown: it closes idle connections after it began, so
		// one of the two sees the other (see beginClose).
		c.state.Store(stateIdle)
		if e.closing() {
			break
		}
		wait = e.cfg.IdleTimeout
	}
	_ = tc.Close()
}

// readRequest reads the next request's header, recording what it reads so that the
// request can still go to net/http as it came.
func (h *h1conn) readRequest() (*http.Request, error) {
	buffered, _ := h.br.Peek(h.br.Buffered())
	h.snap = append(h.snap[:0], buffered...)
	h.rec.start(h.e.srv.MaxHeaderBytes + h1ReadBuffer)
	req, err := http.ReadRequest(h.br)
	h.rec.stop()
	return req, err
}

// strict checks the head http.ReadRequest just parsed as a strict RFC 9112 parser
// would, on the raw bytes: http.ReadRequest alone accepts field names with a space
// ("Transfer-Encoding : chunked", which net/http's server refuses only later and which
// Python's http.server takes for the end of the header) and folds obs-fold lines. ""
// when the request may go on, else why it gets 400.
func (h *h1conn) strict(req *http.Request) string {
	// The head is what ReadRequest consumed: the bytes buffered before it began (snap)
	// and those it read, less what is still buffered (the body, a pipelined request).
	all := h.rec.buf
	if len(h.snap) > 0 {
		h.head = append(append(h.head[:0], h.snap...), h.rec.buf...)
		all = h.head
	}
	return checkRequest(req, all[:len(all)-h.br.Buffered()])
}

// checkRequest is strict's check of req, parsed from head: one framing, no ambiguity.
func checkRequest(req *http.Request, head []byte) string {
	cl, te, why := checkHead(head)
	switch {
	case why != "":
		return why
	case cl > 1:
		return "more than one Content-Length"
	case cl > 0 && te > 0:
		return "both Content-Length and Transfer-Encoding" // RFC 9112 §6.1: no guessing
	case te > 0 && !req.ProtoAtLeast(1, 1):
		return "Transfer-Encoding in an HTTP/1.0 request"
	case len(req.Header["Host"]) > 1:
		return "more than one Host"
	}
	return ""
}

// checkHead checks a request head (request line, field lines, the empty line) line by
// line: no bare CR, no control characters, no obs-fold, every field name a token and
// every value field-content (RFC 9110 §5.1, §5.5); LF alone ends a line, as net/http
// and RFC 9112 §2.2 allow. It counts the Content-Length and Transfer-Encoding lines.
func checkHead(head []byte) (cl, te int, why string) {
	first := true
	for len(head) > 0 {
		i := bytes.IndexByte(head, '\n')
		if i < 0 {
			return cl, te, "unterminated line"
		}
		line := head[:i]
		head = head[i+1:]
		if n := len(line); n > 0 && line[n-1] == '\r' {
			line = line[:n-1]
		}
		if first {
			first = false
			for _, c := range line {
				if ctl[c] || c == '\t' {
					return cl, te, "control character in the request line"
				}
			}
			continue
		}
		if len(line) == 0 {
			break // the end of the header
		}
		if line[0] == ' ' || line[0] == '\t' {
			return cl, te, "obs-fold line"
		}
		colon := bytes.IndexByte(line, ':')
		if colon <= 0 || !isToken(line[:colon]) {
			return cl, te, "invalid header name"
		}
		for _, c := range line[colon+1:] {
			if ctl[c] {
				return cl, te, "invalid header value"
			}
		}
		switch name := line[:colon]; {
		case len(name) == len("Content-Length") && asciiEqualFold(name, "Content-Length"):
			cl++
		case len(name) == len("Transfer-Encoding") && asciiEqualFold(name, "Transfer-Encoding"):
			te++
		}
	}
	return cl, te, ""
}

func asciiEqualFold(b []byte, s string) bool {
	for i := range b {
		if b[i]|0x20 != s[i]|0x20 {
			return false
		}
	}
	return true
}

// isToken reports whether b is an RFC 9110 token (tchar: ALPHA DIGIT and !#$%&'*+-.^_`|~).
func isToken(b []byte) bool {
	for _, c := range b {
		if !tchar[c] {
			return false
		}
	}
	return len(b) > 0
}

func isTokenString(s string) bool {
	for i := 0; i < len(s); i++ {
		if !tchar[s[i]] {
			return false
		}
	}
	return s != ""
}

// ctl: the bytes a field value may not contain (RFC 9110 §5.5: CTLs but HTAB, DEL;
// obs-text, 0x80 and up, is allowed, as net/http does).
var ctl = func() (t [256]bool) {
	for c := range 0x20 {
		t[c] = c != '\t'
	}
	t[0x7f] = true
	return t
}()

var tchar = func() (t [256]bool) {
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for c := 'a'; c <= 'z'; c++ {
		t[c], t[c-'a'+'A'] = true, true
	}
	for _, c := range "!#$%&'*+-.^_`|~" {
		t[c] = true
	}
	return t
}()

// badRequest answers 400 with why, and the connection closes: as net/http answers a
// request it cannot parse.
func (h *h1conn) badRequest(why string) {
	counters.EdgeRequest(http.StatusBadRequest)
	cw := getWriter(h.tc)
	defer putWriter(cw)
	body := "400 Bad Request: " + why
	_, _ = cw.WriteString("HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n")
	writeContentLength(cw, int64(len(body)))
	_, _ = cw.WriteString("\r\n")
	n, _ := cw.WriteString(body)
	counters.EdgeHTTPSOut.Add(int64(n))
	_ = cw.Flush()
}

// handOver gives the connection to the http.Server, replaying what the current request's
// reading consumed.
func (h *h1conn) handOver() {
	pending := append(h.snap, h.rec.buf...)
	h.rec.buf = nil
	rc := &replayConn{Conn: h.tc, pending: pending}
	if !h.e.q.deliver(rc) {
		_ = rc.Close()
	}
}

// plain reports whether the fast path serves req, see above.
func plain(req *http.Request) bool {
	return req.ProtoMajor == 1 && req.ProtoMinor == 1 &&
		len(req.RequestURI) > 0 && req.RequestURI[0] == '/' && plainPath(req.RequestURI) &&
		validHost(req.Host) &&
		len(req.TransferEncoding) == 0 && req.ContentLength >= 0 &&
		req.Header["Upgrade"] == nil && req.Header["Expect"] == nil && req.Header["Trailer"] == nil &&
		req.Method != http.MethodConnect && plainQuery(req.URL.RawQuery)
}

// validHost accepts the host[:port] characters an endpoint name can have; net/http
// judges the rest.
func validHost(h string) bool {
	if h == "" {
		return false
	}
	for i := 0; i < len(h); i++ {
		c := h[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '.' || c == ':') {
			return false
		}
	}
	return true
}

// plainPath reports whether net/http's proxy would send the path of target (up to a
// '?') as it is: it re-escapes one with bytes outside pchar ('"', '{', '|', non-ASCII
// ...); others go to net/http, so that the sandbox sees the same target either way.
func plainPath(target string) bool {
	for i := 0; i < len(target) && target[i] != '?'; i++ {
		if !pathChar[target[i]] {
			return false
		}
	}
	return true
}

var pathChar = func() (t [256]bool) {
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for c := 'a'; c <= 'z'; c++ {
		t[c], t[c-'a'+'A'] = true, true
	}
	for _, c := range "-._~!$&'()*+,;=:@[]/%" {
		t[c] = true
	}
	return t
}()

// plainQuery reports whether httputil.ReverseProxy would pass the query on unchanged (it
// re-encodes one with semicolons or bad escapes); others go to net/http.
func plainQuery(s string) bool {
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case ';':
			return false
		case '%':
			if i+2 >= len(s) || !isHex(s[i+1]) || !isHex(s[i+2]) {
				return false
			}
		}
	}
	return strings.Count(s, "&") < 10000
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

// serve answers one plain request; false: close the connection.
func (h *h1conn) serve(req *http.Request) bool {
	h.local = localResponse{}
	rt, ok := h.e.admit(&h.local, req)
	if !ok {
		return h.answer(req, &h.local)
	}
	rt, done, err := h.e.wake(req.Context(), rt)
	if err != nil {
		http.Error(&h.local, unavailableMsg, http.StatusServiceUnavailable)
		return h.answer(req, &h.local)
	}
	defer done()
	if req.ContentLength > 0 {
		// A body is bounded as its header is: each read must bring something within
		// HandshakeTimeout, or the request (and its sandbox connection) is given up.
		req.Body = &idleBody{ReadCloser: req.Body, c: h.tc, idle: h.e.cfg.HandshakeTimeout}
	}
	return h.forward(req, rt)
}

// forward proxies req to rt's backend and its response back.
func (h *h1conn) forward(req *http.Request, rt Route) bool {
	var (
		bc   *backendConn
		resp *http.Response
		cw   *bufio.Writer
	)
	for attempt := 0; ; attempt++ {
		var (
			reused bool
			err    error
		)
		bc, reused, err = h.e.backendConn(rt.Backend, attempt > 0)
		if err == nil {
			cw, resp, err = h.roundTrip(bc, req, rt)
			if err == nil {
				break
			}
			_ = bc.Close()
			if cw != nil {
				putWriter(cw)
			}
		}
		var ce clientError
		if errors.As(err, &ce) {
			return false // the client's body broke off; nobody to answer
		}
		// A reused connection the sandbox closed as the request went out: once more on a
		// newly dialled one, when the request can be sent again (net/http's rule, too),
		// and never once the sandbox answered anything: it may have processed it.
		var ae answeredError
		if reused && attempt == 0 && replayable(req) && !isTimeout(err) && !errors.As(err, &ae) {
			continue
		}
		code, msg := h.e.proxyFailure(rt, err)
		h.local = localResponse{}
		http.Error(&h.local, msg, code)
		return h.answer(req, &h.local)
	}
	keep := !req.Close && !h.e.closing()
	counters.EdgeRequest(resp.StatusCode)
	reusable, err := copyResponse(cw, resp, req, bc.br, !keep)
	putWriter(cw)
	if err != nil || !reusable {
		_ = bc.Close()
	} else {
		_ = resp.Body.Close() // read to its end: returns at once
		h.e.backends.put(rt.Backend, bc)
	}
	return err == nil && keep && drained(req.Body)
}

// clientError is a failure reading the client's request body.
type clientError struct{ error }

func (e clientError) Unwrap() error { return e.error }

// clientBody is a request body as it goes to the sandbox: its bytes are counted
// (cwsandbox_edge_bytes_total) and its failures are clientErrors.
type clientBody struct{ io.Reader }

// answeredError is a failure after the sandbox began to answer (a malformed response, a
// 101 nobody asked for): the request may have been processed, so it is never sent again.
type answeredError struct{ error }

func (e answeredError) Unwrap() error { return e.error }

// idleBody is a request body each read of which must bring data within idle.
type idleBody struct {
	io.ReadCloser
	c    net.Conn
	idle time.Duration
}

func (b *idleBody) Read(p []byte) (int, error) {
	_ = b.c.SetReadDeadline(time.Now().Add(b.idle))
	return b.ReadCloser.Read(p)
}

func (b clientBody) Read(p []byte) (int, error) {
	n, err := b.Reader.Read(p)
	counters.EdgeHTTPSIn.Add(int64(n))
	if err != nil && !errors.Is(err, io.EOF) {
		err = clientError{err}
	}
	return n, err
}

func replayable(req *http.Request) bool {
	if req.ContentLength != 0 {
		return false
	}
	switch req.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true
	}
	return req.Header["Idempotency-Key"] != nil || req.Header["X-Idempotency-Key"] != nil
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// roundTrip sends req to bc and reads the response headers within rt's timeout; 1xx
// responses on the way are passed to the client at once, hence the client writer it
// returns (nil if there was none yet), which the response is to follow on.
func (h *h1conn) roundTrip(bc *backendConn, req *http.Request, rt Route) (*bufio.Writer, *http.Response, error) {
	writeRequestHead(bc.bw, req, rt, h.clientIP)
	if req.ContentLength > 0 {
		if _, err := io.Copy(bc.bw, clientBody{req.Body}); err != nil {
			return nil, nil, err
		}
	}
	if err := bc.bw.Flush(); err != nil {
		return nil, nil, err
	}
	_ = bc.SetReadDeadline(time.Now().Add(rt.timeout()))
	h.watchFor(bc)
	resp, cw, err := h.readResponse(bc, req)
	if h.unwatch() {
		return cw, nil, clientError{errors.New("the client went away")}
	}
	return cw, resp, err
}

// readResponse reads the response headers, passing 1xx responses to the client.
func (h *h1conn) readResponse(bc *backendConn, req *http.Request) (*http.Response, *bufio.Writer, error) {
	var cw *bufio.Writer
	if _, err := bc.br.Peek(1); err != nil {
		return nil, nil, err // nothing came: the connection was closed, or the timeout
	}
	for {
		resp, err := http.ReadResponse(bc.br, req)
		if err != nil {
			return nil, cw, answeredError{err}
		}
		if resp.StatusCode >= 200 {
			_ = bc.SetReadDeadline(time.Time{})
			if cw == nil {
				cw = getWriter(h.tc)
			}
			return resp, cw, nil
		}
		_ = resp.Body.Close() // a 1xx has none
		if resp.StatusCode == http.StatusSwitchingProtocols {
			return nil, cw, answeredError{errors.New("101 Switching Protocols to a request without Upgrade")}
		}
		if cw == nil {
			cw = getWriter(h.tc)
		}
		writeStatusLine(cw, resp.StatusCode)
		writeHeaders(cw, resp.Header, skipResponseHeader)
		_, _ = cw.WriteString("\r\n")
		if err := cw.Flush(); err != nil {
			return nil, cw, clientError{err}
		}
	}
}

// writeRequestHead writes req's request line and header for the sandbox, as
// httputil.ReverseProxy with rewrite (proxy.go) would: hop-by-hop fields and the
// client's forwarding fields (forwardingHeader) dropped, X-Forwarded-For, -Host and
// -Proto set, a TOKEN route's credentials (bearer key, share token, session cookie)
// removed, no User-Agent added, the framing (Content-Length) the edge's own. Field names
// are canonical: strict let only tokens through, and http.ReadRequest canonicalizes those.
func writeRequestHead(w *bufio.Writer, req *http.Request, rt Route, clientIP string) {
	_, _ = w.WriteString(req.Method)
	_ = w.WriteByte(' ')
	_, _ = w.WriteString(req.RequestURI)
	_, _ = w.WriteString(" HTTP/1.1\r\nHost: ")
	_, _ = w.WriteString(req.Host)
	_, _ = w.WriteString("\r\n")
	token := rt.Auth == AuthToken
	cookies := req.Header["Cookie"]
	session := token && hasSession(cookies) // an OPEN endpoint owns the name
	writeHeaders(w, req.Header, func(k string) bool {
		return skipRequestHeader(k) || token && (k == "Authorization" || k == ShareTokenHeader) || session && k == "Cookie"
	})
	if session {
		for _, v := range withoutSession(cookies) {
			_, _ = w.WriteString("Cookie: ")
			_, _ = w.WriteString(v)
			_, _ = w.WriteString("\r\n")
		}
	}
	if te := req.Header["Te"]; te != nil && tokenListed(te, "trailers") {
		_, _ = w.WriteString("Te: trailers\r\n")
	}
	if clientIP != "" {
		_, _ = w.WriteString("X-Forwarded-For: ")
		_, _ = w.WriteString(clientIP)
		_, _ = w.WriteString("\r\n")
	}
	_, _ = w.WriteString("X-Forwarded-Host: ")
	_, _ = w.WriteString(req.Host)
	_, _ = w.WriteString("\r\nX-Forwarded-Proto: https\r\n")
	if req.ContentLength > 0 || req.Header["Content-Length"] != nil {
		writeContentLength(w, req.ContentLength)
	}
	_, _ = w.WriteString("\r\n")
}

// Hop-by-hop header fields (RFC 9110 §7.6.1), as httputil.ReverseProxy drops them.
func hopByHop(k string) bool {
	switch k {
	case "Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization",
		"Te", "Trailer", "Transfer-Encoding", "Upgrade":
		return true
	}
	return false
}

func skipRequestHeader(k string) bool {
	switch k {
	case "Host", "Content-Length":
		return true
	}
	return hopByHop(k) || forwardingHeader(k)
}

// forwardingHeader reports whether k (canonical) is a field by which a proxy tells the
// server about the client or the original request. A client sets none of them that the
// sandbox may believe: the edge drops them all, on both paths (here and rewrite in
// proxy.go), and sets X-Forwarded-For (the client's address), X-Forwarded-Host (the
// Host) and X-Forwarded-Proto (https) from its own knowledge. Dropped:
//
//	Forwarded, X-Forwarded-* (For, Host, Proto, Port, Server, Prefix, Scheme, Ssl, Uri,
//	Path ...), X-Original-Forwarded-For, X-Real-Ip, True-Client-Ip, X-Client-Ip,
//	Client-Ip, X-Cluster-Client-Ip, Cf-Connecting-Ip, Fastly-Client-Ip, X-Proxyuser-Ip,
//	X-Envoy-External-Address, X-Envoy-Original-Path, X-Original-Url, X-Original-Uri,
//	X-Rewrite-Url, X-Original-Host, X-Host, X-Url-Scheme, Front-End-Https
func forwardingHeader(k string) bool {
	if strings.HasPrefix(k, "X-Forwarded-") {
		return true
	}
	switch k {
	case "Forwarded", "X-Original-Forwarded-For", "X-Real-Ip", "True-Client-Ip", "X-Client-Ip",
		"Client-Ip", "X-Cluster-Client-Ip", "Cf-Connecting-Ip", "Fastly-Client-Ip", "X-Proxyuser-Ip",
		"X-Envoy-External-Address", "X-Envoy-Original-Path", "X-Original-Url", "X-Original-Uri",
		"X-Rewrite-Url", "X-Original-Host", "X-Host", "X-Url-Scheme", "Front-End-Https":
		return true
	}
	return false
}

// skipResponseHeader: the edge frames responses itself, and a field name that is not a
// token (a sandbox's "Content-Length : 5") never reaches a client.
func skipResponseHeader(k string) bool {
	return k == "Content-Length" || hopByHop(k) || !isTokenString(k)
}

func skipTrailer(k string) bool { return hopByHop(k) || !isTokenString(k) }

// writeHeaders writes h's fields but those skip names and those h's Connection lists.
func writeHeaders(w *bufio.Writer, h http.Header, skip func(string) bool) {
	listed := h["Connection"]
	for k, vs := range h {
		if skip(k) || listed != nil && tokenListed(listed, k) {
			continue
		}
		for _, v := range vs {
			_, _ = w.WriteString(k)
			_, _ = w.WriteString(": ")
			_, _ = w.WriteString(v)
			_, _ = w.WriteString("\r\n")
		}
	}
}

// tokenListed reports whether the comma-separated lists vs name tok (case-insensitively).
func tokenListed(vs []string, tok string) bool {
	for _, v := range vs {
		for v != "" {
			var t string
			t, v, _ = strings.Cut(v, ",")
			if strings.EqualFold(strings.TrimSpace(t), tok) {
				return true
			}
		}
	}
	return false
}

// The formatting writers below append to w.AvailableBuffer: no allocation.

func writeStatusLine(w *bufio.Writer, code int) {
	s := append(w.AvailableBuffer(), "HTTP/1.1 "...)
	s = strconv.AppendInt(s, int64(code), 10)
	s = append(s, ' ')
	if text := http.StatusText(code); text != "" {
		s = append(s, text...)
	} else { // as net/http writes an unknown code
		s = append(s, "status code "...)
		s = strconv.AppendInt(s, int64(code), 10)
	}
	s = append(s, "\r\n"...)
	_, _ = w.Write(s)
}

func writeContentLength(w *bufio.Writer, n int64) {
	s := append(w.AvailableBuffer(), "Content-Length: "...)
	s = strconv.AppendInt(s, n, 10)
	s = append(s, "\r\n"...)
	_, _ = w.Write(s)
}

// writeDate adds the Date a proxy must add to a response without one (RFC 9110 §6.6.1).
func writeDate(w *bufio.Writer, h http.Header) {
	if h["Date"] != nil {
		return
	}
	s := append(w.AvailableBuffer(), "Date: "...)
	s = time.Now().UTC().AppendFormat(s, http.TimeFormat)
	s = append(s, "\r\n"...)
	_, _ = w.Write(s)
}

// copyResponse writes resp to the client and copies its body, flushing whenever the
// sandbox has sent nothing more yet, so that streams (server-sent events) go out at once
// and a small response goes out in one TLS record. reusable: the backend connection is
// at the start of the next response.
func copyResponse(cw *bufio.Writer, resp *http.Response, req *http.Request, src *bufio.Reader, closeAfter bool) (reusable bool, err error) {
	noBody := req.Method == http.MethodHead || resp.StatusCode == http.StatusNoContent || resp.StatusCode == http.StatusNotModified
	chunked := !noBody && resp.ContentLength < 0
	writeStatusLine(cw, resp.StatusCode)
	writeHeaders(cw, resp.Header, skipResponseHeader)
	writeDate(cw, resp.Header)
	switch {
	case noBody:
		if cl := resp.Header["Content-Length"]; len(cl) > 0 && resp.StatusCode != http.StatusNoContent {
			_, _ = cw.WriteString("Content-Length: ")
			_, _ = cw.WriteString(cl[0])
			_, _ = cw.WriteString("\r\n")
		}
	case chunked:
		if len(resp.Trailer) > 0 {
			keys := make([]string, 0, len(resp.Trailer))
			for k := range resp.Trailer {
				if !skipTrailer(k) {
					keys = append(keys, k)
				}
			}
			_, _ = cw.WriteString("Trailer: " + strings.Join(keys, ", ") + "\r\n")
		}
		_, _ = cw.WriteString("Transfer-Encoding: chunked\r\n")
	default:
		writeContentLength(cw, resp.ContentLength)
	}
	if closeAfter {
		_, _ = cw.WriteString("Connection: close\r\n")
	}
	_, _ = cw.WriteString("\r\n")
	if !noBody {
		if err := copyBody(cw, resp.Body, resp.ContentLength, src, chunked); err != nil {
			return false, err
		}
		if chunked {
			_, _ = cw.WriteString("0\r\n")
			writeHeaders(cw, resp.Trailer, skipTrailer)
			_, _ = cw.WriteString("\r\n")
		}
	}
	if err := cw.Flush(); err != nil {
		return false, clientError{err}
	}
	// A body that ended at the connection's close (neither length nor chunks) leaves
	// nothing to reuse; nor does a sandbox that sent more than the response.
	framed := noBody || resp.ContentLength >= 0 || len(resp.TransferEncoding) > 0
	return framed && !resp.Close && src.Buffered() == 0, nil
}

// copyBody copies a response body of n bytes (-1: unknown; chunked says how it goes out)
// to the client, flushing whenever the next read may wait for the sandbox: src, where
// body reads from, has nothing buffered.
func copyBody(cw *bufio.Writer, body io.Reader, n int64, src *bufio.Reader, chunked bool) error {
	bufp := buffers.Get().(*[]byte)
	defer buffers.Put(bufp)
	buf := *bufp
	for {
		k, err := body.Read(buf)
		if k > 0 {
			if chunked {
				s := strconv.AppendInt(cw.AvailableBuffer(), int64(k), 16)
				s = append(s, "\r\n"...)
				_, _ = cw.Write(s)
			}
			_, _ = cw.Write(buf[:k])
			counters.EdgeHTTPSOut.Add(int64(k))
			if chunked {
				_, _ = cw.WriteString("\r\n")
			}
			n -= int64(k)
		}
		if errors.Is(err, io.EOF) || n == 0 {
			return nil
		}
		if err != nil {
			return err
		}
		if src.Buffered() == 0 && cw.Buffered() > 0 {
			if err := cw.Flush(); err != nil {
				return clientError{err}
			}
		}
	}
}

// answer writes a response the edge made itself (local) to req.
func (h *h1conn) answer(req *http.Request, local *localResponse) bool {
	counters.EdgeRequest(local.code)
	keep := !req.Close && !h.e.closing() && req.ContentLength <= maxDiscard
	cw := getWriter(h.tc)
	defer putWriter(cw)
	writeStatusLine(cw, local.code)
	writeHeaders(cw, local.header, func(k string) bool { return k == "Content-Length" })
	writeDate(cw, local.header)
	writeContentLength(cw, int64(local.body.Len()))
	if !keep {
		_, _ = cw.WriteString("Connection: close\r\n")
	}
	_, _ = cw.WriteString("\r\n")
	if req.Method != http.MethodHead {
		n, _ := cw.WriteString(local.body.String())
		counters.EdgeHTTPSOut.Add(int64(n)) // before the client can have it, as copyBody counts
	}
	if cw.Flush() != nil {
		return false
	}
	return keep && drained(req.Body)
}

// drained reads what is left of a request body; false if that failed or was too much.
func drained(body io.Reader) bool {
	n, err := io.CopyN(io.Discard, body, maxDiscard+1)
	return errors.Is(err, io.EOF) || err == nil && n == 0
}

// localResponse is an http.ResponseWriter for the edge's own short answers (admit's
// refusals, proxy failures) on the fast path.
type localResponse struct {
	header http.Header
	code   int
	body   strings.Builder
}

func (l *localResponse) Header() http.Header {
	if l.header == nil {
		l.header = make(http.Header)
	}
	return l.header
}

func (l *localResponse) WriteHeader(code int) {
	if l.code == 0 {
		l.code = code
	}
}

func (l *localResponse) Write(p []byte) (int, error) {
	l.WriteHeader(http.StatusOK)
	return l.body.Write(p)
}

// recorder is the fast path's reader of the TLS connection: while on, it keeps what it
// reads (for handOver) and the connection's error, up to a limit, past which reads fail
// and net/http gets the request to answer 431.
type recorder struct {
	r     io.Reader
	on    bool
	limit int
	buf   []byte
	err   error // of the connection, while on
}

var errHeaderTooLarge = errors.New("request header too large for the fast path")

func (r *recorder) start(limit int) { r.on, r.limit, r.buf, r.err = true, limit, r.buf[:0], nil }
func (r *recorder) stop()           { r.on = false }

func (r *recorder) Read(p []byte) (int, error) {
	if !r.on {
		return r.r.Read(p)
	}
	if len(r.buf) >= r.limit {
		return 0, errHeaderTooLarge
	}
	n, err := r.r.Read(p[:min(len(p), r.limit-len(r.buf))])
	r.buf = append(r.buf, p[:n]...)
	r.err = err
	return n, err
}

// The client writers are pooled: a connection needs one only while it answers.
var writers sync.Pool

func getWriter(w io.Writer) *bufio.Writer {
	if bw, ok := writers.Get().(*bufio.Writer); ok {
		bw.Reset(w)
		return bw
	}
	return bufio.NewWriterSize(w, 4<<10)
}

func putWriter(bw *bufio.Writer) {
	bw.Reset(nil)
	writers.Put(bw)
}
