package tracing

import (
	"context"
	"net/http"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// execSpans does what the interceptors do for one traced exec, without the calls: the
// gateway's public server span, its client span to the runner with the trace context
// injected, the runner's server span continuing it from the header, its client span to
// the agent; then ends the four, innermost first.
func execSpans(ctx context.Context) {
	const proc = "/sandboxd.agent.v1.AgentService/Exec"
	gctx, gs := interceptor{kind: kindPublic}.serverStart(ctx, proc, http.Header{})
	h1 := http.Header{}
	gctx, gc := clientStart(gctx, proc, h1)
	rctx, rs := interceptor{kind: kindInternal}.serverStart(context.Background(), proc, h1)
	_, rc := clientStart(rctx, proc, http.Header{}) // the agent hop, with the trace context
	End(rc, nil)
	End(rs, nil)
	End(gc, nil)
	End(gs, nil)
	_ = gctx
}

// BenchmarkExecSpans: the in-process cost of tracing one exec (4 spans, 2 injections, 1
// extraction; exported in batches to an exporter that drops them) with Setup's batcher
// and with the SDK's BatchSpanProcessor, in time, CPU time (the export goroutine's
// wake-ups included) and allocations.
func BenchmarkExecSpans(b *testing.B) {
	for _, mode := range []string{"sdk-batch", "batcher"} {
		b.Run(mode, func(b *testing.B) {
			var sp sdktrace.SpanProcessor = newBatcher(&discard{}, time.Second, batchQueueSize, batchSize)
			if mode == "sdk-batch" {
				sp = sdktrace.NewBatchSpanProcessor(&discard{}, sdktrace.WithBatchTimeout(time.Second))
			}
			tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sp))
			prev := otel.GetTracerProvider()
			otel.SetTracerProvider(tp)
			b.Cleanup(func() { _ = tp.Shutdown(context.Background()); otel.SetTracerProvider(prev) })
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			cpu0 := cpuTime(b)
			for range b.N {
				execSpans(ctx)
			}
			b.ReportMetric(float64(cpuTime(b)-cpu0)/float64(b.N), "cpu-ns/op")
		})
	}
}
