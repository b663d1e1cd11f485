package local

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// percentiles reports p50 and p99 of ds (ms) on b.
func percentiles(b *testing.B, ds []time.Duration, prefix string) {
	if len(ds) == 0 {
		return
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	at := func(q float64) float64 {
		i := int(q*float64(len(ds)) + 0.5)
		if i >= len(ds) {
			i = len(ds) - 1
		}
		return float64(ds[i].Microseconds()) / 1000
	}
	b.ReportMetric(at(0.50), prefix+"p50-ms")
	b.ReportMetric(at(0.99), prefix+"p99-ms")
}

// BenchmarkCreateFirstExec: Create, then the first Exec through the agent returns
// (fresh connection). Destroy is outside the timing. -v prints where Create's time goes.
// The userns variants (the default) map the sandbox into a user namespace of its own
// with idmapped image layers; nouserns runs it as host root (Config.NoUserNS).
func BenchmarkCreateFirstExec(b *testing.B) {
	b.Run("loopback", func(b *testing.B) { benchCreateFirstExec(b, benchOpts{}) })
	b.Run("loopback-nouserns", func(b *testing.B) { benchCreateFirstExec(b, benchOpts{noUserNS: true}) })
	b.Run("bridge", func(b *testing.B) { benchCreateFirstExec(b, benchOpts{withNet: true}) })
	b.Run("bridge-nouserns", func(b *testing.B) { benchCreateFirstExec(b, benchOpts{withNet: true, noUserNS: true}) })
	b.Run("loopback-disk10Gi", func(b *testing.B) { benchCreateFirstExec(b, benchOpts{disk: 10 << 30}) })
	b.Run("bridge-disk10Gi", func(b *testing.B) { benchCreateFirstExec(b, benchOpts{withNet: true, disk: 10 << 30}) })
}

type benchOpts struct {
	withNet  bool
	noUserNS bool
	disk     int64 // the backend's default disk limit
}

func benchCreateFirstExec(b *testing.B, o benchOpts) {
	e := newEnv(b)
	if o.noUserNS {
		e.b.cfg.NoUserNS, e.b.ids = true, nil
	}
	e.b.cfg.DiskBytes = o.disk
	if o.withNet {
		e.withNetwork(b, 1)
	}
	var mu sync.Mutex
	steps := map[string]time.Duration{}
	e.b.trace = func(step string, d time.Duration) {
		mu.Lock()
		steps[step] += d
		mu.Unlock()
	}
	var total, creates []time.Duration
	ctx := context.Background()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		id := fmt.Sprintf("bench-%d", i)
		start := time.Now()
		if _, err := e.b.Create(ctx, &runtime.Spec{ID: id, Container: runtime.Container{Image: "busybox", Command: "sleep", Args: []string{"3600"}, Resources: runtime.Resources{MilliCPU: 1000, MemoryBytes: 256 << 20}}}); err != nil {
			b.Fatal(err)
		}
		created := time.Since(start)
		out, _, _ := execIn(b, agentClient(e.b, id), "echo", "hi")
		total = append(total, time.Since(start))
		creates = append(creates, created)
		if out != "hi\n" {
			b.Fatalf("exec: %q", out)
		}
		b.StopTimer()
		if err := e.b.Destroy(ctx, id); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.StopTimer()
	percentiles(b, total, "first-exec-")
	percentiles(b, creates, "create-")
	var parts []string
	for _, s := range []string{"dirs", "disk", "pull", "network", "overlay", "bundle", "socket", "runtime", "finish"} {
		parts = append(parts, fmt.Sprintf("%s %.2fms", s, float64(steps[s].Microseconds())/1000/float64(b.N)))
	}
	b.Logf("n=%d mean per step: %s", b.N, strings.Join(parts, ", "))
}

// BenchmarkAgentExec and BenchmarkRuncExec compare an exec through the agent (reused
// connection) with `runc exec <id> /bin/true` on the same sandbox.
func BenchmarkAgentExec(b *testing.B) {
	e := newEnv(b)
	e.create(runtime.Spec{ID: "bench-exec", Container: runtime.Container{Command: "sleep", Args: []string{"3600"}}})
	c := agentClient(e.b, "bench-exec")
	execIn(b, c, "true")
	var ds []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		if _, _, code := execIn(b, c, "/bin/true"); code != 0 {
			b.Fatal(code)
		}
		ds = append(ds, time.Since(start))
	}
	b.StopTimer()
	percentiles(b, ds, "")
}

