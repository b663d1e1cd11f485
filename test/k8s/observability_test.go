package k8s

import (
	"context"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/sandboxd/sandboxd/internal/metrics"
	"github.com/sandboxd/sandboxd/internal/metrics/counters"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// TestObservability: on a real cluster, the Kubernetes backend reports what the local
// backend does (docs/observability.md): the image pulls the kubelet made (the test images
// are present: hits) and a pull that cannot be had by its reason; the sandbox's CPU and
// memory from its node's kubelet, in status.resource_usage and in the per-sandbox series;
// and the create's steps as child spans of the runner's start span.
func TestObservability(t *testing.T) {
	_, s, _ := setup(t)
	r := s.Runner
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	prev := otel.GetTracerProvider()
	otel.SetTracerProvider(tp)
	t.Cleanup(func() { otel.SetTracerProvider(prev) })

	before := counters.Values()
	ctx, call := tp.Tracer("test").Start(context.Background(), "test.create")
	sb, err := r.Create(ctx, runner.CreateRequest{Spec: runtime.Spec{
		Container: runtime.Container{Image: busybox, Command: "sh", Args: []string{"-c", "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done; exec sleep 3600"},
			Resources: runtime.Resources{MilliCPU: 500, MemoryBytes: 128 << 20}},
		Meta: map[string]string{runtime.MetaOrg: "org-obs"},
	}})
	call.End()
	if err != nil {
		t.Fatal(err)
	}
	id := sb.ID
	sb = waitState(t, r, id, 2*time.Minute, running)
	if sb.State != runner.StateRunning {
		t.Fatalf("state %s (%s: %s), want RUNNING", sb.State, sb.Reason, sb.Message)
	}

	// A pull the kubelet cannot make (not on the node, policy Never).
	bad, err := r.Create(context.Background(), runner.CreateRequest{Spec: runtime.Spec{
		Container: runtime.Container{Image: "localhost/sandboxd/not-imported:1", Command: "true"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	bsb := terminal(t, r, bad.ID)
	t.Logf("missing image: %s %s", bsb.State, bsb.Reason)

	// Image pulls: the busybox hit (the agent's image is not counted), the failure by reason.
	deadline := time.Now().Add(30 * time.Second)
	for {
		hits := counters.Values()[`cwsandbox_image_pulls_total{cache="hit",result="ok"}`] - before[`cwsandbox_image_pulls_total{cache="hit",result="ok"}`]
		fails := counters.Values()[`cwsandbox_image_pull_failures_total{reason="ErrImageNeverPull"}`] - before[`cwsandbox_image_pull_failures_total{reason="ErrImageNeverPull"}`]
		if hits >= 1 && fails >= 1 {
			t.Logf("image pulls: %v hits, %v ErrImageNeverPull", hits, fails)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("image pulls: %v hits, %v ErrImageNeverPull failures; want ≥ 1 each", hits, fails)
		}
		time.Sleep(200 * time.Millisecond)
	}

	// Usage: the kubelet's summary (its CPU stats appear within its housekeeping interval).
	var u *runner.Usage
	for deadline := time.Now().Add(90 * time.Second); ; time.Sleep(time.Second) {
		got, err := r.Get(id)
		if err != nil {
			t.Fatal(err)
		}
		if u = got.Usage; u != nil && u.CPUUsec > 0 && u.MemoryBytes > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no usage from the kubelet within 90 s: %+v", u)
		}
	}
	t.Logf("usage: %d µs CPU, %d bytes, %d millicores", u.CPUUsec, u.MemoryBytes, u.CPUMillicores)
	if u.MemoryBytes > 128<<20 {
		t.Errorf("memory %d above the sandbox's limit", u.MemoryBytes)
	}
	m := metrics.New()
	m.RegisterSandboxUsage(func(limit int) []metrics.SandboxUsage {
		var out []metrics.SandboxUsage
		for _, x := range r.Usages(limit) {
			out = append(out, metrics.SandboxUsage{ID: x.ID, Org: x.Org, CPUUsec: x.CPUUsec, MemoryBytes: x.MemoryBytes, MemoryPeakBytes: x.MemoryPeakBytes})
		}
		return out
	})
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := map[string]float64{}
	for _, mf := range mfs {
		for _, mm := range mf.GetMetric() {
			if label(mm, "sandbox_id") == id && label(mm, "organization") == "org-obs" {
				found[mf.GetName()] = mm.GetCounter().GetValue() + mm.GetGauge().GetValue()
			}
		}
	}
	if found["cwsandbox_sandbox_cpu_usage_seconds_total"] <= 0 || found["cwsandbox_sandbox_memory_bytes"] <= 0 {
		t.Errorf("per-sandbox series of %s: %v; want CPU and memory > 0", id, found)
	}
	if p, ok := found["cwsandbox_sandbox_memory_peak_bytes"]; ok && p < found["cwsandbox_sandbox_memory_bytes"] {
		t.Errorf("memory peak %v below the usage %v", p, found["cwsandbox_sandbox_memory_bytes"])
	}

	// Spans: the create's steps under the runner's start span, in the call's trace.
	var startSpan sdktrace.ReadOnlySpan
	var steps map[string]int
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		steps = map[string]int{}
		for _, sp := range rec.Ended() {
			if sp.Name() == "runner.start" && sp.Parent().SpanID() == call.SpanContext().SpanID() {
				startSpan = sp
			}
		}
		if startSpan != nil {
			for _, sp := range rec.Ended() {
				if sp.Parent().SpanID() == startSpan.SpanContext().SpanID() {
					steps[sp.Name()]++
				}
			}
		}
		if steps["image.pull"] >= 1 || time.Now().After(deadline) {
			break
		}
	}
	if startSpan == nil {
		t.Fatal("no runner.start span under the create's span")
	}
	for _, name := range []string{"kubernetes.schedule", "kubernetes.runtime", "kubernetes.agent", "image.pull"} {
		if steps[name] != 1 {
			t.Errorf("%d %s spans under runner.start, want 1 (got %v)", steps[name], name, steps)
		}
	}
	var names []string
	for n := range steps {
		names = append(names, n)
	}
	t.Logf("steps: %s", strings.Join(names, ", "))
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}
