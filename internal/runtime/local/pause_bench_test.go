package local

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// BenchmarkPauseResume: a checkpoint pause (resources released) and a resume of an idle
// gVisor sandbox on the bridge, without a CPU limit and with the API's default 1000m
// (a cpuset of one CPU and a quota here), and of one with 256 MiB resident (a tmpfs file
// in the sentry's memory): p50/p99 of each and the checkpoint's size on disk.
func BenchmarkPauseResume(b *testing.B) {
	for _, c := range []struct {
		mib   int
		milli int64
	}{{0, 0}, {0, 1000}, {256, 0}} {
		mib := c.mib
		name := fmt.Sprintf("resident-%dMiB", mib)
		if c.milli > 0 {
			name += fmt.Sprintf("-cpu%dm", c.milli)
		}
		b.Run(name, func(b *testing.B) {
			e := gvisorEnv(b)
			e.withNetwork(b, 8)
			ctx := context.Background()
			const id = "bpr"
			e.create(runtime.Spec{ID: id, RuntimeClass: GVisorClass, Container: runtime.Container{Command: "sleep", Args: []string{"100000"},
				Resources: runtime.Resources{MemoryBytes: 1 << 30, MilliCPU: c.milli}}})
			if mib > 0 {
				sh(b, e.b, id, "dd if=/dev/urandom of=/tmp/fill bs=1M count="+strconv.Itoa(mib)+" 2>/dev/null")
			}
			var pauses, resumes []time.Duration
			var size int64
			steps := traceSteps(e.b)
			b.ResetTimer()
			for range b.N {
				pi, err := e.b.Pause(ctx, id, true)
				if err != nil {
					b.Fatal(err)
				}
				pauses = append(pauses, pi.Took)
				size = pi.CheckpointBytes
				start := time.Now()
				if _, err := e.b.Resume(ctx, id); err != nil {
					b.Fatal(err)
				}
				resumes = append(resumes, time.Since(start))
			}
			b.StopTimer()
			percentiles(b, pauses, "pause-")
			percentiles(b, resumes, "resume-")
			b.ReportMetric(float64(size), "checkpoint-bytes")
			steps.log(b, b.N, "op")
		})
	}
}

// BenchmarkFork: forks ×1 (also with the API's default CPU limit, 1000m) and ×10 of a
// running idle gVisor sandbox on the bridge with a scratch volume (wall time of the Fork
// call; the forks are destroyed untimed).
func BenchmarkFork(b *testing.B) {
	for _, c := range []struct {
		n     int
		milli int64
	}{{1, 0}, {1, 1000}, {10, 0}} {
		n := c.n
		name := fmt.Sprintf("x%d", n)
		if c.milli > 0 {
			name += fmt.Sprintf("-cpu%dm", c.milli)
		}
		b.Run(name, func(b *testing.B) {
			e := volPoolEnv(b)
			if e.b.runtimes[GVisorClass] == nil {
				b.Skip("runsc not found")
			}
			e.withNetwork(b, 9)
			ctx := context.Background()
			const src = "bfs"
			sp := volSpec(src, GVisorClass, []runtime.Volume{{Name: "data", SizeBytes: 64 << 20}}, "sleep 100000")
			sp.Image = "busybox"
			sp.Container.Resources.MilliCPU = c.milli
			e.create(sp)
			var walls []time.Duration
			steps := traceSteps(e.b)
			b.ResetTimer()
			for it := range b.N {
				specs := make([]*runtime.Spec, n)
				for i := range specs {
					f := sp.Clone()
					f.ID = "bf-" + strconv.Itoa(it) + "-" + strconv.Itoa(i)
					specs[i] = &f
				}
				start := time.Now()
				_, errs := e.b.Fork(ctx, src, specs)
				walls = append(walls, time.Since(start))
				b.StopTimer()
				for i, err := range errs {
					if err != nil {
						b.Fatal(err)
					}
					if err := e.b.Destroy(ctx, specs[i].ID); err != nil {
						b.Fatal(err)
					}
				}
				b.StartTimer()
			}
			b.StopTimer()
			percentiles(b, walls, "fork-")
			steps.log(b, b.N*n, "fork (concurrent forks overlap)")
		})
	}
}

// stepTimes sums the backend's traced steps (b.trace), from concurrent calls too.
type stepTimes struct {
	mu sync.Mutex
	d  map[string]time.Duration
}

func traceSteps(b *Backend) *stepTimes {
	st := &stepTimes{d: map[string]time.Duration{}}
	b.trace = func(step string, d time.Duration) {
		st.mu.Lock()
		st.d[step] += d
		st.mu.Unlock()
	}
	return st
}

func (st *stepTimes) log(b *testing.B, n int, per string) {
	st.mu.Lock()
	defer st.mu.Unlock()
	keys := make([]string, 0, len(st.d))
	for k := range st.d {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		b.Logf("%s: %v per %s", k, st.d[k]/time.Duration(max(n, 1)), per)
	}
}
