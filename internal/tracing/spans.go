package tracing

import (
	"context"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// instrumentation is the tracer's name (the instrumentation scope of every span).
const instrumentation = "github.com/sandboxd/sandboxd"

// Attribute keys sandboxd's spans use besides the rpc.* ones.
const (
	KeySandboxID = attribute.Key("sandboxd.sandbox_id")
	KeyRunnerID  = attribute.Key("sandboxd.runner_id")
	KeyCacheHit  = attribute.Key("sandboxd.cache_hit")
	KeyContainer = attribute.Key("sandboxd.container")
)

// propagator is W3C Trace Context: traceparent and tracestate headers. Baggage is not
// carried (callers' baggage could hold anything).
var propagator = propagation.TraceContext{}

// tracer is the global tracer provider's tracer. The last one is kept with its provider:
// the SDK's Tracer takes a lock and hashes the instrumentation scope, on every span of
// every call otherwise. A provider set later (Setup, tests) is noticed, as it is another
// provider.
func tracer() trace.Tracer {
	tp := otel.GetTracerProvider()
	// Comparing interfaces of the same non-comparable type panics: only a comparable
	// provider (every one in use: pointers, the no-op struct) is kept.
	if c := lastTracer.Load(); c != nil && c.tp == tp {
		return c.t
	}
	t := tp.Tracer(instrumentation)
	if reflect.TypeOf(tp).Comparable() {
		lastTracer.Store(&providerTracer{tp: tp, t: t})
	}
	return t
}

type providerTracer struct {
	tp trace.TracerProvider
	t  trace.Tracer
}

var lastTracer atomic.Pointer[providerTracer]

// Start starts span name as a child of ctx's span. Call it only where a trace should
// begin or continue; End ends it.
func Start(ctx context.Context, name string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	return tracer().Start(ctx, name, trace.WithAttributes(attrs...))
}

// Child starts span name only when ctx is in a trace; otherwise it returns ctx
// and a no-op span. For steps (image pull, network set-up) that background work also
// runs: they never begin a trace of their own.
func Child(ctx context.Context, name string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	if !inTrace(ctx) {
		return ctx, trace.SpanFromContext(context.Background())
	}
	return Start(ctx, name, attrs...)
}

// inTrace reports whether ctx carries a trace to continue: a span context, sampled or
// not (an unsampled one gives non-recording children), even of a span that has ended
// (work a call left running, such as a sandbox's start after Create answered).
func inTrace(ctx context.Context) bool { return trace.SpanContextFromContext(ctx).IsValid() }

// End ends span with err as its status: the error's gRPC code, never its message.
func End(span trace.Span, err error) {
	if err != nil && span.IsRecording() {
		span.SetStatus(codes.Error, codeOf(err))
	}
	span.End()
}

// Step records a step that ran from start to end as a child span of ctx's span, when
// ctx is in a trace (the backends' create steps), with attrs.
func Step(ctx context.Context, name string, start, end time.Time, attrs ...attribute.KeyValue) {
	if !inTrace(ctx) {
		return
	}
	_, sp := tracer().Start(ctx, name, trace.WithTimestamp(start), trace.WithAttributes(attrs...))
	sp.End(trace.WithTimestamp(end))
}

func codeOf(err error) string {
	if errors.Is(err, context.Canceled) {
		return connect.CodeCanceled.String()
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return connect.CodeDeadlineExceeded.String()
	}
	return connect.CodeOf(err).String()
}

// rpcAttrs are the rpc.* attributes of a procedure "/pkg.Service/Method".
func rpcAttrs(procedure string) []attribute.KeyValue {
	svc, method, _ := strings.Cut(strings.TrimPrefix(procedure, "/"), "/")
	return []attribute.KeyValue{
		attribute.String("rpc.system", "connect_rpc"),
		attribute.String("rpc.service", svc),
		attribute.String("rpc.method", method),
	}
}

func spanName(procedure string) string { return strings.TrimPrefix(procedure, "/") }

// procSpans is what the spans of one procedure start with: its name and its rpc.*
// attributes, made once per procedure rather than on every call. The attributes are set
// on a span after its start (procSpans.start): given as a start option, the SDK would copy
// them into the span's start config (an allocation per span) and only then into the span.
// The sampler (ParentBased over a trace-ID ratio) does not look at attributes.
type procSpans struct {
	name  string
	attrs []attribute.KeyValue
}

// The start options of the spans of the interceptors: a client span, a server span (the
// internal API, continuing the caller's trace), and the server span of a public call
// when its context already holds a span context (a new root; the usual public call has
// none, and is then a root without the option, which would add a context to the call's).
var (
	startClient = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindClient)}
	startServer = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindServer)}
	startRoot   = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindServer), trace.WithNewRoot()}
)

