package tracing

import (
	"context"
	"errors"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1/agentv1connect"
)

func TestConfigValidate(t *testing.T) {
	ok := []Config{
		{},
		{Endpoint: "127.0.0.1:4317", ServiceName: "s", SampleRatio: 1},
		{Endpoint: "http://collector:4317", ServiceName: "s"},
		{Endpoint: "https://collector.example:443", Protocol: ProtocolHTTP, ServiceName: "s", SampleRatio: 0.25},
		{Endpoint: "http://[::1]:4318/otlp/v1/traces", Protocol: ProtocolHTTP, ServiceName: "s"},
	}
	for _, c := range ok {
		if err := c.Validate(); err != nil {
			t.Errorf("%+v: %v", c, err)
		}
	}
	bad := []Config{
		{Endpoint: "collector", ServiceName: "s"},
		{Endpoint: "ftp://collector:21", ServiceName: "s"},
		{Endpoint: "http://user:pw@collector:4317", ServiceName: "s"},
		{Endpoint: "http://collector:4317?x=1", ServiceName: "s"},
		{Endpoint: "http://:4317", ServiceName: "s"},
		{Endpoint: "127.0.0.1:4317", Protocol: "thrift", ServiceName: "s"},
		{Endpoint: "127.0.0.1:4317", SampleRatio: 1.5, ServiceName: "s"},
		{Endpoint: "127.0.0.1:4317", SampleRatio: -0.1, ServiceName: "s"},
		{Endpoint: "127.0.0.1:4317", SampleRatio: math.NaN(), ServiceName: "s"},
		{Endpoint: "127.0.0.1:4317"},
		{Endpoint: "127.0.0.1:4317", ServiceName: "s", BatchTimeout: -time.Second},
	}
	for _, c := range bad {
		if err := c.Validate(); err == nil {
			t.Errorf("%+v: valid", c)
		}
	}
}

// TestTarget: a bare host:port is plaintext only on loopback.
func TestTarget(t *testing.T) {
	for e, plain := range map[string]bool{"127.0.0.1:4317": true, "localhost:4317": true, "[::1]:4317": true,
		"collector:4317": false, "http://collector:4317": true, "https://127.0.0.1:4317": false} {
		_, p, err := Config{Endpoint: e}.target()
		if err != nil || p != plain {
			t.Errorf("%s: plaintext %v %v, want %v", e, p, err, plain)
		}
	}
}

// TestSetupOff: without an endpoint nothing is set up.
func TestSetupOff(t *testing.T) {
	before := otel.GetTracerProvider()
	stop, err := Setup(context.Background(), Config{}, nil)
	if err != nil || stop(context.Background()) != nil || otel.GetTracerProvider() != before {
		t.Fatalf("Setup of the zero config: %v", err)
	}
	if _, err := Setup(context.Background(), Config{Endpoint: "nope"}, nil); err == nil {
		t.Fatal("Setup of a bad config: no error")
	}
}

// recorder makes the global tracer provider record every span (sampler: ratio) for the
// test's duration.
func recorder(t *testing.T, ratio float64) *tracetest.SpanRecorder {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(ratio))))
	prev := otel.GetTracerProvider()
	otel.SetTracerProvider(tp)
	t.Cleanup(func() { otel.SetTracerProvider(prev) })
	return rec
}

// hop is an AgentService whose Exec calls next (if any) and notes the traceparent it got.
type hop struct {
	agentv1connect.UnimplementedAgentServiceHandler
	next agentv1connect.AgentServiceClient
	mu   sync.Mutex
	got  []string
	fail bool
}

func (h *hop) Exec(ctx context.Context, req *connect.Request[agentv1.ExecRequest]) (*connect.Response[agentv1.ExecResponse], error) {
	h.mu.Lock()
	h.got = append(h.got, req.Header().Get("traceparent"))
	h.mu.Unlock()
	if h.fail {
		return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("secret-value in a message"))
	}
	if h.next != nil {
		return h.next.Exec(ctx, req)
	}
	return connect.NewResponse(&agentv1.ExecResponse{}), nil
}

func (h *hop) Logs(ctx context.Context, req *connect.Request[agentv1.LogsRequest], s *connect.ServerStream[agentv1.LogsResponse]) error {
	h.mu.Lock()
	h.got = append(h.got, req.Header().Get("traceparent"))
	h.mu.Unlock()
	return s.Send(&agentv1.LogsResponse{})
}

func serve(t testing.TB, h *hop, ic ...connect.Interceptor) string {
	t.Helper()
	path, handler := agentv1connect.NewAgentServiceHandler(h, connect.WithInterceptors(ic...))
	mux := http.NewServeMux()
	mux.Handle(path, handler)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.URL
}

