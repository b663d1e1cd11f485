package egress

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"testing"
	"time"
)

// benchDialers are the two ways to the Internet's server for api.example.test: straight
// to its address, or through the proxy from a granted source.
func benchDialers(b *testing.B) (*proxyEnv, map[string]func(context.Context) (net.Conn, error)) {
	e := newProxyEnv(b, func(p *Proxy) { p.Log = slog.New(slog.DiscardHandler) })
	direct := e.real.Addr.String()
	fromGranted := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(granted, 0))}
	return e, map[string]func(context.Context) (net.Conn, error){
		"direct": func(ctx context.Context) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", direct)
		},
		"proxy": func(ctx context.Context) (net.Conn, error) {
			return fromGranted.DialContext(ctx, "tcp", e.addr)
		},
	}
}

// BenchmarkProxyThroughput: one TLS connection streaming from the server, MB/s through
// the splice against the same stream direct. Each op is 1 MiB.
func BenchmarkProxyThroughput(b *testing.B) {
	const chunk = 1 << 20
	e, dialers := benchDialers(b)
	for _, name := range []string{"direct", "proxy"} {
		dial := dialers[name]
		b.Run(name, func(b *testing.B) {
			tr := &http.Transport{
				DialContext:     func(ctx context.Context, _, _ string) (net.Conn, error) { return dial(ctx) },
				TLSClientConfig: e.in.ClientConfig("api.example.test"),
			}
			defer tr.CloseIdleConnections()
			client := &http.Client{Transport: tr}
			get := func(n int64) {
				resp, err := client.Get(fmt.Sprintf("https://api.example.test/zero?n=%d", n))
				if err != nil {
					b.Fatal(err)
				}
				defer resp.Body.Close()
				if got, err := io.Copy(io.Discard, resp.Body); err != nil || got != n {
					b.Fatalf("read %d of %d bytes: %v", got, n, err)
				}
			}
			get(1) // the connection, kept alive: the loop measures the stream alone
			b.SetBytes(chunk)
			b.ResetTimer()
			get(int64(b.N) * chunk)
		})
	}
}

// BenchmarkProxyConnect: connection rate, TCP connect plus a full TLS handshake, through
// the proxy (which also resolves the name each time) against direct.
func BenchmarkProxyConnect(b *testing.B) {
	e, dialers := benchDialers(b)
	for _, name := range []string{"direct", "proxy"} {
		dial := dialers[name]
		b.Run(name, func(b *testing.B) {
			start := time.Now()
			for b.Loop() {
				c, err := dial(context.Background())
				if err != nil {
					b.Fatal(err)
				}
				tc := tls.Client(c, e.in.ClientConfig("api.example.test"))
				_ = tc.SetDeadline(time.Now().Add(10 * time.Second))
				if err := tc.Handshake(); err != nil {
					b.Fatal(err)
				}
				_ = tc.Close()
			}
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "conns/s")
		})
	}
}
