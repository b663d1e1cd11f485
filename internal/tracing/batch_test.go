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
	mu       sync.Mutex
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

func (g *gate) Shutdown(context.Context) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.shutdown = true
	return nil
}

func (g *gate) isShutdown() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.shutdown
}

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

// TestBatcherTimer: spans wait for the timer, then are exported by it (in one request
// unless a tick fell between them on a slow machine).
func TestBatcherTimer(t *testing.T) {
	g := newGate(true)
	const tick = 300 * time.Millisecond
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(newBatcher(g, tick, 100, 10)))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	t0 := time.Now()
	spans(tp, 3)
	if n := len(g.GetSpans()); n != 0 && time.Since(t0) < tick/2 {
		t.Fatalf("%d spans exported at once, want them batched", n)
	}
	for got := 0; got < 3; {
		select {
		case n := <-g.calls:
			got += n
		case <-time.After(10 * time.Second):
			t.Fatalf("%d of 3 spans exported by the timer", got)
		}
	}
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
	waitCall(t, g, 2) // held at the gate: they still count against the bound
	spans(tp, 7)      // 2 fit, 5 are dropped
	close(g.open)
	// The drop is reported by the export that follows it: the background one (through
	// the error handler) or Shutdown's.
	err := tp.Shutdown(context.Background())
	mu.Lock()
	all := errors.Join(append(reported, err)...)
	mu.Unlock()
	if all == nil || !strings.Contains(all.Error(), "5 spans dropped") {
		t.Errorf("reported %v, want 5 spans dropped", all)
	}
	if n := len(g.GetSpans()); n != 4 {
		t.Errorf("%d spans exported, want 4", n)
	}
}

// TestBatcherCtx: a ForceFlush whose ctx ends while another export is held returns its
// error and takes nothing (the spans wait for the next export); a Shutdown whose ctx ends
// while the background export is held returns, and the exporter is still shut down once
// that export is done.
func TestBatcherCtx(t *testing.T) {
	g := newGate(false)
	b := newBatcher(g, time.Hour, 100, 2)
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(b))
	spans(tp, 2)
	waitCall(t, g, 2) // the background export, held
	spans(tp, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := b.ForceFlush(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("flush during a held export: %v, want the deadline", err)
	}
	b.mu.Lock()
	waiting := len(b.queue)
	b.mu.Unlock()
	if waiting != 1 {
		t.Fatalf("%d spans wait after the failed flush, want 1", waiting)
	}
	sctx, scancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer scancel()
	if err := tp.Shutdown(sctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("shutdown during a held export: %v, want the deadline", err)
	}
	close(g.open)
	deadline := time.Now().Add(10 * time.Second)
	for len(g.GetSpans()) != 3 || !g.isShutdown() {
		if time.Now().After(deadline) {
			t.Fatalf("after the held export: %d spans exported (want 3), exporter shut down %v", len(g.GetSpans()), g.isShutdown())
		}
		time.Sleep(10 * time.Millisecond)
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
		sdktrace.WithSampler(recordOnly{})).Tracer("t").Start(unsampled, "u")
	if !sp.IsRecording() || sp.SpanContext().IsSampled() {
		t.Fatal("the span is not recorded-but-unsampled: the check below would prove nothing")
	}
	sp.End()
	if err := tp.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := len(g.GetSpans()); n != 5 || !g.isShutdown() {
		t.Errorf("after shutdown %d spans exported (want 5), exporter shut down %v", n, g.isShutdown())
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

// recordOnly records every span without sampling it: the processor sees it end (a
// dropped span it would not).
type recordOnly struct{}

func (recordOnly) ShouldSample(p sdktrace.SamplingParameters) sdktrace.SamplingResult {
	return sdktrace.SamplingResult{Decision: sdktrace.RecordOnly, Tracestate: trace.SpanContextFromContext(p.ParentContext).TraceState()}
}
func (recordOnly) Description() string { return "record only" }
