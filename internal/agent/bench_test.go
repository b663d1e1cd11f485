package agent

import (
	"context"
	"slices"
	"testing"
	"time"

	"connectrpc.com/connect"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
)

// BenchmarkExec is a unary exec of /bin/true through the client over the unix socket.
func BenchmarkExec(b *testing.B) {
	h := startAgent(b, longMain())
	ctx := context.Background()
	req := &agentv1.ExecRequest{Command: []string{"/bin/true"}}
	if _, err := h.client.Exec(ctx, connect.NewRequest(req)); err != nil { // warm the connection
		b.Fatal(err)
	}
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for b.Loop() {
		start := time.Now()
		res, err := h.client.Exec(ctx, connect.NewRequest(req))
		if err != nil || res.Msg.ExitCode != 0 {
			b.Fatal(res, err)
		}
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}
