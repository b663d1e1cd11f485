package metrics

import (
	"context"
	"errors"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/metrics/counters"
	"github.com/sandboxd/sandboxd/internal/metrics/promtest"
	"github.com/sandboxd/sandboxd/internal/store"
)

// testStore is a SQLite store with organization org, runner r1 (heartbeat 5 s ago) and
// two sandboxes: one RUNNING, one ended.
func testStore(t *testing.T, now time.Time) store.Store {
	t.Helper()
	ctx := context.Background()
	st, err := store.OpenSQLite(ctx, filepath.Join(t.TempDir(), "s.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	if _, err := st.Orgs().Create(ctx, store.Org{ID: "org-a", Name: "A"}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Runners().Create(ctx, store.Runner{Org: "org-a", RunnerID: "r1", ClusterID: "c1"}); err != nil {
		t.Fatal(err)
	}
	hb := now.Add(-5 * time.Second)
	if err := st.Runners().RecordHeartbeat(ctx, "org-a", "r1", store.RunnerStatus{LastHeartbeatAt: &hb, Ready: true,
		Capacity: []byte(`{"milli_cpu":4000,"memory_bytes":8589934592,"sandboxes":10}`),
		Usage:    []byte(`{"milli_cpu":500,"memory_bytes":1073741824,"sandboxes":1}`)}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Sandboxes().Create(ctx, store.Sandbox{ID: "sb-1", Org: "org-a", RunnerID: "r1", State: "RUNNING",
		Spec: []byte(`{"image":"busybox","runtimeClass":"gvisor"}`)}); err != nil {
		t.Fatal(err)
	}
	ended := now
	if _, err := st.Sandboxes().Create(ctx, store.Sandbox{ID: "sb-2", Org: "org-a", RunnerID: "r1", State: "CREATING", Spec: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Sandboxes().UpdateStatus(ctx, "org-a", "sb-2", store.SandboxStatusUpdate{State: "COMPLETED", EndedAt: &ended}); err != nil {
		t.Fatal(err)
	}
	return st
}

// TestStoreSeries: live sandboxes have an _info series with their placement, ended ones
// none; counts by state; runner capacity, usage and heartbeat age from the heartbeat.
func TestStoreSeries(t *testing.T) {
	now := time.Now().Truncate(time.Second) // the store keeps less than ns
	st := testStore(t, now)
	m := New()
	m.now = func() time.Time { return now }
	if err := m.RegisterStore(StoreView{Orgs: st.Orgs(), Sandboxes: st.Sandboxes(), Runners: st.Runners()}); err != nil {
		t.Fatal(err)
	}
	want := `
# HELP cwsandbox_sandbox_info 1 for each live sandbox, with its placement (the gateway's view, refreshed about every 30 s and after changes).
# TYPE cwsandbox_sandbox_info gauge
cwsandbox_sandbox_info{organization="org-a",runner_id="r1",runtime_class="gvisor",sandbox_id="sb-1",state="RUNNING"} 1
# HELP cwsandbox_sandboxes Live sandboxes by organization and state.
# TYPE cwsandbox_sandboxes gauge
cwsandbox_sandboxes{organization="org-a",state="RUNNING"} 1
# HELP cwsandbox_runner_cpu_capacity_cores CPU a runner offers sandboxes, from its last heartbeat.
# TYPE cwsandbox_runner_cpu_capacity_cores gauge
cwsandbox_runner_cpu_capacity_cores{organization="org-a",runner_id="r1"} 4
# HELP cwsandbox_runner_memory_usage_bytes Memory a runner's sandboxes hold, from its last heartbeat.
# TYPE cwsandbox_runner_memory_usage_bytes gauge
cwsandbox_runner_memory_usage_bytes{organization="org-a",runner_id="r1"} 1.073741824e+09
# HELP cwsandbox_runner_heartbeat_age_seconds Seconds since the runner's last heartbeat (absent: never heard from).
# TYPE cwsandbox_runner_heartbeat_age_seconds gauge
cwsandbox_runner_heartbeat_age_seconds{organization="org-a",runner_id="r1"} 5
# HELP cwsandbox_runner_ready 1 when the runner's last heartbeat said ready.
# TYPE cwsandbox_runner_ready gauge
cwsandbox_runner_ready{organization="org-a",runner_id="r1"} 1
`
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(want),
		"cwsandbox_sandbox_info", "cwsandbox_sandboxes", "cwsandbox_runner_cpu_capacity_cores",
		"cwsandbox_runner_memory_usage_bytes", "cwsandbox_runner_heartbeat_age_seconds", "cwsandbox_runner_ready"); err != nil {
		t.Error(err)
	}

	// A write through Index is seen at the next scrape, before the refresh interval.
	x := m.Index(st.Sandboxes())
	ended := now
	if _, err := x.UpdateStatus(context.Background(), "org-a", "sb-1", store.SandboxStatusUpdate{State: "TERMINATED", EndedAt: &ended}); err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(m.Registry(), "cwsandbox_sandbox_info"); n != 0 {
		t.Errorf("after the delete: %d sandbox_info series, want 0", n)
	}
	lint(t, m)
}

// TestAPIMetrics: creates and deletes by result and reason (an unknown reason is OTHER),
// exec latency by path, time to RUNNING only for sandboxes this process created.
func TestAPIMetrics(t *testing.T) {
	m := New()
	now := time.Now()
	m.now = func() time.Time { return now }
	m.ObserveCreate(nil)
	m.ObserveCreate(apierr.New(apierr.InvalidRequest, "bad", nil))
	m.ObserveCreate(connect.NewError(connect.CodeInternal, errors.New("boom")))
	m.ObserveDelete(nil)
	m.ObserveExec(PathGateway, 20*time.Millisecond, nil)
	m.ObserveExec("anything else", time.Second, nil) // not a label value: gateway
	m.Created("sb-1", now.Add(-3*time.Second))
	m.StateChanged("sb-1", "CREATING", false)
	m.StateChanged("sb-1", "RUNNING", false)
	m.StateChanged("sb-1", "RUNNING", false)   // observed once
	m.StateChanged("sb-old", "RUNNING", false) // not created here: not observed
	want := `
# HELP cwsandbox_sandbox_creates_total CreateSandbox calls by result (ok or the gRPC code) and CWSANDBOX_* reason.
# TYPE cwsandbox_sandbox_creates_total counter
cwsandbox_sandbox_creates_total{reason="",result="ok"} 1
cwsandbox_sandbox_creates_total{reason="CWSANDBOX_INVALID_REQUEST",result="invalid_argument"} 1
cwsandbox_sandbox_creates_total{reason="OTHER",result="internal"} 1
# HELP cwsandbox_sandbox_deletes_total DeleteSandbox calls by result (ok or the gRPC code) and CWSANDBOX_* reason.
# TYPE cwsandbox_sandbox_deletes_total counter
cwsandbox_sandbox_deletes_total{reason="",result="ok"} 1
`
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(want), "cwsandbox_sandbox_creates_total", "cwsandbox_sandbox_deletes_total"); err != nil {
		t.Error(err)
	}
	if n := testutil.CollectAndCount(m.Registry(), "cwsandbox_exec_duration_seconds"); n != 1 {
		t.Errorf("exec_duration series: %d, want 1 (path=gateway,result=ok)", n)
	}
	scrape := gather(t, m)
	if !strings.Contains(scrape, "cwsandbox_sandbox_time_to_running_seconds_count 1\n") ||
		!strings.Contains(scrape, "cwsandbox_sandbox_time_to_running_seconds_sum 3\n") {
		t.Errorf("time_to_running: want one observation of 3 s in:\n%s", grepLines(scrape, "time_to_running"))
	}
	lint(t, m)
}

// TestListener: the listener serves GET /metrics, /livez and /readyz (not ready before
// a readiness check is set) and nothing else.
func TestListener(t *testing.T) {
	m := New()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addr, err := m.Listen(ctx, "127.0.0.1:0", nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		method, path string
		want         int
	}{{"GET", "/metrics", 200}, {"GET", "/livez", 200}, {"GET", "/readyz", 503}, {"GET", "/", 404}, {"GET", "/v1/sandboxes", 404}, {"POST", "/metrics", 405}} {
		req, _ := http.NewRequest(c.method, "http://"+addr+c.path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.want {
			t.Errorf("%s %s: %d, want %d", c.method, c.path, resp.StatusCode, c.want)
		}
		if c.path != "/metrics" {
			continue
		}
		if c.want == 200 && !strings.Contains(string(b), "go_goroutines") || c.want == 200 && !strings.Contains(string(b), "process_cpu_seconds_total") {
			t.Errorf("GET /metrics lacks the Go runtime or process metrics")
		}
	}
	if a, err := m.Listen(ctx, "", nil); a != "" || err != nil {
		t.Errorf("empty address: %q, %v; want disabled", a, err)
	}
}

// TestRuntimeClassLabel: the spec's runtime class is the caller's: only a name-shaped one
// becomes a label value.
func TestRuntimeClassLabel(t *testing.T) {
	for spec, want := range map[string]string{
		`{"runtimeClass":"gvisor"}`:                             "gvisor",
		`{"runtimeClassSelection":"RUNTIME_CLASS_CPU_DEFAULT"}`: "RUNTIME_CLASS_CPU_DEFAULT",
		`{"runtimeClass":"` + strings.Repeat("a", 64) + `"}`:    "other",
		`{"runtimeClass":"x\"} 1\nevil{a=\"b"}`:                 "other",
		`{}`:                                                    "",
		`not json`:                                              "",
	} {
		if got := runtimeClass([]byte(spec)); got != want {
			t.Errorf("runtimeClass(%s) = %q, want %q", spec, got, want)
		}
	}
	if stateLabel("RUNNING") != "RUNNING" || stateLabel("whatever the store holds") != "UNKNOWN" {
		t.Error("stateLabel passes unknown states through")
	}
}

// TestPromtoolCheck: `promtool check metrics` finds nothing wrong with a full scrape.
func TestPromtoolCheck(t *testing.T) {
	if testing.Short() {
		t.Skip("runs promtool")
	}
	now := time.Now()
	st := testStore(t, now)
	m := New()
	if err := m.RegisterStore(StoreView{Orgs: st.Orgs(), Sandboxes: st.Sandboxes(), Runners: st.Runners()}); err != nil {
		t.Fatal(err)
	}
	m.ObserveCreate(nil)
	m.ObserveExec(PathGateway, time.Millisecond, nil)
	m.RegisterRunnerHealth([]string{"r1"}, func() map[string]string { return map[string]string{"r1": "degraded"} })
	m.RunnerHealthTransition("r1", HealthScopeRunner, "healthy", "degraded")
	m.RegisterSandboxUsage(func(int) []SandboxUsage {
		return []SandboxUsage{{ID: "sb-1", Org: "org-a", CPUUsec: 1000, MemoryBytes: 4096, MemoryPeakBytes: 8192}}
	})
	counters.ImagePull(false, time.Second, nil)
	counters.ImagePullBytes(1000)
	counters.Placement(counters.ResultOK, []string{"constraints.resources.max_cpu", "room"})
	m.ObserveFile(OpWrite, PathGateway, time.Millisecond, 10, nil)
	counters.EgressDecision(counters.EgressAllowed)
	counters.StoreOp(counters.StoreQueryRow, time.Millisecond)
	counters.EdgeRequest(200)
	counters.EdgePassthrough(true)
	counters.EdgeHTTPSIn.Add(100)
	counters.EdgePassthroughOut.Add(200)
	scrape := gather(t, m)
	for _, name := range []string{"cwsandbox_sandbox_cpu_usage_seconds_total", "cwsandbox_image_pulls_total", "cwsandbox_image_pull_bytes_total",
		"cwsandbox_image_pull_duration_seconds_bucket", "cwsandbox_placement_decisions_total", "cwsandbox_placement_rejections_total",
		"cwsandbox_file_operation_duration_seconds_bucket", "cwsandbox_file_bytes_total", "cwsandbox_streams",
		"cwsandbox_egress_decisions_total", "cwsandbox_store_operation_duration_seconds_bucket", "cwsandbox_edge_requests_total",
		"cwsandbox_edge_passthrough_connections_total", "cwsandbox_edge_bytes_total", "cwsandbox_sandbox_memory_bytes", "cwsandbox_sandbox_memory_peak_bytes"} {
		if !strings.Contains(scrape, "\n"+name) {
			t.Errorf("the scrape lacks %s", name)
		}
	}
	if out := promtest.CheckMetrics(t, []byte(gather(t, m))); out != "" {
		t.Errorf("promtool check metrics:\n%s", out)
	}
}

func lint(t *testing.T, m *Metrics) {
	t.Helper()
	problems, err := testutil.GatherAndLint(m.Registry())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		if strings.HasPrefix(p.Metric, "cwsandbox_") {
			t.Errorf("lint: %s: %s", p.Metric, p.Text)
		}
	}
}

func gather(t *testing.T, m *Metrics) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addr, err := m.Listen(ctx, "127.0.0.1:0", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestCreateToFirstExec: observed once per sandbox created here, at its first successful
// exec; a failed exec, an ended sandbox or one created elsewhere observe nothing.
func TestCreateToFirstExec(t *testing.T) {
	m := New()
	now := time.Now()
	m.now = func() time.Time { return now }
	m.Created("sb-1", now.Add(-5*time.Second))
	m.Executed("sb-1", errors.New("exec failed"))
	m.Executed("sb-1", nil)
	m.Executed("sb-1", nil)
	m.Executed("sb-elsewhere", nil)
	m.Created("sb-2", now.Add(-time.Second))
	m.StateChanged("sb-2", "TERMINATED", true)
	m.Executed("sb-2", nil)
	scrape := gather(t, m)
	if !strings.Contains(scrape, "cwsandbox_sandbox_create_to_first_exec_seconds_count 1\n") ||
		!strings.Contains(scrape, "cwsandbox_sandbox_create_to_first_exec_seconds_sum 5\n") {
		t.Errorf("create_to_first_exec: want one observation of 5 s in:\n%s", grepLines(scrape, "first_exec"))
	}
	lint(t, m)
}

// TestObserveExecBoundChild: successful execs go through the result="ok" child bound at
// the first one, each path its own; a failed exec still gets its code's series; no series
// exists before its first observation.
func TestObserveExecBoundChild(t *testing.T) {
	m := New()
	if n := testutil.CollectAndCount(m.Registry(), "cwsandbox_exec_duration_seconds"); n != 0 {
		t.Fatalf("exec_duration series before any exec: %d, want 0", n)
	}
	m.ObserveExec(PathGateway, time.Second, nil)
	m.ObserveExec(PathGateway, 2*time.Second, nil)
	m.ObserveExec(PathDirect, 4*time.Second, nil)
	m.ObserveExec("elsewhere", 8*time.Second, nil) // any other path is the gateway's
	m.ObserveExec(PathDirect, time.Second, connect.NewError(connect.CodeNotFound, errors.New("x")))
	scrape := gather(t, m)
	for _, want := range []string{
		`cwsandbox_exec_duration_seconds_count{path="gateway",result="ok"} 3`,
		`cwsandbox_exec_duration_seconds_sum{path="gateway",result="ok"} 11`,
		`cwsandbox_exec_duration_seconds_count{path="direct",result="ok"} 1`,
		`cwsandbox_exec_duration_seconds_sum{path="direct",result="ok"} 4`,
		`cwsandbox_exec_duration_seconds_count{path="direct",result="not_found"} 1`,
	} {
		if !strings.Contains(scrape, want+"\n") {
			t.Errorf("want %s in:\n%s", want, grepLines(scrape, "exec_duration_seconds_"))
		}
	}
}
