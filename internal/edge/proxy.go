package edge

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"sync"
	"syscall"
	"time"
)

type routeKey struct{}

// proxyFor returns the reverse proxy for a request timeout. The timeout is the
// Transport's ResponseHeaderTimeout, so each distinct value (a handful in practice) has
// a proxy and a connection pool of its own; it costs nothing per request, where a timer
// and a cancellable context per request cost a tenth of the edge's allocations.
func (e *Edge) proxyFor(timeout time.Duration) *httputil.ReverseProxy {
	if p, ok := e.proxies.Load(timeout); ok {
		return p.(*httputil.ReverseProxy)
	}
	p, _ := e.proxies.LoadOrStore(timeout, e.newProxy(timeout))
	return p.(*httputil.ReverseProxy)
}

func (e *Edge) newProxy(timeout time.Duration) *httputil.ReverseProxy {
	t := &http.Transport{
		Proxy:                 nil, // never an environment proxy: backends are sandbox addresses
		DialContext:           e.dialer.DialContext,
		MaxIdleConns:          4096,
		MaxIdleConnsPerHost:   256, // keep-alive to busy sandboxes instead of a dial per request
		IdleConnTimeout:       90 * time.Second,
		ResponseHeaderTimeout: timeout,
		ExpectContinueTimeout: time.Second,
		DisableCompression:    true, // pass bodies through as the sandbox sent them
		WriteBufferSize:       32 << 10,
		ReadBufferSize:        32 << 10,
	}
	return &httputil.ReverseProxy{
		Rewrite:      rewrite,
		Transport:    t,
		ErrorHandler: e.proxyError,
		BufferPool:   bufferPool{},
		ErrorLog:     slog.NewLogLogger(e.log.Handler(), slog.LevelDebug), // copy errors of gone clients
		// FlushInterval 0: ReverseProxy already flushes at once for text/event-stream and
		// for responses of unknown length, and buffers the rest for throughput.
	}
}

// forward proxies r to rt's backend. The request timeout runs from the moment the
// request is sent to the sandbox to its response headers; a WebSocket or an event
// stream that has its headers is never cut by it, nor is a slow upload.
func (e *Edge) forward(w http.ResponseWriter, r *http.Request, rt Route) {
	e.proxyFor(rt.timeout()).ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), routeKey{}, rt)))
}

func rewrite(pr *httputil.ProxyRequest) {
	rt := pr.In.Context().Value(routeKey{}).(Route)
	pr.Out.URL.Scheme = "http"
	pr.Out.URL.Host = rt.Backend.String()
	// Out.Host stays the public name: apps build their own URLs from it.
	for k := range pr.Out.Header {
		if forwardingHeader(k) { // the client's own: none of them is to be believed
			delete(pr.Out.Header, k)
		}
	}
	pr.SetXForwarded() // X-Forwarded-For, -Host, -Proto
	// Always https: HTTP/1.1 connections the fast path hands over (h1.go) reach net/http
	// without their *tls.Conn, so SetXForwarded would say http.
	pr.Out.Header.Set("X-Forwarded-Proto", "https")
	// A TOKEN endpoint's credentials are not the workload's business: the platform key,
	// the share token (its query parameter is cut in admit) and the edge's session
	// cookie. (An OPEN endpoint owns these names.)
	if rt.Auth == AuthToken {
		pr.Out.Header.Del("Authorization")
		pr.Out.Header.Del(ShareTokenHeader)
		if hasSession(pr.Out.Header["Cookie"]) {
			if c := withoutSession(pr.Out.Header["Cookie"]); c != nil {
				pr.Out.Header["Cookie"] = c
			} else {
				pr.Out.Header.Del("Cookie")
			}
		}
	}
	pr.Out.Trailer = nil // request trailers are not passed on: fields after the body are unchecked
}

// proxyError answers a request the sandbox did not answer, saying why in one line.
func (e *Edge) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	if r.Context().Err() != nil {
		return // the client went away; nobody reads an answer
	}
	if b, ok := r.Body.(*checkedBody); ok && b.err != nil {
		// The client's body broke off or was malformed: the sandbox connection is
		// closed by the Transport, never reused; the client gets 400 and a close.
		w.Header().Set("Connection", "close")
		http.Error(w, "malformed or incomplete request body", http.StatusBadRequest)
		return
	}
	rt := r.Context().Value(routeKey{}).(Route)
	code, msg := e.proxyFailure(rt, err)
	http.Error(w, msg, code)
}

// proxyFailure is the status and the one-line reason for err, an error reaching rt's
// backend or reading its response headers.
func (e *Edge) proxyFailure(rt Route, err error) (int, string) {
	var ne net.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return http.StatusBadGateway, fmt.Sprintf("sandbox port %d is not accepting connections yet", rt.Port)
	case isDialError(err):
		return http.StatusBadGateway, fmt.Sprintf("sandbox port %d is not reachable", rt.Port)
	case errors.As(err, &ne) && ne.Timeout(): // the response header timeout
		return http.StatusGatewayTimeout, fmt.Sprintf("sandbox port %d did not answer within %s", rt.Port, rt.timeout())
	default:
		e.log.Info("proxy error", "sandbox", rt.SandboxID, "port", rt.Port, "err", err)
		return http.StatusBadGateway, fmt.Sprintf("sandbox port %d sent no valid response", rt.Port)
	}
}

func isDialError(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// bufferPool recycles the proxy's copy buffers instead of allocating 32 KiB per response.
type bufferPool struct{}

var buffers = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

func (bufferPool) Get() []byte  { return *buffers.Get().(*[]byte) }
func (bufferPool) Put(b []byte) { buffers.Put(&b) }
