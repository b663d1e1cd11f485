package logstore

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

func readAll(t *testing.T, r *Reader, opts ReadOptions) (string, []Chunk) {
	t.Helper()
	var b strings.Builder
	var chunks []Chunk
	if _, err := r.Read(opts, func(c Chunk) error {
		b.Write(c.Data)
		c.Data = bytes.Clone(c.Data)
		chunks = append(chunks, c)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return b.String(), chunks
}

func TestReadOptions(t *testing.T) {
	dir := t.TempDir()
	w, err := Open(dir, "main")
	if err != nil {
		t.Fatal(err)
	}
	base := time.Unix(1000, 0)
	tick := 0
	w.now = func() time.Time { tick++; return base.Add(time.Duration(tick) * time.Second) }
	// Times: a=1s, b=2s, c=3s, d=4s
	w.Write(Stdout, []byte("one\ntwo\nth"))
	w.Write(Stderr, []byte("ree\n"))
	w.Write(Stdout, []byte("four\n"))
	w.Write(Stdout, []byte("five"))
	r, err := OpenReader(dir, "main")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	all := "one\ntwo\nthree\nfour\nfive"
	tests := []struct {
		name string
		opts ReadOptions
		want string
	}{
		{"all", ReadOptions{}, all},
		{"tail 1 partial line", ReadOptions{TailLines: 1}, "five"},
		{"tail 2", ReadOptions{TailLines: 2}, "four\nfive"},
		{"tail 3 spans chunks", ReadOptions{TailLines: 3}, "three\nfour\nfive"},
		{"tail many", ReadOptions{TailLines: 50}, all},
		{"offset mid chunk", ReadOptions{Offset: 4, FromOffset: true}, all[4:]},
		{"offset end", ReadOptions{Offset: uint64(len(all)), FromOffset: true}, ""},
		{"offset beyond", ReadOptions{Offset: 1000, FromOffset: true}, ""},
		{"since exact", ReadOptions{Since: base.Add(2 * time.Second)}, "ree\nfour\nfive"},
		{"since between", ReadOptions{Since: base.Add(2500 * time.Millisecond)}, "four\nfive"},
		{"since future", ReadOptions{Since: base.Add(time.Hour)}, ""},
		{"since and tail: later wins", ReadOptions{Since: base, TailLines: 1}, "five"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, chunks := readAll(t, r, tc.opts)
			if got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
			if len(chunks) > 0 && chunks[0].Offset != uint64(len(all)-len(tc.want)) {
				t.Errorf("first offset %d", chunks[0].Offset)
			}
		})
	}
	_, chunks := readAll(t, r, ReadOptions{})
	if len(chunks) != 4 || chunks[1].Stream != Stderr || !chunks[2].Time.Equal(base.Add(3*time.Second)) {
		t.Errorf("chunks %+v", chunks)
	}
	// Trailing newline: the last line is the one before it.
	w.Write(Stdout, []byte("\n"))
	if got, _ := readAll(t, r, ReadOptions{TailLines: 1}); got != "five\n" {
		t.Errorf("tail after newline = %q", got)
	}
	w.Close()
}

func TestTornTailAndReopen(t *testing.T) {
	dir := t.TempDir()
	w, _ := Open(dir, "main")
	w.Write(Stdout, []byte("hello "))
	w.Write(Stdout, []byte("world\n"))
	w.Close()
	// Simulate a crash: a half record and bytes with no record.
	f, _ := os.OpenFile(filepath.Join(dir, "main.idx"), os.O_APPEND|os.O_WRONLY, 0)
	f.Write(make([]byte, RecordSize/2))
	f.Close()
	f, _ = os.OpenFile(filepath.Join(dir, "main.log"), os.O_APPEND|os.O_WRONLY, 0)
	f.Write([]byte("unindexed"))
	f.Close()
	r, _ := OpenReader(dir, "main")
	if got, _ := readAll(t, r, ReadOptions{}); got != "hello world\n" {
		t.Errorf("got %q", got)
	}
	r.Close()
	w, err := Open(dir, "main")
	if err != nil {
		t.Fatal(err)
	}
	w.Write(Stderr, []byte("again\n"))
	w.Close()
	r, _ = OpenReader(dir, "main")
	defer r.Close()
	if got, _ := readAll(t, r, ReadOptions{}); got != "hello world\nagain\n" {
		t.Errorf("after reopen %q", got)
	}
}

func TestFollow(t *testing.T) {
	dir := t.TempDir()
	w, _ := Open(dir, "main")
	w.Write(Stdout, []byte("a\n"))
	r, _ := OpenReader(dir, "main")
	defer r.Close()
	got := make(chan string, 100)
	done := make(chan error, 1)
	go func() {
		done <- Follow(context.Background(), r, w, ReadOptions{}, func(c Chunk) error { got <- string(c.Data); return nil })
	}()
	if s := <-got; s != "a\n" {
		t.Fatalf("got %q", s)
	}
	for i := 0; i < 100; i++ {
		w.Write(Stdout, []byte("b"))
	}
	var b strings.Builder
	for b.Len() < 100 {
		b.WriteString(<-got)
	}
	w.Write(Stdout, []byte("end"))
	w.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	close(got)
	rest := ""
	for s := range got {
		rest += s
	}
	if rest != "end" {
		t.Errorf("rest %q", rest)
	}
	// A follow that starts after Close returns what is there.
	r2, _ := OpenReader(dir, "main")
	defer r2.Close()
	n := 0
	if err := Follow(context.Background(), r2, w, ReadOptions{TailLines: 1}, func(c Chunk) error { n += len(c.Data); return nil }); err != nil || n != 103 {
		t.Errorf("follow after close: %d %v", n, err)
	}
	// Cancellation.
	w3, _ := Open(t.TempDir(), "x")
	defer w3.Close()
	r3, _ := OpenReader(filepath.Dir(w3.log.Name()), "x")
	defer r3.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := Follow(ctx, r3, w3, ReadOptions{}, func(Chunk) error { return nil }); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("err = %v", err)
	}
}

