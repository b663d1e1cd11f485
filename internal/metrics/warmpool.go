package metrics

import "github.com/prometheus/client_golang/prometheus"

// WarmPool is what the local backend's warm pool reports (local.PoolStats): the
// containers ready now, the number it aims at now (its fixed size per image, what recent
// bursts of creates ask for within its memory budget, templates' targets), and its
// counters.
type WarmPool struct {
	Ready, Target, Starting          int
	Claims, Misses, Refills, Dropped int
}

var (
	warmReadyDesc    = prometheus.NewDesc(Namespace+"_warm_pool_ready", "Pre-started containers of the local backend's warm pool ready now.", nil, nil)
	warmTargetDesc   = prometheus.NewDesc(Namespace+"_warm_pool_target", "Pre-started containers the warm pool aims at now: its size per image, what recent bursts of creates ask for (within its memory budget) and templates' warm pools.", nil, nil)
	warmStartingDesc = prometheus.NewDesc(Namespace+"_warm_pool_starting", "Warm pool refills running now.", nil, nil)
	warmClaimsDesc   = prometheus.NewDesc(Namespace+"_warm_pool_claims_total", "Creates served from the warm pool.", nil, nil)
	warmMissesDesc   = prometheus.NewDesc(Namespace+"_warm_pool_misses_total", "Creates the warm pool could not serve (created cold).", nil, nil)
	warmRefillsDesc  = prometheus.NewDesc(Namespace+"_warm_pool_refills_total", "Containers the warm pool started.", nil, nil)
	warmDroppedDesc  = prometheus.NewDesc(Namespace+"_warm_pool_dropped_total", "Pooled containers destroyed unclaimed (idle, beyond the demand, stale, drained, broken).", nil, nil)
)

// warmPoolCollector reads a warm pool at each scrape.
type warmPoolCollector struct{ read func() WarmPool }

// NewWarmPoolCollector is a collector of the warm pool read reads (cmd/sandboxd
// registers it for a local backend).
func NewWarmPoolCollector(read func() WarmPool) prometheus.Collector {
	return warmPoolCollector{read: read}
}

func (c warmPoolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{warmReadyDesc, warmTargetDesc, warmStartingDesc, warmClaimsDesc, warmMissesDesc, warmRefillsDesc, warmDroppedDesc} {
		ch <- d
	}
}

func (c warmPoolCollector) Collect(ch chan<- prometheus.Metric) {
	w := c.read()
	ch <- prometheus.MustNewConstMetric(warmReadyDesc, prometheus.GaugeValue, float64(w.Ready))
	ch <- prometheus.MustNewConstMetric(warmTargetDesc, prometheus.GaugeValue, float64(w.Target))
	ch <- prometheus.MustNewConstMetric(warmStartingDesc, prometheus.GaugeValue, float64(w.Starting))
	ch <- prometheus.MustNewConstMetric(warmClaimsDesc, prometheus.CounterValue, float64(w.Claims))
	ch <- prometheus.MustNewConstMetric(warmMissesDesc, prometheus.CounterValue, float64(w.Misses))
	ch <- prometheus.MustNewConstMetric(warmRefillsDesc, prometheus.CounterValue, float64(w.Refills))
	ch <- prometheus.MustNewConstMetric(warmDroppedDesc, prometheus.CounterValue, float64(w.Dropped))
}
