package metrics

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// SandboxUsage is one running sandbox's cgroup usage (the numbers of its
// status.resource_usage), as the runner reads it.
type SandboxUsage struct {
	ID, Org                      string
	CPUUsec                      int64
	MemoryBytes, MemoryPeakBytes int64 // 0: unknown
}

// newUsageDescs returns the per-sandbox usage series' descriptions (made in New, not
// package variables: Default is initialised before this file's variables would be).
func newUsageDescs() (cpu, mem, peak *prometheus.Desc) {
	cpu = prometheus.NewDesc(Namespace+"_sandbox_cpu_usage_seconds_total",
		"CPU time a running sandbox's cgroup has used since it started (the runner's view; status.resource_usage's numbers).",
		[]string{"sandbox_id", "organization"}, nil)
	mem = prometheus.NewDesc(Namespace+"_sandbox_memory_bytes",
		"Memory a running sandbox's cgroup is charged now (the runner's view).",
		[]string{"sandbox_id", "organization"}, nil)
	peak = prometheus.NewDesc(Namespace+"_sandbox_memory_peak_bytes",
		"Most memory a running sandbox's cgroup was charged (the runner's view; absent when the kernel does not tell).",
		[]string{"sandbox_id", "organization"}, nil)
	return cpu, mem, peak
}

// usageCollector reports the runner's running sandboxes' usage (one source: the last
// registered), read at each scrape.
type usageCollector struct {
	cpu, mem, peak *prometheus.Desc

	mu  sync.Mutex
	src func(limit int) []SandboxUsage
}

func (c *usageCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.cpu
	ch <- c.mem
	ch <- c.peak
}

func (c *usageCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	src := c.src
	c.mu.Unlock()
	if src == nil {
		return
	}
	seen := map[string]bool{}
	for _, u := range src(MaxInfoSeries) {
		if len(seen) >= MaxInfoSeries || seen[u.ID] {
			continue
		}
		seen[u.ID] = true
		ch <- prometheus.MustNewConstMetric(c.cpu, prometheus.CounterValue, float64(u.CPUUsec)/1e6, u.ID, u.Org)
		ch <- prometheus.MustNewConstMetric(c.mem, prometheus.GaugeValue, float64(u.MemoryBytes), u.ID, u.Org)
		if u.MemoryPeakBytes > 0 {
			ch <- prometheus.MustNewConstMetric(c.peak, prometheus.GaugeValue, float64(u.MemoryPeakBytes), u.ID, u.Org)
		}
	}
}

// RegisterSandboxUsage makes the per-sandbox CPU and memory series report what src
// returns at each scrape (at most limit sandboxes; MaxInfoSeries is passed), replacing
// an earlier source. The runner process (runner, dev) registers its runner's.
func (m *Metrics) RegisterSandboxUsage(src func(limit int) []SandboxUsage) {
	m.usage.mu.Lock()
	m.usage.src = src
	m.usage.mu.Unlock()
}
