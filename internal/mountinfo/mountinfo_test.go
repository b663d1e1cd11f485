package mountinfo

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/internal/testenv"
)

func TestUnescape(t *testing.T) {
	for in, want := range map[string]string{
		"/plain":            "/plain",
		`/with\040space`:    "/with space",
		`/tab\011and\134bs`: "/tab\tand\\bs",
		`/end\040`:          "/end ",
		`/short\04`:         `/short\04`,
		`/not\999octal`:     `/not\999octal`,
	} {
		if got := unescape(in); got != want {
			t.Errorf("unescape(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestUnder: mounts below a dir (one with a space in its name among them) come back
// unescaped, deepest first; others do not.
func TestUnder(t *testing.T) {
	testenv.RequireRoot(t, "mounts")
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a b"), filepath.Join(dir, "a b", "c")
	for _, d := range []string{a, b} { // c is made on a's tmpfs
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mount("tmpfs", d, "tmpfs", 0, "size=1m"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = unix.Unmount(d, unix.MNT_DETACH) })
	}
	got, err := Under(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, []string{b, a}) {
		t.Errorf("Under = %q, want %q", got, []string{b, a})
	}
	// Several dirs: one read, the mounts below each, deepest first over all of them.
	other := t.TempDir()
	if err := unix.Mount("tmpfs", other, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(other, unix.MNT_DETACH) })
	if got, err := Under(other, dir, filepath.Join(t.TempDir(), "none")); err != nil || !slices.Equal(got, []string{b, a, other}) {
		t.Errorf("Under(3 dirs) = %q, %v; want %q", got, err, []string{b, a, other})
	}
	if ok, err := IsMountPoint(a); !ok || err != nil {
		t.Errorf("IsMountPoint(%q) = %v, %v", a, ok, err)
	}
	if ok, _ := IsMountPoint(dir); ok {
		t.Errorf("IsMountPoint(%q): the temp dir itself is no mount", dir)
	}
}
