// Package counters holds the process-wide Prometheus series recorded by packages that
// internal/metrics cannot be imported from: the store itself (internal/metrics reads it),
// the runner side (image pulls, edge, egress) and what both sides share (placement). It
// imports nothing of sandboxd's; internal/metrics registers Collectors into every
// registry it makes, so every process serves them (a process that records none shows
// them at 0 or not at all).
//
// Every label takes a bounded set of values, checked here: the recording functions map
// anything else to a fixed value ("other"). See docs/observability.md.
package counters

import (
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

const namespace = "cwsandbox"

// Label values.
const (
	ResultOK    = "ok"
	ResultError = "error"
	CacheHit    = "hit"
	CacheMiss   = "miss"
	Other       = "other"
)

// off is whether recording is switched off (SetRecording).
var off atomic.Bool

// SetRecording switches the recording of every metric of the process on (the default) or
// off: while off, the recording functions of this package and the hooks of
// internal/metrics (its API interceptor, sandbox-index wrapper and Observe* methods)
// return at once, recording nothing and taking no lock; the series keep their values
// and are still served. For measuring what recording costs (bench/
// BenchmarkTracingOverhead switches it call by call): a clock started while on and
// stopped while off (time to RUNNING, create → first exec) is not observed.
func SetRecording(on bool) { off.Store(!on) }

// Recording reports whether metrics are recorded (SetRecording).
func Recording() bool { return !off.Load() }

// Collectors returns every series of this package, for registration.
func Collectors() []prometheus.Collector {
	return []prometheus.Collector{
		imagePulls, imagePullBytes, imagePullDuration, imagePullFailures, kubeletImageSize,
		placementDecisions, placementRejections,
		egressDecisions, storeDuration,
		edgeRequests, edgePassthrough, edgeBytes,
	}
}

var (
	imagePulls = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Name: "image_pulls_total",
		Help: "Image pulls of the local backend's image store by result (ok, error) and cache (hit: served from the local cache, miss: layers fetched).",
	}, []string{"result", "cache"})
	imagePullBytes = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: namespace, Name: "image_pull_bytes_total",
		Help: "Compressed layer bytes the local backend's image store fetched from registries.",
	})
	imagePullDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: namespace, Name: "image_pull_duration_seconds",
		Help:    "Duration of image pulls by result (ok, error) and cache (hit, miss): the local backend's image store's (concurrent callers of one pull share one observation), the Kubernetes backend's as the kubelet reports them (a failed pull: from its Pulling to its Failed event, second resolution).",
		Buckets: []float64{0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600},
	}, []string{"result", "cache"})
	imagePullFailures = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Name: "image_pull_failures_total",
		Help: "Failed image pulls of the Kubernetes backend by the kubelet's reason (ErrImagePull, ImagePullBackOff, ErrImageNeverPull, InvalidImageName, ImageInspectError, RegistryUnavailable, other); each also counts in image_pulls_total{result=\"error\"}.",
	}, []string{"reason"})
	kubeletImageSize = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: namespace, Name: "kubelet_reported_image_size_bytes_total",
		Help: "Kubernetes backend: the sum of the image sizes the kubelet's Pulled events report for the images it pulled (misses) for sandbox containers. The size of the whole image as the node's container runtime reports it (containerd: its stored content; CRI-O: unpacked), layers the node already had included: NOT the bytes fetched (those are image_pull_bytes_total, which the kubelet does not tell). From events, which anyone allowed to create events in the namespace can forge: for dashboards only.",
	})

	placementDecisions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Name: "placement_decisions_total",
		Help: "Placements of a sandbox on a runner (create, move, fork elsewhere) by result: ok, or the CWSANDBOX_* reason of the refusal.",
	}, []string{"result"})
	placementRejections = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Name: "placement_rejections_total",
		Help: "Runners a placement left out, by the constraint that rejected each (a policy constraint name, or unavailable, quarantined, capacity, room, source_ip_allowlist); one per runner and constraint.",
	}, []string{"constraint"})
)

var egressDecisions = prometheus.NewCounterVec(prometheus.CounterOpts{
	Namespace: namespace, Name: "egress_decisions_total",
	Help: "Connections to the local backend's egress proxy (dns_name grants) by decision: allowed (spliced to the granted name), intercepted (secret injection), denied (name not granted, no or IP server name, not TLS, only forbidden addresses), limited (too many connections from the sandbox), error (the name did not resolve or its server did not answer).",
}, []string{"decision"})

// Decisions of cwsandbox_egress_decisions_total.
const (
	EgressAllowed     = "allowed"
	EgressIntercepted = "intercepted"
	EgressDenied      = "denied"
	EgressLimited     = "limited"
	EgressError       = "error"
)

// egressDecisionValues are the label values of cwsandbox_egress_decisions_total.
var egressDecisionValues = []string{EgressAllowed, EgressIntercepted, EgressDenied, EgressLimited, EgressError}

// bounded is v when it is one of allowed, else Other: a label's values stay the code's.
func bounded(v string, allowed ...string) string {
	if slices.Contains(allowed, v) {
		return v
	}
	return Other
}

