package edge

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"html/template"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Browsers cannot send an Authorization header on a navigation, so a TOKEN endpoint
// also accepts a session cookie that its login page sets once an API key was checked.
//
//   - A GET or HEAD for a page (Accept: text/html) without credentials is redirected
//     (303) to /.sandboxd/login?next=<path>; other requests still get 401.
//   - The login page posts the key (form field "key") back; a key that Config.Authorize
//     accepts for the route's organization sets the cookie and redirects to next.
//     A bearer header on the POST works too, for scripts.
//   - The cookie, __Host-sandboxd, is bound to the endpoint's host name, the
//     organization and the ID of the API key that logged in, carries its expiry, and is
//     signed (HMAC-SHA256) with the edge's session key; it is Secure, HttpOnly and
//     SameSite=Lax, and the __Host- prefix keeps it to this one host. It is removed
//     before the request reaches the sandbox.
//   - /.sandboxd/logout clears it. Paths under /.sandboxd/ of TOKEN endpoints belong to
//     the edge; OPEN endpoints pass every path to the workload.
//
// The key itself is never stored. Every request on a session asks Config.KeyActive
// whether its key is still active (answers are cached for sessionKeyCacheTTL at most), so
// revoking the key ends its sessions; the cookie also expires (Config.SessionTTL, 1 h by
// default).

const (
	sessionCookie  = "__Host-sandboxd"
	edgePathPrefix = "/.sandboxd/"
	loginPath      = edgePathPrefix + "login"
	logoutPath     = edgePathPrefix + "logout"
	maxLoginForm   = 8 << 10

	// DefaultSessionTTL is how long a login lasts when Config.SessionTTL is zero.
	DefaultSessionTTL = time.Hour
)

// NewSessionKey returns a random key for Config.SessionKey.
func NewSessionKey() []byte {
	k := make([]byte, 32)
	_, _ = rand.Read(k) // never fails (crypto/rand)
	return k
}

// session signs and checks session cookies.
type session struct {
	key []byte
	ttl time.Duration
	now func() time.Time
}

// issue returns a cookie value for host, org and the API key keyID valid until now+ttl.
func (s *session) issue(host, org, keyID string) string {
	exp := strconv.FormatInt(s.now().Add(s.ttl).Unix(), 10)
	payload := exp + "|" + host + "|" + org + "|" + keyID
	return exp + "." + base64.RawURLEncoding.EncodeToString([]byte(org)) + "." +
		base64.RawURLEncoding.EncodeToString([]byte(keyID)) + "." + s.sign(payload)
}

// valid reports whether v is an unexpired cookie this edge issued for host and org, and
// the ID of the key it was issued for.
func (s *session) valid(v, host, org string) (keyID string, ok bool) {
	parts := strings.Split(v, ".")
	if len(parts) != 4 {
		return "", false
	}
	exp, o, k, mac := parts[0], parts[1], parts[2], parts[3]
	unix, err := strconv.ParseInt(exp, 10, 64)
	if err != nil || s.now().Unix() >= unix {
		return "", false
	}
	ob, err := base64.RawURLEncoding.DecodeString(o)
	if err != nil || string(ob) != org {
		return "", false
	}
	kb, err := base64.RawURLEncoding.DecodeString(k)
	if err != nil || strings.Contains(string(kb), "|") {
		return "", false
	}
	if !hmac.Equal([]byte(mac), []byte(s.sign(exp+"|"+host+"|"+org+"|"+string(kb)))) {
		return "", false
	}
	return string(kb), true
}

func (s *session) sign(payload string) string {
	m := hmac.New(sha256.New, s.key)
	m.Write([]byte(payload))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// fromCookie reports whether r carries a valid session for rt's host and organization,
// made with a key that is still active.
func (e *Edge) fromCookie(r *http.Request, rt Route) bool {
	host := hostOnly(r.Host)
	for _, c := range r.CookiesNamed(sessionCookie) {
		keyID, ok := e.sessions.valid(c.Value, host, rt.Org)
		if !ok {
			continue
		}
		// A session a share token opened lasts while the route takes share tokens (they
		// are not revoked; they end with the sandbox); a key's while the key is active.
		if keyID == shareSession {
			if rt.ShareTokenHash != "" {
				return true
			}
		} else if e.keyActive(r.Context(), keyID, rt.Org) {
			return true
		}
	}
	return false
}

// setSession sets the session cookie for r's host and rt's organization, made by the
// API key keyID (or shareSession).
func (e *Edge) setSession(w http.ResponseWriter, r *http.Request, rt Route, keyID string) {
	http.SetCookie(w, &http.Cookie{
		Name: sessionCookie, Value: e.sessions.issue(hostOnly(r.Host), rt.Org, keyID), Path: "/",
		MaxAge: int(e.sessions.ttl / time.Second), Secure: true, HttpOnly: true, SameSite: http.SameSiteLaxMode,
	})
}

// wantsPage reports whether r looks like a browser navigating, which a login redirect
// helps; API clients get a 401 they can act on.
func wantsPage(r *http.Request) bool {
	return (r.Method == http.MethodGet || r.Method == http.MethodHead) &&
		strings.Contains(r.Header.Get("Accept"), "text/html")
}

// redirectToLogin sends a browser to the login page, to come back to r's path.
func redirectToLogin(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Location", loginPath+"?next="+url.QueryEscape(r.URL.RequestURI()))
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusSeeOther)
}

