package fsarchive

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// TestExtractWithExisting: directories made before the fill (a kubelet's sub_path dirs,
// ExtractOptions.Existing) are filled by the archive's directories at their paths, in
// place (the same inode: a mount of it shows the content); a missing one stays as it
// was; a file or symlink of the archive there (or on the way) is refused with ErrNotDir
// and the directory stays a directory; a root holding anything else is refused with
// ErrNotEmpty; a repeated directory is still a repeated path.
func TestExtractWithExisting(t *testing.T) {
	ctx := context.Background()
	// mk makes a root holding the dirs, returns it and the inode of its last dir.
	mk := func(t *testing.T, dirs ...string) (string, uint64) {
		t.Helper()
		root := t.TempDir()
		var ino uint64
		for _, d := range dirs {
			p := filepath.Join(root, d)
			if err := os.MkdirAll(p, 0o777); err != nil {
				t.Fatal(err)
			}
			fi, err := os.Stat(p)
			if err != nil {
				t.Fatal(err)
			}
			ino = inode(fi)
		}
		return root, ino
	}
	extract := func(t *testing.T, root string, data []byte, existing ...string) error {
		t.Helper()
		f := openDir(t, root)
		defer f.Close()
		_, err := ExtractWith(ctx, bytes.NewReader(data), f, runtime.ArchiveLimits{MaxBytes: 1 << 20}, ExtractOptions{Existing: existing})
		return err
	}

	// The archive's a/b fills the existing a/b in place.
	root, ino := mk(t, "a/b")
	data := archive(t, dirEnt("./"), dirEnt("a/"), dirEnt("a/b/"), fileEnt("a/b/f.txt", "content"), fileEnt("top.txt", "top"))
	if err := extract(t, root, data, "a/b"); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(root, "a/b"))
	if err != nil || inode(fi) != ino || fi.Mode().Perm() != 0o755 {
		t.Errorf("a/b after the fill: %v (inode %d, want %d), %v; want the same directory, mode 0755 as archived", fi.Mode(), inode(fi), ino, err)
	}
	for name, want := range map[string]string{"a/b/f.txt": "content", "top.txt": "top"} {
		if got, err := os.ReadFile(filepath.Join(root, name)); err != nil || string(got) != want {
			t.Errorf("%s: %q, %v", name, got, err)
		}
	}

	// Not in the archive: the existing directory stays (as its maker made it).
	root, ino = mk(t, "x/y")
	if err := extract(t, root, archive(t, dirEnt("./"), fileEnt("f", "1")), "x/y"); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(filepath.Join(root, "x/y")); err != nil || !fi.IsDir() || inode(fi) != ino {
		t.Errorf("missing from the archive: %v, %v; want the existing directory", fi, err)
	}

	// A symlink or file where a directory exists: ErrNotDir; nothing followed, the
	// directory stays.
	canary := t.TempDir()
	for name, ents := range map[string][]ent{
		"symlink":               {dirEnt("./"), linkEnt("s", canary)},
		"file":                  {dirEnt("./"), fileEnt("s", "x")},
		"symlink on the way":    {dirEnt("./"), dirEnt("p/"), linkEnt("p/q", canary)},
		"relative symlink":      {dirEnt("./"), dirEnt("p/"), linkEnt("p/q", "..")},
		"file on the way (top)": {dirEnt("./"), fileEnt("p", "x")},
	} {
		sub := "s"
		if name != "symlink" && name != "file" {
			sub = "p/q/r"
		}
		root, _ := mk(t, sub)
		err := extract(t, root, archive(t, ents...), sub)
		if !errors.Is(err, ErrNotDir) {
			t.Errorf("%s: %v, want ErrNotDir", name, err)
		}
		if fi, err := os.Lstat(filepath.Join(root, sub)); err != nil || !fi.IsDir() {
			t.Errorf("%s: %s after the refusal: %v, %v; want the directory", name, sub, fi, err)
		}
		if ents, _ := os.ReadDir(canary); len(ents) != 0 {
			t.Errorf("%s: something was written through the symlink: %v", name, ents)
		}
	}

	// Listed but not made (the kubelet did not make it, or not yet): a file or symlink of
	// the archive at the path (or on the way) is still refused, nothing is made there.
	for name, ents := range map[string][]ent{
		"symlink to /":       {dirEnt("./"), linkEnt("s", "/")},
		"symlink":            {dirEnt("./"), linkEnt("s", canary)},
		"file":               {dirEnt("./"), fileEnt("s", "x")},
		"symlink on the way": {dirEnt("./"), dirEnt("p/"), linkEnt("p/q", canary)},
		"file on the way":    {dirEnt("./"), fileEnt("p", "x")},
	} {
		sub, top := "s", "s"
		if strings.HasSuffix(name, "on the way") {
			sub, top = "p/q/r", "p"
		}
		root, _ := mk(t)
		err := extract(t, root, archive(t, ents...), sub)
		if !errors.Is(err, ErrNotDir) {
			t.Errorf("listed, not made, %s: %v, want ErrNotDir", name, err)
		}
		if fi, err := os.Lstat(filepath.Join(root, sub)); err == nil {
			t.Errorf("listed, not made, %s: %s made: %v", name, sub, fi.Mode())
		}
		if fi, err := os.Lstat(filepath.Join(root, top)); err == nil && !fi.IsDir() {
			t.Errorf("listed, not made, %s: %s is a %v", name, top, fi.Mode())
		}
	}
	// Listed, not made, and the archive makes it a directory: filled as usual.
	root, _ = mk(t)
	if err := extract(t, root, archive(t, dirEnt("./"), dirEnt("n/"), fileEnt("n/f", "1")), "n"); err != nil {
		t.Errorf("listed, not made, archive's directory: %v", err)
	}

	// A root holding anything else (a file, a directory not listed, a symlink where a
	// listed directory should be) is refused before anything is extracted.
	for name, prep := range map[string]func(root string) error{
		"file":     func(root string) error { return os.WriteFile(filepath.Join(root, "a", "planted"), nil, 0o600) },
		"dir":      func(root string) error { return os.Mkdir(filepath.Join(root, "other"), 0o700) },
		"symlink":  func(root string) error { return os.Symlink(canary, filepath.Join(root, "a", "b")) },
		"top file": func(root string) error { return os.WriteFile(filepath.Join(root, "planted"), nil, 0o600) },
	} {
		root, _ := mk(t, "a")
		if err := prep(root); err != nil {
			t.Fatal(err)
		}
		err := extract(t, root, archive(t, dirEnt("./"), fileEnt("f", "1")), "a/b")
		if !errors.Is(err, ErrNotEmpty) {
			t.Errorf("root with a %s: %v, want ErrNotEmpty", name, err)
		}
		if _, serr := os.Lstat(filepath.Join(root, "f")); serr == nil {
			t.Errorf("root with a %s: extracted anyway", name)
		}
	}

	// A repeated directory is still refused (the existing one is filled once).
	root, _ = mk(t, "a")
	if err := extract(t, root, archive(t, dirEnt("./"), dirEnt("a/"), dirEnt("a/")), "a"); !errors.Is(err, ErrInvalid) {
		t.Errorf("a repeated existing directory: %v, want ErrInvalid", err)
	}
	// Bad existing paths are refused.
	for _, bad := range []string{"../x", "/abs", "a/../b", "", ".", strings.Repeat("n", MaxName+1), strings.Repeat("a/", MaxPath/2) + "a"} {
		root, _ := mk(t)
		if err := extract(t, root, archive(t, dirEnt("./")), bad); !errors.Is(err, ErrBadOptions) {
			t.Errorf("existing %.40q: %v, want ErrBadOptions", bad, err)
		}
		if err := CheckExisting([]string{bad}); !errors.Is(err, ErrBadOptions) {
			t.Errorf("CheckExisting(%.40q): %v, want ErrBadOptions", bad, err)
		}
	}
	many := make([]string, MaxExisting+1)
	for i := range many {
		many[i] = fmt.Sprintf("d%d", i)
	}
	if err := CheckExisting(many); !errors.Is(err, ErrBadOptions) {
		t.Errorf("%d existing: %v, want ErrBadOptions", len(many), err)
	}
	if err := CheckExisting(many[:MaxExisting]); err != nil {
		t.Errorf("%d existing: %v", MaxExisting, err)
	}
	// Without Existing, the options change nothing: an empty root is extracted into.
	root, _ = mk(t)
	if err := extract(t, root, data); err != nil {
		t.Errorf("no existing dirs: %v", err)
	}
}

func inode(fi os.FileInfo) uint64 {
	if fi == nil {
		return 0
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Ino
	}
	return 0
}
