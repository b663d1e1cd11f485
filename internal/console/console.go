// Package console is the web console the API port serves at /console/: a single-page
// application (internal/console/web, built with esbuild and embedded) and the little it
// needs on the server.
//
// A browser signs in with an API key (POST /console/api/session). The key is checked by
// the same authenticator as the API's, then kept server-side in a bounded session table
// (idle and absolute expiry); the browser only holds a 256-bit session ID in an HttpOnly,
// SameSite=Strict cookie: __Host-sbx_console (Secure, Path=/) over TLS, which no sibling
// subdomain can set, sbx_console (Path=/console) over plain HTTP. A request with more than
// one session cookie is refused, never one of them picked. Every call the console
// makes then goes through the API port's own front (apifront) with the session's key as
// its bearer key: /console/api/v1/... is the REST API itself, the terminal and log
// streams are StreamExec and StreamLogs called in-process through that front. So the
// console can do exactly what its key can, in its key's organization and role.
//
// Writes (every method but GET and HEAD) need the session's CSRF token in the
// X-CSRF-Token header, and are refused when the browser says they come from another
// origin (Origin, Sec-Fetch-Site); the terminal's WebSocket must come from the same
// origin. A request without a valid session is refused before its body is read.
package console

import (
	"crypto/subtle"
	"embed"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/apifront"
	"github.com/sandboxd/sandboxd/internal/auth"
)

// Path is where the console is served.
const Path = "/console/"

// CookieName is the session cookie's name over plain HTTP (loopback development), with
// Path=/console. SecureCookieName is its name over TLS, with Path=/ and Secure and no
// Domain: a browser accepts a __Host- cookie only so, set by this very host over HTTPS,
// so sandbox JavaScript on an endpoint subdomain (PORT-SANDBOX.RUNNER.BASE-DOMAIN) cannot
// plant one. A request's session is read from the name of its scheme only.
const (
	CookieName       = "sbx_console"
	SecureCookieName = "__Host-sbx_console"
)

// SignInBodyTimeout bounds the time the sign-in body may take to arrive.
const SignInBodyTimeout = 10 * time.Second

// CSRFHeader carries the session's CSRF token on writes.
const CSRFHeader = "X-CSRF-Token"

// Defaults of Config.
const (
	DefaultMaxSessions    = 4096
	DefaultIdleTimeout    = 30 * time.Minute
	DefaultSessionMaxLife = 12 * time.Hour
	// MaxSignInBytes bounds the sign-in request's body.
	MaxSignInBytes = 4 << 10
	// MaxProxyBodyBytes bounds the body of a proxied API call (the console sends small
	// JSON requests only; the API port's own front bounds the rest).
	MaxProxyBodyBytes = 1 << 20
)

// Config configures a Console.
type Config struct {
	// Auth checks the keys browsers sign in with (the API port's authenticator).
	Auth auth.Authenticator
	// API is the API port's handler behind its front: it authenticates the key the
	// console sets on each call, as it does any client's.
	API http.Handler
	// MaxSessions bounds the session table; IdleTimeout and MaxLifetime end a session
	// unused for that long or that old (defaults above).
	MaxSessions int
	IdleTimeout time.Duration
	MaxLifetime time.Duration
	// Now is the clock (tests); nil is time.Now.
	Now    func() time.Time
	Logger *slog.Logger
}

// Console serves the console under Path.
type Console struct {
	auth     auth.Authenticator
	api      http.Handler
	sessions *sessions
	mux      *http.ServeMux
	log      *slog.Logger
}

//go:embed web/index.html web/dist
var webFS embed.FS

