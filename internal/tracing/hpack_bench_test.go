package tracing

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"connectrpc.com/connect"
	"go.opentelemetry.io/otel/trace"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1/agentv1connect"
)

// countingConn counts the bytes written on it into n.
type countingConn struct {
	net.Conn
	n *atomic.Int64
}

func (c countingConn) Write(p []byte) (int, error) {
	k, err := c.Conn.Write(p)
	c.n.Add(int64(k))
	return k, err
}

// BenchmarkTraceparentHPACK: a unary gRPC call over one HTTP/2 (h2c) connection, as
// the runner's to an agent, with no traceparent, the same traceparent on every call, and
// a new one on every call (as a traced call has: its client span's ID) — what HPACK's
// dynamic table makes of it: the bytes the client writes per call (wire-B/op) and the
// CPU of both ends. A new value each call is added to the table (and evicts older
// entries once it is full, the call's other headers too, which are then sent again).
// The -notable modes: the client's encoder indexes nothing (MaxEncoderHeaderTableSize
// 1), every header a literal — the alternative to the churn, measured: see
// docs/observability.md.
func BenchmarkTraceparentHPACK(b *testing.B) {
	for _, mode := range []string{"none", "fixed", "fresh", "none-notable", "fresh-notable"} {
		b.Run(mode, func(b *testing.B) {
			path, handler := agentv1connect.NewAgentServiceHandler(&hop{})
			mux := http.NewServeMux()
			mux.Handle(path, handler)
			srv := httptest.NewUnstartedServer(mux)
			srv.Config.Protocols = new(http.Protocols)
			srv.Config.Protocols.SetUnencryptedHTTP2(true)
			srv.Start()
			b.Cleanup(srv.Close)
			var wrote atomic.Int64
			protos := new(http.Protocols)
			protos.SetUnencryptedHTTP2(true)
			tr := &http.Transport{Protocols: protos, DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
				if err != nil {
					return nil, err
				}
				return countingConn{c, &wrote}, nil
			}}
			if strings.HasSuffix(mode, "-notable") { // the client's HPACK encoder indexes nothing
				tr.HTTP2 = &http.HTTP2Config{MaxEncoderHeaderTableSize: 1}
			}
			b.Cleanup(tr.CloseIdleConnections)
			c := agentv1connect.NewAgentServiceClient(&http.Client{Transport: tr}, srv.URL, connect.WithGRPC())
			sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: trace.SpanID{1}, TraceFlags: trace.FlagsSampled})
			call := func(i int) {
				req := connect.NewRequest(&agentv1.ExecRequest{})
				switch strings.TrimSuffix(mode, "-notable") {
				case "fixed":
					inject(sc, req.Header())
				case "fresh":
					sid := trace.SpanID{}
					sid[0], sid[1], sid[2] = byte(i), byte(i>>8), byte(i>>16)
					sid[7] = 1
					inject(sc.WithSpanID(sid), req.Header())
				}
				if _, err := c.Exec(context.Background(), req); err != nil {
					b.Fatal(err)
				}
			}
			for i := range 200 { // the connection, and a full table
				call(i)
			}
			b.ReportAllocs()
			b.ResetTimer()
			w0, cpu0 := wrote.Load(), cpuTime(b)
			for i := range b.N {
				call(1000 + i)
			}
			b.ReportMetric(float64(cpuTime(b)-cpu0)/float64(b.N), "cpu-ns/op")
			b.ReportMetric(float64(wrote.Load()-w0)/float64(b.N), "wire-B/op")
		})
	}
}
