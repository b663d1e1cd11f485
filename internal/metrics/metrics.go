// Package metrics owns sandboxd's Prometheus metrics: one registry per process (Default),
// the metric names and their bounded labels, the listener that serves them
// (--metrics-listen, never an API port), and the small hooks the rest of the code calls:
// an API interceptor (creates, deletes, exec latency), a sandbox-index wrapper (time to
// RUNNING) and a collector that reads the store's view of sandboxes and runners. See
// docs/observability.md for the list.
//
// Cardinality is bounded: the only per-sandbox series are cwsandbox_sandbox_info's (at
// most MaxInfoSeries), organization labels stop at MaxOrgs organizations, reasons are the
// CWSANDBOX_* table's (internal/apierr) or "OTHER", states the runner's state names or
// "UNKNOWN", and runtime classes are checked for shape.
package metrics

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/metrics/counters"
)

// Namespace prefixes every sandboxd metric, as the target system's do.
const Namespace = "cwsandbox"

// Label values of the API metrics.
const (
	ResultOK     = "ok"
	ReasonNone   = ""      // a success has no reason
	ReasonOther  = "OTHER" // an error without a CWSANDBOX_* reason of the table
	PathGateway  = "gateway"
	PathDirect   = "direct"
	maxPending   = 10000 // creates waiting for RUNNING that time_to_running remembers
	pendingLimit = time.Hour
)

// Metrics is one process's registry and the metrics the hooks record.
type Metrics struct {
	reg *prometheus.Registry

	creates       *prometheus.CounterVec
	deletes       *prometheus.CounterVec
	timeToRunning prometheus.Histogram
	toFirstExec   prometheus.Histogram
	execDuration  *prometheus.HistogramVec
	execOK        [2]atomic.Pointer[prometheus.Observer] // execDuration's result="ok" child of PathGateway, PathDirect: bound at its first use
	fileDuration  *prometheus.HistogramVec
	fileBytes     *prometheus.CounterVec
	streams       *prometheus.GaugeVec

	health            healthCollector
	usage             usageCollector
	healthTransitions *prometheus.CounterVec

	auditWriteFailures *prometheus.CounterVec

	readyMu sync.Mutex
	ready   []readiness // SetReady's checks, by name

	mu      sync.Mutex
	pending map[string]time.Time // sandbox id → when its create was recorded
	noExec  map[string]time.Time // likewise, until its first successful exec
	waiting atomic.Int64         // len(noExec), kept under mu: an exec reads it without the lock
	now     func() time.Time
	stale   atomic.Bool // a sandbox write since the store collectors' last read
}

// Default is the process's registry: cmd/sandboxd serves it on --metrics-listen.
var Default = New()

