package edge

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// cookieEcho answers with the Cookie and Authorization headers the sandbox got.
var cookieEcho = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	_, _ = io.WriteString(w, "cookie="+r.Header.Get("Cookie")+" auth="+r.Header.Get("Authorization"))
})

// loginAuthorizer accepts key-a for sbxA's organization; key-b is another
// organization's key, anything else no key at all.
func loginAuthorizer(_ context.Context, token, org string) error {
	switch {
	case token == "key-a" && org == "org-"+sbxA:
		return nil
	case token == "key-b":
		return errors.New("key of another org")
	default:
		return ErrUnauthenticated
	}
}

// browser is a client with a cookie jar that does not follow redirects, so each step
// of the login dance is seen.
func browser(t *testing.T, te *testEdge, proto string) *http.Client {
	t.Helper()
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	c := te.client(proto)
	c.Jar = jar
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return c
}

func do(t *testing.T, c *http.Client, method, u string, body url.Values, header ...string) (*http.Response, string) {
	t.Helper()
	var r io.Reader
	if body != nil {
		r = strings.NewReader(body.Encode())
	}
	req, err := http.NewRequest(method, u, r)
	if err != nil {
		t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	res, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, u, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res, string(b)
}

func TestBrowserLoginSetsSessionCookie(t *testing.T) {
	te := startEdge(t, func(c *Config) { c.Authorize = loginAuthorizer })
	base := te.httpRoute(t, sbxA, 8080, AuthToken, 0, cookieEcho)
	for _, proto := range []string{"h2", "http/1.1"} {
		t.Run(proto, func(t *testing.T) {
			c := browser(t, te, proto)
			u, _ := url.Parse(base)
			c.Jar.SetCookies(u, []*http.Cookie{{Name: "app", Value: "1"}})

			// A page without credentials goes to the login page, an API call gets 401.
			res, _ := do(t, c, http.MethodGet, base+"/page?x=1", nil, "Accept", "text/html") //nolint:bodyclose // do closes
			if res.StatusCode != http.StatusSeeOther || res.Header.Get("Location") != "/.sandboxd/login?next=%2Fpage%3Fx%3D1" {
				t.Fatalf("page without credentials: %s Location %q, want 303 to the login page", res.Status, res.Header.Get("Location"))
			}
			if res, _ := do(t, c, http.MethodGet, base+"/api", nil); res.StatusCode != http.StatusUnauthorized { //nolint:bodyclose // do closes
				t.Fatalf("API call without credentials: %s, want 401", res.Status)
			}
			res, body := do(t, c, http.MethodGet, base+"/.sandboxd/login?next=%2Fpage%3Fx%3D1", nil) //nolint:bodyclose // do closes
			if res.StatusCode != http.StatusOK || !strings.Contains(body, `name="key"`) || !strings.Contains(body, `value="/page?x=1"`) {
				t.Fatalf("login page: %s %q", res.Status, body)
			}

			for _, tc := range []struct {
				key  string
				want int
			}{{"", http.StatusUnauthorized}, {"nope", http.StatusUnauthorized}, {"key-b", http.StatusForbidden}} {
				res, body := do(t, c, http.MethodPost, base+"/.sandboxd/login", url.Values{"key": {tc.key}, "next": {"/page"}}) //nolint:bodyclose // do closes
				if res.StatusCode != tc.want || res.Header.Get("Set-Cookie") != "" || !strings.Contains(body, "<form") {
					t.Errorf("login with %q: %s Set-Cookie %q, want %d and the form again", tc.key, res.Status, res.Header.Get("Set-Cookie"), tc.want)
				}
			}

			res, _ = do(t, c, http.MethodPost, base+"/.sandboxd/login", url.Values{"key": {"key-a"}, "next": {"/page?x=1"}}) //nolint:bodyclose // do closes
			if res.StatusCode != http.StatusSeeOther || res.Header.Get("Location") != "/page?x=1" {
				t.Fatalf("login: %s Location %q, want 303 to /page?x=1", res.Status, res.Header.Get("Location"))
			}
			set := res.Header.Get("Set-Cookie")
			for _, attr := range []string{sessionCookie + "=", "Path=/", "Secure", "HttpOnly", "SameSite=Lax", "Max-Age=3600"} {
				if !strings.Contains(set, attr) {
					t.Errorf("Set-Cookie %q lacks %s", set, attr)
				}
			}

			// Signed in: the sandbox gets the request, with the app's cookie and without ours.
			res, body = do(t, c, http.MethodGet, base+"/page", nil, "Accept", "text/html") //nolint:bodyclose // do closes
			if res.StatusCode != http.StatusOK || body != "cookie=app=1 auth=" {
				t.Fatalf("signed in: %s %q, want 200 with only the app's cookie", res.Status, body)
			}

			res, _ = do(t, c, http.MethodGet, base+"/.sandboxd/logout", nil) //nolint:bodyclose // do closes
			if res.StatusCode != http.StatusOK {
				t.Fatalf("logout: %s", res.Status)
			}
			if res, _ := do(t, c, http.MethodGet, base+"/page", nil); res.StatusCode != http.StatusUnauthorized { //nolint:bodyclose // do closes
				t.Fatalf("after logout: %s, want 401", res.Status)
			}
		})
	}
}

func TestSessionCookieIsBoundToHostOrgAndTime(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	s := session{key: []byte("k"), ttl: time.Hour, now: func() time.Time { return now }}
	host := Host(8080, sbxA, testRunner, testDomain)
	v := s.issue(host, "org-a", "k1")
	other := session{key: []byte("other key"), ttl: time.Hour, now: s.now}
	tampered := []byte(v)
	tampered[len(tampered)-2] ^= 1
	for _, tc := range []struct {
		name, value, host, org string
		at                     time.Time
		want                   bool
	}{
		{"valid", v, host, "org-a", now, true},
		{"just before expiry", v, host, "org-a", now.Add(time.Hour - time.Second), true},
		{"expired", v, host, "org-a", now.Add(time.Hour), false},
		{"other host", v, Host(8081, sbxA, testRunner, testDomain), "org-a", now, false},
		{"other org", v, host, "org-b", now, false},
		{"tampered", string(tampered), host, "org-a", now, false},
		{"other key", other.issue(host, "org-a", "k1"), host, "org-a", now, false},
		{"old format without key", v[:strings.Index(v, ".")] + "." + strings.SplitN(v, ".", 3)[1] + "." + strings.SplitN(v, ".", 4)[3], host, "org-a", now, false},
		{"garbage", "x.y", host, "org-a", now, false},
		{"empty", "", host, "org-a", now, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			at := tc.at
			s.now = func() time.Time { return at }
			keyID, got := s.valid(tc.value, tc.host, tc.org)
			if got != tc.want || got && keyID != "k1" {
				t.Errorf("valid = %q %v, want k1 %v", keyID, got, tc.want)
			}
		})
	}
}

