package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"go.opentelemetry.io/otel"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/tracing"
	"github.com/sandboxd/sandboxd/internal/tracing/jaegertest"
)

// TestTracingJaeger exports the traces of a gateway and a runner behind runnerapi (gRPC
// over mTLS, as on two hosts) to a real Jaeger (scripts/build-jaeger.sh) over OTLP/gRPC,
// creates a sandbox and runs an exec, and reads the traces back from Jaeger's query API:
// the create is one trace — the gateway's CreateSandbox span (a new root linking the
// caller's traceparent), placement, the RunnerService/Create client span and the runner's
// server span under it, the runner's start under that with image pull, network set-up and
// container start — and the exec is one trace down to the runner's client span of the
// agent hop. Skips without the Jaeger binary; SANDBOXD_REQUIRE_JAEGER=1 fails instead.
func TestTracingJaeger(t *testing.T) {
	if testing.Short() {
		t.Skip("runs Jaeger and sandboxes")
	}
	j := jaegertest.Start(t)
	const service = "sandboxd-e2e-tracing"
	prev := otel.GetTracerProvider()
	shutdown, err := tracing.Setup(context.Background(), tracing.Config{Endpoint: "http://" + j.OTLPGRPC, ServiceName: service,
		SampleRatio: 1, BatchTimeout: 200 * time.Millisecond}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = shutdown(context.Background()); otel.SetTracerProvider(prev) })

	g := startSplitGateway(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const callerTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
	// Values a span must never carry: an environment variable's, a command's argument.
	const envValue, argValue = "trace-env-value-5e1f9a", "trace-arg-value-77c2d0"
	sp := spec(busybox(), "sh", "-c", "sleep 600 # "+argValue)
	sp.Containers[0].EnvironmentVariables = map[string]string{"TRACE_TEST": envValue}
	req := connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: sp}})
	req.Header().Set("traceparent", "00-"+callerTrace+"-00f067aa0ba902b7-01")
	res, err := g.sandboxes.CreateSandbox(ctx, req)
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	id := res.Msg.GetSandboxId()
	g.waitState(t, id, sandboxv1.State_STATE_RUNNING)
	if _, err := g.sandboxes.Exec(ctx, connect.NewRequest(&sandboxv1.ExecRequest{SandboxId: id, Command: []string{"echo", argValue}})); err != nil {
		t.Fatalf("exec: %v", err)
	}

	// The create's trace: the one whose runner.start names this sandbox.
	create := j.Await(t, service, "coreweave.sandbox.v1.SandboxService/CreateSandbox", func(tr jaegertest.Trace) bool {
		for _, s := range tr.Named("runner.start") {
			if s.Tags["sandboxd.sandbox_id"] == id && len(tr.Named("local.runtime"))+len(tr.Named("local.claim")) > 0 {
				return true
			}
		}
		return false
	}, 60*time.Second)
	one := func(tr jaegertest.Trace, op, kind string) jaegertest.Span {
		t.Helper()
		var got []jaegertest.Span
		for _, s := range tr.Named(op) {
			if kind == "" || s.Tags["span.kind"] == kind {
				got = append(got, s)
			}
		}
		if len(got) != 1 {
			t.Fatalf("trace %s: %d %s spans %q, want 1", tr.ID, len(got), kind, op)
		}
		return got[0]
	}
	childOf := func(tr jaegertest.Trace, child, parent jaegertest.Span) {
		t.Helper()
		if child.Parent != parent.SpanID {
			p, _ := tr.ByID(child.Parent)
			t.Errorf("%s's parent is %q (%s), want %s (%s)", child.Operation, child.Parent, p.Operation, parent.SpanID, parent.Operation)
		}
	}
	for _, s := range create.Spans {
		t.Logf("create trace %s: span %s %-45s kind=%v parent=%s links=%v", s.TraceID, s.SpanID, s.Operation, s.Tags["span.kind"], s.Parent, s.Links)
	}
	root := one(create, "coreweave.sandbox.v1.SandboxService/CreateSandbox", "server")
	if root.Parent != "" || root.TraceID == callerTrace {
		t.Errorf("the create continued the caller's trace: parent %q, trace %s", root.Parent, root.TraceID)
	}
	if !slices.ContainsFunc(root.Links, func(l string) bool { return len(l) > 32 && l[:32] == callerTrace }) {
		t.Errorf("the create's span links %v, want the caller's trace %s", root.Links, callerTrace)
	}
	childOf(create, one(create, "gateway.place", ""), root)
	rc := one(create, "sandboxd.runner.v1.RunnerService/Create", "client")
	rs := one(create, "sandboxd.runner.v1.RunnerService/Create", "server")
	childOf(create, rc, root)
	childOf(create, rs, rc)
	start := one(create, "runner.start", "")
	childOf(create, start, rs)
	steps := []string{"image.pull", "network.setup", "local.runtime"}
	if len(create.Named("local.claim")) > 0 {
		steps = []string{"local.claim"} // a warm-pool container: pulled and started before
	}
	for _, op := range steps {
		childOf(create, one(create, op, ""), start)
	}
	for _, s := range create.Spans {
		if s.TraceID != root.TraceID {
			t.Errorf("span %s of trace %s in %s", s.Operation, s.TraceID, root.TraceID)
		}
	}

	// The exec's trace: gateway → runner (the agent relay) → the runner's agent hop.
	ex := j.Await(t, service, "coreweave.sandbox.v1.SandboxService/Exec", func(tr jaegertest.Trace) bool {
		return len(tr.Named("sandboxd.agent.v1.AgentService/Exec")) == 3
	}, 60*time.Second)
	for _, s := range ex.Spans {
		t.Logf("exec trace %s: span %s %-45s kind=%v parent=%s", s.TraceID, s.SpanID, s.Operation, s.Tags["span.kind"], s.Parent)
	}
	eroot := one(ex, "coreweave.sandbox.v1.SandboxService/Exec", "server")
	var gwc, rsrv, agentc jaegertest.Span
	for _, s := range ex.Named("sandboxd.agent.v1.AgentService/Exec") {
		switch {
		case s.Tags["span.kind"] == "server":
			rsrv = s
		case s.Parent == eroot.SpanID:
			gwc = s
		default:
			agentc = s
		}
	}
	childOf(ex, gwc, eroot)
	childOf(ex, rsrv, gwc)
	childOf(ex, agentc, rsrv)
	if agentc.Tags["span.kind"] != "client" {
		t.Errorf("the agent hop's span is %v, want a client span", agentc.Tags["span.kind"])
	}
	for _, tr := range []jaegertest.Trace{create, ex} {
		for _, s := range tr.Spans {
			for k, v := range s.Tags {
				if str := fmt.Sprint(v); strings.Contains(str, envValue) || strings.Contains(str, argValue) {
					t.Errorf("span %s carries %s=%q: an environment value or a command argument", s.Operation, k, str)
				}
			}
		}
	}
}
