package tracing

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	otelinst "go.opentelemetry.io/otel/sdk/instrumentation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/embedded"
)

// Span limits (Setup gives the SDK's provider the same): no span of ours comes near them.
const (
	maxAttrs      = 32
	maxAttrLen    = 256 // characters of a string value
	maxEvents     = 32
	maxLinks      = 4
	maxLinkAttrs  = 8
	maxEventAttrs = 8
)

// limits are the SDK provider's bounds per span (every one given: a raw limit of 0 allows
// none), the lean tracer's too.
var limits = sdktrace.SpanLimits{
	AttributeValueLengthLimit: maxAttrLen, AttributeCountLimit: maxAttrs, EventCountLimit: maxEvents,
	LinkCountLimit: maxLinks, AttributePerEventCountLimit: maxEventAttrs, AttributePerLinkCountLimit: maxLinkAttrs,
}

// provider is Setup's tracer provider: the OpenTelemetry SDK's, which any code asking it
// for a tracer by name gets, and this package's own tracer (lean) for the spans this
// package makes (the interceptors', Start, Child, Step). Both end their spans in the same
// batcher, which exports them with the SDK's OTLP exporter.
//
// Why a tracer of its own: the SDK's span costs 4 allocations and about 1 KB a span on
// the call's path (the span, its attributes copied, its context, a snapshot of it at
// End), and an exec is 4 spans. The lean tracer's span is one allocation (and the
// context's); it keeps a procedure's attributes by reference (made once per procedure),
// decides sampling with one context lookup, draws IDs without a lock, and is itself the
// read-only span the exporter reads (no snapshot). Sampling, IDs, parents, trace state,
// limits and what is exported are the SDK's (TestLeanAsSDK compares the two).
type provider struct {
	*sdktrace.TracerProvider
	lean *leanTracer
}

// leanTracer makes the spans of this package for provider.
type leanTracer struct {
	embedded.Tracer
	tp    trace.TracerProvider
	all   bool   // every new trace sampled
	bound uint64 // else: a new trace is sampled when its ID's low 63 bits are below bound
	b     *batcher
	res   *resource.Resource
	scope otelinst.Scope
}

// newProvider is a provider exporting with b (which it owns: the SDK's provider shuts it
// down), new traces sampled at ratio, spans carrying res.
func newProvider(b *batcher, ratio float64, res *resource.Resource) *provider {
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithSpanProcessor(b),
		sdktrace.WithResource(res),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(ratio))),
		sdktrace.WithRawSpanLimits(limits),
	)
	p := &provider{TracerProvider: tp}
	p.lean = &leanTracer{tp: p, b: b, res: res, scope: otelinst.Scope{Name: instrumentation}}
	// As TraceIDRatioBased: the trace ID's last 8 bytes, big-endian, shifted right by 1.
	if ratio >= 1 {
		p.lean.all = true
	} else if ratio > 0 {
		p.lean.bound = uint64(ratio * (1 << 63))
	}
	return p
}

func (t *leanTracer) sampledRoot(id trace.TraceID) bool {
	return t.all || binary.BigEndian.Uint64(id[8:16])>>1 < t.bound
}

// Start starts a span: a child of ctx's span context (none with trace.WithNewRoot), in
// its trace and sampled as it is (ParentBased), else a new trace sampled at the ratio.
func (t *leanTracer) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	var cfg trace.SpanConfig
	if len(opts) > 0 {
		cfg = trace.NewSpanStartConfig(opts...)
	}
	var psc trace.SpanContext
	if !cfg.NewRoot() {
		psc = trace.SpanContextFromContext(ctx)
	}
	scc := trace.SpanContextConfig{SpanID: newSpanID(), TraceFlags: psc.TraceFlags() &^ trace.FlagsSampled}
	if psc.TraceID().IsValid() {
		scc.TraceID, scc.TraceState = psc.TraceID(), psc.TraceState()
	} else {
		scc.TraceID = newTraceID()
	}
	sampled := psc.IsSampled()
	if !psc.IsValid() {
		sampled = t.sampledRoot(scc.TraceID)
	}
	if sampled {
		scc.TraceFlags |= trace.FlagsSampled
	}
	s := &span{t: t, sc: trace.NewSpanContext(scc)}
	if sampled {
		s.recording = true
		s.parent, s.name, s.kind = psc, name, trace.ValidateSpanKind(cfg.SpanKind())
		if s.start = cfg.Timestamp(); s.start.IsZero() {
			s.start = time.Now()
		}
		s.addAttrs(cfg.Attributes())
		for _, l := range cfg.Links() {
			s.addLink(l)
		}
	}
	return trace.ContextWithSpan(ctx, s), s
}

