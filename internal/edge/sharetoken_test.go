package edge

import (
	"bufio"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/testenv/logbuf"
)

// shareEcho answers with the request target and the headers the sandbox got.
var shareEcho = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	_, _ = io.WriteString(w, "target="+r.RequestURI+" share="+r.Header.Get(ShareTokenHeader)+" auth="+r.Header.Get("Authorization")+" cookie="+r.Header.Get("Cookie"))
})

// shareRoute adds a SHARE_TOKEN route of sandbox id whose share token is token ("": none).
func (te *testEdge) shareRoute(t testing.TB, id string, port int, token string) string {
	t.Helper()
	srv := httptest.NewServer(shareEcho)
	t.Cleanup(srv.Close)
	rt := Route{SandboxID: id, Org: "org-" + id, Port: port, Kind: KindHTTPS, Auth: AuthToken, Backend: addrPort(t, srv.Listener.Addr())}
	if token != "" {
		rt.ShareTokenHash = ShareTokenHash(token)
	}
	if err := rt.Validate(); err != nil {
		t.Fatal(err)
	}
	te.rm.add(rt)
	return "https://" + Host(port, id, testRunner, testDomain)
}

// garbledRoute adds a SHARE_TOKEN route of sandbox id (token) whose backend reads each
// request's header and answers bytes that are no HTTP response: the edge logs a proxy
// error for every request to it.
func (te *testEdge) garbledRoute(t testing.TB, id string, port int, token string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					line, err := br.ReadString('\n')
					if err != nil || line == "\r\n" {
						break
					}
				}
				_, _ = io.WriteString(c, "this is no HTTP response\r\n\r\n")
			}()
		}
	}()
	rt := Route{SandboxID: id, Org: "org-" + id, Port: port, Kind: KindHTTPS, Auth: AuthToken, Backend: addrPort(t, ln.Addr()), ShareTokenHash: ShareTokenHash(token)}
	if err := rt.Validate(); err != nil {
		t.Fatal(err)
	}
	te.rm.add(rt)
	return "https://" + Host(port, id, testRunner, testDomain)
}