// FuzzIndex feeds arbitrary index files: reads must not panic, and every chunk must be
// inside the log, contiguous, and in order.
func FuzzIndex(f *testing.F) {
	var rec [RecordSize]byte
	var seed []byte
	for i, n := range []uint32{3, 5, 1} {
		encodeRecord(rec[:], record{off: uint64(i * 3), nanos: int64(i), length: n, stream: Stdout})
		seed = append(seed, rec[:]...)
	}
	f.Add(seed, 9, 2, uint64(1))
	f.Add(seed[:RecordSize+7], 3, 0, uint64(0))
	f.Add([]byte{}, 0, 1, uint64(5))
	f.Fuzz(func(t *testing.T, idx []byte, logSize int, tail int, off uint64) {
		if logSize < 0 || logSize > 1<<16 || tail < 0 {
			return
		}
		dir := t.TempDir()
		os.WriteFile(filepath.Join(dir, "m.idx"), idx, 0o644)
		os.WriteFile(filepath.Join(dir, "m.log"), bytes.Repeat([]byte("ab\n"), logSize/3+1)[:logSize], 0o644)
		r, err := OpenReader(dir, "m")
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		for _, opts := range []ReadOptions{{}, {TailLines: tail}, {Offset: off, FromOffset: true}, {Since: time.Unix(0, int64(off))}} {
			var next uint64
			first := true
			end, err := r.Read(opts, func(c Chunk) error {
				if !first && c.Offset != next {
					t.Fatalf("gap: %d after %d", c.Offset, next)
				}
				first = false
				next = c.NextOffset()
				if next > uint64(logSize) || len(c.Data) == 0 {
					t.Fatalf("chunk %d+%d beyond log %d", c.Offset, len(c.Data), logSize)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if end > uint64(logSize) {
				t.Fatalf("end %d", end)
			}
		}
		// The writer recovers from whatever is there.
		w, err := Open(dir, "m")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Write(Stdout, []byte("x")); err != nil {
			t.Fatal(err)
		}
		w.Close()
	})
}

// TestTimesStrictlyIncrease: chunks written within one clock tick, or while the clock
// steps back, still get strictly increasing times, so a since_time at a chunk's own time
// never starts at an earlier chunk.
func TestTimesStrictlyIncrease(t *testing.T) {
	dir := t.TempDir()
	w, err := Open(dir, "main")
	if err != nil {
		t.Fatal(err)
	}
	base := time.Unix(1000, 0)
	steps := []time.Duration{0, 0, -time.Second, 0, time.Millisecond}
	i := 0
	w.now = func() time.Time { d := steps[i]; i++; return base.Add(d) }
	for _, s := range []string{"a", "b", "c", "d", "e"} {
		w.Write(Stdout, []byte(s))
	}
	w.Close()
	r, err := OpenReader(dir, "main")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	_, chunks := readAll(t, r, ReadOptions{})
	for i := 1; i < len(chunks); i++ {
		if !chunks[i].Time.After(chunks[i-1].Time) {
			t.Errorf("chunk %d at %v, not after %v", i, chunks[i].Time, chunks[i-1].Time)
		}
	}
	if got, _ := readAll(t, r, ReadOptions{Since: chunks[2].Time}); got != "cde" {
		t.Errorf("since chunk 2's time = %q, want cde", got)
	}
	// Reopened after a crash, the writer goes on after the last time it wrote.
	w, err = Open(dir, "main")
	if err != nil {
		t.Fatal(err)
	}
	w.now = func() time.Time { return base }
	w.Write(Stdout, []byte("f"))
	w.Close()
	_, chunks = readAll(t, r, ReadOptions{})
	if n := len(chunks); n != 6 || !chunks[5].Time.After(chunks[4].Time) {
		t.Errorf("after reopen: %d chunks, last at %v", n, chunks[n-1].Time)
	}
}

// TestReaderMemoryIsBounded: the runner reads logs a sandbox wrote, so what a Reader
// allocates must not grow with what the files claim: neither with a forged 2 GiB chunk
// nor with an index of a million records.
func TestReaderMemoryIsBounded(t *testing.T) {
	allocated := func(dir string, opts ReadOptions) (uint64, int) {
		t.Helper()
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		r, err := OpenReader(dir, "m")
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		n := 0
		if _, err := r.Read(opts, func(c Chunk) error { n += len(c.Data); return nil }); err != nil {
			t.Fatal(err)
		}
		runtime.ReadMemStats(&after)
		return after.TotalAlloc - before.TotalAlloc, n
	}
	const limit = 8 << 20

	forged := t.TempDir()
	var rec [RecordSize]byte
	encodeRecord(rec[:], record{off: 0, nanos: 1, length: 2 << 30, stream: Stdout})
	os.WriteFile(filepath.Join(forged, "m.idx"), rec[:], 0o644)
	f, _ := os.Create(filepath.Join(forged, "m.log"))
	f.Truncate(2 << 30) // sparse
	f.Close()
	if a, n := allocated(forged, ReadOptions{}); a > limit || n != 0 {
		t.Errorf("forged 2 GiB chunk: allocated %d bytes, passed %d bytes", a, n)
	}

	many := t.TempDir()
	const records = 1 << 20
	idx := make([]byte, records*RecordSize)
	for i := range records {
		encodeRecord(idx[i*RecordSize:], record{off: uint64(i), nanos: int64(i + 1), length: 1, stream: Stdout})
	}
	os.WriteFile(filepath.Join(many, "m.idx"), idx, 0o644)
	os.WriteFile(filepath.Join(many, "m.log"), bytes.Repeat([]byte("x"), records), 0o644)
	for _, opts := range []ReadOptions{{}, {Since: time.Unix(0, records/2)}, {Offset: records - 10, FromOffset: true}} {
		if a, n := allocated(many, opts); a > limit || n == 0 {
			t.Errorf("%+v over a million records: allocated %d bytes, passed %d bytes", opts, a, n)
		}
	}
}

// TestReaderRefusesSymlinks: a log file that is a symlink (planted by the sandbox whose
// log it is) is not followed.
func TestReaderRefusesSymlinks(t *testing.T) {
	dir := t.TempDir()
	secret := filepath.Join(t.TempDir(), "secret")
	os.WriteFile(secret, []byte("host secret\n"), 0o600)
	os.Symlink(secret, filepath.Join(dir, "m.log"))
	os.WriteFile(filepath.Join(dir, "m.idx"), nil, 0o644)
	if r, err := OpenReader(dir, "m"); err == nil {
		r.Close()
		t.Error("a symlinked log was opened")
	}
}

// writeLog writes a one-chunk log m with data in dir.
func writeLog(t *testing.T, dir, data string) {
	t.Helper()
	w, err := Open(dir, "m")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(Stdout, []byte(data)); err != nil {
		t.Fatal(err)
	}
	w.Close()
}

func readLog(r *Reader) (string, error) {
	var got []byte
	_, err := r.Read(ReadOptions{}, func(c Chunk) error { got = append(got, c.Data...); return nil })
	return string(got), err
}

// TestReaderRefusesSymlinkedDir: a log dir that its sandbox replaced by a symlink (to
// another sandbox's log, or any host dir) is not followed, by OpenReader (the dir's own
// name) and by OpenReaderBeneath (any element below the trusted root); a real dir beneath
// the root reads.
func TestReaderRefusesSymlinkedDir(t *testing.T) {
	other := t.TempDir()
	writeLog(t, other, "other tenant's log\n")
	root := t.TempDir()
	own := filepath.Join(root, "c", "side", "run", "logs")
	if err := os.MkdirAll(own, 0o700); err != nil {
		t.Fatal(err)
	}
	writeLog(t, own, "own log\n")
	r, err := OpenReaderBeneath(root, "c/side/run/logs", "m")
	if err != nil {
		t.Fatal(err)
	}
	if got, err := readLog(r); err != nil || got != "own log\n" {
		t.Fatalf("own log beneath the root: %q %v", got, err)
	}
	r.Close()

	// The last element swapped.
	if err := os.Rename(own, own+".old"); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(other, own); err != nil {
		t.Fatal(err)
	}
	if r, err := OpenReaderBeneath(root, "c/side/run/logs", "m"); err == nil {
		got, _ := readLog(r)
		r.Close()
		t.Errorf("a symlinked log dir was followed beneath the root: read %q", got)
	}
	if r, err := OpenReader(own, "m"); err == nil {
		got, _ := readLog(r)
		r.Close()
		t.Errorf("OpenReader followed a symlinked log dir: read %q", got)
	}
	// An element in the middle swapped (the run dir of a container).
	os.Remove(own)
	os.Rename(own+".old", own)
	run := filepath.Join(root, "c", "side", "run")
	if err := os.Rename(run, run+".old"); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Dir(other), run); err != nil {
		t.Fatal(err)
	}
	if r, err := OpenReaderBeneath(root, "c/side/run/"+filepath.Base(other), "m"); err == nil {
		got, _ := readLog(r)
		r.Close()
		t.Errorf("a symlink in the middle of rel was followed: read %q", got)
	}
	// Leaving the root with "..".
	if r, err := OpenReaderBeneath(own, "../../../../"+filepath.Base(filepath.Dir(other)), "m"); err == nil {
		r.Close()
		t.Error("a rel leaving the root was opened")
	}
}

// TestReaderOfASmallLogIsSmall: a reader (one per log stream: an agent serves hundreds of
// follows at once, inside the sandbox's memory limit) of a log of a few short lines
// allocates about what it reads, not a whole MaxChunk buffer and index block each.
func TestReaderOfASmallLogIsSmall(t *testing.T) {
	dir := t.TempDir()
	w, err := Open(dir, "m")
	if err != nil {
		t.Fatal(err)
	}
	for range 20 {
		if _, err := w.Write(Stdout, []byte("tick\n")); err != nil {
			t.Fatal(err)
		}
	}
	w.Close()
	const readers = 100
	rs := make([]*Reader, 0, readers)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for range readers {
		r, err := OpenReader(dir, "m")
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		if _, err := r.Read(ReadOptions{}, func(c Chunk) error { n += len(c.Data); return nil }); err != nil || n != 100 {
			t.Fatalf("read %d bytes, %v", n, err)
		}
		rs = append(rs, r)
	}
	runtime.ReadMemStats(&after)
	for _, r := range rs {
		r.Close()
	}
	if per := (after.TotalAlloc - before.TotalAlloc) / readers; per > 16<<10 {
		t.Errorf("each reader of a 100-byte log allocated %d bytes, want < 16 KiB", per)
	}
}

// TestIdleFollowersHoldNoBuffers: a follower waiting for more of its log keeps at most
// keptBytes of its read buffers, however long the log. Before, each kept a 1 MiB span and
// a 96 KiB index block: 600 log streams of one sandbox (test/security
// TestAgentSocketSwap) took its agent past the sandbox's 1 GiB and the kernel killed it.
func TestIdleFollowersHoldNoBuffers(t *testing.T) {
	dir := t.TempDir()
	w, err := Open(dir, "main")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	w.Write(Stdout, bytes.Repeat([]byte("x"), 3*MaxChunk)) // a log of several spans
	w.Write(Stdout, []byte("mark0\n"))
	heap := func() int64 {
		var m runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&m)
		return int64(m.HeapInuse)
	}
	const followers = 200
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	marks := make(chan struct{}, 2*followers) // one per follower per "mark" line it passes
	done := make(chan error, followers)
	base := heap()
	for range followers {
		r, err := OpenReader(dir, "main")
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		go func() {
			done <- Follow(ctx, r, w, ReadOptions{}, func(c Chunk) error {
				if bytes.Contains(c.Data, []byte("mark")) {
					marks <- struct{}{}
				}
				return nil
			})
		}()
	}
	for round := range 2 {
		for range followers {
			<-marks
		}
		time.Sleep(50 * time.Millisecond) // each is past its read, waiting for more
		if grew := heap() - base; grew > 32<<20 {
			t.Errorf("round %d: %d idle followers hold %d MiB", round, followers, grew>>20)
		}
		w.Write(Stdout, []byte("mark1\n"))
	}
	cancel()
	for range followers {
		<-done
	}
}
