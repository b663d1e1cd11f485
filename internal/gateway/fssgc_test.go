package gateway

import (
	"context"
	"errors"
	"io"
	"iter"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/blob"
	"github.com/sandboxd/sandboxd/internal/blob/dir"
)

func TestParseFSSKey(t *testing.T) {
	for key, want := range map[string]string{
		"fss/acme/snap-1.tar.zst": "acme snap-1",
		"fss/acme/.tar.zst":       "",
		"fss//snap.tar.zst":       "",
		"fss/acme/snap.tar":       "",
		"fss/acme/x/snap.tar.zst": "",
		"fss/snap.tar.zst":        "",
		"other/acme/snap.tar.zst": "",
	} {
		org, id, ok := parseFSSKey(key)
		got := ""
		if ok {
			got = org + " " + id
		}
		if got != want {
			t.Errorf("parseFSSKey(%q) = %q, want %q", key, got, want)
		}
	}
}

// gcFixture is a directory blob store with objects, some made old.
type gcFixture struct {
	root  string
	store *dir.Store
}

func newGCFixture(t *testing.T) *gcFixture {
	t.Helper()
	root := t.TempDir()
	st, err := dir.Open(root)
	if err != nil {
		t.Fatal(err)
	}
	return &gcFixture{root: root, store: st}
}

// put stores key, aged age (by its file's mtime: the directory store's layout puts key
// a/b/c at objects/a.d/b.d/c.o).
func (f *gcFixture) put(t *testing.T, key string, age time.Duration) {
	t.Helper()
	if _, err := f.store.Put(context.Background(), key, strings.NewReader("archive "+key), -1); err != nil {
		t.Fatal(err)
	}
	comps := strings.Split(key, "/")
	for i := range comps[:len(comps)-1] {
		comps[i] += ".d"
	}
	comps[len(comps)-1] += ".o"
	p := filepath.Join(append([]string{f.root, "objects"}, comps...)...)
	when := time.Now().Add(-age)
	if err := os.Chtimes(p, when, when); err != nil {
		t.Fatal(err)
	}
	if info, err := f.store.Stat(context.Background(), key); err != nil || info.ModTime.After(time.Now().Add(-age+time.Minute)) {
		t.Fatalf("aging %s: %v, %v", key, info.ModTime, err)
	}
}

func (f *gcFixture) keys(t *testing.T) []string {
	t.Helper()
	var out []string
	for info, err := range f.store.List(context.Background(), "") {
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, info.Key)
	}
	return out
}

func existsIn(ids ...string) SnapshotExistsFunc {
	return func(_ context.Context, key string) (bool, error) {
		_, id, _ := parseFSSKey(key)
		return slices.Contains(ids, id), nil
	}
}

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func TestFSSGCDeletesOnlyOldUnindexedObjects(t *testing.T) {
	f := newGCFixture(t)
	old := 2 * time.Hour
	f.put(t, "fss/acme/orphan.tar.zst", old)          // no row, old: garbage
	f.put(t, "fss/acme/young.tar.zst", time.Minute)   // no row, young: kept (upload racing its row)
	f.put(t, "fss/acme/indexed.tar.zst", old)         // row: kept
	f.put(t, "fss/globex/indexed2.tar.zst", old)      // row: kept
	f.put(t, "fss/acme/notes.txt", old)               // unparsable under fss/: garbage
	f.put(t, "fss/acme/deep/x.tar.zst", old)          // unparsable: garbage
	f.put(t, "fss/stray", old)                        // unparsable: garbage
	f.put(t, "fss/acme/young-stray.txt", time.Minute) // unparsable but young: kept
	f.put(t, "other/acme/orphan.tar.zst", old)        // not under fss/: never touched

	g := newFSSGC(f.store, existsIn("indexed", "indexed2"), FSSGCConfig{}, quietLog())
	n, err := g.pass(context.Background())
	if err != nil || n != 4 {
		t.Fatalf("pass = %d, %v; want 4 deleted", n, err)
	}
	want := []string{"fss/acme/indexed.tar.zst", "fss/acme/young-stray.txt", "fss/acme/young.tar.zst", "fss/globex/indexed2.tar.zst", "other/acme/orphan.tar.zst"}
	if got := f.keys(t); !slices.Equal(got, want) {
		t.Errorf("left %v, want %v", got, want)
	}
	// Nothing more to do.
	if n, err := g.pass(context.Background()); err != nil || n != 0 {
		t.Errorf("second pass = %d, %v", n, err)
	}
}

func TestFSSGCKeepsObjectsWhenTheIndexCannotTell(t *testing.T) {
	f := newGCFixture(t)
	f.put(t, "fss/acme/a.tar.zst", 2*time.Hour)
	g := newFSSGC(f.store, func(context.Context, string) (bool, error) { return false, errors.New("db down") }, FSSGCConfig{}, quietLog())
	if n, err := g.pass(context.Background()); err != nil || n != 0 {
		t.Fatalf("pass = %d, %v", n, err)
	}
	if got := f.keys(t); len(got) != 1 {
		t.Errorf("left %v", got)
	}
}

func TestFSSGCBoundedPasses(t *testing.T) {
	f := newGCFixture(t)
	for _, id := range []string{"a", "b", "c", "d", "e"} {
		f.put(t, "fss/acme/"+id+".tar.zst", 2*time.Hour)
	}
	f.put(t, "fss/acme/0.tar.zst", 2*time.Hour) // indexed, first in order
	g := newFSSGC(f.store, existsIn("0"), FSSGCConfig{MaxPerPass: 2}, quietLog())
	var per []int
	for range 4 {
		n, err := g.pass(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		per = append(per, n)
	}
	// 0 (kept) and a; b and c; d and e; then from the start: nothing left but 0.
	if want := []int{1, 2, 2, 0}; !slices.Equal(per, want) {
		t.Errorf("deleted per pass %v, want %v", per, want)
	}
	if got := f.keys(t); !slices.Equal(got, []string{"fss/acme/0.tar.zst"}) {
		t.Errorf("left %v", got)
	}
}

// failingList is a blob store whose listing fails after one object.
type failingList struct{ deleted []string }

func (l *failingList) List(context.Context, string) iter.Seq2[blob.Info, error] {
	return func(yield func(blob.Info, error) bool) {
		if !yield(blob.Info{Key: "fss/acme/x.tar.zst", ModTime: time.Now().Add(-2 * time.Hour)}, nil) {
			return
		}
		yield(blob.Info{}, errors.New("s3: connection reset"))
	}
}

func (l *failingList) Delete(_ context.Context, key string) error {
	l.deleted = append(l.deleted, key)
	return nil
}

func TestFSSGCListErrorEndsThePass(t *testing.T) {
	l := &failingList{}
	g := newFSSGC(l, existsIn(), FSSGCConfig{}, quietLog())
	n, err := g.pass(context.Background())
	if err == nil || n != 0 || len(l.deleted) != 0 {
		t.Fatalf("pass = %d, %v, deleted %v: want the list error and nothing deleted", n, err, l.deleted)
	}
	// The loop survives it: a pass every few milliseconds, until cancelled.
	g.cfg.Interval = time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { g.run(ctx); close(done) }()
	time.Sleep(20 * time.Millisecond)
	cancel()
	<-done
	if len(l.deleted) != 0 {
		t.Errorf("deleted %v after failed listings", l.deleted)
	}
}