// TestShareToken: a SHARE_TOKEN endpoint lets in its own sandbox's token (header or query
// parameter, which is cut from the target) or an API key, refuses every other token, and
// passes no credential to the sandbox. The edge never logs a share token: requests that
// carry one make it log (at debug level) a refused API key, a proxy error (the sandbox
// answers no HTTP) and a sandbox that cannot be woken, and none of those lines holds it.
func TestShareToken(t *testing.T) {
	const (
		tokA = "tokA-0123456789abcdefghijklmnopqrstuvwxyzABC" // sbxA's
		tokB = "tokB-0123456789abcdefghijklmnopqrstuvwxyzABC" // sbxB's
		tokC = "tokC-0123456789abcdefghijklmnopqrstuvwxyzABC" // sbxC's
		sbxC = "cccccccccccccc44"                             // cannot be woken
	)
	var logs logbuf.Buffer
	te := startEdge(t, func(c *Config) {
		c.Authorize = loginAuthorizer
		c.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
		c.Wake = func(_ context.Context, id string) (func(), error) {
			if id == sbxC {
				return nil, errors.New("the sandbox could not be resumed")
			}
			return func() {}, nil
		}
	})
	a := te.shareRoute(t, sbxA, 8080, tokA)
	a2 := te.shareRoute(t, sbxA, 8081, tokA) // another SHARE_TOKEN port of the same sandbox
	b := te.shareRoute(t, sbxB, 8080, tokB)
	keysOnly := te.shareRoute(t, sbxA, 8082, "") // a sandbox made before share tokens
	garbled := te.garbledRoute(t, sbxA, 8083, tokA)
	asleep := te.shareRoute(t, sbxC, 8080, tokC)
	for _, proto := range []string{"h2", "http/1.1"} {
		t.Run(proto, func(t *testing.T) {
			c := te.client(proto)
			c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
			for _, tc := range []struct {
				name   string
				url    string
				header []string
				code   int
				target string // what the sandbox saw, when it answered
			}{
				{"header", a + "/p?x=1", []string{ShareTokenHeader, tokA}, 200, "/p?x=1"},
				{"header, the sandbox's other port", a2 + "/", []string{ShareTokenHeader, tokA}, 200, "/"},
				{"header of sandbox B's token on its own endpoint", b + "/", []string{ShareTokenHeader, tokB}, 200, "/"},
				{"query parameter, the rest kept byte for byte", a + "/p?a=1&" + ShareTokenParam + "=" + tokA + "&b=%2Fx&c", nil, 200, "/p?a=1&b=%2Fx&c"},
				{"query parameter alone", a + "/p?" + ShareTokenParam + "=" + tokA, nil, 200, "/p"},
				{"query parameter with its name escaped", a + "/p?sandbox%5Fshare%5Ftoken=" + tokA + "&z=2", nil, 200, "/p?z=2"},
				{"API key", a + "/k", []string{"Authorization", "Bearer key-a"}, 200, "/k"},
				{"another sandbox's token in the header", a + "/", []string{ShareTokenHeader, tokB}, 401, ""},
				{"another sandbox's token in the query", a + "/?" + ShareTokenParam + "=" + tokB, nil, 401, ""},
				{"sandbox A's token on sandbox B", b + "/", []string{ShareTokenHeader, tokA}, 401, ""},
				{"no credentials", a + "/", nil, 401, ""},
				{"an empty token", a + "/?" + ShareTokenParam + "=", nil, 401, ""},
				{"two different tokens in the query", a + "/?" + ShareTokenParam + "=" + tokA + "&" + ShareTokenParam + "=x", nil, 401, ""},
				{"a wrong token next to a valid API key", a + "/", []string{ShareTokenHeader, "nope", "Authorization", "Bearer key-a"}, 401, ""},
				{"a token where the sandbox has none", keysOnly + "/", []string{ShareTokenHeader, tokA}, 401, ""},
				{"an API key where the sandbox has none", keysOnly + "/?" + ShareTokenParam + "=" + tokA + "&q", []string{"Authorization", "Bearer key-a"}, 401, ""},
				// Requests the edge logs, each with tokens wherever a request can carry them.
				{"another org's API key, a token in the cookie and the path", keysOnly + "/" + tokA, []string{"Authorization", "Bearer key-b", "Cookie", "t=" + tokA}, 403, ""},
				{"a sandbox that answers no HTTP", garbled + "/" + tokA + "?" + ShareTokenParam + "=" + tokA + "&x=" + tokB, []string{ShareTokenHeader, tokA, "Cookie", "t=" + tokB}, 502, ""},
				{"a sandbox that cannot be woken", asleep + "/" + tokC + "?" + ShareTokenParam + "=" + tokC, []string{ShareTokenHeader, tokC}, 503, ""},
			} {
				res, body := do(t, c, http.MethodGet, tc.url, nil, tc.header...) //nolint:bodyclose // do closes
				if res.StatusCode != tc.code {
					t.Errorf("%s: %s %q, want %d", tc.name, res.Status, body, tc.code)
					continue
				}
				if strings.Contains(body, "tokA") || strings.Contains(body, "tokB") || strings.Contains(body, "tokC") || strings.Contains(body, "key-a") {
					t.Errorf("%s: a credential came back or reached the sandbox: %q", tc.name, body)
				}
				if tc.code == 200 && !strings.HasPrefix(body, "target="+tc.target+" share= auth= ") {
					t.Errorf("%s: the sandbox got %q, want target %s without credentials", tc.name, body, tc.target)
				}
			}
		})
	}
	l := logs.String()
	for _, line := range []string{"token refused", "proxy error", "sandbox not woken"} {
		if strings.Count(l, line) < 2 { // once per protocol
			t.Errorf("the edge did not log %q for each protocol (this test could not see a token in it):\n%s", line, l)
		}
	}
	for _, part := range []string{"tokA-", "tokB-", "tokC-", "0123456789abcdefghijklmnopqrstuvwxyzABC"} { // any part of one
		if strings.Contains(l, part) {
			t.Errorf("the edge logged (part of) a share token, %q:\n%s", part, l)
		}
	}
}

