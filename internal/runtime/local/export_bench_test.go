package local

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// BenchmarkExportImport: ExportCheckpoint of a running idle gVisor sandbox on the bridge
// with a scratch volume, into a blob dir store (the parts compressed), and a
// ForkFromCheckpoint of it into a new sandbox on the same backend (staging every part,
// then the restore), with 0 and 256 MiB resident (a tmpfs file in the sentry's memory):
// p50/p99 of each, the source's pause and the bytes stored. The forks are destroyed
// untimed.
func BenchmarkExportImport(b *testing.B) {
	for _, mib := range []int{0, 256} {
		b.Run(fmt.Sprintf("resident-%dMiB", mib), func(b *testing.B) {
			e := exportEnv(b)
			e.withNetwork(b, 12)
			ctx := context.Background()
			store := newCkStore(b)
			const src = "bex"
			sp := volSpec(src, GVisorClass, []runtime.Volume{{Name: "data", SizeBytes: 64 << 20}}, "sleep 100000")
			sp.Image = "busybox"
			sp.Resources.MemoryBytes = 1 << 30
			e.create(sp)
			if mib > 0 {
				sh(b, e.b, src, "dd if=/dev/urandom of=/tmp/fill bs=1M count="+strconv.Itoa(mib)+" 2>/dev/null")
			}
			var exports, imports, pauses []time.Duration
			var stored, content int64
			b.ResetTimer()
			for it := range b.N {
				prefix := "b" + strconv.Itoa(it)
				start := time.Now()
				ex, err := e.b.ExportCheckpoint(ctx, src, store.put(prefix))
				if err != nil {
					b.Fatal(err)
				}
				exports = append(exports, time.Since(start))
				pauses = append(pauses, ex.Took)
				content = ex.Bytes
				b.StopTimer()
				stored = 0
				for _, p := range ex.Parts {
					info, err := store.s.Stat(ctx, prefix+"/"+p)
					if err != nil {
						b.Fatal(err)
					}
					stored += info.Size
				}
				f := sp.Clone()
				f.ID = "bex-" + strconv.Itoa(it)
				f.Image = "busybox@sha256:b0b0"
				b.StartTimer()
				start = time.Now()
				_, errs := e.b.ForkFromCheckpoint(ctx, ex, store.open(prefix), []*runtime.Spec{&f})
				imports = append(imports, time.Since(start))
				b.StopTimer()
				if errs[0] != nil {
					b.Fatal(errs[0])
				}
				if err := e.b.Destroy(ctx, f.ID); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
			b.StopTimer()
			percentiles(b, exports, "export-")
			percentiles(b, pauses, "export-pause-")
			percentiles(b, imports, "import-")
			b.ReportMetric(float64(content), "content-bytes")
			b.ReportMetric(float64(stored), "stored-bytes")
		})
	}
}
