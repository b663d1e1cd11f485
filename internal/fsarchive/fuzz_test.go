package fsarchive

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// FuzzExtract: whatever the bytes, Extract returns (nil, ErrInvalid or ErrTooLarge),
// never panics, and never writes outside its root (its sibling stays empty). With
// compressed set, data is a tar stream that the test compresses (so the fuzzer works
// on tar headers); else data is the archive as it is (zstd frames too).
func FuzzExtract(f *testing.F) {
	outside := f.TempDir()
	for _, c := range attackCases() {
		f.Add(c.raw(f, outside), true)
		f.Add(compress(f, c.raw(f, outside)), false)
	}
	src := f.TempDir()
	for _, d := range []string{"a", "a/b"} {
		if err := os.Mkdir(filepath.Join(src, d), 0o755); err != nil {
			f.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(src, "a/b/f"), []byte("hello"), 0o644); err != nil {
		f.Fatal(err)
	}
	if err := os.Symlink("../sibling", filepath.Join(src, "a/s")); err != nil {
		f.Fatal(err)
	}
	valid, _ := writeArchive(f, src, IDMap{})
	f.Add(valid, false)
	f.Add(tarOfArchive(f, valid), true)
	f.Add([]byte("garbage"), false)

	enc, err := zstd.NewWriter(nil, zstd.WithEncoderConcurrency(1), zstd.WithWindowSize(1<<20))
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte, compressed bool) {
		if compressed {
			data = enc.EncodeAll(data, nil)
		}
		parent := t.TempDir()
		removable(t, parent)
		root := filepath.Join(parent, "root")
		for _, d := range []string{root, filepath.Join(parent, "sibling")} {
			if err := os.Mkdir(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := Extract(ctx, bytes.NewReader(data), openDir(t, root), runtime.ArchiveLimits{MaxBytes: 1 << 20, MaxFiles: 1000}, IDMap{})
		if err != nil && !errors.Is(err, ErrInvalid) && !errors.Is(err, ErrTooLarge) {
			t.Fatalf("Extract: %v, want nil, ErrInvalid or ErrTooLarge", err)
		}
		checkNothingOutside(t, parent)
		if ents, _ := os.ReadDir(outside); len(ents) != 0 {
			t.Fatalf("written outside: %v", ents)
		}
	})
}

// tarOfArchive decompresses an archive.
func tarOfArchive(t testing.TB, data []byte) []byte {
	t.Helper()
	var out bytes.Buffer
	dec := mustDecoder(t, data)
	defer dec.Close()
	if _, err := out.ReadFrom(dec); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}

// FuzzCheckAgreesWithExtract: whatever the bytes, Check gives Extract's verdict
// (accepted, ErrInvalid or ErrTooLarge): an archive Check passes is one a restore can
// extract, and one it refuses is one Extract refuses.
func FuzzCheckAgreesWithExtract(f *testing.F) {
	outside := f.TempDir()
	for _, c := range attackCases() {
		f.Add(c.raw(f, outside))
	}
	f.Add(rawTar(f, dirEnt("./"), dirEnt("a/"), dirEnt("a/b/"), fileEnt("a/b/f", "x"), fileEnt("a/g", "y"), linkEnt("s", "a"), fileEnt("z", "z")))
	f.Add(rawTar(f, dirEnt("./"), dirEnt("a/"), fileEnt("a/x", "x"), fileEnt("b", "x"), fileEnt("a", "x")))
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderConcurrency(1), zstd.WithWindowSize(1<<20))
	if err != nil {
		f.Fatal(err)
	}
	limits := runtime.ArchiveLimits{MaxBytes: 1 << 20, MaxFiles: 1000}
	f.Fuzz(func(t *testing.T, raw []byte) {
		data := enc.EncodeAll(raw, nil)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, checkErr := Check(ctx, bytes.NewReader(data), limits)
		_, _, extractErr := extractFresh(t, data, limits, IDMap{})
		if verdict(checkErr) != verdict(extractErr) {
			t.Fatalf("Check: %v; Extract: %v", checkErr, extractErr)
		}
	})
}
