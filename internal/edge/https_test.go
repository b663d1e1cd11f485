package edge

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"
)

// seen is what the echo backend reports about the request it got.
type seen struct {
	Host, Authorization, XFF, XFProto, XFHost, Path string
}

var echo = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	_ = json.NewEncoder(w).Encode(seen{
		Host: r.Host, Authorization: r.Header.Get("Authorization"), Path: r.URL.Path,
		XFF: r.Header.Get("X-Forwarded-For"), XFProto: r.Header.Get("X-Forwarded-Proto"), XFHost: r.Header.Get("X-Forwarded-Host"),
	})
})

func get(t *testing.T, c *http.Client, url string, header ...string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	res, err := c.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatalf("GET %s: read body: %v", url, err)
	}
	return res, string(b)
}

func TestHTTPSProxiesWithForwardedHeaders(t *testing.T) {
	te := startEdge(t, nil)
	url := te.httpRoute(t, sbxA, 8080, AuthOpen, 0, echo)
	host := strings.TrimPrefix(url, "https://")
	for _, tc := range []struct {
		offer     []string
		wantProto string
	}{
		{[]string{"h2", "http/1.1"}, "HTTP/2.0"},
		{[]string{"http/1.1"}, "HTTP/1.1"},
	} {
		t.Run(tc.wantProto, func(t *testing.T) {
			// A client's own X-Forwarded-For must not reach the sandbox; the edge says who connected.
			res, body := get(t, te.client(tc.offer...), url+"/p?q=1", "X-Forwarded-For", "6.6.6.6", "Authorization", "Basic app-own") //nolint:bodyclose // get reads and closes the body
			if res.StatusCode != http.StatusOK || res.Proto != tc.wantProto {
				t.Fatalf("got %s %s, want 200 %s: %s", res.Proto, res.Status, tc.wantProto, body)
			}
			var s seen
			if err := json.Unmarshal([]byte(body), &s); err != nil {
				t.Fatal(err)
			}
			want := seen{Host: host, Authorization: "Basic app-own", XFF: "127.0.0.1", XFProto: "https", XFHost: host, Path: "/p"}
			if s != want {
				t.Errorf("backend saw %+v, want %+v", s, want)
			}
		})
	}
}

func TestHTTP2NegotiatedByALPN(t *testing.T) {
	te := startEdge(t, nil)
	host := strings.TrimPrefix(te.httpRoute(t, sbxA, 8080, AuthOpen, 0, echo), "https://")
	for _, offer := range [][]string{{"h2", "http/1.1"}, {"http/1.1"}} {
		c, err := te.dialTLS(host, te.roots, offer...)
		if err != nil {
			t.Fatal(err)
		}
		if got := c.ConnectionState().NegotiatedProtocol; got != offer[0] {
			t.Errorf("offered %v: negotiated %q, want %q", offer, got, offer[0])
		}
		c.Close()
	}
}

func TestTokenAuth(t *testing.T) {
	te := startEdge(t, func(c *Config) { c.Authorize = loginAuthorizer })
	url := te.httpRoute(t, sbxA, 8080, AuthToken, 0, echo)
	for _, proto := range []string{"h2", "http/1.1"} {
		t.Run(proto, func(t *testing.T) { testTokenAuth(t, te.client(proto), url) })
	}
}

func testTokenAuth(t *testing.T, c *http.Client, url string) {
	for _, tc := range []struct {
		name, auth string
		want       int
	}{
		{"missing", "", http.StatusUnauthorized},
		{"not bearer", "Basic a2V5LWE=", http.StatusUnauthorized},
		{"invalid", "Bearer nope", http.StatusUnauthorized},
		{"foreign", "Bearer key-b", http.StatusForbidden},
		{"valid", "Bearer key-a", http.StatusOK},
		{"valid, scheme in capitals", "BEARER key-a", http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var h []string
			if tc.auth != "" {
				h = []string{"Authorization", tc.auth}
			}
			res, body := get(t, c, url, h...) //nolint:bodyclose // get reads and closes the body
			if res.StatusCode != tc.want {
				t.Fatalf("status %d, want %d: %s", res.StatusCode, tc.want, body)
			}
			if tc.want == http.StatusUnauthorized && res.Header.Get("WWW-Authenticate") == "" {
				t.Error("401 without WWW-Authenticate")
			}
			if tc.want == http.StatusOK {
				var s seen
				if err := json.Unmarshal([]byte(body), &s); err != nil {
					t.Fatal(err)
				}
				if s.Authorization != "" {
					t.Errorf("backend got Authorization %q; the edge must strip it", s.Authorization)
				}
			}
		})
	}
}