// start starts a span of p with opts as a child of ctx's span.
func (p *procSpans) start(ctx context.Context, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	ctx, sp := tracer().Start(ctx, p.name, opts...)
	sp.SetAttributes(p.attrs...) // not copied: the SDK appends them to the span's own
	return ctx, sp
}

// maxProcs bounds the procedures whose spans' names and attributes are kept. The
// procedures are those of the services sandboxd serves and calls (a handler's procedure
// is the one it was made for, not the request's path), far fewer; past the bound they are
// made per call.
const maxProcs = 256

var (
	procs     sync.Map // procedure → *procSpans
	procsKept atomic.Int32
)

func spansOf(procedure string) *procSpans {
	if p, ok := procs.Load(procedure); ok {
		return p.(*procSpans)
	}
	p := &procSpans{name: spanName(procedure), attrs: rpcAttrs(procedure)}
	if procsKept.Load() < maxProcs {
		if _, loaded := procs.LoadOrStore(procedure, p); !loaded {
			procsKept.Add(1)
		}
	}
	return p
}

// headers is a propagation carrier over an http.Header that finds the two W3C Trace
// Context headers by their canonical names directly (http.Header's Get and Set
// canonicalize the key, which allocates for these two on every call).
type headers http.Header

func canonical(key string) string {
	switch key {
	case "traceparent":
		return "Traceparent"
	case "tracestate":
		return "Tracestate"
	}
	return http.CanonicalHeaderKey(key)
}

func (h headers) Get(key string) string {
	if v := h[canonical(key)]; len(v) > 0 {
		return v[0]
	}
	return ""
}

func (h headers) Set(key, value string) { h[canonical(key)] = []string{value} }

func (h headers) Keys() []string { return propagation.HeaderCarrier(h).Keys() }

// remote is the trace context in header h (invalid: none).
func remote(h http.Header) trace.SpanContext {
	if len(h["Traceparent"]) == 0 { // the common case of a public call: nothing to parse
		return trace.SpanContext{}
	}
	return trace.SpanContextFromContext(propagator.Extract(context.Background(), headers(h)))
}

// PublicServer traces the calls of the public API (the gateway, the direct data plane):
// each call is a new trace. A caller's traceparent is untrusted: it neither becomes the
// parent (a caller could splice our spans into its trace, or force sampling) nor decides
// sampling; when valid it is added as a link, so a caller's trace and ours can be joined.
func PublicServer() connect.Interceptor { return interceptor{kind: kindPublic} }

// Server traces the calls of an internal API whose callers are sandboxd processes
// authenticated by mTLS (the runner API): a call continues the caller's trace.
func Server() connect.Interceptor { return interceptor{kind: kindInternal} }

// Client traces the calls a sandboxd process makes over an internal hop (gateway →
// runner, runner → agent): a client span, and its context in the traceparent header.
// Calls made outside any trace (background loops) are left alone, so they do not
// each begin a trace.
func Client() connect.Interceptor { return interceptor{kind: kindClient} }

type kind int

const (
	kindPublic kind = iota
	kindInternal
	kindClient
)

type interceptor struct{ kind kind }

// serverStart starts the server span of a call with header h.
func (i interceptor) serverStart(ctx context.Context, procedure string, h http.Header) (context.Context, trace.Span) {
	p := spansOf(procedure)
	if i.kind != kindPublic {
		if len(h["Traceparent"]) > 0 {
			// The caller's span becomes the parent (as a remote span context in ctx); an
			// invalid header leaves ctx as it is.
			ctx = propagator.Extract(ctx, headers(h))
		}
		return p.start(ctx, startServer...)
	}
	opts := startServer
	if !trace.SpanContextFromContext(ctx).Equal(trace.SpanContext{}) {
		opts = startRoot // never a child of what ctx holds
	}
	if sc := remote(h); sc.IsValid() {
		// The link keeps the caller's trace and span IDs, not its tracestate: text a
		// caller chose is not stored in the trace backend.
		sc = sc.WithTraceState(trace.TraceState{})
		opts = append(opts[:len(opts):len(opts)], // a copy: opts is shared
			trace.WithLinks(trace.Link{SpanContext: sc, Attributes: []attribute.KeyValue{attribute.String("sandboxd.link", "caller")}}))
	}
	return p.start(ctx, opts...)
}

