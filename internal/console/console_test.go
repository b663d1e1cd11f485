package console

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/auth"
)

const goodKey = "sbx_key1_secretsecretsecret"

type keys map[string]auth.Principal

func (k keys) Authenticate(key string) (auth.Principal, error) {
	if p, ok := k[key]; ok {
		return p, nil
	}
	return auth.Principal{}, auth.ErrInvalidKey
}

// recordAPI stands in for the API port: it records the Authorization and path it got.
type recordAPI struct {
	authz, path, cookie, body string
	escaped, uri, method      string
	calls                     int
}

func (a *recordAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	a.calls++
	a.authz, a.path, a.cookie = r.Header.Get("Authorization"), r.URL.Path, r.Header.Get("Cookie")
	a.escaped, a.uri, a.method = r.URL.EscapedPath(), r.RequestURI, r.Method
	b, _ := io.ReadAll(r.Body)
	a.body = string(b)
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, `{"ok":true}`)
}

type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func newTestConsole(t *testing.T) (*Console, *recordAPI, *clock) {
	t.Helper()
	api := &recordAPI{}
	clk := &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	c := New(Config{Auth: keys{goodKey: {KeyID: "key1", Org: "org-a", Role: auth.RoleUser, Name: "alice"}}, API: api,
		MaxSessions: 3, IdleTimeout: time.Minute, MaxLifetime: time.Hour, Now: clk.now})
	return c, api, clk
}

func do(c http.Handler, method, path, body string, hdr map[string]string, cookie *http.Cookie) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, path, strings.NewReader(body))
	for k, v := range hdr {
		r.Header.Set(k, v)
	}
	if cookie != nil {
		r.AddCookie(cookie)
	}
	w := httptest.NewRecorder()
	c.ServeHTTP(w, r)
	return w
}

