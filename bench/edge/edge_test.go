package edgebench

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// figure is one measurement, taken for every target.
type figure struct {
	name, unit string
	per        string // one unit of work, for CPU per unit: "req", "MB", "conn"
	conc       int
	measure    func(t target, e *env, conc int, d time.Duration) (float64, error)
}

var figures = map[string]figure{
	"HTTPSKeepAlive": {"HTTPS requests over keep-alive", "req/s", "req", 32, func(t target, e *env, c int, d time.Duration) (float64, error) {
		return requestsPerSecond(t.httpsAddr, e.httpsHost, e.platformRoots, c, d)
	}},
	"Passthrough": {"TLS passthrough throughput", "MB/s", "MB", 4, func(t target, e *env, c int, d time.Duration) (float64, error) {
		return passthroughMBps(t.tlsAddr, e.tlsHost, e.workloadRoots, c, d)
	}},
	"ConnRate": {"new TLS connections", "conn/s", "conn", 16, func(t target, e *env, c int, d time.Duration) (float64, error) {
		return connectionsPerSecond(t.httpsAddr, e.httpsHost, e.platformRoots, c, d)
	}},
}

// results caches each figure: the testing package calls a benchmark more than once
// (b.N = 1, then the -benchtime count), but one timed measurement per target is the point.
var (
	resultsMu sync.Mutex
	results   = map[string][]float64{} // edge, haproxy, edge CPU per unit, haproxy CPU per unit
)

func BenchmarkHTTPSKeepAlive(b *testing.B) { compare(b, "HTTPSKeepAlive") }
func BenchmarkPassthrough(b *testing.B)    { compare(b, "Passthrough") }
func BenchmarkConnRate(b *testing.B)       { compare(b, "ConnRate") }

// compare measures one figure through the edge and through HAProxy, prints both and the
// ratio, and reports them as metrics.
func compare(b *testing.B, key string) {
	e := setup(b)
	f := figures[key]
	resultsMu.Lock()
	defer resultsMu.Unlock()
	vals, done := results[key]
	if !done {
		var cpu []float64
		vals, cpu = measureInterleaved(b, f, e, duration(b))
		vals = append(vals, cpu...)
		results[key] = vals
		fmt.Printf("edge-bench: %-32s edge %10.1f %-6s  haproxy %10.1f %-6s  ratio %.2f%s\n",
			f.name, vals[0], f.unit, vals[1], f.unit, vals[0]/vals[1], verdict(vals[0]/vals[1]))
		fmt.Printf("edge-bench: %-32s edge %10.1f %-6s  haproxy %10.1f %-6s  ratio %.2f (haproxy/edge: higher is better for the edge)\n",
			"  proxy CPU per "+f.per, cpu[0], "µs", cpu[1], "µs", cpu[1]/cpu[0])
	}
	unit := strings.ReplaceAll(f.unit, "/", "_per_")
	b.ReportMetric(vals[0], "edge_"+unit)
	b.ReportMetric(vals[1], "haproxy_"+unit)
	b.ReportMetric(vals[0]/vals[1], "ratio")
	b.ReportMetric(vals[2], "edge_cpu_us_per_"+f.per)
	b.ReportMetric(vals[3], "haproxy_cpu_us_per_"+f.per)
	b.ReportMetric(0, "ns/op") // the figures above are the result, not the loop time
}

// rounds: each target is measured in turns, the order alternating, and the median
// counts, so that load from elsewhere on a shared machine hits both alike.
const rounds = 5

func measureInterleaved(b *testing.B, f figure, e *env, d time.Duration) (medians, cpuPerUnit []float64) {
	per := make([][]float64, len(e.targets))
	cpu := make([]time.Duration, len(e.targets))
	units := make([]float64, len(e.targets))
	for i, t := range e.targets {
		_, _ = f.measure(t, e, f.conc, d/10) // warm up: connection pools, caches
		per[i] = make([]float64, 0, rounds)
	}
	for r := range rounds {
		for k := range e.targets {
			i := k
			if r%2 == 1 {
				i = len(e.targets) - 1 - k
			}
			t := e.targets[i]
			before, err := processCPU(t.pid)
			if err != nil {
				b.Fatal(err)
			}
			start := time.Now()
			v, err := f.measure(t, e, f.conc, d/rounds)
			if err != nil {
				b.Fatalf("%s through %s: %v", f.name, t.name, err)
			}
			took := time.Since(start)
			after, err := processCPU(t.pid)
			if err != nil {
				b.Fatal(err)
			}
			per[i] = append(per[i], v)
			cpu[i] += after - before
			units[i] += v * took.Seconds()
		}
	}
	for i, vs := range per {
		slices.Sort(vs)
		medians = append(medians, vs[len(vs)/2])
		cpuPerUnit = append(cpuPerUnit, float64(cpu[i].Microseconds())/units[i])
	}
	return medians, cpuPerUnit
}

func verdict(ratio float64) string {
	if ratio < 0.9 {
		return "  (below the 0.9 target)"
	}
	return ""
}

func duration(b *testing.B) time.Duration {
	s := os.Getenv("EDGE_BENCH_DURATION")
	if s == "" {
		return 3 * time.Second
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		b.Fatalf("EDGE_BENCH_DURATION=%q: want a positive duration such as 5s", s)
	}
	return d
}
