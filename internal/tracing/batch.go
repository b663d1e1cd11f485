package tracing

import (
	"context"
	"fmt"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// Bounds of the batcher (the OpenTelemetry SDK's BatchSpanProcessor has 2048 and 512).
const (
	// batchQueueSize is the most ended spans waiting for export; spans ending while
	// it is full are dropped (and counted, reported through the error handler).
	batchQueueSize = 8192
	// batchSize is the most spans of one export request; a full one is exported at
	// once rather than at the next tick.
	batchSize = 1024
	// batchExportTimeout bounds one export request.
	batchExportTimeout = 30 * time.Second
)

// batcher is the span processor of Setup: it collects ended spans and exports them in
// batches in the background, every timeout or as soon as a batch is full, like the SDK's
// BatchSpanProcessor — but ending a span only appends it to a slice under a mutex. The
// SDK's processor hands every span to its export goroutine over a channel, which wakes
// that goroutine (often another OS thread) once per span: four times per traced exec,
// on the call's path. Here the export goroutine wakes on its timer, or once per full
// batch.
type batcher struct {
	exp       sdktrace.SpanExporter
	timeout   time.Duration
	queueSize int
	batchSize int

	mu      sync.Mutex
	queue   []sdktrace.ReadOnlySpan
	spare   []sdktrace.ReadOnlySpan // the previous queue's array, reused
	dropped int
	stopped bool

	exporting sync.Mutex    // one export at a time (an exporter need not be safe for more)
	full      chan struct{} // a batch is full (buffered 1: one wake-up pending at most)
	stop      chan struct{}
	done      chan struct{}
	once      sync.Once
}

var _ sdktrace.SpanProcessor = (*batcher)(nil)

func newBatcher(exp sdktrace.SpanExporter, timeout time.Duration, queueSize, size int) *batcher {
	b := &batcher{exp: exp, timeout: timeout, queueSize: queueSize, batchSize: min(size, queueSize),
		full: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	go b.loop()
	return b
}

func (b *batcher) OnStart(context.Context, sdktrace.ReadWriteSpan) {}

func (b *batcher) OnEnd(s sdktrace.ReadOnlySpan) {
	if !s.SpanContext().IsSampled() {
		return
	}
	b.mu.Lock()
	if b.stopped {
		b.mu.Unlock()
		return
	}
	if len(b.queue) >= b.queueSize {
		b.dropped++
		b.mu.Unlock()
		return
	}
	b.queue = append(b.queue, s)
	full := len(b.queue) == b.batchSize
	b.mu.Unlock()
	if full {
		select {
		case b.full <- struct{}{}:
		default:
		}
	}
}

func (b *batcher) loop() {
	defer close(b.done)
	t := time.NewTicker(b.timeout)
	defer t.Stop()
	for {
		select {
		case <-b.stop:
			return
		case <-t.C:
		case <-b.full:
		}
		if err := b.export(context.Background()); err != nil {
			otel.Handle(err)
		}
	}
}

// export exports every span waiting, in requests of at most batchSize spans, each
// bounded by batchExportTimeout and ctx. It returns the first error (and reports spans
// dropped since the last export as one).
func (b *batcher) export(ctx context.Context) error {
	b.exporting.Lock()
	defer b.exporting.Unlock()
	b.mu.Lock()
	spans, dropped := b.queue, b.dropped
	b.queue, b.spare, b.dropped = b.spare[:0], nil, 0
	b.mu.Unlock()
	var first error
	if dropped > 0 {
		first = fmt.Errorf("tracing: %d spans dropped: more than %d waited for export", dropped, b.queueSize)
	}
	for rest := spans; len(rest) > 0; {
		n := min(len(rest), b.batchSize)
		ectx, cancel := context.WithTimeout(ctx, batchExportTimeout)
		err := b.exp.ExportSpans(ectx, rest[:n])
		cancel()
		if err != nil && first == nil {
			first = err
		}
		rest = rest[n:]
	}
	clear(spans) // the spans can be collected; the array is reused
	b.mu.Lock()
	if b.spare == nil && cap(spans) <= b.queueSize {
		b.spare = spans[:0]
	}
	b.mu.Unlock()
	return first
}

// ForceFlush exports every span ended so far.
func (b *batcher) ForceFlush(ctx context.Context) error { return b.export(ctx) }

// Shutdown stops the background export, exports what waits and shuts the exporter down.
// Spans ending after it are dropped.
func (b *batcher) Shutdown(ctx context.Context) error {
	var err error
	b.once.Do(func() {
		b.mu.Lock()
		b.stopped = true
		b.mu.Unlock()
		close(b.stop)
		select {
		case <-b.done:
		case <-ctx.Done():
			err = ctx.Err()
			return
		}
		err = b.export(ctx)
		if serr := b.exp.Shutdown(ctx); err == nil {
			err = serr
		}
	})
	return err
}
