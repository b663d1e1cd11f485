package metrics

import (
	"context"
	"encoding/json"
	"log/slog"
	"regexp"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sandboxd/sandboxd/internal/store"
)

// Bounds of the store-derived series.
const (
	// MaxOrgs: organizations beyond the first MaxOrgs (by id) are not broken down; their
	// sandboxes and runners are left out and cwsandbox_metrics_truncated says so.
	MaxOrgs = 1000
	// MaxInfoSeries: at most this many live sandboxes get a cwsandbox_sandbox_info series.
	MaxInfoSeries = 20000
	// MaxRunners: at most this many runners get per-runner series.
	MaxRunners = 2000
	// DefaultRefresh is how old the store view may get before a scrape re-reads it (a
	// sandbox write through Index re-reads at the next scrape sooner).
	DefaultRefresh = 30 * time.Second
	readTimeout    = 10 * time.Second
)

// StoreView is where the store collector reads: Sandboxes nil leaves the sandbox series
// out (the control plane exports runners only), Runners nil the runner series.
type StoreView struct {
	Orgs      store.Orgs
	Sandboxes store.Sandboxes
	Runners   store.Runners
	Refresh   time.Duration // 0: DefaultRefresh
	Logger    *slog.Logger
}

var (
	descInfo = prometheus.NewDesc(Namespace+"_sandbox_info",
		"1 for each live sandbox, with its placement (the gateway's view, refreshed about every 30 s and after changes).",
		[]string{"sandbox_id", "organization", "runner_id", "state", "runtime_class"}, nil)
	descByState = prometheus.NewDesc(Namespace+"_sandboxes",
		"Live sandboxes by organization and state.", []string{"organization", "state"}, nil)
	descCPUCap = prometheus.NewDesc(Namespace+"_runner_cpu_capacity_cores",
		"CPU a runner offers sandboxes, from its last heartbeat.", []string{"organization", "runner_id"}, nil)
	descMemCap = prometheus.NewDesc(Namespace+"_runner_memory_capacity_bytes",
		"Memory a runner offers sandboxes, from its last heartbeat.", []string{"organization", "runner_id"}, nil)
	descSbxCap = prometheus.NewDesc(Namespace+"_runner_sandbox_capacity",
		"Sandboxes a runner admits (0: no count limit), from its last heartbeat.", []string{"organization", "runner_id"}, nil)
	descCPUUse = prometheus.NewDesc(Namespace+"_runner_cpu_usage_cores",
		"CPU a runner's sandboxes hold, from its last heartbeat.", []string{"organization", "runner_id"}, nil)
	descMemUse = prometheus.NewDesc(Namespace+"_runner_memory_usage_bytes",
		"Memory a runner's sandboxes hold, from its last heartbeat.", []string{"organization", "runner_id"}, nil)
	descSbxUse = prometheus.NewDesc(Namespace+"_runner_sandboxes",
		"Sandboxes on a runner, from its last heartbeat.", []string{"organization", "runner_id"}, nil)
	descReady = prometheus.NewDesc(Namespace+"_runner_ready",
		"1 when the runner's last heartbeat said ready.", []string{"organization", "runner_id"}, nil)
	descHBAge = prometheus.NewDesc(Namespace+"_runner_heartbeat_age_seconds",
		"Seconds since the runner's last heartbeat (absent: never heard from).", []string{"organization", "runner_id"}, nil)
	descTrunc = prometheus.NewDesc(Namespace+"_metrics_truncated",
		"1 when the last store read hit a bound (MaxOrgs, MaxInfoSeries, MaxRunners) and left series out.", nil, nil)
	descErrors = prometheus.NewDesc(Namespace+"_metrics_store_read_errors_total",
		"Store reads for the sandbox and runner series that failed.", nil, nil)
)

type storeCollector struct {
	v StoreView
	m *Metrics

	mu     sync.Mutex
	at     time.Time
	cached []prometheus.Metric
	trunc  bool
	errors float64
}

// RegisterStore registers a collector of v's sandboxes and runners.
func (m *Metrics) RegisterStore(v StoreView) error {
	if v.Refresh <= 0 {
		v.Refresh = DefaultRefresh
	}
	if v.Logger == nil {
		v.Logger = slog.New(slog.DiscardHandler)
	}
	return m.Register(&storeCollector{v: v, m: m})
}

func (m *Metrics) markStale() { m.stale.Store(true) }

func (c *storeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descTrunc, descErrors} {
		ch <- d
	}
	if c.v.Sandboxes != nil {
		ch <- descInfo
		ch <- descByState
	}
	if c.v.Runners != nil {
		for _, d := range []*prometheus.Desc{descCPUCap, descMemCap, descSbxCap, descCPUUse, descMemUse, descSbxUse, descReady, descHBAge} {
			ch <- d
		}
	}
}

func (c *storeCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.m.now()
	if c.cached == nil || now.Sub(c.at) >= c.v.Refresh || c.m.stale.Swap(false) {
		ctx, cancel := context.WithTimeout(context.Background(), readTimeout)
		ms, trunc, err := c.read(ctx, now)
		cancel()
		if err != nil {
			c.errors++
			c.v.Logger.Warn("metrics: read sandboxes and runners", "err", err)
		} else {
			c.cached, c.trunc, c.at = ms, trunc, now
		}
	}
	for _, m := range c.cached {
		ch <- m
	}
	t := 0.0
	if c.trunc {
		t = 1
	}
	ch <- prometheus.MustNewConstMetric(descTrunc, prometheus.GaugeValue, t)
	ch <- prometheus.MustNewConstMetric(descErrors, prometheus.CounterValue, c.errors)
}