// clientStart starts the client span of a unary call to procedure and puts its context
// in the call's header h.
func clientStart(ctx context.Context, procedure string, h http.Header) (context.Context, trace.Span) {
	ctx, sp := spansOf(procedure).start(ctx, startClient...)
	inject(sp.SpanContext(), h)
	return ctx, sp
}

// inject writes span context sc in header h as W3C Trace Context (what
// propagation.TraceContext.Inject writes): traceparent, and tracestate when sc has one.
// Nothing when sc is invalid.
func inject(sc trace.SpanContext, h http.Header) {
	if !sc.IsValid() {
		return
	}
	if ts := sc.TraceState().String(); ts != "" {
		h["Tracestate"] = []string{ts}
	}
	h["Traceparent"] = traceparent(sc)
}

// traceparentLen is the length of a version 00 traceparent:
// 00-<32 hex trace ID>-<16 hex span ID>-<2 hex flags>.
const traceparentLen = 2 + 1 + 32 + 1 + 16 + 1 + 2

// traceparent is sc's traceparent header value, as a header's value slice. Only the
// flags the spec defines (sampled, random) are kept, as propagation.TraceContext does.
func traceparent(sc trace.SpanContext) []string {
	var buf [traceparentLen]byte
	tid, sid := sc.TraceID(), sc.SpanID()
	flags := [1]byte{byte(sc.TraceFlags() & (trace.FlagsSampled | trace.FlagsRandom))}
	b := append(buf[:0], "00-"...)
	b = hex.AppendEncode(b, tid[:])
	b = append(b, '-')
	b = hex.AppendEncode(b, sid[:])
	b = append(b, '-')
	b = hex.AppendEncode(b, flags[:])
	return []string{string(b)}
}

func (i interceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		proc := req.Spec().Procedure
		if req.Spec().IsClient {
			if i.kind != kindClient || !inTrace(ctx) {
				return next(ctx, req)
			}
			ctx, sp := clientStart(ctx, proc, req.Header())
			res, err := next(ctx, req)
			End(sp, err)
			return res, err
		}
		if i.kind == kindClient {
			return next(ctx, req)
		}
		ctx, sp := i.serverStart(ctx, proc, req.Header())
		res, err := next(ctx, req)
		End(sp, err)
		return res, err
	}
}

func (i interceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	if i.kind != kindClient {
		return next
	}
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		if !inTrace(ctx) {
			return next(ctx, spec)
		}
		ctx, sp := spansOf(spec.Procedure).start(ctx, startClient...)
		conn := next(ctx, spec)
		inject(sp.SpanContext(), conn.RequestHeader())
		// A stream's span ends with its context or when its response is done: at the
		// first of CloseResponse and the context's end.
		sc := &streamClient{StreamingClientConn: conn, span: sp}
		sc.stop = context.AfterFunc(ctx, func() { sc.end(ctx.Err()) })
		return sc
	}
}

type streamClient struct {
	connect.StreamingClientConn
	span trace.Span
	stop func() bool
	done bool
}

func (s *streamClient) end(err error) {
	if s.done {
		return
	}
	s.done = true
	End(s.span, err)
}

func (s *streamClient) Receive(m any) error {
	err := s.StreamingClientConn.Receive(m)
	if err != nil && !errors.Is(err, io.EOF) {
		s.fail(err)
	}
	return err
}

func (s *streamClient) fail(err error) {
	if s.span.IsRecording() {
		s.span.SetStatus(codes.Error, codeOf(err))
	}
}

func (s *streamClient) CloseResponse() error {
	err := s.StreamingClientConn.CloseResponse()
	if s.stop() {
		s.end(nil)
	}
	return err
}

func (i interceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	if i.kind == kindClient {
		return next
	}
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		ctx, sp := i.serverStart(ctx, conn.Spec().Procedure, conn.RequestHeader())
		err := next(ctx, conn)
		End(sp, err)
		return err
	}
}