func TestTimeoutIs504(t *testing.T) {
	te := startEdge(t, nil)
	release := make(chan struct{})
	defer close(release)
	url := te.httpRoute(t, sbxA, 8080, AuthOpen, 200*time.Millisecond, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	for _, proto := range []string{"h2", "http/1.1"} {
		start := time.Now()
		res, body := get(t, te.client(proto), url) //nolint:bodyclose // get reads and closes the body
		if res.StatusCode != http.StatusGatewayTimeout || !strings.Contains(body, "sandbox port 8080 did not answer within 200ms") {
			t.Fatalf("%s: got %d %q, want 504 naming the port and the timeout", proto, res.StatusCode, body)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("%s: 504 after %v", proto, d)
		}
	}
}

func TestRefusedIs502(t *testing.T) {
	te := startEdge(t, nil)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr()
	ln.Close() // nothing listens there now: connection refused
	te.rm.add(Route{SandboxID: sbxA, Port: 3000, Kind: KindHTTPS, Backend: addrPort(t, closed)})
	for _, proto := range []string{"h2", "http/1.1"} {
		res, body := get(t, te.client(proto), "https://"+Host(3000, sbxA, testRunner, testDomain)) //nolint:bodyclose // get reads and closes the body
		if res.StatusCode != http.StatusBadGateway || strings.TrimSpace(body) != "sandbox port 3000 is not accepting connections yet" {
			t.Errorf("%s: got %d %q, want 502 saying the port is not accepting connections", proto, res.StatusCode, body)
		}
	}
}

func TestUnknownNamesUnderTheWildcardLookAlike(t *testing.T) {
	te := startEdge(t, nil)
	te.httpRoute(t, sbxA, 8080, AuthOpen, 0, echo)
	te.rm.add(Route{SandboxID: sbxB, Port: 5432, Kind: KindPassthrough, Backend: netip.MustParseAddrPort("127.0.0.1:1")})
	names := map[string]string{
		"existing sandbox, port without endpoint": Host(9090, sbxA, testRunner, testDomain),
		"sandbox that does not exist":             Host(8080, sbxNone, testRunner, testDomain),
		"malformed label":                         "www." + testRunner + "." + testDomain,
		"port 0":                                  "0-" + sbxA + "." + testRunner + "." + testDomain,
	}
	type answer struct {
		status int
		body   string
	}
	var first *answer
	for name, host := range names {
		t.Run(name, func(t *testing.T) {
			c, err := te.dialTLS(host, te.roots, "http/1.1")
			if err != nil {
				t.Fatalf("handshake for %s: %v; names under the wildcard must complete it", host, err)
			}
			c.Close()
			for _, proto := range []string{"h2", "http/1.1"} {
				res, body := get(t, te.client(proto), "https://"+host+"/") //nolint:bodyclose // get reads and closes the body
				a := answer{res.StatusCode, body}
				if a.status != http.StatusNotFound {
					t.Errorf("%s %s: status %d, want 404", proto, host, a.status)
				}
				if first == nil {
					first = &a
				} else if a != *first {
					t.Errorf("%s %s answered %+v, another unknown name %+v: they must not differ", proto, host, a, *first)
				}
			}
		})
	}
	// A request for a passthrough name on a terminated (HTTP/2-reused) connection; and on
	// HTTP/1.1, where a client has no reason to, the same answer.
	for _, proto := range []string{"h2", "http/1.1"} {
		req, _ := http.NewRequest(http.MethodGet, "https://"+Host(9090, sbxA, testRunner, testDomain), nil)
		req.Host = Host(5432, sbxB, testRunner, testDomain)
		res, err := te.client(proto).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusMisdirectedRequest {
			t.Errorf("%s: passthrough name on a terminated connection: %d, want 421", proto, res.StatusCode)
		}
	}
}

func TestForeignNamesGetUnrecognizedName(t *testing.T) {
	te := startEdge(t, nil)
	te.httpRoute(t, sbxA, 8080, AuthOpen, 0, echo)
	for _, sni := range []string{
		"",                                     // no SNI
		"example.com",                          // another domain
		testRunner + "." + testDomain,          // the runner's own name: not under the wildcard
		"a.8080-" + sbxA + ".r1." + testDomain, // deeper than the wildcard
		"8080-" + sbxA + ".r2." + testDomain,   // another runner
	} {
		_, err := te.dialTLS(sni, te.roots)
		if err == nil || !strings.Contains(err.Error(), "unrecognized name") {
			t.Errorf("SNI %q: handshake error %v, want an unrecognized_name alert", sni, err)
		}
	}
}