func (c *storeCollector) read(ctx context.Context, now time.Time) ([]prometheus.Metric, bool, error) {
	orgs, err := c.v.Orgs.List(ctx)
	if err != nil {
		return nil, false, err
	}
	sort.Slice(orgs, func(i, j int) bool { return orgs[i].ID < orgs[j].ID })
	trunc := false
	if len(orgs) > MaxOrgs {
		orgs, trunc = orgs[:MaxOrgs], true
	}
	out := []prometheus.Metric{}
	infos, runners := 0, 0
	for _, o := range orgs {
		if c.v.Sandboxes != nil {
			byState := map[string]int{}
			tok := ""
			for {
				page, next, err := c.v.Sandboxes.List(ctx, o.ID, store.SandboxFilter{}, store.Page{Size: store.MaxPageSize, Token: tok})
				if err != nil {
					return nil, false, err
				}
				for _, s := range page {
					if s.EndedAt != nil {
						continue
					}
					st := stateLabel(s.State)
					byState[st]++
					if infos >= MaxInfoSeries {
						trunc = true
						continue
					}
					infos++
					out = append(out, prometheus.MustNewConstMetric(descInfo, prometheus.GaugeValue, 1,
						s.ID, s.Org, s.RunnerID, st, runtimeClass(s.Spec)))
				}
				if next == "" {
					break
				}
				tok = next
			}
			for st, n := range byState {
				out = append(out, prometheus.MustNewConstMetric(descByState, prometheus.GaugeValue, float64(n), o.ID, st))
			}
		}
		if c.v.Runners != nil {
			tok := ""
			for {
				page, next, err := c.v.Runners.List(ctx, o.ID, store.Page{Size: store.MaxPageSize, Token: tok})
				if err != nil {
					return nil, false, err
				}
				for _, r := range page {
					if runners >= MaxRunners {
						trunc = true
						break
					}
					runners++
					out = append(out, runnerMetrics(r, now)...)
				}
				if next == "" || runners >= MaxRunners {
					break
				}
				tok = next
			}
		}
	}
	return out, trunc, nil
}

// resources is a heartbeat's capacity or usage (controlplane.Resources' JSON).
type resources struct {
	MilliCPU    int64 `json:"milli_cpu"`
	MemoryBytes int64 `json:"memory_bytes"`
	Sandboxes   int64 `json:"sandboxes"`
}

func runnerMetrics(r store.Runner, now time.Time) []prometheus.Metric {
	lv := []string{r.Org, r.RunnerID}
	g := func(d *prometheus.Desc, v float64) prometheus.Metric {
		return prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, lv...)
	}
	var out []prometheus.Metric
	ready := 0.0
	if r.Status.Ready {
		ready = 1
	}
	out = append(out, g(descReady, ready))
	if t := r.Status.LastHeartbeatAt; t != nil {
		out = append(out, g(descHBAge, max(0, now.Sub(*t).Seconds())))
	}
	var capy, use resources
	if len(r.Status.Capacity) > 0 && json.Unmarshal(r.Status.Capacity, &capy) == nil {
		out = append(out, g(descCPUCap, float64(capy.MilliCPU)/1000), g(descMemCap, float64(capy.MemoryBytes)), g(descSbxCap, float64(capy.Sandboxes)))
	}
	if len(r.Status.Usage) > 0 && json.Unmarshal(r.Status.Usage, &use) == nil {
		out = append(out, g(descCPUUse, float64(use.MilliCPU)/1000), g(descMemUse, float64(use.MemoryBytes)), g(descSbxUse, float64(use.Sandboxes)))
	}
	return out
}

var knownStates = map[string]bool{
	"UNSPECIFIED": true, "PENDING": true, "CREATING": true, "RUNNING": true, "PAUSED": true,
	"TERMINATING": true, "TERMINATED": true, "COMPLETED": true, "FAILED": true,
}

// stateLabel is s when it is a known state name, "UNKNOWN" otherwise.
func stateLabel(s string) string {
	if knownStates[s] {
		return s
	}
	return "UNKNOWN"
}

// runtimeClassRE: a runtime class label must look like a Kubernetes RuntimeClass name or
// an enum name; the spec's field is the caller's.
var runtimeClassRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

// runtimeClass is the spec's runtime class (protojson), its selection's enum name when
// that is all it has, or "" (the runner's default).
func runtimeClass(spec json.RawMessage) string {
	var s struct {
		RuntimeClass          string          `json:"runtimeClass"`
		RuntimeClassSelection json.RawMessage `json:"runtimeClassSelection"`
	}
	if json.Unmarshal(spec, &s) != nil {
		return ""
	}
	rc := s.RuntimeClass
	if rc == "" && len(s.RuntimeClassSelection) > 0 {
		if u, err := strconv.Unquote(string(s.RuntimeClassSelection)); err == nil {
			rc = u
		}
	}
	if rc == "" || !runtimeClassRE.MatchString(rc) {
		if rc != "" {
			return "other"
		}
		return ""
	}
	return rc
}
