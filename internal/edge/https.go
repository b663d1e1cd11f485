package edge

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/internal/metrics/counters"
)

// ErrUnauthenticated is what Config.Authorize wraps when the key is not a valid key at
// all; the client gets 401 instead of 403.
var ErrUnauthenticated = errors.New("edge: invalid key")

const (
	// notFoundBody answers every request for a name without an HTTPS route, the same
	// whether the sandbox exists or not.
	notFoundBody   = "no endpoint at this address"
	misdirectedMsg = "this endpoint is TLS passthrough; connect to it directly"
)

// serveHTTP answers requests on terminated connections that net/http serves (HTTP/2, and
// HTTP/1.1 requests the fast path in h1.go hands over), routed by Host.
func (e *Edge) serveHTTP(w http.ResponseWriter, r *http.Request) {
	sw := &statusWriter{ResponseWriter: w}
	defer func() {
		code := sw.code
		if code == 0 && upgrading(r) {
			code = http.StatusSwitchingProtocols // hijacked: the proxy wrote it on the connection
		} else if code == 0 {
			code = http.StatusOK // what net/http sends for a handler that wrote nothing
		}
		counters.EdgeRequest(code)
	}()
	w = sw
	rt, ok := e.admit(w, r)
	if !ok {
		return
	}
	rt, done, err := e.wake(r.Context(), rt)
	if err != nil {
		http.Error(w, unavailableMsg, http.StatusServiceUnavailable)
		return
	}
	defer done()
	// (Not for an upgrade: its connection is hijacked with the read deadline as set.)
	if r.Body != nil && r.Body != http.NoBody && !upgrading(r) {
		b := &checkedBody{r: r.Body, req: r, rc: http.NewResponseController(w), idle: e.cfg.HandshakeTimeout}
		r.Body = b
		if r.ProtoMajor == 1 && r.ContentLength < 0 {
			// A chunked upload: read the first chunks before anything goes to the
			// sandbox, so that a malformed one gets 400 with nothing sent, and a small
			// body goes on with a Content-Length.
			if !b.prefetch(maxPrefetch) {
				w.Header().Set("Connection", "close")
				http.Error(w, "malformed or incomplete request body", http.StatusBadRequest)
				return
			}
			if b.complete {
				r.ContentLength = int64(len(b.pre))
				r.TransferEncoding = nil
			}
		}
	}
	e.forward(w, r, rt)
}

// statusWriter notes the status code of a response (cwsandbox_edge_requests_total) and
// counts its body bytes and those of a hijacked (upgraded) connection
// (cwsandbox_edge_bytes_total); Unwrap gives http.ResponseController (flush, deadlines)
// the writer beneath.
type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.code == 0 && code >= 200 || w.code == 0 && code == http.StatusSwitchingProtocols {
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	n, err := w.ResponseWriter.Write(b)
	counters.EdgeHTTPSOut.Add(int64(n))
	return n, err
}

