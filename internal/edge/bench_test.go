package edge

import (
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