// EgressDecision counts one egress proxy connection's decision (one of the Egress*
// values; another is "other").
func EgressDecision(d string) {
	if off.Load() {
		return
	}
	egressDecisions.WithLabelValues(bounded(d, egressDecisionValues...)).Inc()
}

var storeDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
	Namespace: namespace, Name: "store_operation_duration_seconds",
	Help:    "Store (SQLite or PostgreSQL) statements and transactions by op: exec, query (until its first answer), query_row, tx (a whole write transaction).",
	Buckets: []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10},
}, []string{"op"})

// Ops of cwsandbox_store_operation_duration_seconds.
const (
	StoreExec     = "exec"
	StoreQuery    = "query"
	StoreQueryRow = "query_row"
	StoreTx       = "tx"
)

// StoreOp records one store operation (one of the Store* ops; another is "other").
func StoreOp(op string, d time.Duration) {
	if off.Load() {
		return
	}
	op = bounded(op, StoreExec, StoreQuery, StoreQueryRow, StoreTx)
	storeDuration.WithLabelValues(op).Observe(d.Seconds())
}

var (
	edgeRequests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Name: "edge_requests_total",
		Help: "HTTP requests the runner's edge answered on HTTPS endpoints (proxied to the sandbox or refused by the edge) by kind (https) and status class (1xx to 5xx).",
	}, []string{"kind", "code_class"})
	edgePassthrough = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Name: "edge_passthrough_connections_total",
		Help: "Connections the runner's edge took for TLS_PASSTHROUGH endpoints by result: spliced to the sandbox, or unreachable (the sandbox did not wake or its port did not answer).",
	}, []string{"result"})
	edgeBytes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Name: "edge_bytes_total",
		Help: "Bytes the runner's edge moved by endpoint kind and direction (in: from clients, out: to clients). https: request body bytes read from clients for the sandbox and response body bytes written to clients (the edge's own answers included), and both ways of an upgraded connection (WebSocket); passthrough: the TCP bytes spliced each way (TLS records as they are), added as each 256 KiB passes and at each direction's end.",
	}, []string{"kind", "direction"})
)

// Edge byte counters, resolved once: each Add is one atomic add (no label lookup).
var (
	EdgeHTTPSIn        = ByteCounter{edgeBytes.WithLabelValues(EdgeKindHTTPS, DirIn)}
	EdgeHTTPSOut       = ByteCounter{edgeBytes.WithLabelValues(EdgeKindHTTPS, DirOut)}
	EdgePassthroughIn  = ByteCounter{edgeBytes.WithLabelValues(EdgeKindPassthrough, DirIn)}
	EdgePassthroughOut = ByteCounter{edgeBytes.WithLabelValues(EdgeKindPassthrough, DirOut)}
)

// ByteCounter is one series of a bytes counter.
type ByteCounter struct{ c prometheus.Counter }

// Add counts n bytes (nothing for n <= 0).
func (b ByteCounter) Add(n int64) {
	if off.Load() {
		return
	}
	if n > 0 {
		b.c.Add(float64(n)) // an integer: client_golang adds it to an atomic uint64
	}
}

// Label values of the edge series.
const (
	EdgeKindHTTPS       = "https"
	EdgeKindPassthrough = "passthrough"
	DirIn               = "in"
	DirOut              = "out"
	EdgeSpliced         = "spliced"
	EdgeUnreachable     = "unreachable"
)

// codeClass is an HTTP status's class ("2xx"), "other" outside 100-599.
func codeClass(code int) string {
	if code < 100 || code > 599 {
		return Other
	}
	return string(rune('0'+code/100)) + "xx"
}

// EdgeRequest counts one request an HTTPS endpoint answered with status code.
func EdgeRequest(code int) {
	if off.Load() {
		return
	}
	edgeRequests.WithLabelValues(EdgeKindHTTPS, codeClass(code)).Inc()
}

// EdgePassthrough counts one TLS_PASSTHROUGH connection, spliced or not.
func EdgePassthrough(spliced bool) {
	if off.Load() {
		return
	}
	r := EdgeUnreachable
	if spliced {
		r = EdgeSpliced
	}
	edgePassthrough.WithLabelValues(r).Inc()
}

func init() {
	for _, d := range egressDecisionValues {
		egressDecisions.WithLabelValues(d) // present at 0
	}
	imagePulls.WithLabelValues(ResultOK, CacheHit) // present at 0
	imagePulls.WithLabelValues(ResultOK, CacheMiss)
	imagePulls.WithLabelValues(ResultError, CacheMiss)
	placementDecisions.WithLabelValues(ResultOK)
}

// ImagePull records one image pull (one per pull made, however many callers share it):
// hit when it was served from the local cache (no image fetched; a failed pull is a
// miss), its duration, and whether it failed. Bytes are counted as layers arrive (ImagePullBytes).
func ImagePull(hit bool, d time.Duration, err error) {
	if off.Load() {
		return
	}
	cache := CacheMiss
	if hit && err == nil {
		cache = CacheHit
	}
	res := ResultOK
	if err != nil {
		res = ResultError
	}
	imagePulls.WithLabelValues(res, cache).Inc()
	imagePullDuration.WithLabelValues(res, cache).Observe(d.Seconds())
}

