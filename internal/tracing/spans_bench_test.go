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
// injected in h[1], the runner's server span continuing it from that header, its client
// span to the agent (h[2]); then ends the four, innermost first. The headers are the
// calls' (h[0] the public call's), emptied first: a call's header exists before the
// interceptors see it.
func execSpans(ctx context.Context, h *[3]http.Header) {
	const proc = "/sandboxd.agent.v1.AgentService/Exec"
	for _, x := range h {
		clear(x)
	}
	gctx, gs := interceptor{kind: kindPublic}.serverStart(ctx, proc, h[0])
	gctx, gc := clientStart(gctx, proc, h[1])
	rctx, rs := interceptor{kind: kindInternal}.serverStart(context.Background(), proc, h[1])
	_, rc := clientStart(rctx, proc, h[2]) // the agent hop, with the trace context
	End(rc, nil)
	End(rs, nil)
	End(gc, nil)
	End(gs, nil)
	_ = gctx
}

func newHeaders() *[3]http.Header { return &[3]http.Header{{}, {}, {}} }

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
			ctx, h := context.Background(), newHeaders()
			b.ReportAllocs()
			b.ResetTimer()
			cpu0 := cpuTime(b)
			for range b.N {
				execSpans(ctx, h)
			}
			b.ReportMetric(float64(cpuTime(b)-cpu0)/float64(b.N), "cpu-ns/op")
		})
	}
}