func client(url string, ic ...connect.Interceptor) agentv1connect.AgentServiceClient {
	return agentv1connect.NewAgentServiceClient(http.DefaultClient, url, connect.WithInterceptors(ic...))
}

// chain is gateway (public) → runner (internal) → agent (untraced), as in sandboxd.
func chain(t testing.TB) (gw agentv1connect.AgentServiceClient, agent, runner *hop) {
	agent = &hop{}
	agentURL := serve(t, agent)
	runner = &hop{next: client(agentURL, Client())}
	runnerURL := serve(t, runner, Server())
	gateway := &hop{next: client(runnerURL, Client())}
	return client(serve(t, gateway, PublicServer())), agent, runner
}

const callerParent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

func byName(spans []sdktrace.ReadOnlySpan) map[string][]sdktrace.ReadOnlySpan {
	m := map[string][]sdktrace.ReadOnlySpan{}
	for _, s := range spans {
		m[s.Name()] = append(m[s.Name()], s)
	}
	return m
}

// TestOneTraceAcrossHops: a public call is a new trace linking the caller's; the runner
// hop continues it (parent links intact); the agent gets the runner's client span as its
// parent in traceparent; no span carries more than the procedure.
func TestOneTraceAcrossHops(t *testing.T) {
	rec := recorder(t, 1)
	gw, agent, _ := chain(t)
	req := connect.NewRequest(&agentv1.ExecRequest{Command: []string{"echo", "secret-arg"}})
	req.Header().Set("traceparent", callerParent)
	req.Header().Set("tracestate", "vendor=caller-chosen-text")
	if _, err := gw.Exec(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	spans := rec.Ended()
	if len(spans) != 4 {
		t.Fatalf("%d spans, want 4 (gateway server, its client, runner server, its client)", len(spans))
	}
	var server, clients []sdktrace.ReadOnlySpan
	for _, s := range spans {
		if s.Name() != "sandboxd.agent.v1.AgentService/Exec" {
			t.Errorf("span name %q", s.Name())
		}
		switch s.SpanKind() {
		case trace.SpanKindServer:
			server = append(server, s)
		case trace.SpanKindClient:
			clients = append(clients, s)
		}
		for _, a := range s.Attributes() {
			if strings.Contains(a.Value.String(), "secret") || strings.Contains(a.Value.String(), "echo") {
				t.Errorf("span %s carries %s=%s", s.Name(), a.Key, a.Value.String())
			}
		}
	}
	if len(server) != 2 || len(clients) != 2 {
		t.Fatalf("%d server and %d client spans", len(server), len(clients))
	}
	// Ended innermost first: runner's client, runner's server, gateway's client, gateway's server.
	rc, rs, gc, gs := spans[0], spans[1], spans[2], spans[3]
	tid := gs.SpanContext().TraceID()
	if tid.String() == "0af7651916cd43dd8448eb211c80319c" || gs.Parent().IsValid() {
		t.Errorf("the public call continued the caller's trace (parent %v)", gs.Parent())
	}
	if l := gs.Links(); len(l) != 1 || l[0].SpanContext.TraceID().String() != "0af7651916cd43dd8448eb211c80319c" {
		t.Errorf("links %v, want the caller's context", l)
	} else if ts := l[0].SpanContext.TraceState().String(); ts != "" {
		t.Errorf("the link keeps the caller's tracestate %q", ts)
	}
	for _, c := range []struct {
		child, parent sdktrace.ReadOnlySpan
	}{{gc, gs}, {rs, gc}, {rc, rs}} {
		if c.child.SpanContext().TraceID() != tid || c.child.Parent().SpanID() != c.parent.SpanContext().SpanID() {
			t.Errorf("%v's parent %v, want %v", c.child.SpanKind(), c.child.Parent().SpanID(), c.parent.SpanContext().SpanID())
		}
	}
	if !rs.Parent().IsRemote() {
		t.Error("the runner's server span's parent is not remote: it did not come over the wire")
	}
	want := "00-" + tid.String() + "-" + rc.SpanContext().SpanID().String() + "-01"
	if agent.got[0] != want {
		t.Errorf("agent got traceparent %q, want %q", agent.got[0], want)
	}
}

// TestErrorStatusCodeOnly: a failed call's spans have the code, not the message.
func TestErrorStatusCodeOnly(t *testing.T) {
	rec := recorder(t, 1)
	gw, _, runner := chain(t)
	runner.fail = true
	_, err := gw.Exec(context.Background(), connect.NewRequest(&agentv1.ExecRequest{}))
	if connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatal(err)
	}
	for _, s := range rec.Ended() {
		if s.Status().Code != codes.Error || s.Status().Description != "failed_precondition" {
			t.Errorf("%v span status %+v", s.SpanKind(), s.Status())
		}
	}
}

