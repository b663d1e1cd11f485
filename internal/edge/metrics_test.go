package edge

import (
	"io"
	"net"
	"net/http"
	"testing"

	"github.com/sandboxd/sandboxd/internal/metrics/counters"
)

// TestEdgeRequestMetrics: each request an HTTPS endpoint answers counts once by status
// class, over HTTP/1.1 (the fast path) and HTTP/2 (net/http), whether the sandbox
// answered or the edge refused it (an unknown endpoint's 404).
func TestEdgeRequestMetrics(t *testing.T) {
	te := startEdge(t, nil)
	url := te.httpRoute(t, sbxA, 8080, AuthOpen, 0, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/teapot" {
			w.WriteHeader(http.StatusTeapot)
			return
		}
		_, _ = io.WriteString(w, "ok")
	}))
	key := func(class string) string {
		return `cwsandbox_edge_requests_total{code_class="` + class + `",kind="https"}`
	}
	for _, proto := range []string{"http/1.1", "h2"} {
		c := te.client(proto)
		for _, tc := range []struct {
			url   string
			class string
		}{
			{url + "/", "2xx"},
			{url + "/teapot", "4xx"},
			{"https://" + Host(8081, sbxA, testRunner, testDomain) + "/", "4xx"}, // no such endpoint: the edge's 404
		} {
			before := counters.Values()
			resp, err := c.Get(tc.url)
			if err != nil {
				t.Fatalf("%s %s: %v", proto, tc.url, err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if got := resp.Proto; proto == "h2" && got != "HTTP/2.0" {
				t.Fatalf("%s: got %s", proto, got)
			}
			after := counters.Values()
			for _, class := range []string{"2xx", "4xx", "5xx"} {
				want := 0.0
				if class == tc.class {
					want = 1
				}
				if got := after[key(class)] - before[key(class)]; got != want {
					t.Errorf("%s %s (%d): %s grew by %v, want %v", proto, tc.url, resp.StatusCode, class, got, want)
				}
			}
		}
	}
}

// TestEdgePassthroughMetrics: a TLS_PASSTHROUGH connection counts once, spliced when the
// sandbox's port answers, unreachable when it does not.
func TestEdgePassthroughMetrics(t *testing.T) {
	te := startEdge(t, nil)
	host := Host(5432, sbxB, testRunner, testDomain)
	w := startWorkload(t, host)
	te.rm.add(Route{SandboxID: sbxB, Port: 5432, Kind: KindPassthrough, Backend: addrPort(t, w.addr)})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr()
	ln.Close()
	te.rm.add(Route{SandboxID: sbxB, Port: 5433, Kind: KindPassthrough, Backend: addrPort(t, closed)})
	key := func(r string) string { return `cwsandbox_edge_passthrough_connections_total{result="` + r + `"}` }

	before := counters.Values()
	c, err := te.dialTLS(host, w.ca.Pool())
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if _, err := te.dialTLS(Host(5433, sbxB, testRunner, testDomain), te.roots); err == nil {
		t.Fatal("handshake succeeded with nothing listening behind the edge")
	}
	after := counters.Values()
	for r, want := range map[string]float64{counters.EdgeSpliced: 1, counters.EdgeUnreachable: 1} {
		if got := after[key(r)] - before[key(r)]; got != want {
			t.Errorf("%s grew by %v, want %v", r, got, want)
		}
	}
}
