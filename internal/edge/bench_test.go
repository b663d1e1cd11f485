package edge

import (
	"bufio"
	"bytes"
	"io"
	"log/slog"
	"net/http"
	"testing"
)

// BenchmarkHTTPSRequest is one keep-alive HTTP/1.1 request through the edge, with client
// and backend in this process: for the allocations and profile of the edge's request
// path (bench/edge compares the edge with HAProxy).
func BenchmarkHTTPSRequest(b *testing.B) {
	te := startEdge(b, func(c *Config) { c.Logger = slog.New(slog.DiscardHandler) })
	url := te.httpRoute(b, sbxA, 8080, AuthOpen, 0, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "hello")
	}))
	c := te.client("http/1.1")
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			res, err := c.Get(url)
			if err != nil {
				b.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, res.Body)
			res.Body.Close()
		}
	})
}

// BenchmarkStrictHead is the fast path's strict check of a browser-like request head,
// the per-request cost the smuggling defence adds.
func BenchmarkStrictHead(b *testing.B) {
	head := []byte("GET /static/app.js?v=3 HTTP/1.1\r\nHost: 8080-abcdefghijklmn23.r1.edge.test\r\n" +
		"User-Agent: Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120.0 Safari/537.36\r\n" +
		"Accept: text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8\r\nAccept-Language: en-US,en;q=0.5\r\n" +
		"Accept-Encoding: gzip, deflate, br\r\nCookie: a=1; b=2; theme=dark\r\nSec-Fetch-Dest: script\r\nConnection: keep-alive\r\n\r\n")
	req, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(head)))
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(head)))
	b.ReportAllocs()
	for b.Loop() {
		if why := checkRequest(req, head); why != "" {
			b.Fatal(why)
		}
	}
}
