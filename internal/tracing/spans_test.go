package tracing

import (
	"context"
	"net/http"
	"testing"
	"time"

	"connectrpc.com/connect"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
)

// TestInjectAsPropagator: inject writes the headers OpenTelemetry's W3C propagator
// writes, for sampled, unsampled and random-flagged contexts, with and without
// tracestate, and nothing for an invalid one; and the propagator reads them back.
func TestInjectAsPropagator(t *testing.T) {
	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	ts, err := trace.ParseTraceState("vendor=x,other=y")
	if err != nil {
		t.Fatal(err)
	}
	for _, sc := range []trace.SpanContext{
		trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled}),
		trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid}),
		trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled | trace.FlagsRandom | 0x80}),
		trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled, TraceState: ts}),
		trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid}), // invalid: no span ID
		{},
	} {
		got, want := http.Header{"Content-Type": {"application/proto"}}, http.Header{"Content-Type": {"application/proto"}}
		inject(sc, got)
		propagation.TraceContext{}.Inject(trace.ContextWithSpanContext(context.Background(), sc), propagation.HeaderCarrier(want))
		if len(got) != len(want) {
			t.Errorf("%v: headers %v, want %v", sc, got, want)
		}
		for k, v := range want {
			if len(got[k]) != 1 || got[k][0] != v[0] {
				t.Errorf("%v: %s %q, want %q", sc, k, got[k], v)
			}
		}
		if !sc.IsValid() {
			continue
		}
		back := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), propagation.HeaderCarrier(got)))
		if back.TraceID() != sc.TraceID() || back.SpanID() != sc.SpanID() || back.IsSampled() != sc.IsSampled() || back.TraceState().String() != sc.TraceState().String() {
			t.Errorf("%v read back as %v", sc, back)
		}
	}
}

// TestSpanAttributes: every span of a traced exec carries the rpc.* attributes of its
// procedure (set after the span's start) and its kind.
func TestSpanAttributes(t *testing.T) {
	rec := recorder(t, 1)
	gw, _, _ := chain(t)
	if _, err := gw.Exec(context.Background(), connect.NewRequest(&agentv1.ExecRequest{})); err != nil {
		t.Fatal(err)
	}
	spans := rec.Ended()
	if len(spans) != 4 {
		t.Fatalf("%d spans, want 4", len(spans))
	}
	want := map[attribute.Key]string{"rpc.system": "connect_rpc", "rpc.service": "sandboxd.agent.v1.AgentService", "rpc.method": "Exec"}
	kinds := []trace.SpanKind{trace.SpanKindClient, trace.SpanKindServer, trace.SpanKindClient, trace.SpanKindServer}
	for i, s := range spans {
		got := map[attribute.Key]string{}
		for _, a := range s.Attributes() {
			got[a.Key] = a.Value.String()
		}
		if len(got) != len(want) {
			t.Errorf("span %d (%v): attributes %v, want %v", i, s.SpanKind(), got, want)
		}
		for k, v := range want {
			if got[k] != v {
				t.Errorf("span %d (%v): %s=%q, want %q", i, s.SpanKind(), k, got[k], v)
			}
		}
		if s.SpanKind() != kinds[i] {
			t.Errorf("span %d is %v, want %v", i, s.SpanKind(), kinds[i])
		}
	}
}

// TestExecSpansAllocs bounds the allocations of tracing one exec in process (the 4
// spans, 2 trace contexts written, 1 read; headers that exist already, as a call's do):
// the SDK's own are 4 a span (the span, its attributes, its context, its snapshot at the
// end), then 2 for the runner's remote parent in its context and 2 per trace context
// written (its value and the header's slice). It was 35 (with 3 new headers) before the attributes were set after the start,
// the remote context was made once and the public span stopped asking for a new root.
func TestExecSpansAllocs(t *testing.T) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(newBatcher(&discard{}, time.Hour, 1<<20, 1<<20)))
	prev := otel.GetTracerProvider()
	otel.SetTracerProvider(tp)
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()); otel.SetTracerProvider(prev) })
	ctx, h := context.Background(), newHeaders()
	execSpans(ctx, h) // the procedure's names and attributes are made once
	const most = 4*4 + 2 + 2*2
	if n := testing.AllocsPerRun(200, func() { execSpans(ctx, h) }); n > most {
		t.Errorf("%v allocations per traced exec, want at most %d", n, most)
	}
}
