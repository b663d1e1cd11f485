package tracing

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/sandboxd/sandboxd/internal/tracing/jaegertest"
)

// BenchmarkExecExport: the spans of one exec (execSpans) made and exported over OTLP
// (gRPC and HTTP) to a real Jaeger (another process: its CPU is not counted), the
// export of what waits included (a flush at the end); against execSpans exported to
// an exporter that drops them, the difference is what the export costs this process.
func BenchmarkExecExport(b *testing.B) {
	j := jaegertest.Start(b)
	for _, proto := range []string{ProtocolGRPC, ProtocolHTTP} {
		b.Run(proto, func(b *testing.B) {
			ep := "http://" + j.OTLPGRPC
			if proto == ProtocolHTTP {
				ep = "http://" + j.OTLPHTTP
			}
			prev := otel.GetTracerProvider()
			shutdown, err := Setup(context.Background(), Config{Endpoint: ep, Protocol: proto, ServiceName: "bench", SampleRatio: 1}, nil)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = shutdown(context.Background()); otel.SetTracerProvider(prev) })
			tp := otel.GetTracerProvider().(*sdktrace.TracerProvider)
			ctx, h := context.Background(), newHeaders()
			for range 100 { // the exporter's connection
				execSpans(ctx, h)
			}
			if err := tp.ForceFlush(ctx); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.ResetTimer()
			cpu0 := cpuTime(b)
			for i := range b.N {
				execSpans(ctx, h)
				if i%256 == 255 { // a full batch (1024 spans): the loop outruns the export otherwise
					if err := tp.ForceFlush(ctx); err != nil {
						b.Fatal(err)
					}
				}
			}
			if err := tp.ForceFlush(ctx); err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(cpuTime(b)-cpu0)/float64(b.N), "cpu-ns/op")
		})
	}
}
