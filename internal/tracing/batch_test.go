package tracing

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// gate is an in-memory exporter whose exports wait while it is closed.
type gate struct {
	tracetest.InMemoryExporter
	open     chan struct{}
	calls    chan int // the size of each export, as it begins
	shutdown bool
}

func newGate(open bool) *gate {
	g := &gate{open: make(chan struct{}), calls: make(chan int, 100)}
	if open {
		close(g.open)
	}
	return g
}

func (g *gate) ExportSpans(ctx context.Context, s []sdktrace.ReadOnlySpan) error {
	g.calls <- len(s)
	select {
	case <-g.open:
	case <-ctx.Done():
		return ctx.Err()
	}
	return g.InMemoryExporter.ExportSpans(ctx, s)
}

func (g *gate) Shutdown(context.Context) error { g.shutdown = true; return nil }

// spans ends n sampled spans of tp.
func spans(tp trace.TracerProvider, n int) {
	for range n {
		_, sp := tp.Tracer("t").Start(context.Background(), "s")
		sp.End()
	}
}

func waitCall(t *testing.T, g *gate, want int) {
	t.Helper()
	select {
	case n := <-g.calls:
		if n != want {
			t.Fatalf("an export of %d spans, want %d", n, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("no export of %d spans", want)
	}
}

// TestBatcherTimer: spans wait for the timer, then are exported together.
func TestBatcherTimer(t *testing.T) {
	g := newGate(true)
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(newBatcher(g, 50*time.Millisecond, 100, 10)))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	spans(tp, 3)
	if n := len(g.GetSpans()); n != 0 {
		t.Fatalf("%d spans exported at once, want them batched", n)
	}
	waitCall(t, g, 3)
}

// TestBatcherFullBatch: a full batch goes at once, not at the (hour-long) timer; a
// backlog goes in requests of at most the batch size.
func TestBatcherFullBatch(t *testing.T) {
	g := newGate(false)
	b := newBatcher(g, time.Hour, 100, 4)
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(b))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	spans(tp, 4)
	waitCall(t, g, 4) // waits at the gate
	spans(tp, 9)      // queued meanwhile: a full batch signalled, and more
	close(g.open)
	waitCall(t, g, 4)
	waitCall(t, g, 4)
	waitCall(t, g, 1)
	if n := len(g.GetSpans()); n != 13 {
		t.Errorf("%d spans exported, want 13", n)
	}
}

// TestBatcherQueueBound: spans ending while the queue is full are dropped and reported.
func TestBatcherQueueBound(t *testing.T) {
	var mu sync.Mutex
	var reported []error
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { mu.Lock(); reported = append(reported, err); mu.Unlock() }))
	t.Cleanup(func() { otel.SetErrorHandler(otel.ErrorHandlerFunc(func(error) {})) })
	g := newGate(false)
	b := newBatcher(g, time.Hour, 4, 2)
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(b))
	spans(tp, 2)
	waitCall(t, g, 2) // held at the gate: the queue is empty again
	spans(tp, 7)      // 4 fit, 3 are dropped
	close(g.open)
	// The drop is reported by the export that follows it: the background one (through
	// the error handler) or Shutdown's.
	err := tp.Shutdown(context.Background())
	mu.Lock()
	all := errors.Join(append(reported, err)...)
	mu.Unlock()
	if all == nil || !strings.Contains(all.Error(), "3 spans dropped") {
		t.Errorf("reported %v, want 3 spans dropped", all)
	}
	if n := len(g.GetSpans()); n != 6 {
		t.Errorf("%d spans exported, want 6", n)
	}
}

// TestBatcherFlushShutdown: ForceFlush exports at once; Shutdown exports what waits and
// shuts the exporter down; spans after it, and unsampled spans, are not exported.
func TestBatcherFlushShutdown(t *testing.T) {
	g := newGate(true)
	b := newBatcher(g, time.Hour, 100, 50)
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(b))
	spans(tp, 2)
	if err := tp.ForceFlush(context.Background()); err != nil || len(g.GetSpans()) != 2 {
		t.Fatalf("flush: %v, %d spans exported", err, len(g.GetSpans()))
	}
	spans(tp, 3)
	// An unsampled span (a caller's decision continued over the runner API) is not exported.
	unsampled := trace.ContextWithRemoteSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{1}, SpanID: trace.SpanID{1}, Remote: true}))
	_, sp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(b),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.AlwaysSample()))).Tracer("t").Start(unsampled, "u")
	sp.End()
	if err := tp.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := len(g.GetSpans()); n != 5 || !g.shutdown {
		t.Errorf("after shutdown %d spans exported (want 5), exporter shut down %v", n, g.shutdown)
	}
	b.OnEnd(g.GetSpans()[0].Snapshot())
	if err := b.ForceFlush(context.Background()); err != nil || len(g.GetSpans()) != 5 {
		t.Errorf("a span after shutdown: %v, %d spans", err, len(g.GetSpans()))
	}
}

// TestBatcherExportError: an exporter's error is returned by ForceFlush.
func TestBatcherExportError(t *testing.T) {
	b := newBatcher(failing{}, time.Hour, 10, 5)
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(b))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	spans(tp, 1)
	if err := tp.ForceFlush(context.Background()); !errors.Is(err, errExport) {
		t.Errorf("flush: %v, want %v", err, errExport)
	}
}

var errExport = errors.New("collector down")

type failing struct{}

func (failing) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return errExport }
func (failing) Shutdown(context.Context) error                             { return nil }

// TestBatcherConcurrent: spans ended from many goroutines, across many full batches and
// ticks, are each exported once.
func TestBatcherConcurrent(t *testing.T) {
	g := newGate(true)
	g.calls = make(chan int, 100000)
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(newBatcher(g, time.Millisecond, 10000, 7)))
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() { spans(tp, 500) })
	}
	wg.Wait()
	if err := tp.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	seen := map[trace.SpanID]bool{}
	for _, s := range g.GetSpans() {
		if seen[s.SpanContext.SpanID()] {
			t.Fatalf("span %s exported twice", s.SpanContext.SpanID())
		}
		seen[s.SpanContext.SpanID()] = true
	}
	if len(seen) != 4000 {
		t.Errorf("%d spans exported, want 4000", len(seen))
	}
}