// New returns the console of cfg.
func New(cfg Config) *Console {
	if cfg.MaxSessions <= 0 {
		cfg.MaxSessions = DefaultMaxSessions
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = DefaultIdleTimeout
	}
	if cfg.MaxLifetime <= 0 {
		cfg.MaxLifetime = DefaultSessionMaxLife
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	c := &Console{auth: cfg.Auth, api: cfg.API, log: cfg.Logger,
		sessions: newSessions(cfg.MaxSessions, cfg.IdleTimeout, cfg.MaxLifetime, cfg.Now)}
	dist, err := fs.Sub(webFS, "web/dist")
	if err != nil {
		panic(err) // embedded: a programming error
	}
	m := http.NewServeMux()
	m.HandleFunc("GET /console", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, Path, http.StatusMovedPermanently)
	})
	m.HandleFunc("GET /console/{$}", c.index)
	m.Handle("GET /console/assets/", http.StripPrefix("/console/assets/", http.FileServerFS(dist)))
	m.HandleFunc("POST /console/api/session", c.signIn)
	m.HandleFunc("GET /console/api/session", c.withSession(c.whoAmI))
	m.HandleFunc("DELETE /console/api/session", c.withSession(c.signOut))
	m.HandleFunc("/console/api/v1/", c.withSession(c.proxy))
	m.HandleFunc("GET /console/api/sandboxes/{id}/terminal", c.withSession(c.terminal))
	m.HandleFunc("GET /console/api/sandboxes/{id}/logs", c.withSession(c.logs))
	m.HandleFunc("/console/", func(w http.ResponseWriter, r *http.Request) {
		apifront.WriteRESTError(w, apierr.Newf(apierr.InvalidRequest, "no console route %s %s", r.Method, r.URL.Path))
	})
	c.mux = m
	return c
}

// csp allows the console's own script, styles and connections only. Inline styles are
// allowed because xterm.js sizes and themes the terminal with <style> elements it makes;
// scripts are never inline.
const csp = "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; " +
	"font-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"

// ServeHTTP serves the console (paths under /console).
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", csp)
	h.Set("X-Frame-Options", "DENY")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
	h.Set("Cross-Origin-Resource-Policy", "same-origin")
	if strings.HasPrefix(r.URL.Path, "/console/api/") {
		h.Set("Cache-Control", "no-store")
	}
	c.mux.ServeHTTP(w, r)
}