// New returns a registry with the Go runtime and process collectors and sandboxd's API
// metrics registered.
func New() *Metrics {
	m := &Metrics{reg: prometheus.NewRegistry(), pending: map[string]time.Time{}, noExec: map[string]time.Time{}, now: time.Now}
	m.usage.cpu, m.usage.mem, m.usage.peak = newUsageDescs()
	m.creates = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Name: "sandbox_creates_total",
		Help: "CreateSandbox calls by result (ok or the gRPC code) and CWSANDBOX_* reason.",
	}, []string{"result", "reason"})
	m.deletes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Name: "sandbox_deletes_total",
		Help: "DeleteSandbox calls by result (ok or the gRPC code) and CWSANDBOX_* reason.",
	}, []string{"result", "reason"})
	m.timeToRunning = prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: Namespace, Name: "sandbox_time_to_running_seconds",
		Help:    "Time from a sandbox's create to the gateway seeing it RUNNING.",
		Buckets: []float64{0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600},
	})
	m.toFirstExec = prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: Namespace, Name: "sandbox_create_to_first_exec_seconds",
		Help:    "Time from a sandbox's create to its first successful unary Exec through this process.",
		Buckets: []float64{0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600},
	})
	m.execDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: Namespace, Name: "exec_duration_seconds",
		Help:    "Unary Exec calls' duration by path (gateway or direct data plane) and result.",
		Buckets: []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300},
	}, []string{"path", "result"})
	m.fileDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: Namespace, Name: "file_operation_duration_seconds",
		Help:    "ReadFile and WriteFile calls' duration by op (read, write), path (gateway or direct data plane) and result.",
		Buckets: []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60},
	}, []string{"op", "path", "result"})
	m.fileBytes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Name: "file_bytes_total",
		Help: "File content bytes of successful ReadFile (returned) and WriteFile (written) calls by op and path (gateway or direct data plane).",
	}, []string{"op", "path"})
	m.streams = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: Namespace, Name: "streams",
		Help: "Open streaming calls by kind (exec, logs, connect, build_logs) and path (gateway or direct data plane).",
	}, []string{"kind", "path"})
	for _, k := range []string{StreamExec, StreamLogs, StreamConnect, StreamBuildLogs} {
		for _, p := range []string{PathGateway, PathDirect} {
			m.streams.WithLabelValues(k, p) // present at 0
		}
	}
	m.healthTransitions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Name: "runner_health_transitions_total",
		Help: "Changes of a runner's health state (internal/health) by scope (runner: for every organization; organization: one organization's own record), from and to state.",
	}, []string{"runner_id", "scope", "from", "to"})
	m.auditWriteFailures = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Name: "audit_write_failures_total",
		Help: "Audit events that could not be stored (internal/audit) by reason: timeout (the store did not answer in time) or error.",
	}, []string{"reason"})
	for _, r := range []string{AuditFailTimeout, AuditFailError} {
		m.auditWriteFailures.WithLabelValues(r) // present at 0
	}
	m.reg.MustRegister(
		&m.health, &m.usage, m.healthTransitions, m.auditWriteFailures,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.creates, m.deletes, m.timeToRunning, m.toFirstExec, m.execDuration,
		m.fileDuration, m.fileBytes, m.streams,
	)
	m.reg.MustRegister(counters.Collectors()...)
	return m
}

// Reasons of cwsandbox_audit_write_failures_total.
const (
	AuditFailTimeout = "timeout"
	AuditFailError   = "error"
)

// AuditWriteFailed counts one audit event that could not be stored because of err.
func (m *Metrics) AuditWriteFailed(err error) {
	if !counters.Recording() {
		return
	}
	reason := AuditFailError
	if errors.Is(err, context.DeadlineExceeded) {
		reason = AuditFailTimeout
	}
	m.auditWriteFailures.WithLabelValues(reason).Inc()
}

// Registry is the registry (for tests and extra collectors).
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Register adds a collector; registering one twice is not an error.
func (m *Metrics) Register(c prometheus.Collector) error {
	err := m.reg.Register(c)
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		return nil
	}
	return err
}

// Handler serves the registry in the Prometheus text (or OpenMetrics) format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg, MaxRequestsInFlight: 4, Timeout: 20 * time.Second})
}

// Listen serves GET /metrics, GET /livez and GET /readyz (and nothing else) on addr
// until ctx ends; addr "" serves nothing. It returns the address it listens on ("" when disabled).
func (m *Metrics) Listen(ctx context.Context, addr string, log *slog.Logger) (string, error) {
	if addr == "" {
		return "", nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", err
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", m.Handler())
	mux.HandleFunc("GET /livez", Livez)
	mux.HandleFunc("GET /readyz", m.Readyz)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second, WriteTimeout: 60 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) && log != nil {
			log.Warn("metrics listener stopped", "err", err)
		}
	}()
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	if log != nil {
		log.Info("metrics listening", "addr", "http://"+ln.Addr().String()+"/metrics")
	}
	return ln.Addr().String(), nil
}

// result and reason label an API call's outcome with bounded values.
func result(err error) (string, string) {
	if err == nil {
		return ResultOK, ReasonNone
	}
	code := connect.CodeOf(err).String()
	reason := apierr.Reason(err)
	if !apierr.Known(reason) {
		reason = ReasonOther
	}
	return code, reason
}

// ObserveCreate counts one create; a successful one starts the time-to-RUNNING clock of
// sandboxID.
func (m *Metrics) ObserveCreate(err error) {
	if !counters.Recording() {
		return
	}
	res, reason := result(err)
	m.creates.WithLabelValues(res, reason).Inc()
}