func reason(t *testing.T, w *httptest.ResponseRecorder) string {
	t.Helper()
	var st struct {
		Details []struct {
			Reason string `json:"reason"`
		} `json:"details"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &st); err != nil {
		t.Fatalf("not a REST error (%d): %s", w.Code, w.Body)
	}
	for _, d := range st.Details {
		if d.Reason != "" {
			return d.Reason
		}
	}
	return ""
}

// signIn signs in with goodKey and returns the session cookie and CSRF token.
func signIn(t *testing.T, c http.Handler) (*http.Cookie, string) {
	t.Helper()
	w := do(c, "POST", "/console/api/session", `{"apiKey":"`+goodKey+`"}`, map[string]string{"Content-Type": "application/json"}, nil)
	if w.Code != 200 {
		t.Fatalf("sign-in: %d %s", w.Code, w.Body)
	}
	res := w.Result()
	var ck *http.Cookie
	for _, x := range res.Cookies() {
		if x.Name == CookieName {
			ck = x
		}
	}
	if ck == nil {
		t.Fatal("no session cookie")
	}
	var who Who
	if err := json.Unmarshal(w.Body.Bytes(), &who); err != nil {
		t.Fatal(err)
	}
	return ck, who.CSRFToken
}

func TestSignInCookieAndWho(t *testing.T) {
	c, _, _ := newTestConsole(t)
	w := do(c, "POST", "/console/api/session", `{"apiKey":"`+goodKey+`"}`, nil, nil)
	if w.Code != 200 {
		t.Fatalf("sign-in: %d %s", w.Code, w.Body)
	}
	if strings.Contains(w.Body.String(), goodKey) || strings.Contains(w.Header().Get("Set-Cookie"), "secret") {
		t.Fatalf("the key is echoed: %s / %s", w.Body, w.Header().Get("Set-Cookie"))
	}
	ck := w.Result().Cookies()[0]
	if ck.Name != CookieName || !ck.HttpOnly || ck.SameSite != http.SameSiteStrictMode || ck.Path != "/console" || ck.Secure {
		t.Fatalf("cookie attributes: %+v", ck)
	}
	if len(ck.Value) != 43 { // 256 bits, base64url
		t.Fatalf("session ID %q is not 256 bits", ck.Value)
	}
	var who Who
	_ = json.Unmarshal(w.Body.Bytes(), &who)
	if who.Organization != "org-a" || who.KeyID != "key1" || who.Role != string(auth.RoleUser) || len(who.CSRFToken) != 43 {
		t.Fatalf("who: %+v", who)
	}
	g := do(c, "GET", "/console/api/session", "", nil, ck)
	if g.Code != 200 || strings.Contains(g.Body.String(), goodKey) {
		t.Fatalf("GET session: %d %s", g.Code, g.Body)
	}

	// Over TLS the cookie is a __Host- one: Secure, Path=/, no Domain.
	r := httptest.NewRequest("POST", "https://example.test/console/api/session", strings.NewReader(`{"apiKey":"`+goodKey+`"}`))
	tw := httptest.NewRecorder()
	c.ServeHTTP(tw, r)
	if ck := tw.Result().Cookies()[0]; ck.Name != SecureCookieName || !ck.Secure || ck.Path != "/" || ck.Domain != "" ||
		!ck.HttpOnly || ck.SameSite != http.SameSiteStrictMode {
		t.Fatalf("cookie over TLS: %+v", ck)
	}
}

// doScheme is do over TLS (https) or not, with the given Cookie header lines.
func doScheme(c http.Handler, method, url string, cookies ...*http.Cookie) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, url, nil)
	for _, ck := range cookies {
		r.AddCookie(ck)
	}
	w := httptest.NewRecorder()
	c.ServeHTTP(w, r)
	return w
}

// signInTLS signs in over TLS and returns the session cookie.
func signInTLS(t *testing.T, c http.Handler) *http.Cookie {
	t.Helper()
	r := httptest.NewRequest("POST", "https://example.test/console/api/session", strings.NewReader(`{"apiKey":"`+goodKey+`"}`))
	w := httptest.NewRecorder()
	c.ServeHTTP(w, r)
	if w.Code != 200 || len(w.Result().Cookies()) != 1 {
		t.Fatalf("sign-in over TLS: %d %v", w.Code, w.Result().Cookies())
	}
	return w.Result().Cookies()[0]
}

// TestSessionCookieNamePerScheme: over TLS only the __Host- cookie (which a sibling
// subdomain or plain HTTP cannot set) names the session, over plain HTTP only sbx_console.
func TestSessionCookieNamePerScheme(t *testing.T) {
	c, api, _ := newTestConsole(t)
	plain, _ := signIn(t, c)
	secure := signInTLS(t, c)
	if w := doScheme(c, "GET", "https://example.test/console/api/session", secure); w.Code != 200 {
		t.Fatalf("__Host- cookie over TLS: %d %s", w.Code, w.Body)
	}
	if w := doScheme(c, "GET", "http://example.test/console/api/session", plain); w.Code != 200 {
		t.Fatalf("plain cookie over HTTP: %d %s", w.Code, w.Body)
	}
	calls := api.calls
	// A valid session under the other scheme's name is no session.
	for name, w := range map[string]*httptest.ResponseRecorder{
		"sbx_console over TLS": doScheme(c, "GET", "https://example.test/console/api/v1/sandboxes",
			&http.Cookie{Name: CookieName, Value: plain.Value}),
		"__Host- over HTTP": doScheme(c, "GET", "http://example.test/console/api/v1/sandboxes",
			&http.Cookie{Name: SecureCookieName, Value: secure.Value}),
	} {
		if w.Code != 401 || reason(t, w) != apierr.Unauthenticated {
			t.Fatalf("%s: %d %s", name, w.Code, w.Body)
		}
	}
	if api.calls != calls {
		t.Fatal("a session cookie of the other scheme's name reached the API")
	}
}

// TestDuplicateSessionCookiesRefused: a cookie planted beside the console's (by sandbox
// JavaScript on a sibling subdomain, with a longer Path so the browser sends it first)
// is never picked: a request with two session cookies is refused, the browser told to
// forget its own, and the sessions they name end (the planted one, left alone, would
// otherwise be taken for the browser's).
func TestDuplicateSessionCookiesRefused(t *testing.T) {
	c, api, _ := newTestConsole(t)
	c.sessions.max = 100
	plain := func() *http.Cookie { ck, _ := signIn(t, c); return ck }
	secure := func() *http.Cookie { return signInTLS(t, c) }
	calls := api.calls
	for _, tc := range []struct {
		name string
		url  string
		mk   func() *http.Cookie
		same bool
	}{
		{"http, API call", "http://example.test/console/api/v1/sandboxes", plain, false},
		{"http, session GET", "http://example.test/console/api/session", plain, false},
		{"http, terminal", "http://example.test/console/api/sandboxes/sb1/terminal", plain, false},
		{"https, API call", "https://example.test/console/api/v1/sandboxes", secure, false},
		{"http, same session twice", "http://example.test/console/api/session", plain, true},
	} {
		attacker, victim := tc.mk(), tc.mk()
		if tc.same {
			attacker = victim
		}
		w := doScheme(c, "GET", tc.url, attacker, victim)
		if w.Code != 401 || reason(t, w) != apierr.Unauthenticated {
			t.Fatalf("%s: %d %s", tc.name, w.Code, w.Body)
		}
		cks := w.Result().Cookies()
		if len(cks) != 1 || cks[0].Name != victim.Name || cks[0].MaxAge >= 0 || cks[0].Value != "" || cks[0].Path != victim.Path {
			t.Fatalf("%s: no expiring Set-Cookie: %v", tc.name, cks)
		}
		base := strings.Split(tc.url, "/console/")[0]
		for who, ck := range map[string]*http.Cookie{"attacker's": attacker, "victim's": victim} {
			if w := doScheme(c, "GET", base+"/console/api/session", ck); w.Code != 401 {
				t.Fatalf("%s: the %s session lives on alone: %d", tc.name, who, w.Code)
			}
		}
	}
	if api.calls != calls {
		t.Fatal("a request with two session cookies reached the API")
	}
}

// TestSignInReplacesSessionCookies: signing in never keeps a session the browser sent
// (its own old one or a planted one): they end, and a new ID is set.
func TestSignInReplacesSessionCookies(t *testing.T) {
	c, _, _ := newTestConsole(t)
	old, _ := signIn(t, c)
	planted, _ := signIn(t, c)
	r := httptest.NewRequest("POST", "/console/api/session", strings.NewReader(`{"apiKey":"`+goodKey+`"}`))
	r.AddCookie(planted)
	r.AddCookie(old)
	w := httptest.NewRecorder()
	c.ServeHTTP(w, r)
	cks := w.Result().Cookies()
	if w.Code != 200 || len(cks) != 1 || cks[0].Value == old.Value || cks[0].Value == planted.Value {
		t.Fatalf("sign-in with cookies: %d %v", w.Code, cks)
	}
	for _, ck := range []*http.Cookie{old, planted} {
		if w := do(c, "GET", "/console/api/session", "", nil, ck); w.Code != 401 {
			t.Fatalf("a session sent at sign-in lives on: %d", w.Code)
		}
	}
	if w := do(c, "GET", "/console/api/session", "", nil, cks[0]); w.Code != 200 {
		t.Fatalf("the new session: %d", w.Code)
	}
}

// deadlineWriter is a ResponseWriter that can set read deadlines (as net/http's can),
// recording them; deadlineBody records whether a deadline was set before each read.
type deadlineWriter struct {
	*httptest.ResponseRecorder
	deadlines []time.Time
}

func (d *deadlineWriter) SetReadDeadline(t time.Time) error {
	d.deadlines = append(d.deadlines, t)
	return nil
}

type deadlineBody struct {
	w        *deadlineWriter
	r        io.Reader
	unbound  bool
	anyReads bool
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	b.anyReads = true
	if n := len(b.w.deadlines); n == 0 || b.w.deadlines[n-1].IsZero() {
		b.unbound = true
	}
	return b.r.Read(p)
}

// TestSignInBodyReadUnderDeadline: the sign-in body (read before any key is checked) is
// read under a read deadline, which goes once it is read.
func TestSignInBodyReadUnderDeadline(t *testing.T) {
	c, _, _ := newTestConsole(t)
	w := &deadlineWriter{ResponseRecorder: httptest.NewRecorder()}
	body := &deadlineBody{w: w, r: strings.NewReader(`{"apiKey":"` + goodKey + `"}`)}
	r := httptest.NewRequest("POST", "/console/api/session", body)
	c.ServeHTTP(w, r)
	if w.Code != 200 || !body.anyReads {
		t.Fatalf("sign-in: %d %s", w.Code, w.Body)
	}
	if body.unbound {
		t.Fatal("the sign-in body was read without a read deadline")
	}
	if n := len(w.deadlines); n != 2 || w.deadlines[0].IsZero() || !w.deadlines[1].IsZero() {
		t.Fatalf("read deadlines %v: want one set, then cleared", w.deadlines)
	}
}

func TestSignInRefusals(t *testing.T) {
	c, _, _ := newTestConsole(t)
	for name, tc := range map[string]struct {
		body   string
		hdr    map[string]string
		code   int
		reason string
	}{
		"wrong key":     {`{"apiKey":"sbx_nope_nope"}`, nil, 401, apierr.Unauthenticated},
		"unknown field": {`{"apiKey":"` + goodKey + `","role":"admin"}`, nil, 400, apierr.InvalidRequest},
		"empty":         {`{}`, nil, 400, apierr.InvalidRequest},
		"trailing":      {`{"apiKey":"` + goodKey + `"} {}`, nil, 400, apierr.InvalidRequest},
		"too big":       {`{"apiKey":"` + strings.Repeat("a", MaxSignInBytes) + `"}`, nil, 400, apierr.InvalidRequest},
		"cross origin":  {`{"apiKey":"` + goodKey + `"}`, map[string]string{"Origin": "https://evil.test"}, 403, apierr.PermissionDenied},
		"cross site":    {`{"apiKey":"` + goodKey + `"}`, map[string]string{"Sec-Fetch-Site": "cross-site"}, 403, apierr.PermissionDenied},
	} {
		t.Run(name, func(t *testing.T) {
			w := do(c, "POST", "/console/api/session", tc.body, tc.hdr, nil)
			if w.Code != tc.code || reason(t, w) != tc.reason {
				t.Fatalf("got %d %s, want %d %s", w.Code, w.Body, tc.code, tc.reason)
			}
			if len(w.Result().Cookies()) != 0 {
				t.Fatal("a refused sign-in set a cookie")
			}
			if strings.Contains(w.Body.String(), "secretsecret") {
				t.Fatal("the key is echoed")
			}
		})
	}
	if n := c.sessions.len(); n != 0 {
		t.Fatalf("%d sessions after refused sign-ins", n)
	}
}

// bodyReads records whether a body was read.
type bodyReads struct{ n atomic.Int64 }

func (b *bodyReads) Read(p []byte) (int, error) { b.n.Add(1); return 0, io.EOF }

func TestUnauthenticatedRefusedWithoutReadingBody(t *testing.T) {
	c, api, _ := newTestConsole(t)
	for _, tc := range []struct{ method, path string }{
		{"POST", "/console/api/v1/sandboxes"},
		{"DELETE", "/console/api/v1/sandboxes/x"},
		{"GET", "/console/api/v1/sandboxes"},
		{"GET", "/console/api/sandboxes/x/terminal"},
		{"GET", "/console/api/sandboxes/x/logs"},
		{"DELETE", "/console/api/session"},
	} {
		for _, ck := range []*http.Cookie{nil, {Name: CookieName, Value: "forged"}, {Name: CookieName, Value: randomToken()}} {
			body := &bodyReads{}
			r := httptest.NewRequest(tc.method, tc.path, body)
			if ck != nil {
				r.AddCookie(ck)
			}
			w := httptest.NewRecorder()
			c.ServeHTTP(w, r)
			if w.Code != 401 || reason(t, w) != apierr.Unauthenticated {
				t.Fatalf("%s %s cookie %v: %d %s", tc.method, tc.path, ck, w.Code, w.Body)
			}
			if body.n.Load() != 0 {
				t.Fatalf("%s %s: the body was read before authentication", tc.method, tc.path)
			}
		}
	}
	if api.calls != 0 {
		t.Fatalf("the API was called %d times without a session", api.calls)
	}
}

func TestProxyInjectsKeyAndNeedsCSRF(t *testing.T) {
	c, api, _ := newTestConsole(t)
	ck, csrf := signIn(t, c)

	w := do(c, "GET", "/console/api/v1/sandboxes?state=STATE_RUNNING", "", nil, ck)
	if w.Code != 200 || api.authz != "Bearer "+goodKey || api.path != "/v1/sandboxes" || api.cookie != "" {
		t.Fatalf("proxied GET: %d, API got authz %q path %q cookie %q", w.Code, api.authz, api.path, api.cookie)
	}
	if w.Header().Get("Cache-Control") != "no-store" {
		t.Fatal("API answers may be cached")
	}

	calls := api.calls
	for name, hdr := range map[string]map[string]string{
		"no token":     {},
		"wrong token":  {CSRFHeader: csrf[:42] + "x"},
		"cross origin": {CSRFHeader: csrf, "Origin": "http://evil.test"},
		"cross site":   {CSRFHeader: csrf, "Sec-Fetch-Site": "same-site"},
	} {
		body := &bodyReads{}
		r := httptest.NewRequest("DELETE", "/console/api/v1/sandboxes/abc", body)
		r.AddCookie(ck)
		for k, v := range hdr {
			r.Header.Set(k, v)
		}
		w := httptest.NewRecorder()
		c.ServeHTTP(w, r)
		if w.Code != 403 || reason(t, w) != apierr.PermissionDenied || body.n.Load() != 0 {
			t.Fatalf("%s: %d %s (body reads %d)", name, w.Code, w.Body, body.n.Load())
		}
	}
	if api.calls != calls {
		t.Fatal("a refused write reached the API")
	}
	// An ID holding an encoded slash stays one path segment: the API gets the path as
	// the browser encoded it, not another route.
	w = do(c, "GET", "/console/api/v1/sandboxes/a%2Fb%2F..%2Fc", "", nil, ck)
	if w.Code != 200 || api.escaped != "/v1/sandboxes/a%2Fb%2F..%2Fc" || api.path != "/v1/sandboxes/a/b/../c" || api.uri != "/v1/sandboxes/a%2Fb%2F..%2Fc" {
		t.Fatalf("encoded slash: %d, API got escaped path %q path %q request URI %q", w.Code, api.escaped, api.path, api.uri)
	}
	w = do(c, "POST", "/console/api/v1/sandboxes/abc:exec", `{"command":["true"]}`,
		map[string]string{CSRFHeader: csrf, "Origin": "http://example.com", "Sec-Fetch-Site": "same-origin"}, ck)
	if w.Code != 200 || api.path != "/v1/sandboxes/abc:exec" || api.body != `{"command":["true"]}` {
		t.Fatalf("write with token: %d %s (API path %q)", w.Code, w.Body, api.path)
	}
}

// TestProxyEditWrites: the editors' writes (PATCH with an update mask, PUT of a quota)
// reach the API with their method, query and body as sent, under the session's key; each
// needs the CSRF token, like every write.
func TestProxyEditWrites(t *testing.T) {
	c, api, _ := newTestConsole(t)
	ck, csrf := signIn(t, c)
	for _, x := range []struct{ method, path, body string }{
		{"PATCH", "/v1/sandboxTemplates/t1?updateMask=displayName,spec", `{"displayName":"n","revision":"3"}`},
		{"PATCH", "/v1/volumes/v1?updateMask=spec.description,spec.size", `{"spec":{"description":"d","size":"2Gi"}}`},
		{"PUT", "/v1/quotas/org-a", `{"limits":{"maxSandboxes":"7"}}`},
		{"POST", "/v1/sandboxes/abc:snapshot", `{"scratchVolumeName":"workspace","requestId":"r"}`},
	} {
		calls := api.calls
		if w := do(c, x.method, "/console/api"+x.path, x.body, nil, ck); w.Code != 403 || reason(t, w) != apierr.PermissionDenied || api.calls != calls {
			t.Fatalf("%s %s without the token: %d %s", x.method, x.path, w.Code, w.Body)
		}
		w := do(c, x.method, "/console/api"+x.path, x.body, map[string]string{CSRFHeader: csrf}, ck)
		if w.Code != 200 || api.method != x.method || api.uri != x.path || api.body != x.body || api.authz != "Bearer "+goodKey {
			t.Fatalf("%s %s: %d, API got %s %s %q (authz %q)", x.method, x.path, w.Code, api.method, api.uri, api.body, api.authz)
		}
	}
}

func TestSessionExpiry(t *testing.T) {
	c, _, clk := newTestConsole(t)
	ck, _ := signIn(t, c)
	clk.t = clk.t.Add(59 * time.Second)
	if w := do(c, "GET", "/console/api/session", "", nil, ck); w.Code != 200 {
		t.Fatalf("within idle timeout: %d", w.Code)
	}
	clk.t = clk.t.Add(time.Minute) // idle for a minute
	if w := do(c, "GET", "/console/api/session", "", nil, ck); w.Code != 401 {
		t.Fatalf("idle session still valid: %d", w.Code)
	}

	ck, _ = signIn(t, c)
	for range 62 { // used every 59 s, but an hour old at the end
		clk.t = clk.t.Add(59 * time.Second)
		do(c, "GET", "/console/api/session", "", nil, ck)
	}
	if w := do(c, "GET", "/console/api/session", "", nil, ck); w.Code != 401 {
		t.Fatalf("session past its absolute lifetime still valid: %d", w.Code)
	}
}

func TestSignOutAndBound(t *testing.T) {
	c, _, _ := newTestConsole(t)
	ck, csrf := signIn(t, c)
	if w := do(c, "DELETE", "/console/api/session", "", nil, ck); w.Code != 403 {
		t.Fatalf("sign-out without CSRF token: %d", w.Code)
	}
	if w := do(c, "DELETE", "/console/api/session", "", map[string]string{CSRFHeader: csrf}, ck); w.Code != 204 {
		t.Fatalf("sign-out: %d", w.Code)
	}
	if w := do(c, "GET", "/console/api/session", "", nil, ck); w.Code != 401 {
		t.Fatalf("signed-out session still valid: %d", w.Code)
	}
	var cks []*http.Cookie
	for range 5 {
		ck, _ := signIn(t, c)
		cks = append(cks, ck)
	}
	if n := c.sessions.len(); n != 3 {
		t.Fatalf("%d sessions, bound is 3", n)
	}
	if w := do(c, "GET", "/console/api/session", "", nil, cks[0]); w.Code != 401 {
		t.Fatal("the least recently used session was not evicted")
	}
	if w := do(c, "GET", "/console/api/session", "", nil, cks[4]); w.Code != 200 {
		t.Fatal("the newest session was evicted")
	}
}

func TestRevokedKeyEndsSession(t *testing.T) {
	c, _, _ := newTestConsole(t)
	ck, _ := signIn(t, c)
	c.auth = keys{}
	if w := do(c, "GET", "/console/api/session", "", nil, ck); w.Code != 401 {
		t.Fatalf("revoked key's session: %d", w.Code)
	}
	if c.sessions.len() != 0 {
		t.Fatal("the revoked key's session is kept")
	}
}

func TestSecurityHeaders(t *testing.T) {
	c, _, _ := newTestConsole(t)
	for _, p := range []string{"/console/", "/console/assets/console.js", "/console/api/session"} {
		w := do(c, "GET", p, "", nil, nil)
		h := w.Header()
		csp := h.Get("Content-Security-Policy")
		if !strings.Contains(csp, "script-src 'self';") || !strings.Contains(csp, "connect-src 'self'") ||
			!strings.Contains(csp, "frame-ancestors 'none'") || strings.Contains(csp, "unsafe-eval") ||
			h.Get("X-Frame-Options") != "DENY" || h.Get("X-Content-Type-Options") != "nosniff" || h.Get("Referrer-Policy") == "" {
			t.Fatalf("%s: headers %v", p, h)
		}
	}
	w := do(c, "GET", "/console/", "", nil, nil)
	if w.Code != 200 || !strings.Contains(w.Body.String(), `src="assets/console.js"`) || strings.Contains(w.Body.String(), "<script>") {
		t.Fatalf("index: %d %s", w.Code, w.Body)
	}
	if w := do(c, "GET", "/console/assets/console.js", "", nil, nil); w.Code != 200 || w.Body.Len() < 1000 {
		t.Fatalf("bundle: %d, %d bytes", w.Code, w.Body.Len())
	}
}

func TestSessionsPerKeyBounded(t *testing.T) {
	c, _, _ := newTestConsole(t)
	c.sessions.max = 100
	var cks []*http.Cookie
	for range MaxSessionsPerKey + 3 {
		ck, _ := signIn(t, c)
		cks = append(cks, ck)
	}
	if n := c.sessions.len(); n != MaxSessionsPerKey {
		t.Fatalf("%d sessions of one key, bound is %d", n, MaxSessionsPerKey)
	}
	if w := do(c, "GET", "/console/api/session", "", nil, cks[2]); w.Code != 401 {
		t.Fatal("the key's oldest sessions were kept")
	}
	if w := do(c, "GET", "/console/api/session", "", nil, cks[3]); w.Code != 200 {
		t.Fatal("a session within the key's bound was dropped")
	}
}
