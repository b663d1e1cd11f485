package fsarchive

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// names lists the entries of an archive in order.
func names(t *testing.T, data []byte) []string {
	t.Helper()
	zr, err := zstd.NewReader(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	defer zr.Close()
	tr := tar.NewReader(zr)
	var out []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, h.Name)
	}
}

func mkTree(t *testing.T, files ...string) string {
	t.Helper()
	dir := t.TempDir()
	for _, f := range files {
		p := filepath.Join(dir, f)
		if strings.HasSuffix(f, "/") {
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("data of "+f), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestWriteWithFilter: Skip leaves a subtree out unread, SkipUnlessContent keeps a
// directory only for the entries kept below it (written before them, in order), and
// the result extracts.
func TestWriteWithFilter(t *testing.T) {
	dir := mkTree(t, "a/x", "a/y", "b/keep", "b/drop", "c/d/drop", "e/", "z")
	var asked []string
	filter := func(p string, isDir bool) (Decision, error) {
		asked = append(asked, p)
		switch {
		case p == "a":
			return Skip, nil
		case isDir && (p == "b" || p == "c" || p == "c/d"):
			return SkipUnlessContent, nil
		case p == "b/keep", p == "e", p == "z":
			return Keep, nil
		}
		return Skip, nil
	}
	var buf bytes.Buffer
	st, err := WriteWith(context.Background(), openDir(t, dir), &buf, WriteOptions{Filter: filter})
	if err != nil {
		t.Fatal(err)
	}
	got := names(t, buf.Bytes())
	want := []string{"./", "b/", "b/keep", "e/", "z"}
	if !slices.Equal(got, want) || st.Files != int64(len(want)) {
		t.Fatalf("entries %q (stats %+v), want %q", got, st, want)
	}
	if slices.Contains(asked, "a/x") {
		t.Errorf("a skipped directory was read: asked %q", asked)
	}
	if !slices.Contains(asked, "c/d/drop") {
		t.Errorf("the content of a SkipUnlessContent directory was not asked for: %q", asked)
	}
	root, _, err := extractFresh(t, buf.Bytes(), runtime.ArchiveLimits{}, IDMap{})
	if err != nil {
		t.Fatalf("Extract: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(root, "b/keep")); err != nil || string(b) != "data of b/keep" {
		t.Errorf("b/keep: %q %v", b, err)
	}

	boom := errors.New("bad pattern")
	_, err = WriteWith(context.Background(), openDir(t, dir), io.Discard, WriteOptions{Filter: func(string, bool) (Decision, error) { return Keep, boom }})
	if !errors.Is(err, boom) {
		t.Errorf("filter error: %v", err)
	}
	_, err = WriteWith(context.Background(), openDir(t, dir), io.Discard, WriteOptions{Filter: func(string, bool) (Decision, error) { return Decision(7), nil }})
	if err == nil {
		t.Error("an unknown decision was accepted")
	}
}

// TestWriteWithBounds: more entries or bytes than allowed fail with ErrTooLarge.
func TestWriteWithBounds(t *testing.T) {
	dir := mkTree(t, "a", "b", "c") // 3 files of 9 bytes + the root
	for _, tc := range []struct {
		opts WriteOptions
		ok   bool
	}{
		{WriteOptions{MaxEntries: 4, MaxBytes: 27}, true},
		{WriteOptions{MaxEntries: 3}, false},
		{WriteOptions{MaxBytes: 26}, false},
	} {
		_, err := WriteWith(context.Background(), openDir(t, dir), io.Discard, tc.opts)
		if tc.ok != (err == nil) || (err != nil && !errors.Is(err, ErrTooLarge)) {
			t.Errorf("%+v: %v", tc.opts, err)
		}
	}
}