// ObserveDelete counts one delete.
func (m *Metrics) ObserveDelete(err error) {
	if !counters.Recording() {
		return
	}
	res, reason := result(err)
	m.deletes.WithLabelValues(res, reason).Inc()
}

// ObserveExec records one unary exec's duration on path (PathGateway or PathDirect).
func (m *Metrics) ObserveExec(path string, d time.Duration, err error) {
	if !counters.Recording() {
		return
	}
	if path != PathDirect {
		path = PathGateway
	}
	if err != nil {
		res, _ := result(err)
		m.execDuration.WithLabelValues(path, res).Observe(d.Seconds())
		return
	}
	// A successful exec, the usual one, observes a child bound once per path: no label
	// hashing and lookup in the vector's map per call. Bound at first use, not at New, so
	// the series appears with its first observation as before.
	i := 0
	if path == PathDirect {
		i = 1
	}
	o := m.execOK[i].Load()
	if o == nil {
		c := m.execDuration.WithLabelValues(path, ResultOK)
		o = &c
		m.execOK[i].Store(o)
	}
	(*o).Observe(d.Seconds())
}

// Ops of the file metrics.
const (
	OpRead  = "read"
	OpWrite = "write"
)

// Kinds of cwsandbox_streams.
const (
	StreamExec      = "exec"
	StreamLogs      = "logs"
	StreamConnect   = "connect"
	StreamBuildLogs = "build_logs"
)

// ObserveFile records one ReadFile or WriteFile (op OpRead or OpWrite) on path
// (PathGateway or PathDirect): its duration and, when it succeeded, its n content bytes.
func (m *Metrics) ObserveFile(op, path string, d time.Duration, n int, err error) {
	if !counters.Recording() {
		return
	}
	if op != OpWrite {
		op = OpRead
	}
	if path != PathDirect {
		path = PathGateway
	}
	res, _ := result(err)
	m.fileDuration.WithLabelValues(op, path, res).Observe(d.Seconds())
	if err == nil && n > 0 {
		m.fileBytes.WithLabelValues(op, path).Add(float64(n))
	}
}

// Created starts sandbox id's time-to-RUNNING and create-to-first-exec clocks at
// createdAt. At most maxPending clocks of each run; the oldest beyond pendingLimit are
// dropped first.
func (m *Metrics) Created(id string, createdAt time.Time) {
	if !counters.Recording() {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.startClock(m.pending, id, createdAt)
	m.startClock(m.noExec, id, createdAt)
	m.waiting.Store(int64(len(m.noExec)))
}

func (m *Metrics) startClock(clocks map[string]time.Time, id string, at time.Time) {
	if len(clocks) >= maxPending {
		cutoff := m.now().Add(-pendingLimit)
		for k, t := range clocks {
			if t.Before(cutoff) {
				delete(clocks, k)
			}
		}
		if len(clocks) >= maxPending {
			return
		}
	}
	clocks[id] = at
}

// Executed stops sandbox id's create-to-first-exec clock at its first successful exec
// (a failed one, err != nil, leaves it running).
func (m *Metrics) Executed(id string, err error) {
	if !counters.Recording() {
		return
	}
	if err != nil || m.waiting.Load() == 0 { // no clock running: the usual exec takes no lock
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	t, ok := m.noExec[id]
	if !ok {
		return
	}
	m.toFirstExec.Observe(max(0, m.now().Sub(t).Seconds()))
	delete(m.noExec, id)
	m.waiting.Store(int64(len(m.noExec)))
}

// StateChanged stops sandbox id's clock: RUNNING observes the time since its create,
// any ended state forgets it. A sandbox this process did not create is not observed (a
// restarted gateway re-reading RUNNING sandboxes is no new start).
func (m *Metrics) StateChanged(id, state string, ended bool) {
	if !counters.Recording() {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if ended {
		delete(m.noExec, id)
		m.waiting.Store(int64(len(m.noExec)))
	}
	t, ok := m.pending[id]
	if !ok {
		return
	}
	switch {
	case strings.EqualFold(state, "RUNNING"):
		m.timeToRunning.Observe(max(0, m.now().Sub(t).Seconds()))
		delete(m.pending, id)
	case ended:
		delete(m.pending, id)
	}
}
