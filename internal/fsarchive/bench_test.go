package fsarchive

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// BenchmarkWriteExtract100MiB archives a 100 MiB tree (25 files of 4 MiB, half random,
// half repeated text, in 5 directories) to a file and extracts it; it reports each
// direction's MB/s and the archive's size relative to the tree.
func BenchmarkWriteExtract100MiB(b *testing.B) {
	const total = 100 << 20
	src := b.TempDir()
	for i := range 25 {
		dir := filepath.Join(src, fmt.Sprintf("d%d", i%5))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%d", i)), bigContent(total/25, uint64(i)), 0o644); err != nil {
			b.Fatal(err)
		}
	}
	work := b.TempDir()
	ctx := context.Background()
	var writeTime, extractTime time.Duration
	var archived int64
	b.SetBytes(total)
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		af, err := os.Create(filepath.Join(work, "archive.tar.zst"))
		if err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		st, err := Write(ctx, openDir(b, src), af, IDMap{})
		if err != nil || st.Bytes != total {
			b.Fatalf("Write: %+v %v", st, err)
		}
		writeTime += time.Since(start)
		if archived, err = af.Seek(0, io.SeekCurrent); err != nil {
			b.Fatal(err)
		}
		if _, err := af.Seek(0, io.SeekStart); err != nil {
			b.Fatal(err)
		}
		dst := filepath.Join(work, fmt.Sprint("x", i))
		if err := os.Mkdir(dst, 0o755); err != nil {
			b.Fatal(err)
		}
		start = time.Now()
		xst, err := Extract(ctx, af, openDir(b, dst), runtime.ArchiveLimits{MaxBytes: total}, IDMap{})
		if err != nil || xst != st {
			b.Fatalf("Extract: %+v %v", xst, err)
		}
		extractTime += time.Since(start)
		af.Close()
		b.StopTimer()
		os.RemoveAll(dst)
		b.StartTimer()
	}
	n := float64(b.N)
	b.ReportMetric(total/1e6*n/writeTime.Seconds(), "write-MB/s")
	b.ReportMetric(total/1e6*n/extractTime.Seconds(), "extract-MB/s")
	b.ReportMetric(float64(archived)/total, "archive/tree")
}
