package edge

import (
	"context"
	"errors"
	"net/http"
	"strings"
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
	if rt, ok := e.admit(w, r); ok {
		e.forward(w, r, rt)
	}
}

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
	if rt.Auth == AuthToken && !e.authorize(w, r, rt) {
		return Route{}, false
	}
	return rt, true
}

// authorize checks the bearer key of an AuthToken route, answering the client if it fails.
func (e *Edge) authorize(w http.ResponseWriter, r *http.Request, rt Route) bool {
	token, ok := bearer(r.Header.Get("Authorization"))
	if !ok {
		w.Header().Set("WWW-Authenticate", `Bearer realm="sandbox endpoint"`)
		http.Error(w, "this endpoint needs Authorization: Bearer <API key>", http.StatusUnauthorized)
		return false
	}
	err := errors.New("no authorizer configured")
	if e.cfg.Authorize != nil {
		err = e.cfg.Authorize(r.Context(), token, rt.Org)
	}
	switch {
	case err == nil:
		return true
	case errors.Is(err, ErrUnauthenticated):
		w.Header().Set("WWW-Authenticate", `Bearer realm="sandbox endpoint", error="invalid_token"`)
		http.Error(w, "the API key is not valid", http.StatusUnauthorized)
	case errors.Is(err, context.Canceled):
	default:
		e.log.Debug("token refused", "sandbox", rt.SandboxID, "port", rt.Port, "err", err)
		http.Error(w, "the API key may not use this sandbox", http.StatusForbidden)
	}
	return false
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