// span is a lean tracer's span. A non-recording one (not sampled) only carries its
// context. Fields are set under mu until End; the export reads them after.
type span struct {
	embedded.Span
	sdktrace.ReadOnlySpan // nil: its unexported method only (see Name)
	t                     *leanTracer
	sc                    trace.SpanContext
	recording             bool // sampled (fixed at the start)

	mu      sync.Mutex
	ended   bool
	parent  trace.SpanContext
	name    string
	kind    trace.SpanKind
	start   time.Time
	end     time.Time
	attrs   []attribute.KeyValue // may be a procedure's shared slice (shared): appending copies
	shared  bool
	dropped int // attributes dropped (over the limit)
	status  sdktrace.Status
	links   []sdktrace.Link
	events  []sdktrace.Event
}

var _ trace.Span = (*span)(nil)

func (s *span) SpanContext() trace.SpanContext { return s.sc }

func (s *span) TracerProvider() trace.TracerProvider { return s.t.tp }

func (s *span) IsRecording() bool {
	if !s.recording {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return !s.ended
}

// End ends s (at the time of trace.WithTimestamp, else now) and queues it for export.
func (s *span) End(opts ...trace.SpanEndOption) {
	if !s.recording {
		return
	}
	now := time.Now()
	s.mu.Lock()
	if s.ended {
		s.mu.Unlock()
		return
	}
	s.ended = true
	s.end = now
	if len(opts) > 0 {
		cfg := trace.NewSpanEndConfig(opts...)
		if ts := cfg.Timestamp(); !ts.IsZero() {
			s.end = ts
		}
	}
	s.mu.Unlock()
	s.t.b.onEndLean(s)
}

// live locks s when it records and has not ended; the caller unlocks.
func (s *span) live() bool {
	if !s.recording {
		return false
	}
	s.mu.Lock()
	if s.ended {
		s.mu.Unlock()
		return false
	}
	return true
}

// SetStatus as the SDK: Ok is final, Unset changes nothing, a description only with Error.
func (s *span) SetStatus(code codes.Code, description string) {
	if !s.live() {
		return
	}
	defer s.mu.Unlock()
	if code == codes.Unset || s.status.Code == codes.Ok {
		return
	}
	if code != codes.Error {
		description = ""
	}
	s.status = sdktrace.Status{Code: code, Description: description}
}

func (s *span) SetName(name string) {
	if !s.live() {
		return
	}
	defer s.mu.Unlock()
	s.name = name
}

func (s *span) SetAttributes(kv ...attribute.KeyValue) {
	if !s.live() {
		return
	}
	defer s.mu.Unlock()
	s.addAttrs(kv)
}

// setShared sets attrs, a slice nobody changes (a procedure's), as s's attributes when s
// has none: kept by reference, not copied.
func (s *span) setShared(attrs []attribute.KeyValue) {
	if !s.live() {
		return
	}
	defer s.mu.Unlock()
	if len(s.attrs) == 0 && len(attrs) <= maxAttrs {
		s.attrs, s.shared = attrs[:len(attrs):len(attrs)], true
		return
	}
	s.addAttrs(attrs)
}

// addAttrs adds kv within the limits (mu held or s not yet shared). A key set again
// replaces its value, as the SDK's dedupe does.
func (s *span) addAttrs(kv []attribute.KeyValue) {
	if len(kv) == 0 {
		return
	}
	if s.shared {
		s.attrs, s.shared = append(make([]attribute.KeyValue, 0, len(s.attrs)+len(kv)), s.attrs...), false
	}
	s.attrs, s.dropped = appendAttrs(s.attrs, kv, maxAttrs, s.dropped)
}

// appendAttrs appends the valid ones of kv to attrs (a key already there replaced), values
// truncated, at most limit in all; it returns them and dropped plus those left out.
func appendAttrs(attrs, kv []attribute.KeyValue, limit, dropped int) ([]attribute.KeyValue, int) {
next:
	for _, a := range kv {
		if !a.Valid() {
			dropped++
			continue
		}
		a = truncate(a)
		for i := range attrs {
			if attrs[i].Key == a.Key {
				attrs[i] = a
				continue next
			}
		}
		if len(attrs) >= limit {
			dropped++
			continue
		}
		attrs = append(attrs, a)
	}
	return attrs, dropped
}

// truncate cuts a string value (or a string slice's) to maxAttrLen characters.
func truncate(a attribute.KeyValue) attribute.KeyValue {
	switch a.Value.Type() {
	case attribute.STRING:
		if v := a.Value.AsString(); len(v) > maxAttrLen {
			return a.Key.String(cut(v))
		}
	case attribute.STRINGSLICE:
		vs := a.Value.AsStringSlice() // a copy
		for i, v := range vs {
			vs[i] = cut(v)
		}
		return a.Key.StringSlice(vs)
	}
	return a
}

func cut(v string) string {
	n := 0
	for i := range v {
		if n == maxAttrLen {
			return v[:i]
		}
		n++
	}
	return v
}

func (s *span) addLink(l trace.Link) {
	if !l.SpanContext.IsValid() || len(s.links) >= maxLinks {
		return
	}
	attrs, dropped := appendAttrs(nil, l.Attributes, maxLinkAttrs, 0)
	s.links = append(s.links, sdktrace.Link{SpanContext: l.SpanContext, Attributes: attrs, DroppedAttributeCount: dropped})
}

func (s *span) AddLink(l trace.Link) {
	if !s.live() {
		return
	}
	defer s.mu.Unlock()
	s.addLink(l)
}

func (s *span) AddEvent(name string, opts ...trace.EventOption) {
	if !s.live() {
		return
	}
	defer s.mu.Unlock()
	s.addEvent(name, trace.NewEventConfig(opts...))
}

func (s *span) addEvent(name string, cfg trace.EventConfig) {
	if len(s.events) >= maxEvents {
		return
	}
	attrs, dropped := appendAttrs(nil, cfg.Attributes(), maxEventAttrs, 0)
	s.events = append(s.events, sdktrace.Event{Name: name, Attributes: attrs, DroppedAttributeCount: dropped, Time: cfg.Timestamp()})
}

// RecordError records an "exception" event with the error's type only: never its
// message (a message can quote a secret, a path or an argument).
func (s *span) RecordError(err error, opts ...trace.EventOption) {
	if err == nil || !s.live() {
		return
	}
	defer s.mu.Unlock()
	cfg := trace.NewEventConfig(append(opts[:len(opts):len(opts)], trace.WithAttributes(attribute.String("exception.type", typeName(err))))...)
	s.addEvent("exception", cfg)
}

func typeName(err error) string { return fmt.Sprintf("%T", err) }

// The read-only view of an ended span that the SDK's exporters take: the span itself
// (no snapshot is made). sdktrace.ReadOnlySpan has an unexported method, so span embeds
// the (nil) interface for it, as the SDK's tracetest.SpanStub does; every exported
// method is span's own. Read only after End (fields no longer change) and only by the
// export, which took the span from the batcher under its lock.
func (s *span) Name() string                         { return s.name }
func (s *span) Parent() trace.SpanContext            { return s.parent }
func (s *span) SpanKind() trace.SpanKind             { return s.kind }
func (s *span) StartTime() time.Time                 { return s.start }
func (s *span) EndTime() time.Time                   { return s.end }
func (s *span) Attributes() []attribute.KeyValue     { return s.attrs }
func (s *span) Links() []sdktrace.Link               { return s.links }
func (s *span) Events() []sdktrace.Event             { return s.events }
func (s *span) Status() sdktrace.Status              { return s.status }
func (s *span) InstrumentationScope() otelinst.Scope { return s.t.scope }

//nolint:staticcheck // part of sdktrace.ReadOnlySpan
func (s *span) InstrumentationLibrary() otelinst.Library { return s.t.scope }
func (s *span) Resource() *resource.Resource             { return s.t.res }
func (s *span) DroppedAttributes() int                   { return s.dropped }
func (s *span) DroppedLinks() int                        { return 0 }
func (s *span) DroppedEvents() int                       { return 0 }
func (s *span) ChildSpanCount() int                      { return 0 }

var _ sdktrace.ReadOnlySpan = (*span)(nil)

// newTraceID and newSpanID draw random, valid IDs from the runtime's per-thread source
// (math/rand/v2's; the SDK's generator takes a lock for each).
func newTraceID() (id trace.TraceID) {
	for !id.IsValid() {
		binary.NativeEndian.PutUint64(id[:8], rand.Uint64())
		binary.NativeEndian.PutUint64(id[8:], rand.Uint64())
	}
	return id
}

func newSpanID() (id trace.SpanID) {
	for !id.IsValid() {
		binary.NativeEndian.PutUint64(id[:], rand.Uint64())
	}
	return id
}
