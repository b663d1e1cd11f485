package tracing

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
)

// ender is what a test reads its ended spans from.
type ender interface {
	Ended() []sdktrace.ReadOnlySpan
}

// bothRecorders runs f with the SDK's tracer provider recording (recorder) and with
// Setup's provider (the lean tracer, leanRecorder) exporting to memory.
func bothRecorders(t *testing.T, f func(*testing.T, func(*testing.T, float64) ender)) {
	t.Run("sdk", func(t *testing.T) { f(t, func(t *testing.T, r float64) ender { return recorder(t, r) }) })
	t.Run("lean", func(t *testing.T) { f(t, func(t *testing.T, r float64) ender { return leanRecorder(t, r) }) })
}

// memExporter keeps the spans exported to it, in order.
type memExporter struct {
	mu    sync.Mutex
	spans []sdktrace.ReadOnlySpan
}

func (m *memExporter) ExportSpans(_ context.Context, s []sdktrace.ReadOnlySpan) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.spans = append(m.spans, s...)
	return nil
}

func (m *memExporter) Shutdown(context.Context) error { return nil }

// leanEnded flushes Setup's provider and returns what it exported.
type leanEnded struct {
	p   *provider
	exp *memExporter
}

func (l leanEnded) Ended() []sdktrace.ReadOnlySpan {
	if err := l.p.ForceFlush(context.Background()); err != nil {
		panic(err)
	}
	l.exp.mu.Lock()
	defer l.exp.mu.Unlock()
	return append([]sdktrace.ReadOnlySpan(nil), l.exp.spans...)
}

var testResource = resource.NewSchemaless(attribute.String("service.name", "test"))

// leanRecorder makes Setup's provider (the lean tracer for this package's spans) the
// global one for the test's duration, sampling new traces at ratio, exporting to memory.
func leanRecorder(t *testing.T, ratio float64) leanEnded {
	exp := &memExporter{}
	p := newProvider(newBatcher(exp, time.Hour, batchQueueSize, batchSize), ratio, testResource)
	prev := otel.GetTracerProvider()
	otel.SetTracerProvider(p)
	t.Cleanup(func() { _ = p.Shutdown(context.Background()); otel.SetTracerProvider(prev) })
	return leanEnded{p: p, exp: exp}
}

// TestLeanAsSDK: the spans of a traced exec and of Start/Child/Step are exported by
// Setup's provider as the SDK records them: same names, kinds, attributes, statuses,
// links (count and attributes), parent pattern, trace state, resource and scope.
func TestLeanAsSDK(t *testing.T) {
	run := func(rec ender) []sdktrace.ReadOnlySpan {
		gw, _, runner := chain(t)
		req := connect.NewRequest(&agentv1.ExecRequest{})
		req.Header().Set("traceparent", callerParent)
		if _, err := gw.Exec(context.Background(), req); err != nil {
			t.Fatal(err)
		}
		runner.fail = true
		_, _ = gw.Exec(context.Background(), connect.NewRequest(&agentv1.ExecRequest{}))
		ctx, root := Start(context.Background(), "root", KeySandboxID.String(strings.Repeat("é", 300)))
		_, ch := Child(ctx, "child", KeyRunnerID.String("r1"), KeyRunnerID.String("r2"))
		ch.SetStatus(codes.Ok, "ignored")
		ch.SetStatus(codes.Error, "too late")
		End(ch, nil)
		at := time.Unix(1700000000, 0)
		Step(ctx, "step", at, at.Add(time.Second), KeyCacheHit.Bool(true))
		root.End()
		root.SetAttributes(KeyContainer.String("after the end"))
		return rec.Ended()
	}
	// The SDK recording with Setup's limits.
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec), sdktrace.WithRawSpanLimits(limits))
	prev := otel.GetTracerProvider()
	otel.SetTracerProvider(tp)
	sdk := run(rec)
	otel.SetTracerProvider(prev)
	lean := run(leanRecorder(t, 1))
	if len(sdk) != 10 || len(lean) != len(sdk) {
		t.Fatalf("%d spans from the SDK (want 10), %d from the lean tracer", len(sdk), len(lean))
	}
	index := func(spans []sdktrace.ReadOnlySpan) map[trace.SpanID]int {
		m := map[trace.SpanID]int{}
		for i, s := range spans {
			m[s.SpanContext().SpanID()] = i
		}
		return m
	}
	si, li := index(sdk), index(lean)
	parentOf := func(spans []sdktrace.ReadOnlySpan, idx map[trace.SpanID]int, s sdktrace.ReadOnlySpan) int {
		if !s.Parent().IsValid() {
			return -1
		}
		if i, ok := idx[s.Parent().SpanID()]; ok {
			return i
		}
		return -2 // a remote parent
	}
	for i := range sdk {
		a, b := sdk[i], lean[i]
		if a.Name() != b.Name() || a.SpanKind() != b.SpanKind() || a.Status() != b.Status() {
			t.Errorf("span %d: SDK %s %v %+v, lean %s %v %+v", i, a.Name(), a.SpanKind(), a.Status(), b.Name(), b.SpanKind(), b.Status())
		}
		if x, y := attribute.NewSet(a.Attributes()...), attribute.NewSet(b.Attributes()...); !x.Equals(&y) {
			t.Errorf("span %d (%s): attributes SDK %v, lean %v", i, a.Name(), x.Encoded(attribute.DefaultEncoder()), y.Encoded(attribute.DefaultEncoder()))
		}
		if len(a.Links()) != len(b.Links()) {
			t.Errorf("span %d: links SDK %v, lean %v", i, a.Links(), b.Links())
		} else {
			for k := range a.Links() {
				x, y := attribute.NewSet(a.Links()[k].Attributes...), attribute.NewSet(b.Links()[k].Attributes...)
				if !a.Links()[k].SpanContext.Equal(b.Links()[k].SpanContext) || !x.Equals(&y) {
					t.Errorf("span %d: link SDK %+v, lean %+v", i, a.Links()[k], b.Links()[k])
				}
			}
		}
		if p, q := parentOf(sdk, si, a), parentOf(lean, li, b); p != q {
			t.Errorf("span %d (%s): parent SDK #%d, lean #%d", i, a.Name(), p, q)
		}
		if a.SpanContext().TraceFlags() != b.SpanContext().TraceFlags() || a.SpanContext().TraceState().String() != b.SpanContext().TraceState().String() || a.Parent().IsRemote() != b.Parent().IsRemote() {
			t.Errorf("span %d: context SDK %+v parent %+v, lean %+v parent %+v", i, a.SpanContext(), a.Parent(), b.SpanContext(), b.Parent())
		}
		if b.InstrumentationScope().Name != instrumentation || b.Resource() != testResource {
			t.Errorf("span %d: scope %+v, resource %v", i, b.InstrumentationScope(), b.Resource())
		}
		if b.EndTime().Before(b.StartTime()) || b.StartTime().IsZero() {
			t.Errorf("span %d: from %v to %v", i, b.StartTime(), b.EndTime())
		}
		if a.Name() == "step" && (!b.StartTime().Equal(a.StartTime()) || !b.EndTime().Equal(a.EndTime())) {
			t.Errorf("step from %v to %v, want %v to %v", b.StartTime(), b.EndTime(), a.StartTime(), a.EndTime())
		}
	}
}

