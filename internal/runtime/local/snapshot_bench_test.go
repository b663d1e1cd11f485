package local

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// fillVolume writes about mib MiB of incompressible data to /data of sandbox id (16 MiB
// files of random data).
func fillVolume(b *testing.B, e *env, id string, mib int) {
	b.Helper()
	sh(b, e.b, id, "dd if=/dev/urandom of=/tmp/chunk bs=1M count=16 2>/dev/null")
	for i := 0; i*16 < mib; i++ {
		n := min(16, mib-i*16)
		sh(b, e.b, id, "dd if=/tmp/chunk of=/data/f"+strconv.Itoa(i)+" bs=1M count="+strconv.Itoa(n)+" 2>/dev/null")
	}
}

// BenchmarkCaptureVolume: the workload's pause (freeze + btrfs snapshot) and the time
// to capture and write the whole archive (to io.Discard: compression, no upload) of a
// 100 MiB and a 1 GiB volume of a sandbox that keeps writing.
func BenchmarkCaptureVolume(b *testing.B) {
	for _, mib := range []int{100, 1024} {
		b.Run(fmt.Sprintf("%dMiB", mib), func(b *testing.B) {
			e := volPoolEnv(b)
			e.create(volSpec("bcap", "", []runtime.Volume{{Name: "data", SizeBytes: 2 << 30}},
				"i=0; while :; do i=$((i+1)); echo $i > /data/tick; sleep 0.001; done"))
			fillVolume(b, e, "bcap", mib)
			var pauses, totals []time.Duration
			b.ResetTimer()
			for range b.N {
				start := time.Now()
				c, err := e.b.CaptureVolume(context.Background(), "bcap", "data")
				if err != nil {
					b.Fatal(err)
				}
				st, err := c.WriteArchive(context.Background(), io.Discard)
				if err != nil {
					b.Fatal(err)
				}
				totals = append(totals, time.Since(start))
				pauses = append(pauses, c.Pause())
				_ = c.Close()
				if st.Bytes < int64(mib)<<20 {
					b.Fatalf("archived %d bytes, want %d", st.Bytes, mib<<20)
				}
			}
			b.StopTimer()
			percentiles(b, pauses, "pause-")
			percentiles(b, totals, "capture+archive-")
			b.Logf("%d MiB: pause p50 %s, capture+archive p50 %s", mib, median(pauses), median(totals))
		})
	}
}

// BenchmarkCreateRestore: Create → first exec of a sandbox with a 100 MiB volume,
// empty and restored from a cached snapshot (PrepareSnapshot done before).
func BenchmarkCreateRestore(b *testing.B) {
	e := volPoolEnv(b)
	e.create(volSpec("bsrc", "", []runtime.Volume{{Name: "data", SizeBytes: 1 << 30}}, "exec sleep 3600"))
	fillVolume(b, e, "bsrc", 100)
	c, err := e.b.CaptureVolume(context.Background(), "bsrc", "data")
	if err != nil {
		b.Fatal(err)
	}
	var buf bytes.Buffer
	if _, err := c.WriteArchive(context.Background(), &buf); err != nil {
		b.Fatal(err)
	}
	_ = c.Close()
	sum := sha256.Sum256(buf.Bytes())
	digest := hex.EncodeToString(sum[:])
	prepStart := time.Now()
	prepare(b, e.b, buf.Bytes(), digest)
	b.Logf("PrepareSnapshot of 100 MiB (extract into the cache): %s", time.Since(prepStart))
	if err := e.b.Destroy(context.Background(), "bsrc"); err != nil {
		b.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		digest string
	}{{"empty", ""}, {"restore-100MiB", digest}} {
		b.Run(tc.name, func(b *testing.B) {
			var ds []time.Duration
			for i := range b.N {
				id := "bres-" + strconv.Itoa(i)
				sp := volSpec(id, "", []runtime.Volume{{Name: "data", SizeBytes: 1 << 30, RestoreDigest: tc.digest}}, "exec sleep 3600")
				sp.Image = "busybox"
				start := time.Now()
				if _, err := e.b.Create(context.Background(), &sp); err != nil {
					b.Fatal(err)
				}
				sh(b, e.b, id, "test -d /data")
				ds = append(ds, time.Since(start))
				b.StopTimer()
				if err := e.b.Destroy(context.Background(), id); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
			percentiles(b, ds, "create-first-exec-")
			b.Logf("%s: create → first exec p50 %s", tc.name, median(ds))
		})
	}
}

func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}
