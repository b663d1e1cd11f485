package placement

import (
	"testing"

	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/metrics/counters"
)

// TestPlacementMetrics: every Place call counts one decision (ok or the refusal's
// reason) and every runner left out one rejection per constraint that rejected it.
func TestPlacementMetrics(t *testing.T) {
	strict := mustPolicy(t, `{"constraints": {"resources": {"max_cpu": "1", "max_memory": "1Gi"}}}`)
	free := mustPolicy(t, `{}`)
	const (
		ok       = `cwsandbox_placement_decisions_total{result="ok"}`
		noRunner = `cwsandbox_placement_decisions_total{result="` + apierr.NoSuitableRunner + `"}`
		full     = `cwsandbox_placement_decisions_total{result="` + apierr.RunnerCapacityExhausted + `"}`
		maxCPU   = `cwsandbox_placement_rejections_total{constraint="constraints.resources.max_cpu"}`
		maxMem   = `cwsandbox_placement_rejections_total{constraint="constraints.resources.max_memory"}`
		unavail  = `cwsandbox_placement_rejections_total{constraint="unavailable"}`
		room     = `cwsandbox_placement_rejections_total{constraint="room"}`
		capac    = `cwsandbox_placement_rejections_total{constraint="capacity"}`
	)
	keys := []string{ok, noRunner, full, maxCPU, maxMem, unavail, room, capac}
	for _, c := range []struct {
		name    string
		req     Request
		want    map[string]float64
		wantErr bool
	}{
		{"placed past a strict and a down runner", Request{Spec: spec("2", "2Gi"), Runners: []Runner{rn("r1", strict), down(rn("r2", free)), rn("r3", free)}},
			map[string]float64{ok: 1, maxCPU: 1, maxMem: 1, unavail: 1}, false},
		{"no room", Request{Spec: spec("2", ""), Runners: []Runner{used(rn("r1", free), 3000, 0, 1)}},
			map[string]float64{full: 1, room: 1}, true},
		{"never fits, policy rejects", Request{Spec: spec("8", "512Mi"), Runners: []Runner{rn("r1", free), rn("r2", strict)}},
			map[string]float64{noRunner: 1, capac: 1, maxCPU: 1}, true},
	} {
		before := counters.Values()
		_, err := Place(c.req)
		if (err != nil) != c.wantErr {
			t.Fatalf("%s: err %v", c.name, err)
		}
		after := counters.Values()
		for _, k := range keys {
			if got := after[k] - before[k]; got != c.want[k] {
				t.Errorf("%s: %s grew by %v, want %v", c.name, k, got, c.want[k])
			}
		}
	}
}