// MaxReportedImageSize bounds an image size taken from the kubelet's events (16 TiB); a
// larger one is not counted.
const MaxReportedImageSize = 1 << 44

// KubeletImageSize adds the size the kubelet reported for an image it pulled (the
// Kubernetes backend; not bytes fetched). Sizes outside (0, MaxReportedImageSize] are
// not counted.
func KubeletImageSize(n int64) {
	if off.Load() {
		return
	}
	if n > 0 && n <= MaxReportedImageSize {
		kubeletImageSize.Add(float64(n))
	}
}

// ImagePullFailedDuration observes how long a failed pull took (the Kubernetes backend:
// from the kubelet's events), in image_pull_duration_seconds{result="error",cache="miss"}.
// The failure itself is counted by ImagePullFailed.
func ImagePullFailedDuration(d time.Duration) {
	if off.Load() {
		return
	}
	if d >= 0 {
		imagePullDuration.WithLabelValues(ResultError, CacheMiss).Observe(d.Seconds())
	}
}

// Reasons of cwsandbox_image_pull_failures_total: the kubelet's waiting reasons of a
// container whose image cannot be had.
var pullFailureReasons = []string{
	"ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull",
	"InvalidImageName", "ImageInspectError", "RegistryUnavailable",
}

// ImagePullFailed records one failed pull whose duration is not known (the Kubernetes
// backend: the kubelet's waiting reason, one of pullFailureReasons; another is "other"):
// an image_pulls_total{result="error",cache="miss"} and an image_pull_failures_total by reason.
func ImagePullFailed(reason string) {
	if off.Load() {
		return
	}
	imagePulls.WithLabelValues(ResultError, CacheMiss).Inc()
	imagePullFailures.WithLabelValues(bounded(reason, pullFailureReasons...)).Inc()
}

// ImagePullBytes counts n compressed layer bytes fetched.
func ImagePullBytes(n int64) {
	if off.Load() {
		return
	}
	if n > 0 {
		imagePullBytes.Add(float64(n))
	}
}

// MaxConstraints bounds the distinct constraint label values; beyond it they are "other".
const MaxConstraints = 128

var (
	constraintShape = regexp.MustCompile(`^[a-z][a-z0-9_.]{0,63}$`)
	constraintsMu   sync.Mutex
	constraintsSeen = map[string]bool{}
)

// constraintLabel is c when it has a constraint name's shape and is one of the first
// MaxConstraints seen, else "other". Constraint names are the code's (internal/policy,
// internal/placement), never a caller's; the check keeps it that way.
func constraintLabel(c string) string {
	if !constraintShape.MatchString(c) {
		return Other
	}
	constraintsMu.Lock()
	defer constraintsMu.Unlock()
	if !constraintsSeen[c] {
		if len(constraintsSeen) >= MaxConstraints {
			return Other
		}
		constraintsSeen[c] = true
	}
	return c
}

// reasonShape is a CWSANDBOX_* reason.
var reasonShape = regexp.MustCompile(`^CWSANDBOX_[A-Z0-9_]{1,64}$`)

// Placement records one placement's outcome: result ResultOK, or the refusal's
// CWSANDBOX_* reason (another value becomes "other"), and the constraints that rejected
// runners (one entry per runner and constraint).
func Placement(result string, rejections []string) {
	if off.Load() {
		return
	}
	if result != ResultOK && !reasonShape.MatchString(result) {
		result = Other
	}
	placementDecisions.WithLabelValues(result).Inc()
	for _, c := range rejections {
		placementRejections.WithLabelValues(constraintLabel(c)).Inc()
	}
}

// Values returns the current value of every series of this package, keyed by name and
// labels as Prometheus prints them (`cwsandbox_image_pulls_total{cache="hit",result="ok"}`;
// histograms as name_count and name_sum), for tests that compare before and after an action.
func Values() map[string]float64 {
	reg := prometheus.NewRegistry()
	reg.MustRegister(Collectors()...)
	mfs, err := reg.Gather()
	if err != nil {
		panic(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var ls []string
			for _, l := range m.GetLabel() {
				ls = append(ls, l.GetName()+`="`+l.GetValue()+`"`)
			}
			lab := ""
			if len(ls) > 0 {
				lab = "{" + strings.Join(ls, ",") + "}"
			}
			switch {
			case m.Counter != nil:
				out[mf.GetName()+lab] = m.GetCounter().GetValue()
			case m.Gauge != nil:
				out[mf.GetName()+lab] = m.GetGauge().GetValue()
			case m.Histogram != nil:
				out[mf.GetName()+"_count"+lab] = float64(m.GetHistogram().GetSampleCount())
				out[mf.GetName()+"_sum"+lab] = m.GetHistogram().GetSampleSum()
			}
		}
	}
	return out
}