// TestLeanSampling: a new trace is sampled as the SDK's TraceIDRatioBased samples it, a
// child as its parent (ParentBased), and nothing is exported of an unsampled trace.
func TestLeanSampling(t *testing.T) {
	for _, ratio := range []float64{0, 0.25, 0.5, 1} {
		p := newProvider(newBatcher(&memExporter{}, time.Hour, 8, 8), ratio, testResource)
		sdk := sdktrace.TraceIDRatioBased(ratio)
		for range 2000 {
			id := newTraceID()
			want := sdk.ShouldSample(sdktrace.SamplingParameters{ParentContext: context.Background(), TraceID: id}).Decision == sdktrace.RecordAndSample
			if got := p.lean.sampledRoot(id); got != want {
				t.Fatalf("ratio %v, trace %s: sampled %v, the SDK %v", ratio, id, got, want)
			}
		}
		_ = p.Shutdown(context.Background())
	}
	rec := leanRecorder(t, 0)
	ctx, root := Start(context.Background(), "root")
	_, ch := Child(ctx, "child")
	if root.IsRecording() || ch.IsRecording() || root.SpanContext().IsSampled() || !ch.SpanContext().IsValid() || ch.SpanContext().TraceID() != root.SpanContext().TraceID() {
		t.Errorf("at ratio 0: root %+v recording %v, child %+v recording %v", root.SpanContext(), root.IsRecording(), ch.SpanContext(), ch.IsRecording())
	}
	ch.End()
	root.End()
	sampled := trace.ContextWithRemoteSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: newTraceID(), SpanID: newSpanID(), TraceFlags: trace.FlagsSampled, Remote: true}))
	_, sp := Start(sampled, "continued")
	if !sp.IsRecording() {
		t.Error("a sampled parent's child does not record at ratio 0")
	}
	sp.End()
	if sp.IsRecording() {
		t.Error("an ended span still records")
	}
	if got := rec.Ended(); len(got) != 1 || got[0].Name() != "continued" {
		t.Errorf("exported %d spans, want only the sampled parent's child", len(got))
	}
}

// TestSetupIsLean: Setup's provider gives this package's spans to the lean tracer.
func TestSetupIsLean(t *testing.T) {
	prev := otel.GetTracerProvider()
	t.Cleanup(func() { otel.SetTracerProvider(prev) })
	stop, err := Setup(context.Background(), Config{Endpoint: "http://127.0.0.1:1", ServiceName: "t", SampleRatio: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = stop(ctx)
	}()
	if _, sp := Start(context.Background(), "x"); func() bool { _, ok := sp.(*span); return !ok }() {
		t.Errorf("Setup's spans are %T, want the lean tracer's", sp)
	}
}
