package metrics

import (
	"strings"
	"testing"
)

// TestWarmPoolSeries: the warm pool's gauges and counters read what the pool reports
// at each scrape, and pass the linter.
func TestWarmPoolSeries(t *testing.T) {
	m := New()
	w := WarmPool{Ready: 3, Target: 50, Starting: 2, Claims: 7, Misses: 1, Refills: 10, Dropped: 4}
	if err := m.Register(NewWarmPoolCollector(func() WarmPool { return w })); err != nil {
		t.Fatal(err)
	}
	out := gather(t, m)
	for _, line := range []string{
		"cwsandbox_warm_pool_ready 3", "cwsandbox_warm_pool_target 50", "cwsandbox_warm_pool_starting 2",
		"cwsandbox_warm_pool_claims_total 7", "cwsandbox_warm_pool_misses_total 1",
		"cwsandbox_warm_pool_refills_total 10", "cwsandbox_warm_pool_dropped_total 4",
	} {
		if !strings.Contains(out, line+"\n") {
			t.Errorf("no %q in:\n%s", line, out)
		}
	}
	w.Ready = 50
	if out := gather(t, m); !strings.Contains(out, "cwsandbox_warm_pool_ready 50\n") {
		t.Errorf("ready not read at the scrape:\n%s", out)
	}
	lint(t, m)
}