func BenchmarkRuncExec(b *testing.B) {
	e := newEnv(b)
	e.create(runtime.Spec{ID: "bench-runc", Container: runtime.Container{Command: "sleep", Args: []string{"3600"}}})
	rt, _, _ := e.b.runtimeFor("")
	var ds []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		if out, err := exec.Command(rt.binary, "--root", rt.root, "exec", "bench-runc", "/bin/true").CombinedOutput(); err != nil {
			b.Fatalf("%v: %s", err, out)
		}
		ds = append(ds, time.Since(start))
	}
	b.StopTimer()
	percentiles(b, ds, "")
}

// BenchmarkGroupCreateFirstExec: Create of a sandbox of 1, 2 and 3 busybox containers
// (the primary and n-1 sidecars, loopback network, user namespaces) until the first Exec
// in the primary returns. p50/p99 as in BenchmarkCreateFirstExec, and per-extra-ms: the
// p50 less the 1-container p50 of the same run (0 until that one ran), per extra container.
// The 1-container case is the single-container path (no group).
func BenchmarkGroupCreateFirstExec(b *testing.B) { benchGroupCreateFirstExec(b, "") }

// BenchmarkGVisorGroupCreateFirstExec is BenchmarkGroupCreateFirstExec under gVisor: the
// group's containers in one sentry (gvisor_group.go); no user namespaces there.
func BenchmarkGVisorGroupCreateFirstExec(b *testing.B) {
	benchGroupCreateFirstExec(b, GVisorClass)
}

// benchGroupCreateFirstExec is the group benchmark for runtime class class ("" the
// default, runc).
func benchGroupCreateFirstExec(b *testing.B, class string) {
	var p50One time.Duration
	for n := 1; n <= 3; n++ {
		b.Run(fmt.Sprintf("containers-%d", n), func(b *testing.B) {
			var e *env
			if class == GVisorClass {
				e = gvisorEnv(b) // skips without runsc
			} else {
				e = newEnv(b)
			}
			ctx := context.Background()
			var mu sync.Mutex
			steps := map[string]time.Duration{}
			e.b.trace = func(step string, d time.Duration) { // every container's steps (group.go)
				mu.Lock()
				steps[step] += d
				mu.Unlock()
			}
			var total []time.Duration
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				spec := runtime.Spec{ID: fmt.Sprintf("bench-g%d-%d", n, i), RuntimeClass: class,
					Container: runtime.Container{Image: "busybox", Command: "sleep", Args: []string{"3600"}}}
				if n > 1 {
					spec.Name = "app"
				}
				for j := 1; j < n; j++ {
					spec.Sidecars = append(spec.Sidecars, runtime.Container{Name: fmt.Sprintf("side%d", j), Image: "busybox",
						Command: "sleep", Args: []string{"3600"}})
				}
				start := time.Now()
				if _, err := e.b.Create(ctx, &spec); err != nil {
					b.Fatal(err)
				}
				out, _, _ := execIn(b, agentClient(e.b, spec.ID), "echo", "hi")
				total = append(total, time.Since(start))
				if out != "hi\n" {
					b.Fatalf("exec: %q", out)
				}
				b.StopTimer()
				if err := e.b.Destroy(ctx, spec.ID); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
			b.StopTimer()
			percentiles(b, total, "first-exec-")
			var parts []string
			for _, s := range []string{"dirs", "pull", "overlay", "bundle", "socket", "runtime", "finish", "members", "started"} {
				parts = append(parts, fmt.Sprintf("%s %.2fms", s, float64(steps[s].Microseconds())/1000/float64(b.N)))
			}
			b.Logf("n=%d load %s; mean per step, summed over the containers (members: until every container is created; started: the start sequence): %s",
				b.N, loadAvg(), strings.Join(parts, ", "))
			sort.Slice(total, func(i, j int) bool { return total[i] < total[j] })
			p50 := total[len(total)/2]
			if n == 1 {
				p50One = p50
			} else if p50One > 0 {
				b.ReportMetric(float64((p50-p50One).Microseconds())/1000/float64(n-1), "per-extra-ms")
			}
		})
	}
}

// loadAvg is the host's 1-minute load average, for benchmark logs (the machine is shared).
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return "?"
	}
	return f[0]
}