func TestSessionCookieOfAnotherEndpointIsRefused(t *testing.T) {
	te := startEdge(t, func(c *Config) { c.Authorize = loginAuthorizer })
	a := te.httpRoute(t, sbxA, 8080, AuthToken, 0, cookieEcho)
	b := te.httpRoute(t, sbxA, 9090, AuthToken, 0, cookieEcho)
	c := browser(t, te, "http/1.1")
	res, _ := do(t, c, http.MethodPost, a+"/.sandboxd/login", url.Values{"key": {"key-a"}}) //nolint:bodyclose // do closes
	if res.StatusCode != http.StatusSeeOther {
		t.Fatalf("login: %s", res.Status)
	}
	var value string
	for _, ck := range res.Cookies() {
		if ck.Name == sessionCookie {
			value = ck.Value
		}
	}
	res, body := do(t, c, http.MethodGet, b+"/", nil, "Cookie", sessionCookie+"="+value) //nolint:bodyclose // do closes
	if res.StatusCode != http.StatusUnauthorized {
		t.Fatalf("port 9090 with port 8080's session: %s %q, want 401", res.Status, body)
	}
}

func TestCrossOriginLoginRefused(t *testing.T) {
	te := startEdge(t, func(c *Config) { c.Authorize = loginAuthorizer })
	base := te.httpRoute(t, sbxA, 8080, AuthToken, 0, cookieEcho)
	c := browser(t, te, "h2")
	res, _ := do(t, c, http.MethodPost, base+"/.sandboxd/login", url.Values{"key": {"key-a"}}, "Origin", "https://evil.example") //nolint:bodyclose // do closes
	if res.StatusCode != http.StatusForbidden || res.Header.Get("Set-Cookie") != "" {
		t.Fatalf("cross-origin login: %s Set-Cookie %q, want 403 and no cookie", res.Status, res.Header.Get("Set-Cookie"))
	}
	res, _ = do(t, c, http.MethodPost, base+"/.sandboxd/login", url.Values{"key": {"key-a"}}, "Origin", base) //nolint:bodyclose // do closes
	if res.StatusCode != http.StatusSeeOther {
		t.Fatalf("same-origin login: %s, want 303", res.Status)
	}
}

