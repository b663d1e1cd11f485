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

// errTimeout cancels a proxied request whose response headers did not arrive in time.
var errTimeout = errors.New("edge: sandbox did not answer in time")

// call is one proxied request, found by the proxy's hooks in the request's context.
type call struct {
	route Route
	timer *time.Timer
}

type callKey struct{}

func (e *Edge) newProxy() *httputil.ReverseProxy {
	t := &http.Transport{
		Proxy:                 nil, // never an environment proxy: backends are sandbox addresses
		DialContext:           e.dialer.DialContext,
		MaxIdleConns:          4096,
		MaxIdleConnsPerHost:   256, // keep-alive to busy sandboxes instead of a dial per request
		IdleConnTimeout:       90 * time.Second,
		ExpectContinueTimeout: time.Second,
		DisableCompression:    true, // pass bodies through as the sandbox sent them
		WriteBufferSize:       32 << 10,
		ReadBufferSize:        32 << 10,
	}
	return &httputil.ReverseProxy{
		Rewrite:        rewrite,
		Transport:      t,
		ModifyResponse: stopTimer,
		ErrorHandler:   e.proxyError,
		BufferPool:     bufferPool{},
		ErrorLog:       slog.NewLogLogger(e.log.Handler(), slog.LevelDebug), // copy errors of gone clients
		// FlushInterval 0: ReverseProxy already flushes at once for text/event-stream and
		// for responses of unknown length, and buffers the rest for throughput.
	}
}

// forward proxies r to rt's backend. The timer cancels the request if the response
// headers are late; stopTimer stops it once they are in, so a WebSocket or an event
// stream is never cut by it.
func (e *Edge) forward(w http.ResponseWriter, r *http.Request, rt Route) {
	ctx, cancel := context.WithCancelCause(r.Context())
	defer cancel(nil)
	c := &call{route: rt}
	c.timer = time.AfterFunc(rt.timeout(), func() { cancel(errTimeout) })
	defer c.timer.Stop()
	e.proxy.ServeHTTP(w, r.WithContext(context.WithValue(ctx, callKey{}, c)))
}

func rewrite(pr *httputil.ProxyRequest) {
	c := pr.In.Context().Value(callKey{}).(*call)
	pr.Out.URL.Scheme = "http"
	pr.Out.URL.Host = c.route.Backend.String()
	// Out.Host stays the public name: apps build their own URLs from it.
	pr.SetXForwarded() // X-Forwarded-For, -Host, -Proto: https; the client's own are dropped
	if c.route.Auth == AuthToken {
		pr.Out.Header.Del("Authorization") // the platform key is not the workload's business
	}
}

func stopTimer(res *http.Response) error {
	c := res.Request.Context().Value(callKey{}).(*call)
	if !c.timer.Stop() {
		return errTimeout // fired as the headers came in: the context is cancelled already
	}
	return nil
}

// proxyError answers a request the sandbox did not answer, saying why in one line.
func (e *Edge) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	rt := r.Context().Value(callKey{}).(*call).route
	switch {
	case errors.Is(err, errTimeout) || errors.Is(context.Cause(r.Context()), errTimeout):
		http.Error(w, fmt.Sprintf("sandbox port %d did not answer within %s", rt.Port, rt.timeout()), http.StatusGatewayTimeout)
	case r.Context().Err() != nil:
		// The client went away; nobody reads an answer.
	case errors.Is(err, syscall.ECONNREFUSED):
		http.Error(w, fmt.Sprintf("sandbox port %d is not accepting connections yet", rt.Port), http.StatusBadGateway)
	case isDialError(err):
		http.Error(w, fmt.Sprintf("sandbox port %d is not reachable", rt.Port), http.StatusBadGateway)
	default:
		e.log.Info("proxy error", "sandbox", rt.SandboxID, "port", rt.Port, "err", err)
		http.Error(w, fmt.Sprintf("sandbox port %d sent no valid response", rt.Port), http.StatusBadGateway)
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
