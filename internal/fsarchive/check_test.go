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

// verdict is an archive's outcome as the callers see it: accepted, ErrInvalid or
// ErrTooLarge (anything else is spelled out, to fail a comparison).
func verdict(err error) string {
	switch {
	case err == nil:
		return "accepted"
	case errors.Is(err, ErrInvalid) && errors.Is(err, ErrTooLarge):
		return "both: " + err.Error()
	case errors.Is(err, ErrInvalid):
		return "ErrInvalid"
	case errors.Is(err, ErrTooLarge):
		return "ErrTooLarge"
	}
	return "other: " + err.Error()
}

// TestCheckAgreesWithExtract: over crafted archives, those the tree's rules accept
// (nesting, going back up, the same base name in other directories, a symlink beside
// an entry) and those they refuse (the attack cases, a name repeated after its
// directory's subtree, a directory re-entered), Check and Extract give the same
// verdict: the rules of the root entry, the parent and the repeated path are one.
func TestCheckAgreesWithExtract(t *testing.T) {
	type crafted struct {
		name   string
		raw    func(t testing.TB, outside string) []byte
		limits runtime.ArchiveLimits
		want   string
	}
	tarOf := func(ents ...ent) func(testing.TB, string) []byte {
		return func(t testing.TB, _ string) []byte { return rawTar(t, ents...) }
	}
	cases := []crafted{
		{name: "root-only", raw: tarOf(dirEnt("./")), want: "accepted"},
		{name: "root-dot", raw: tarOf(dirEnt("."), fileEnt("f", "x")), want: "accepted"},
		{name: "nested-and-back-up", raw: tarOf(dirEnt("./"), dirEnt("a/"), dirEnt("a/b/"), fileEnt("a/b/f", "x"),
			fileEnt("a/g", "y"), dirEnt("c/"), fileEnt("c/x", ""), fileEnt("z", "z")), want: "accepted"},
		{name: "deep-then-root", raw: tarOf(dirEnt("./"), dirEnt("a/"), dirEnt("a/b/"), dirEnt("a/b/c/"),
			fileEnt("a/b/c/f", "x"), fileEnt("g", "y")), want: "accepted"},
		{name: "same-base-other-dirs", raw: tarOf(dirEnt("./"), dirEnt("a/"), dirEnt("a/d/"), fileEnt("a/d/d", "x"),
			dirEnt("b/"), dirEnt("b/d/"), fileEnt("b/d/d", "x"), fileEnt("d", "x")), want: "accepted"},
		{name: "same-base-as-parent", raw: tarOf(dirEnt("./"), dirEnt("a/"), dirEnt("a/a/"), fileEnt("a/a/a", "x")), want: "accepted"},
		{name: "symlink-beside", raw: tarOf(dirEnt("./"), linkEnt("s", "../x"), fileEnt("t", "x"), dirEnt("u/")), want: "accepted"},
		{name: "exact-limits", raw: tarOf(dirEnt("./"), fileEnt("a", "012345"), fileEnt("b", "0123")),
			limits: runtime.ArchiveLimits{MaxFiles: 3, MaxBytes: 10}, want: "accepted"},
		{name: "repeat-after-subtree", raw: tarOf(dirEnt("./"), dirEnt("a/"), fileEnt("a/x", "x"), fileEnt("b", "x"), fileEnt("a", "x")), want: "ErrInvalid"},
		{name: "dir-repeated-after-subtree", raw: tarOf(dirEnt("./"), dirEnt("a/"), fileEnt("a/f", "x"), dirEnt("a/")), want: "ErrInvalid"},
		{name: "re-enter-left-dir", raw: tarOf(dirEnt("./"), dirEnt("a/"), dirEnt("a/b/"), fileEnt("c", "x"), fileEnt("a/b/x", "x")), want: "ErrInvalid"},
		{name: "child-of-symlink-beside-dir", raw: tarOf(dirEnt("./"), dirEnt("d/"), linkEnt("s", "d"), fileEnt("s/x", "x")), want: "ErrInvalid"},
		{name: "root-second-as-dot", raw: tarOf(dirEnt("./"), dirEnt(".")), want: "ErrInvalid"},
		{name: "root-dir-first-is-file", raw: tarOf(fileEnt("f", "x"), dirEnt("./")), want: "ErrInvalid"},
	}
	for _, c := range attackCases() {
		cases = append(cases, crafted{name: "attack-" + c.name, raw: c.raw, limits: c.limits, want: verdict(c.want)})
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			data := compress(t, c.raw(t, t.TempDir()))
			_, checkErr := Check(context.Background(), bytes.NewReader(data), c.limits)
			_, _, extractErr := extractFresh(t, data, c.limits, IDMap{})
			if got := verdict(checkErr); got != c.want {
				t.Errorf("Check: %s (%v), want %s", got, checkErr, c.want)
			}
			if got := verdict(extractErr); got != c.want {
				t.Errorf("Extract: %s (%v), want %s", got, extractErr, c.want)
			}
		})
	}
}
