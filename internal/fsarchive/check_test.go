package fsarchive

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// TestCheck: Check counts an archive's own statistics (as Write made it), and refuses
// every attack case Extract refuses, also those of the tree (an entry through a
// symlink or a file, a parent missing, out of order, a repeated path, a symlink's own
// checks): an archive Check passes is one a restore can extract.
func TestCheck(t *testing.T) {
	src := t.TempDir()
	if err := os.MkdirAll(filepath.Join(src, "d", "e"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, n := range map[string]int{"a": 1000, "d/b": 70000, "d/e/c": 0} {
		if err := os.WriteFile(filepath.Join(src, name), bigContent(n, uint64(n)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("../a", filepath.Join(src, "d", "l")); err != nil {
		t.Fatal(err)
	}
	good, wrote := writeArchive(t, src, IDMap{})
	got, err := Check(context.Background(), bytes.NewReader(good), runtime.ArchiveLimits{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Files != wrote.Files || got.Bytes != wrote.Bytes || got.Bytes != 71000 {
		t.Errorf("Check counted %+v, Write wrote %+v (71000 bytes)", got, wrote)
	}
	if _, err := Check(context.Background(), bytes.NewReader(good), runtime.ArchiveLimits{MaxBytes: 70999}); !errors.Is(err, ErrTooLarge) {
		t.Errorf("Check over MaxBytes: %v, want ErrTooLarge", err)
	}
	if _, err := Check(context.Background(), bytes.NewReader(good), runtime.ArchiveLimits{MaxFiles: wrote.Files - 1}); !errors.Is(err, ErrTooLarge) {
		t.Errorf("Check over MaxFiles: %v, want ErrTooLarge", err)
	}
	for name, data := range map[string][]byte{
		"empty": nil, "truncated": good[:len(good)/2], "trailing-garbage": append(bytes.Clone(good), "x"...),
		"glued": append(bytes.Clone(good), good...),
	} {
		if _, err := Check(context.Background(), bytes.NewReader(data), runtime.ArchiveLimits{}); !errors.Is(err, ErrInvalid) {
			t.Errorf("Check %s: %v, want ErrInvalid", name, err)
		}
	}
	for _, c := range attackCases() {
		t.Run(c.name, func(t *testing.T) {
			_, err := Check(context.Background(), bytes.NewReader(compress(t, c.raw(t, t.TempDir()))), c.limits)
			if !errors.Is(err, c.want) {
				t.Errorf("Check: %v, want %v (every archive Extract refuses)", err, c.want)
			}
		})
	}
}