func (c *Console) index(w http.ResponseWriter, r *http.Request) {
	b, err := webFS.ReadFile("web/index.html")
	if err != nil {
		http.Error(w, "console not built", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-cache")
	_, _ = w.Write(b)
}

// crossOrigin says whether the browser tells r comes from another site or origin. A
// request without these headers (not a browser) is not cross-origin by them; it still
// needs the session cookie and, to write, the CSRF token.
func crossOrigin(r *http.Request) bool {
	if s := r.Header.Get("Sec-Fetch-Site"); s != "" && s != "same-origin" {
		return true
	}
	o := r.Header.Get("Origin")
	if o == "" {
		return false
	}
	u, err := url.Parse(o)
	if err != nil || u.Host == "" || !strings.EqualFold(u.Host, r.Host) {
		return true
	}
	want := "http"
	if r.TLS != nil {
		want = "https"
	}
	return u.Scheme != want
}

// sessionCookies are the values of the request's session cookies of its scheme's name
// (SecureCookieName over TLS, CookieName over plain HTTP), as many as it sent.
func sessionCookies(r *http.Request) []string {
	name := CookieName
	if r.TLS != nil {
		name = SecureCookieName
	}
	var ids []string
	for _, ck := range r.CookiesNamed(name) {
		ids = append(ids, ck.Value)
	}
	return ids
}

// sessionCookie is the session cookie holding id for a request of r's scheme.
func sessionCookie(r *http.Request, id string) *http.Cookie {
	ck := &http.Cookie{Name: CookieName, Value: id, Path: "/console", HttpOnly: true, SameSite: http.SameSiteStrictMode}
	if r.TLS != nil {
		ck.Name, ck.Path, ck.Secure = SecureCookieName, "/", true
	}
	return ck
}

// expireCookie tells the browser to forget its session cookie.
func expireCookie(w http.ResponseWriter, r *http.Request) {
	ck := sessionCookie(r, "")
	ck.MaxAge = -1
	http.SetCookie(w, ck)
}

func safeMethod(m string) bool { return m == http.MethodGet || m == http.MethodHead }

// withSession runs next with the request's session, or refuses the request before
// reading its body: no valid session (UNAUTHENTICATED); a write from another origin
// or without the session's CSRF token (PERMISSION_DENIED).
func (c *Console) withSession(next func(http.ResponseWriter, *http.Request, *session)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ids := sessionCookies(r)
		if len(ids) > 1 {
			// Another cookie of this name was planted beside ours (by a sibling host, with
			// a longer Path): which is ours cannot be told, so none is used, and all their
			// sessions end, or the planted one, left alone once the browser forgets ours,
			// would be taken for the browser's.
			for _, id := range ids {
				if ss := c.sessions.get(id); ss != nil {
					c.sessions.drop(ss)
				}
			}
			expireCookie(w, r)
			apifront.WriteRESTError(w, apierr.Newf(apierr.Unauthenticated, "more than one console session cookie: sign in again"))
			return
		}
		var ss *session
		if len(ids) == 1 {
			ss = c.sessions.get(ids[0])
		}
		if ss == nil {
			apifront.WriteRESTError(w, apierr.Newf(apierr.Unauthenticated, "not signed in to the console (or the session expired)"))
			return
		}
		if !safeMethod(r.Method) {
			if crossOrigin(r) {
				apifront.WriteRESTError(w, apierr.Newf(apierr.PermissionDenied, "cross-origin console write refused"))
				return
			}
			tok := r.Header.Get(CSRFHeader)
			if subtle.ConstantTimeCompare([]byte(tok), []byte(ss.csrf)) != 1 {
				apifront.WriteRESTError(w, apierr.Newf(apierr.PermissionDenied, "missing or wrong %s header", CSRFHeader))
				return
			}
		}
		next(w, r, ss)
	}
}

// SignIn is the body of POST /console/api/session.
type SignIn struct {
	APIKey string `json:"apiKey"`
}

// Who is what GET /console/api/session answers (never the key).
type Who struct {
	Organization string    `json:"organization"`
	Role         string    `json:"role"`
	KeyID        string    `json:"keyId"`
	KeyName      string    `json:"keyName,omitempty"`
	CSRFToken    string    `json:"csrfToken"`
	ExpiresAt    time.Time `json:"expiresAt"`
}

func (c *Console) signIn(w http.ResponseWriter, r *http.Request) {
	if crossOrigin(r) {
		apifront.WriteRESTError(w, apierr.Newf(apierr.PermissionDenied, "cross-origin console sign-in refused"))
		return
	}
	if r.ContentLength > MaxSignInBytes {
		apifront.WriteRESTError(w, apierr.Invalid(apierr.InvalidRequest, "sign-in body over 4 KiB",
			[]apierr.Violation{{Field: "body", Description: "over 4 KiB"}}))
		return
	}
	// The body must arrive in time (a writer without deadlines, ErrNotSupported, has
	// none to set); once read, the deadline goes, for the next request on the connection.
	rc := http.NewResponseController(w)
	if rc.SetReadDeadline(time.Now().Add(SignInBodyTimeout)) == nil {
		defer func() { _ = rc.SetReadDeadline(time.Time{}) }()
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, MaxSignInBytes))
	dec.DisallowUnknownFields()
	var in SignIn
	err := dec.Decode(&in)
	if err == nil && dec.More() {
		err = errors.New("more than one JSON value")
	}
	if err == nil {
		if _, terr := dec.Token(); !errors.Is(terr, io.EOF) {
			err = errors.New("trailing data after the JSON object")
		}
	}
	var nerr net.Error
	if errors.As(err, &nerr) && nerr.Timeout() {
		apifront.WriteRESTError(w, apierr.Invalid(apierr.InvalidRequest, "the sign-in body did not arrive in time",
			[]apierr.Violation{{Field: "body", Description: "must arrive within " + SignInBodyTimeout.String()}}))
		return
	}
	var tooBig *http.MaxBytesError
	switch {
	case errors.As(err, &tooBig):
		apifront.WriteRESTError(w, apierr.Invalid(apierr.InvalidRequest, "sign-in body over 4 KiB",
			[]apierr.Violation{{Field: "body", Description: "over 4 KiB"}}))
		return
	case err != nil:
		apifront.WriteRESTError(w, apierr.Invalid(apierr.InvalidRequest, "invalid sign-in body: "+err.Error(),
			[]apierr.Violation{{Field: "body", Description: `must be {"apiKey": "<key>"}`}}))
		return
	case in.APIKey == "":
		apifront.WriteRESTError(w, apierr.Invalid(apierr.InvalidRequest, "apiKey is required",
			[]apierr.Violation{{Field: "apiKey", Description: "is required"}}))
		return
	}
	h := http.Header{}
	h.Set("Authorization", "Bearer "+in.APIKey)
	who, err := auth.Check(c.auth, h)
	if err != nil {
		apifront.WriteRESTError(w, err)
		return
	}
	// A session ID the browser held before (e.g. another key's, or one planted beside
	// it) is never reused: every one it sent ends, and the new session replaces them.
	for _, old := range sessionCookies(r) {
		if ss := c.sessions.get(old); ss != nil {
			c.sessions.drop(ss)
		}
	}
	id, ss := c.sessions.create(in.APIKey, who)
	ck := sessionCookie(r, id)
	ck.MaxAge = int(c.sessions.absolute / time.Second)
	http.SetCookie(w, ck)
	c.log.Info("console sign-in", "key_id", who.KeyID, "organization", who.Org)
	c.writeWho(w, ss)
}

