package tracing

import (
	"context"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace/noop"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
)

// cpuTime is the CPU time the process has used (user and system).
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// discard is an exporter that drops what it is given (counting it).
type discard struct{ n int }

func (d *discard) ExportSpans(_ context.Context, s []sdktrace.ReadOnlySpan) error {
	d.n += len(s)
	return nil
}
func (d *discard) Shutdown(context.Context) error { return nil }

// BenchmarkChain: an exec through the interceptors of the three hops (public server →
// client → internal server → client → agent, over loopback HTTP) with tracing off, and
// on with every call sampled and its 4 spans exported in batches (to an exporter that
// drops them) by the SDK's BatchSpanProcessor and by Setup's batcher. The difference
// to off is the in-process cost of tracing a call (allocs/op exactly).
func BenchmarkChain(b *testing.B) {
	for _, mode := range []string{"off", "sdk-batch", "batcher"} {
		b.Run(mode, func(b *testing.B) {
			prev := otel.GetTracerProvider()
			b.Cleanup(func() { otel.SetTracerProvider(prev) })
			switch mode {
			case "off":
				otel.SetTracerProvider(noop.NewTracerProvider())
			case "sdk-batch":
				tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(&discard{}, sdktrace.WithBatchTimeout(time.Second)))
				b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
				otel.SetTracerProvider(tp)
			case "batcher":
				tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(newBatcher(&discard{}, time.Second, batchQueueSize, batchSize)))
				b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
				otel.SetTracerProvider(tp)
			}
			gw, _, _ := chain(b)
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			cpu0 := cpuTime(b)
			for range b.N {
				if _, err := gw.Exec(ctx, connect.NewRequest(&agentv1.ExecRequest{})); err != nil {
					b.Fatal(err)
				}
			}
			// CPU time (the process's, all threads) is steadier than wall time on a
			// shared machine, and counts the export goroutine's wake-ups too.
			b.ReportMetric(float64(cpuTime(b)-cpu0)/float64(b.N), "cpu-ns/op")
		})
	}
}
