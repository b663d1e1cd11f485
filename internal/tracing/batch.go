package tracing

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// Bounds of the batcher (the OpenTelemetry SDK's BatchSpanProcessor has 2048 and 512).
const (
	// batchQueueSize is the most ended spans held, waiting for export or in the export
	// under way; spans ending while it is full are dropped (and counted, reported
	// through the error handler).
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

	mu       sync.Mutex
	queue    []sdktrace.ReadOnlySpan
	spare    []sdktrace.ReadOnlySpan // the previous queue's array, reused
	inflight int                     // spans taken by the export under way, not yet exported
	dropped  int
	stopped  bool

	exporting chan struct{} // one export at a time (an exporter need not be safe for more): held by a send
	full      chan struct{} // a batch is full (buffered 1: one wake-up pending at most)
	stop      chan struct{}
	done      chan struct{}
	once      sync.Once
}

var _ sdktrace.SpanProcessor = (*batcher)(nil)

func newBatcher(exp sdktrace.SpanExporter, timeout time.Duration, queueSize, size int) *batcher {
	b := &batcher{exp: exp, timeout: timeout, queueSize: queueSize, batchSize: min(size, queueSize),
		exporting: make(chan struct{}, 1), full: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
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
	if len(b.queue)+b.inflight >= b.queueSize {
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
// bounded by batchExportTimeout and ctx. Spans taken count against the queue's bound
// until their request is done, so at most queueSize spans are held in all. It returns
// the errors (and spans dropped since the last export as one). A ctx that ends while
// another export runs, or before this one began, exports nothing: the spans wait.
func (b *batcher) export(ctx context.Context) error {
	select {
	case b.exporting <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-b.exporting }()
	if err := ctx.Err(); err != nil {
		return err
	}
	b.mu.Lock()
	spans, dropped := b.queue, b.dropped
	b.queue, b.spare, b.dropped, b.inflight = b.spare[:0], nil, 0, len(spans)
	b.mu.Unlock()
	var errs []error
	if dropped > 0 {
		errs = append(errs, fmt.Errorf("tracing: %d spans dropped: more than %d were held for export", dropped, b.queueSize))
	}
	for rest := spans; len(rest) > 0; {
		n := min(len(rest), b.batchSize)
		ectx, cancel := context.WithTimeout(ctx, batchExportTimeout)
		if err := b.exp.ExportSpans(ectx, rest[:n]); err != nil {
			errs = append(errs, err)
		}
		cancel()
		clear(rest[:n]) // the spans can be collected
		rest = rest[n:]
		b.mu.Lock()
		b.inflight -= n
		b.mu.Unlock()
	}
	b.mu.Lock()
	if b.spare == nil && cap(spans) <= b.queueSize {
		b.spare = spans[:0] // the array is reused
	}
	b.mu.Unlock()
	return errors.Join(errs...)
}

// ForceFlush exports every span ended so far.
func (b *batcher) ForceFlush(ctx context.Context) error { return b.export(ctx) }

// Shutdown stops the background export, exports what waits and shuts the exporter down.
// Spans ending after it are dropped. When ctx ends first, it returns ctx's error and the
// rest (the export under way, the last one, the exporter's shutdown) finishes in the
// background, each step bounded by batchExportTimeout.
func (b *batcher) Shutdown(ctx context.Context) error {
	var err error
	b.once.Do(func() {
		b.mu.Lock()
		b.stopped = true
		b.mu.Unlock()
		close(b.stop)
		finish := func(ctx context.Context) error {
			err := b.export(ctx)
			if serr := b.exp.Shutdown(ctx); err == nil {
				err = serr
			}
			return err
		}
		select {
		case <-b.done:
			err = finish(ctx)
		case <-ctx.Done():
			err = ctx.Err()
			go func() {
				<-b.done
				bctx, cancel := context.WithTimeout(context.Background(), batchExportTimeout)
				defer cancel()
				if err := finish(bctx); err != nil {
					otel.Handle(err)
				}
			}()
		}
	})
	return err
}
