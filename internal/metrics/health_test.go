package metrics

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
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