// TestUntracedClientCall: a call made outside any trace (a background loop) makes no
// span and sends no traceparent.
func TestUntracedClientCall(t *testing.T) {
	rec := recorder(t, 1)
	agent := &hop{}
	c := client(serve(t, agent), Client())
	if _, err := c.Exec(context.Background(), connect.NewRequest(&agentv1.ExecRequest{})); err != nil {
		t.Fatal(err)
	}
	if n := len(rec.Ended()); n != 0 || agent.got[0] != "" {
		t.Errorf("%d spans, traceparent %q", n, agent.got[0])
	}
	// Nor does Child or Step.
	ctx, sp := Child(context.Background(), "x")
	sp.End()
	Step(ctx, "y", time.Now(), time.Now())
	if n := len(rec.Ended()); n != 0 {
		t.Errorf("%d spans outside a trace", n)
	}
}

// TestStreamAndSteps: a server stream's client span ends when the response is closed;
// Step and Child record children of the trace, also after the parent ended (a start that
// outlives its create call).
func TestStreamAndSteps(t *testing.T) {
	rec := recorder(t, 1)
	agent := &hop{}
	c := client(serve(t, agent), Client())
	ctx, root := Start(context.Background(), "root")
	st, err := c.Logs(ctx, connect.NewRequest(&agentv1.LogsRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	for st.Receive() {
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	root.End()
	start := time.Now().Add(-time.Second)
	Step(ctx, "local.runtime", start, start.Add(time.Millisecond))
	_, ch := Child(ctx, "image.pull", KeySandboxID.String("sb-1"))
	End(ch, nil)
	m := byName(rec.Ended())
	rid := root.SpanContext().SpanID()
	for _, name := range []string{"sandboxd.agent.v1.AgentService/Logs", "local.runtime", "image.pull"} {
		if len(m[name]) != 1 || m[name][0].Parent().SpanID() != rid {
			t.Errorf("%s: %v, want one child of root", name, m[name])
		}
	}
	if s := m["local.runtime"]; len(s) == 1 && (!s[0].StartTime().Equal(start) || s[0].EndTime().Sub(s[0].StartTime()) != time.Millisecond) {
		t.Errorf("step from %v to %v", s[0].StartTime(), s[0].EndTime())
	}
	if !strings.Contains(agent.got[0], root.SpanContext().TraceID().String()) {
		t.Errorf("stream's traceparent %q", agent.got[0])
	}
}

// TestCallerCannotForceSampling: with ratio 0 a caller's sampled traceparent records
// nothing, here or downstream.
func TestCallerCannotForceSampling(t *testing.T) {
	rec := recorder(t, 0)
	gw, agent, _ := chain(t)
	req := connect.NewRequest(&agentv1.ExecRequest{})
	req.Header().Set("traceparent", callerParent)
	if _, err := gw.Exec(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	if n := len(rec.Ended()); n != 0 {
		t.Errorf("%d spans recorded at ratio 0", n)
	}
	if strings.HasSuffix(agent.got[0], "-01") {
		t.Errorf("agent got a sampled traceparent %q", agent.got[0])
	}
}

// TestOffIsNoop: with the default (no-op) provider nothing is propagated.
func TestOffIsNoop(t *testing.T) {
	prev := otel.GetTracerProvider()
	otel.SetTracerProvider(noop.NewTracerProvider())
	t.Cleanup(func() { otel.SetTracerProvider(prev) })
	gw, agent, _ := chain(t)
	if _, err := gw.Exec(context.Background(), connect.NewRequest(&agentv1.ExecRequest{})); err != nil {
		t.Fatal(err)
	}
	if agent.got[0] != "" {
		t.Errorf("tracing off, the agent got traceparent %q", agent.got[0])
	}
}

// TestTracerFollowsProvider: the tracer kept between spans is the current global
// provider's: spans go to a provider set later, and back to the first once it is set again.
func TestTracerFollowsProvider(t *testing.T) {
	a := recorder(t, 1)
	tpA := otel.GetTracerProvider()
	_, sp := Start(context.Background(), "one")
	sp.End()
	b := recorder(t, 1)
	_, sp = Start(context.Background(), "two")
	sp.End()
	otel.SetTracerProvider(noop.NewTracerProvider())
	if _, sp = Start(context.Background(), "off"); sp.IsRecording() {
		t.Error("a span of the no-op provider records")
	}
	sp.End()
	otel.SetTracerProvider(tpA)
	_, sp = Start(context.Background(), "three")
	sp.End()
	if len(a.Ended()) != 2 || len(b.Ended()) != 1 {
		t.Fatalf("provider a got %d spans (want 2: set again), b %d (want 1)", len(a.Ended()), len(b.Ended()))
	}
}