func (w *statusWriter) Flush() {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Hijack hands over the connection (httputil.ReverseProxy, for a 101 Switching
// Protocols), its reads and writes counted. Bytes the server had buffered are in the
// bufio.Reader, not counted (the proxy copies from the connection only).
func (w *statusWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, brw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err != nil {
		return c, brw, err
	}
	cc := countedConn{Conn: c}
	if _, ok := c.(interface{ CloseWrite() error }); ok {
		return &countedHalfCloser{cc}, brw, nil // the proxy passes half-closes on when it can
	}
	return &cc, brw, nil
}

// countedConn counts what is read from the client (in) and written to it (out).
type countedConn struct{ net.Conn }

func (c *countedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	counters.EdgeHTTPSIn.Add(int64(n))
	return n, err
}

func (c *countedConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	counters.EdgeHTTPSOut.Add(int64(n))
	return n, err
}

type countedHalfCloser struct{ countedConn }

func (c *countedHalfCloser) CloseWrite() error {
	return c.Conn.(interface{ CloseWrite() error }).CloseWrite()
}

// maxPrefetch is how much of a chunked request body is read before it is forwarded.
const maxPrefetch = 64 << 10

func upgrading(r *http.Request) bool { return r.Header["Upgrade"] != nil }

// checkedBody is a request body on the net/http path: each read must bring data within
// idle (as the header's time is bounded), and its failure is kept so that the proxy's
// error answers 400, not 502.
type checkedBody struct {
	r        io.ReadCloser
	req      *http.Request // its Trailer is checked at the body's end
	rc       *http.ResponseController
	idle     time.Duration
	pre      []byte // prefetched, not yet read
	complete bool   // pre is the whole body
	err      error
}

func (b *checkedBody) read(p []byte) (int, error) {
	_ = b.rc.SetReadDeadline(time.Now().Add(b.idle))
	n, err := b.r.Read(p)
	counters.EdgeHTTPSIn.Add(int64(n))
	if errors.Is(err, io.EOF) {
		for k := range b.req.Trailer { // net/http reads trailer names as loosely as it used to read header names
			if !isTokenString(k) {
				err = errors.New("invalid trailer field name")
				break
			}
		}
	}
	if err != nil && !errors.Is(err, io.EOF) {
		b.err = err
	}
	return n, err
}

// prefetch reads up to max bytes of the body into pre; false if the body failed.
func (b *checkedBody) prefetch(limit int) bool {
	buf := make([]byte, 0, 4<<10)
	for len(buf) < limit {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := b.read(buf[len(buf):min(cap(buf), limit)])
		buf = buf[:len(buf)+n]
		if errors.Is(err, io.EOF) {
			b.complete = true
			break
		}
		if err != nil {
			return false
		}
	}
	b.pre = buf
	return true
}

func (b *checkedBody) Read(p []byte) (int, error) {
	if len(b.pre) > 0 {
		n := copy(p, b.pre)
		b.pre = b.pre[n:]
		return n, nil
	}
	if b.complete {
		return 0, io.EOF
	}
	return b.read(p)
}

func (b *checkedBody) Close() error { return b.r.Close() }

// admit finds r's HTTPS route by Host and checks its auth. When r may not go on, admit
// answers it on w (404, 421, 401, 403) and returns false.
func (e *Edge) admit(w http.ResponseWriter, r *http.Request) (Route, bool) {
	id, port, err := ParseHost(hostOnly(r.Host), e.cfg.RunnerID, e.cfg.BaseDomain)
	if err != nil {
		http.Error(w, notFoundBody, http.StatusNotFound)
		return Route{}, false
	}
	rt, ok := e.cfg.Routes.Lookup(id, port)
	switch {
	case !ok:
		http.Error(w, notFoundBody, http.StatusNotFound)
		return Route{}, false
	case rt.Kind == KindPassthrough:
		// An HTTP/2 client reused a connection for a name the wildcard covers (RFC 9113
		// §9.1.1); 421 makes it open a connection of its own, which gets spliced.
		http.Error(w, misdirectedMsg, http.StatusMisdirectedRequest)
		return Route{}, false
	case rt.Kind != KindHTTPS:
		http.Error(w, notFoundBody, http.StatusNotFound)
		return Route{}, false
	}
	if rt.Auth == AuthToken {
		if strings.HasPrefix(r.URL.Path, edgePathPrefix) {
			e.serveEdgePath(w, r, rt)
			return Route{}, false
		}
		if !e.authorize(w, r, rt, cutShareTokenParam(r)) {
			return Route{}, false
		}
	}
	return rt, true
}

// authorize checks the credentials of an AuthToken request — a share token (header,
// else the query's params), else a bearer key, else a session cookie — answering the
// client if they fail.
func (e *Edge) authorize(w http.ResponseWriter, r *http.Request, rt Route, params []string) bool {
	if share, fromQuery, ok := shareTokenOf(r, params); ok {
		return e.admitShareToken(w, r, rt, share, fromQuery)
	}
	token, ok := bearer(r.Header.Get("Authorization"))
	if !ok {
		if e.fromCookie(r, rt) {
			return true
		}
		if wantsPage(r) {
			redirectToLogin(w, r)
			return false
		}
		w.Header().Set("WWW-Authenticate", `Bearer realm="sandbox endpoint"`)
		http.Error(w, "this endpoint needs its share token ("+ShareTokenHeader+" header or "+ShareTokenParam+
			" query parameter) or Authorization: Bearer <API key> (browsers: "+loginPath+")", http.StatusUnauthorized)
		return false
	}
	code, msg := e.check(r, token, rt)
	if code == 0 {
		return true
	}
	if code == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="sandbox endpoint", error="invalid_token"`)
	}
	if msg != "" {
		http.Error(w, msg, code)
	}
	return false
}

// admitShareToken lets r in with the share token it presents, answering the client when
// r may not go on: 401 for a wrong token; a page request that brought a valid one in its
// query gets a session cookie and a redirect to its URL without it (already cut).
func (e *Edge) admitShareToken(w http.ResponseWriter, r *http.Request, rt Route, token string, fromQuery bool) bool {
	if !shareTokenMatches(token, rt.ShareTokenHash) {
		w.Header().Set("WWW-Authenticate", `Bearer realm="sandbox endpoint", error="invalid_token"`)
		http.Error(w, "the share token is not valid for this endpoint", http.StatusUnauthorized)
		return false
	}
	if fromQuery && wantsPage(r) {
		e.setSession(w, r, rt, shareSession)
		w.Header().Set("Location", safeNext(r.RequestURI))
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(http.StatusSeeOther)
		return false
	}
	return true
}

// check asks Config.Authorize about key for rt: 0 when it may go on, else the status and
// message to answer with (no message: the client went away).
func (e *Edge) check(r *http.Request, key string, rt Route) (int, string) {
	err := errors.New("no authorizer configured")
	if e.cfg.Authorize != nil {
		err = e.cfg.Authorize(r.Context(), key, rt.Org)
	}
	switch {
	case err == nil:
		return 0, ""
	case errors.Is(err, ErrUnauthenticated):
		return http.StatusUnauthorized, "the API key is not valid"
	case errors.Is(err, context.Canceled):
		return http.StatusForbidden, ""
	default:
		e.log.Debug("token refused", "sandbox", rt.SandboxID, "port", rt.Port, "err", err)
		return http.StatusForbidden, "the API key may not use this sandbox"
	}
}

// bearer returns the credentials of an "Authorization: Bearer <token>" header (the
// scheme is case-insensitive, RFC 9110 §11.1).
func bearer(h string) (string, bool) {
	const scheme = "bearer "
	if len(h) <= len(scheme) || !strings.EqualFold(h[:len(scheme)], scheme) {
		return "", false
	}
	t := strings.TrimSpace(h[len(scheme):])
	return t, t != ""
}

// hostOnly drops a :port from a Host header; endpoint names never contain ':'.
func hostOnly(h string) string {
	if i := strings.LastIndexByte(h, ':'); i >= 0 {
		return h[:i]
	}
	return h
}

// unavailableMsg answers a request to a sandbox that cannot serve it now (Config.Wake).
const unavailableMsg = "the sandbox is paused and does not resume by itself, or could not be resumed"

// wakeTimeout bounds the wait for a paused sandbox to resume.
const wakeTimeout = time.Minute

// wake readies rt's sandbox for one request or connection (Config.Wake): the route to
// use (re-read: a resumed sandbox's address can change) and what to call at its end.
func (e *Edge) wake(ctx context.Context, rt Route) (Route, func(), error) {
	if e.cfg.Wake == nil {
		return rt, func() {}, nil
	}
	ctx, cancel := context.WithTimeout(ctx, wakeTimeout)
	defer cancel()
	done, err := e.cfg.Wake(ctx, rt.SandboxID)
	if err != nil {
		e.log.Info("sandbox not woken for a request", "sandbox", rt.SandboxID, "port", rt.Port, "err", err)
		return rt, nil, err
	}
	if fresh, ok := e.cfg.Routes.Lookup(rt.SandboxID, rt.Port); ok && fresh.Kind == rt.Kind {
		rt.Backend = fresh.Backend
	}
	return rt, done, nil
}