// serveEdgePath answers the edge's own paths of a TOKEN endpoint.
func (e *Edge) serveEdgePath(w http.ResponseWriter, r *http.Request, rt Route) {
	w.Header().Set("Cache-Control", "no-store")
	switch {
	case r.URL.Path == logoutPath:
		http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: "", Path: "/", MaxAge: -1, Secure: true, HttpOnly: true, SameSite: http.SameSiteLaxMode})
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = io.WriteString(w, "signed out\n")
	case r.URL.Path != loginPath:
		http.Error(w, notFoundBody, http.StatusNotFound)
	case r.Method == http.MethodGet || r.Method == http.MethodHead:
		loginPage(w, http.StatusOK, safeNext(r.URL.Query().Get("next")), "")
	case r.Method == http.MethodPost:
		e.login(w, r, rt)
	default:
		w.Header().Set("Allow", "GET, HEAD, POST")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
	}
}

// login checks the posted key and sets the session cookie.
func (e *Edge) login(w http.ResponseWriter, r *http.Request, rt Route) {
	host := hostOnly(r.Host)
	// A cross-site form must not log a browser in with someone else's key.
	if o := r.Header.Get("Origin"); o != "" && o != "https://"+host && o != "https://"+r.Host {
		http.Error(w, "cross-origin login refused", http.StatusForbidden)
		return
	}
	var form url.Values
	if strings.HasPrefix(r.Header.Get("Content-Type"), "application/x-www-form-urlencoded") {
		b, err := io.ReadAll(io.LimitReader(r.Body, maxLoginForm+1))
		if err != nil || len(b) > maxLoginForm {
			http.Error(w, "login form too large or unreadable", http.StatusRequestEntityTooLarge)
			return
		}
		if form, err = url.ParseQuery(string(b)); err != nil {
			http.Error(w, "malformed login form", http.StatusBadRequest)
			return
		}
	}
	next := safeNext(form.Get("next"))
	if q := r.URL.Query().Get("next"); form.Get("next") == "" && q != "" {
		next = safeNext(q)
	}
	key := strings.TrimSpace(form.Get("key"))
	if key == "" {
		key, _ = bearer(r.Header.Get("Authorization"))
	}
	if key == "" {
		loginPage(w, http.StatusUnauthorized, next, "Enter an API key.")
		return
	}
	if code, msg := e.check(r, key, rt); code != 0 {
		loginPage(w, code, next, msg)
		return
	}
	e.setSession(w, r, rt, keyIDOf(key))
	w.Header().Set("Location", next)
	w.WriteHeader(http.StatusSeeOther)
}

// safeNext keeps a redirect target on this host: a plain absolute path starting with a
// single "/", else "/". Refused: "//elsewhere", any backslash (browsers read "/\\x" as
// "//x"), any control character or space (browsers drop tab, CR and LF from URLs, so
// "/\t/evil.example" is "//evil.example"), anything outside printable ASCII, and the
// edge's own paths.
func safeNext(next string) string {
	if len(next) < 1 || next[0] != '/' || len(next) > 1 && next[1] == '/' || strings.HasPrefix(next, edgePathPrefix) {
		return "/"
	}
	for i := 0; i < len(next); i++ {
		if c := next[i]; c <= ' ' || c >= 0x7f || c == '\\' {
			return "/"
		}
	}
	if u, err := url.Parse(next); err != nil || u.Scheme != "" || u.Host != "" || u.Opaque != "" {
		return "/"
	}
	return next
}

var loginTemplate = template.Must(template.New("login").Parse(`<!doctype html>
<html><head><meta charset="utf-8"><title>Sign in to this sandbox endpoint</title></head>
<body><h1>Sign in to this sandbox endpoint</h1>
{{if .Message}}<p role="alert">{{.Message}}</p>{{end}}
<form method="post" action="` + loginPath + `">
<input type="hidden" name="next" value="{{.Next}}">
<label>API key <input type="password" name="key" autocomplete="off" autofocus></label>
<button type="submit">Sign in</button>
</form></body></html>
`))

func loginPage(w http.ResponseWriter, code int, next, msg string) {
	var b strings.Builder
	if err := loginTemplate.Execute(&b, struct{ Next, Message string }{next, msg}); err != nil {
		http.Error(w, fmt.Sprintf("login page: %v", err), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("X-Frame-Options", "DENY")
	w.Header().Set("Content-Security-Policy", "default-src 'none'; form-action 'self'")
	w.WriteHeader(code)
	_, _ = io.WriteString(w, b.String())
}

// hasSession reports whether the Cookie header values vs may hold the edge's session
// cookie, in any case: then withoutSession must rewrite them.
func hasSession(vs []string) bool {
	for _, v := range vs {
		if containsFold(v, sessionCookie) {
			return true
		}
	}
	return false
}

func containsFold(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if strings.EqualFold(s[i:i+len(sub)], sub) {
			return true
		}
	}
	return false
}

// withoutSession returns the Cookie header values with the edge's session cookie
// removed — whatever the spacing around its name (net/http's cookie parser trims it)
// and its case — ; nil when nothing is left.
func withoutSession(vs []string) []string {
	var out []string
	for _, v := range vs {
		var kept []string
		for part := range strings.SplitSeq(v, ";") {
			name, _, _ := strings.Cut(part, "=")
			if !strings.EqualFold(strings.TrimSpace(name), sessionCookie) && strings.TrimSpace(part) != "" {
				kept = append(kept, strings.TrimSpace(part))
			}
		}
		if len(kept) > 0 {
			out = append(out, strings.Join(kept, "; "))
		}
	}
	return out
}
