package security

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/fsarchive"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// TestGlobalSubDirsAttacks: a Kubernetes runner fills a GLOBAL copy (sandbox-written
// content) into the directories the kubelet and runc made for the workload's sub_path
// mounts, working directories and nested mount points (fsarchive.ExtractWith Existing).
// Before this test the refusal of a symlink or file there depended on the directory
// having been made: with "s" listed but not (yet) made, an archive entry `s -> /` (or a
// symlink to a host canary) was extracted as a symlink where a mount would point. Now
// a listed path, made or not, and every directory on the way to it, can only be a
// directory of the archive (ErrNotDir, nothing made there); bad listed paths (".", a
// component over 255 bytes, more than 64) are refused before the root is touched
// (ErrBadOptions), so the kubelet's directories are never cleared for them.
func TestGlobalSubDirsAttacks(t *testing.T) {
	ctx := context.Background()
	canary := t.TempDir()
	if err := os.WriteFile(filepath.Join(canary, "host-secret"), []byte("host only\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	archiveOf := func(mk func(root string) error) []byte {
		t.Helper()
		root := t.TempDir()
		if err := mk(root); err != nil {
			t.Fatal(err)
		}
		f, err := os.Open(root)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		var buf bytes.Buffer
		if _, err := fsarchive.Write(ctx, f, &buf, fsarchive.IDMap{}); err != nil {
			t.Fatal(err)
		}
		return buf.Bytes()
	}
	extract := func(dst string, data []byte, existing ...string) error {
		f, err := os.Open(dst)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		_, err = fsarchive.ExtractWith(ctx, bytes.NewReader(data), f, runtime.ArchiveLimits{MaxBytes: 1 << 20}, fsarchive.ExtractOptions{Existing: existing})
		return err
	}
	for _, c := range []struct {
		name, listed, at string
		mk               func(root string) error
	}{
		{"symlink to / at a listed sub_path", "s", "s", func(root string) error { return os.Symlink("/", filepath.Join(root, "s")) }},
		{"symlink to a host dir at a listed sub_path", "s", "s", func(root string) error { return os.Symlink(canary, filepath.Join(root, "s")) }},
		{"symlink on the way", "p/q/r", "p/q", func(root string) error {
			if err := os.Mkdir(filepath.Join(root, "p"), 0o755); err != nil {
				return err
			}
			return os.Symlink(canary, filepath.Join(root, "p", "q"))
		}},
		{"relative symlink out", "a/b", "a", func(root string) error { return os.Symlink("..", filepath.Join(root, "a")) }},
		{"file at a working directory", "wd", "wd", func(root string) error { return os.WriteFile(filepath.Join(root, "wd"), []byte("x"), 0o644) }},
	} {
		dst := t.TempDir() // the kubelet made nothing (or not yet)
		err := extract(dst, archiveOf(c.mk), c.listed)
		if !errors.Is(err, fsarchive.ErrNotDir) {
			t.Errorf("%s, listed but not made: %v, want ErrNotDir", c.name, err)
		}
		if fi, lerr := os.Lstat(filepath.Join(dst, c.at)); lerr == nil && !fi.IsDir() {
			t.Errorf("%s: %s extracted as %v", c.name, c.at, fi.Mode())
		}
		dst = t.TempDir() // made, as the kubelet makes it
		if err := os.MkdirAll(filepath.Join(dst, c.listed), 0o777); err != nil {
			t.Fatal(err)
		}
		if err := extract(dst, archiveOf(c.mk), c.listed); !errors.Is(err, fsarchive.ErrNotDir) {
			t.Errorf("%s, made: %v, want ErrNotDir", c.name, err)
		}
		if fi, err := os.Lstat(filepath.Join(dst, c.listed)); err != nil || !fi.IsDir() {
			t.Errorf("%s, made: the directory is %v, %v", c.name, fi, err)
		}
	}
	if ents, _ := os.ReadDir(canary); len(ents) != 1 {
		t.Errorf("the canary holds %d entries, want host-secret alone", len(ents))
	}

	many := make([]string, fsarchive.MaxExisting+1)
	for i := range many {
		many[i] = "d" + strings.Repeat("x", i%200) + string(rune('a'+i%26)) + "/" + string(rune('a'+i/26))
	}
	for name, bad := range map[string][]string{".": {"."}, "a 256-byte component": {"s", strings.Repeat("n", 256)}, "65 paths": many, "..": {"s/../.."}} {
		dst := t.TempDir()
		if err := os.MkdirAll(filepath.Join(dst, "s"), 0o777); err != nil {
			t.Fatal(err)
		}
		if err := extract(dst, archiveOf(func(string) error { return nil }), bad...); !errors.Is(err, fsarchive.ErrBadOptions) {
			t.Errorf("listed %s: %v, want ErrBadOptions", name, err)
		}
		if fi, err := os.Stat(filepath.Join(dst, "s")); err != nil || !fi.IsDir() {
			t.Errorf("listed %s: the made directory is gone: %v", name, err)
		}
	}
}