func TestOpenEndpointsOwnEveryPath(t *testing.T) {
	te := startEdge(t, nil)
	base := te.httpRoute(t, sbxA, 8080, AuthOpen, 0, cookieEcho)
	res, body := do(t, te.client("http/1.1"), http.MethodGet, base+"/.sandboxd/login", nil, "Cookie", sessionCookie+"=x") //nolint:bodyclose // do closes
	if res.StatusCode != http.StatusOK || body != "cookie="+sessionCookie+"=x auth=" {
		t.Fatalf("OPEN endpoint: %s %q, want the workload's answer with the cookie untouched", res.Status, body)
	}
}

func TestSafeNext(t *testing.T) {
	for in, want := range map[string]string{
		"/page?x=1":              "/page?x=1",
		"/":                      "/",
		"":                       "/",
		"//evil.example/":        "/",
		"/\\evil.example":        "/",
		"https://evil.example":   "/",
		"/.sandboxd/login":       "/",
		"/a\r\nSet-Cookie: x":    "/",
		"/\t/evil.example/phish": "/",
		"/\n/evil.example":       "/",
		"/a\\b":                  "/",
		"/a b":                   "/",
		"/a\x00":                 "/",
		"/a\x7f":                 "/",
		"/\x1f":                  "/",
		"/é":                     "/",
		"/a/b?c=d&e=%2F":         "/a/b?c=d&e=%2F",
	} {
		if got := safeNext(in); got != want {
			t.Errorf("safeNext(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestWithoutSession(t *testing.T) {
	for _, tc := range []struct {
		in, want []string
	}{
		{nil, nil},
		{[]string{sessionCookie + "=v"}, nil},
		{[]string{"a=1; " + sessionCookie + "=v; b=2"}, []string{"a=1; b=2"}},
		{[]string{"a=1", sessionCookie + "=v"}, []string{"a=1"}},
		{[]string{"__Host-sandboxdx=1"}, []string{"__Host-sandboxdx=1"}},
		{[]string{"a=1; " + sessionCookie + " =v; b=2"}, []string{"a=1; b=2"}}, // net/http's parser trims the name
		{[]string{" " + sessionCookie + "\t=v;a=1"}, []string{"a=1"}},
		{[]string{"__host-SANDBOXD=v; a=1"}, []string{"a=1"}},
	} {
		got := withoutSession(tc.in)
		if strings.Join(got, "|") != strings.Join(tc.want, "|") || (got == nil) != (tc.want == nil) {
			t.Errorf("withoutSession(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestRevokedKeyEndsItsSessions: a session remembers its key's ID, and once KeyActive
// says the key is revoked the cookie no longer lets anything through (within the cache's
// few seconds).
func TestRevokedKeyEndsItsSessions(t *testing.T) {
	const key = "sbx_0123456789abcdef_secret"
	var revoked atomic.Bool
	var asked atomic.Int32
	te := startEdge(t, func(c *Config) {
		c.Authorize = func(_ context.Context, token, org string) error {
			if token == key && org == "org-"+sbxA {
				return nil
			}
			return ErrUnauthenticated
		}
		c.KeyActive = func(_ context.Context, keyID, org string) error {
			asked.Add(1)
			if keyID != "0123456789abcdef" || org != "org-"+sbxA || revoked.Load() {
				return errors.New("revoked")
			}
			return nil
		}
	})
	base := te.httpRoute(t, sbxA, 8080, AuthToken, 0, cookieEcho)
	c := browser(t, te, "h2")
	if res, _ := do(t, c, http.MethodPost, base+"/.sandboxd/login", url.Values{"key": {key}, "next": {"/"}}); res.StatusCode != http.StatusSeeOther { //nolint:bodyclose // do closes
		t.Fatalf("login: %s", res.Status)
	}
	if res, _ := do(t, c, http.MethodGet, base+"/api", nil); res.StatusCode != http.StatusOK { //nolint:bodyclose // do closes
		t.Fatalf("signed in: %s", res.Status)
	}
	if asked.Load() == 0 {
		t.Fatal("the session's key was not checked")
	}
	revoked.Store(true)
	deadline := time.Now().Add(sessionKeyCacheTTL + 2*time.Second)
	for {
		res, _ := do(t, c, http.MethodGet, base+"/api", nil) //nolint:bodyclose // do closes
		if res.StatusCode == http.StatusUnauthorized {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("session of a revoked key still works after %v: %s", sessionKeyCacheTTL+2*time.Second, res.Status)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
