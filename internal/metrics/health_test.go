package metrics

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestRunnerHealthSeries: one gauge series per runner and state (1 for the current one,
// runners without a record healthy), and the transitions counter.
func TestRunnerHealthSeries(t *testing.T) {
	m := New()
	m.RegisterRunnerHealth([]string{"r2", "r1"}, func() map[string]string { return map[string]string{"r1": "quarantined"} })
	m.RunnerHealthTransition("r1", HealthScopeRunner, "degraded", "quarantined")
	m.RunnerHealthTransition("r1", HealthScopeOrganization, "healthy", "degraded")
	m.RunnerHealthTransition("r1", "bogus", "healthy", "degraded") // unknown scope: runner
	scrape := gather(t, m)
	for _, want := range []string{
		`cwsandbox_runner_health{runner_id="r1",state="quarantined"} 1`,
		`cwsandbox_runner_health{runner_id="r1",state="healthy"} 0`,
		`cwsandbox_runner_health{runner_id="r2",state="healthy"} 1`,
		`cwsandbox_runner_health{runner_id="r2",state="quarantined"} 0`,
		`cwsandbox_runner_health_transitions_total{from="degraded",runner_id="r1",scope="runner",to="quarantined"} 1`,
		`cwsandbox_runner_health_transitions_total{from="healthy",runner_id="r1",scope="organization",to="degraded"} 1`,
		`cwsandbox_runner_health_transitions_total{from="healthy",runner_id="r1",scope="runner",to="degraded"} 1`,
	} {
		if !strings.Contains(scrape, want+"\n") {
			t.Errorf("missing %s in:\n%s", want, grepLines(scrape, "runner_health"))
		}
	}
	lint(t, m)
}

// TestReadyz: /readyz is 200 only while every readiness check passes, and names those
// that fail; /livez is 200 regardless.
func TestReadyz(t *testing.T) {
	m := New()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addr, err := m.Listen(ctx, "127.0.0.1:0", nil)
	if err != nil {
		t.Fatal(err)
	}
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if st, b := get("/readyz"); st != 503 || !strings.Contains(b, "starting") {
		t.Errorf("before any check: %d %q", st, b)
	}
	var storeErr error
	m.SetReady("store", func(context.Context) error { return storeErr })
	m.SetReady("runners", func(context.Context) error { return nil })
	if st, b := get("/readyz"); st != 200 || b != "ok\n" {
		t.Errorf("all ready: %d %q", st, b)
	}
	storeErr = errors.New("connection refused")
	if st, b := get("/readyz"); st != 503 || !strings.Contains(b, "store: connection refused") || strings.Contains(b, "runners") {
		t.Errorf("store down: %d %q", st, b)
	}
	if st, _ := get("/livez"); st != 200 {
		t.Errorf("livez while not ready: %d", st)
	}
}

// TestSandboxUsageSeries: one CPU (seconds), memory and peak series per running sandbox
// the source reports (peak left out when unknown), a duplicate ID once; nothing without
// a source.
func TestSandboxUsageSeries(t *testing.T) {
	m := New()
	if n := testutil.CollectAndCount(m.Registry(), "cwsandbox_sandbox_cpu_usage_seconds_total"); n != 0 {
		t.Fatalf("%d series without a source", n)
	}
	var gotLimit int
	m.RegisterSandboxUsage(func(limit int) []SandboxUsage {
		gotLimit = limit
		return []SandboxUsage{
			{ID: "sb-1", Org: "org-a", CPUUsec: 2_500_000, MemoryBytes: 64 << 20, MemoryPeakBytes: 80 << 20},
			{ID: "sb-2", Org: "org-b", CPUUsec: 1000, MemoryBytes: 4096},
			{ID: "sb-2", Org: "org-b", CPUUsec: 1000, MemoryBytes: 4096},
		}
	})
	want := `
# HELP cwsandbox_sandbox_cpu_usage_seconds_total CPU time a running sandbox's cgroup has used since it started (the runner's view; status.resource_usage's numbers).
# TYPE cwsandbox_sandbox_cpu_usage_seconds_total counter
cwsandbox_sandbox_cpu_usage_seconds_total{organization="org-a",sandbox_id="sb-1"} 2.5
cwsandbox_sandbox_cpu_usage_seconds_total{organization="org-b",sandbox_id="sb-2"} 0.001
# HELP cwsandbox_sandbox_memory_bytes Memory a running sandbox's cgroup is charged now (the runner's view).
# TYPE cwsandbox_sandbox_memory_bytes gauge
cwsandbox_sandbox_memory_bytes{organization="org-a",sandbox_id="sb-1"} 6.7108864e+07
cwsandbox_sandbox_memory_bytes{organization="org-b",sandbox_id="sb-2"} 4096
# HELP cwsandbox_sandbox_memory_peak_bytes Most memory a running sandbox's cgroup was charged (the runner's view; absent when the kernel does not tell).
# TYPE cwsandbox_sandbox_memory_peak_bytes gauge
cwsandbox_sandbox_memory_peak_bytes{organization="org-a",sandbox_id="sb-1"} 8.388608e+07
`
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(want), "cwsandbox_sandbox_cpu_usage_seconds_total",
		"cwsandbox_sandbox_memory_bytes", "cwsandbox_sandbox_memory_peak_bytes"); err != nil {
		t.Error(err)
	}
	if gotLimit != MaxInfoSeries {
		t.Errorf("limit %d, want %d", gotLimit, MaxInfoSeries)
	}
	lint(t, m)
}