func (c *Console) writeWho(w http.ResponseWriter, ss *session) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(Who{Organization: ss.who.Org, Role: string(ss.who.Role), KeyID: ss.who.KeyID,
		KeyName: ss.who.Name, CSRFToken: ss.csrf, ExpiresAt: ss.created.Add(c.sessions.absolute).UTC()})
}

// whoAmI answers who is signed in, after checking that the key is still valid (a
// revoked key ends its sessions).
func (c *Console) whoAmI(w http.ResponseWriter, r *http.Request, ss *session) {
	h := http.Header{}
	h.Set("Authorization", "Bearer "+ss.key)
	if _, err := auth.Check(c.auth, h); err != nil {
		if apierr.Reason(err) == apierr.Unauthenticated {
			c.sessions.drop(ss)
		}
		apifront.WriteRESTError(w, err)
		return
	}
	c.writeWho(w, ss)
}

func (c *Console) signOut(w http.ResponseWriter, r *http.Request, ss *session) {
	c.sessions.drop(ss)
	expireCookie(w, r)
	w.WriteHeader(http.StatusNoContent)
}

// proxy serves /console/api/v1/... as the API's /v1/... with the session's key: the
// API port's front authenticates it and the API scopes the call to its organization.
func (c *Console) proxy(w http.ResponseWriter, r *http.Request, ss *session) {
	// The path stays as the browser encoded it: an ID holding %2F stays one segment.
	esc := r.URL.EscapedPath()
	if !strings.HasPrefix(esc, "/console/api/v1/") {
		apifront.WriteRESTError(w, apierr.Newf(apierr.InvalidRequest, "no console route %s %s", r.Method, esc))
		return
	}
	esc = strings.TrimPrefix(esc, "/console/api")
	p, err := url.PathUnescape(esc)
	if err != nil {
		apifront.WriteRESTError(w, apierr.Newf(apierr.InvalidRequest, "invalid path %s", esc))
		return
	}
	r2 := r.Clone(r.Context())
	r2.URL.Path, r2.URL.RawPath = p, esc
	r2.RequestURI = r2.URL.RequestURI()
	r2.Header = apiHeaders(r.Header, ss.key)
	if r.Body != nil && r.Body != http.NoBody {
		r2.Body = http.MaxBytesReader(w, r.Body, MaxProxyBodyBytes)
	}
	c.api.ServeHTTP(w, r2)
}

// apiHeaders are the headers of a browser request forwarded to the API: the content
// negotiation ones and the session's key, none of the browser's cookies or tokens.
func apiHeaders(in http.Header, key string) http.Header {
	out := http.Header{}
	for _, k := range []string{"Content-Type", "Accept", "Content-Length", "X-Forwarded-For", "User-Agent"} {
		if v := in.Values(k); len(v) > 0 {
			out[k] = v
		}
	}
	out.Set("Authorization", "Bearer "+key)
	return out
}