// TestShareTokenBrowser: a page request with the token in its query gets the session
// cookie and a redirect to its URL without it; the cookie then lets the browser in on
// that endpoint only.
func TestShareTokenBrowser(t *testing.T) {
	const tok = "browser-token-0123456789abcdefghijklmnopqrs"
	te := startEdge(t, nil)
	a := te.shareRoute(t, sbxA, 8080, tok)
	a2 := te.shareRoute(t, sbxA, 8081, tok)
	for _, proto := range []string{"h2", "http/1.1"} {
		t.Run(proto, func(t *testing.T) {
			c := browser(t, te, proto)
			res, _ := do(t, c, http.MethodGet, a+"/app/page?x=1&"+ShareTokenParam+"="+tok, nil, "Accept", "text/html") //nolint:bodyclose // do closes
			if res.StatusCode != http.StatusSeeOther || res.Header.Get("Location") != "/app/page?x=1" {
				t.Fatalf("page with the token: %s Location %q, want 303 to /app/page?x=1", res.Status, res.Header.Get("Location"))
			}
			cookies := res.Cookies()
			if len(cookies) != 1 || cookies[0].Name != sessionCookie || !cookies[0].Secure || !cookies[0].HttpOnly || strings.Contains(cookies[0].Value, tok) {
				t.Fatalf("cookies %v, want the session cookie (Secure, HttpOnly, without the token)", cookies)
			}
			res, body := do(t, c, http.MethodGet, a+"/app/page?x=1", nil, "Accept", "text/html") //nolint:bodyclose // do closes
			if res.StatusCode != http.StatusOK || body != "target=/app/page?x=1 share= auth= cookie=" {
				t.Fatalf("after the redirect: %s %q, want 200 with no credential reaching the sandbox", res.Status, body)
			}
			// The session is bound to the host: the other port wants the token again.
			if res, _ := do(t, c, http.MethodGet, a2+"/", nil); res.StatusCode != http.StatusUnauthorized { //nolint:bodyclose // do closes
				t.Errorf("the session of port 8080 on port 8081: %s, want 401", res.Status)
			}
			// A forged cookie (another key's signature) does not pass.
			forged := &Edge{sessions: session{key: NewSessionKey(), ttl: time.Hour, now: time.Now}}
			u, _ := url.Parse(a)
			fc := te.client(proto)
			req, _ := http.NewRequest(http.MethodGet, a+"/", nil)
			req.AddCookie(&http.Cookie{Name: sessionCookie, Value: forged.sessions.issue(u.Hostname(), "org-"+sbxA, shareSession)})
			if res, err := fc.Do(req); err != nil || res.StatusCode != http.StatusUnauthorized {
				t.Errorf("forged share session: %v %v, want 401", res, err)
			} else {
				res.Body.Close()
			}
		})
	}
}

func TestCutShareTokenParam(t *testing.T) {
	for _, tc := range []struct {
		target, want string
		vals         []string
	}{
		{"/p", "/p", nil},
		{"/p?a=1", "/p?a=1", nil},
		{"/p?" + ShareTokenParam + "=t", "/p", []string{"t"}},
		{"/p?a=1&" + ShareTokenParam + "=t&b=2", "/p?a=1&b=2", []string{"t"}},
		{"/p?" + ShareTokenParam + "=t&" + ShareTokenParam + "=u", "/p", []string{"t", "u"}},
		{"/p?" + ShareTokenParam, "/p", []string{""}},
		{"/p?sandbox_share_token%3D=t", "/p?sandbox_share_token%3D=t", nil}, // another name
		{"/p?%73andbox_share_token=a%2Bb", "/p", []string{"a+b"}},
		{"/p?x=%zz&" + ShareTokenParam + "=%zz", "/p?x=%zz", []string{""}}, // malformed value: no token
		{"/p?a=1&&b", "/p?a=1&&b", nil},
	} {
		r := httptest.NewRequest(http.MethodGet, "https://x"+tc.target, nil)
		r.RequestURI = tc.target
		vals := cutShareTokenParam(r)
		if r.RequestURI != tc.want || r.URL.RequestURI() != tc.want || strings.Join(vals, ",") != strings.Join(tc.vals, ",") || (vals == nil) != (tc.vals == nil) {
			t.Errorf("%s: target %q (URL %q), values %q; want %q, %q", tc.target, r.RequestURI, r.URL.RequestURI(), vals, tc.want, tc.vals)
		}
	}
}

func TestShareTokenHash(t *testing.T) {
	h := ShareTokenHash("x")
	if !ValidShareTokenHash(h) || h != "2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881" {
		t.Fatalf("ShareTokenHash(x) = %q", h)
	}
	for _, bad := range []string{"", strings.ToUpper(h), h[1:], h + "0", strings.Replace(h, "2", "g", 1)} {
		if ValidShareTokenHash(bad) {
			t.Errorf("ValidShareTokenHash(%q) = true", bad)
		}
	}
	if !shareTokenMatches("x", h) || shareTokenMatches("y", h) || shareTokenMatches("", ShareTokenHash("")) || shareTokenMatches("x", "") {
		t.Error("shareTokenMatches compares wrongly")
	}
	ok := Route{SandboxID: sbxA, Port: 1, Kind: KindHTTPS, Auth: AuthToken, ShareTokenHash: h, Backend: netip.MustParseAddrPort("10.0.0.1:1")}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []Route{
		{SandboxID: sbxA, Port: 1, Kind: KindHTTPS, Auth: AuthOpen, ShareTokenHash: h, Backend: ok.Backend},
		{SandboxID: sbxA, Port: 1, Kind: KindHTTPS, Auth: AuthToken, ShareTokenHash: "abc", Backend: ok.Backend},
		{SandboxID: sbxA, Port: 1, Kind: KindPassthrough, ShareTokenHash: h, Backend: ok.Backend},
	} {
		if bad.Validate() == nil {
			t.Errorf("route %+v validated", bad)
		}
	}
}
