package metrics

import (
	"sort"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sandboxd/sandboxd/internal/metrics/counters"
)

// Scopes of a runner health transition: the runner's state for every organization, or
// one organization's own record of it (internal/health).
const (
	HealthScopeRunner       = "runner"
	HealthScopeOrganization = "organization"
)

// HealthStates are the runner health states, as internal/health names them.
var HealthStates = []string{"healthy", "degraded", "probing", "quarantined"}

var descRunnerHealth = prometheus.NewDesc(Namespace+"_runner_health",
	"1 for a runner's current health state as the placing process sees it for every organization (healthy, degraded, probing, quarantined), 0 for the others.",
	[]string{"runner_id", "state"}, nil)

// healthCollector reports the placing process's runner health (one source: the last
// registered).
type healthCollector struct {
	mu  sync.Mutex
	ids []string
	src func() map[string]string
}

func (c *healthCollector) Describe(ch chan<- *prometheus.Desc) { ch <- descRunnerHealth }

func (c *healthCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	ids, src := c.ids, c.src
	c.mu.Unlock()
	if src == nil {
		return
	}
	states := src()
	for _, id := range ids {
		cur := states[id]
		if cur == "" {
			cur = "healthy"
		}
		for _, st := range HealthStates {
			v := 0.0
			if st == cur {
				v = 1
			}
			ch <- prometheus.MustNewConstMetric(descRunnerHealth, prometheus.GaugeValue, v, id, st)
		}
	}
}

// RegisterRunnerHealth makes cwsandbox_runner_health report runners (at most MaxRunners)
// with states (runner ID → state; absent: healthy), replacing an earlier source.
func (m *Metrics) RegisterRunnerHealth(runners []string, states func() map[string]string) {
	ids := append([]string(nil), runners...)
	sort.Strings(ids)
	if len(ids) > MaxRunners {
		ids = ids[:MaxRunners]
	}
	m.health.mu.Lock()
	m.health.ids, m.health.src = ids, states
	m.health.mu.Unlock()
}

// RunnerHealthTransition counts one change of a runner's health state.
func (m *Metrics) RunnerHealthTransition(runner, scope, from, to string) {
	if !counters.Recording() {
		return
	}
	if scope != HealthScopeOrganization {
		scope = HealthScopeRunner
	}
	m.healthTransitions.WithLabelValues(runner, scope, from, to).Inc()
}
