package agent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// anySum is a well-formed SHA-256 that no test program has.
var anySum = strings.Repeat("ab", 32)

// TestInstallSeccompFilterRefuses: what is not a classic BPF program of at most 4096
// instructions is refused before the kernel sees it (the agent then exits), as is a
// missing file. (Installing a real one: internal/runtime/local TestSeccompCached.)
func TestInstallSeccompFilterRefuses(t *testing.T) {
	dir := t.TempDir()
	for name, size := range map[string]int{"empty": 0, "not whole instructions": 12, "too long": 4097 * 8} {
		p := filepath.Join(dir, strings.ReplaceAll(name, " ", "-"))
		if err := os.WriteFile(p, make([]byte, size), 0o444); err != nil {
			t.Fatal(err)
		}
		if err := InstallSeccompFilter(p, anySum); err == nil || !strings.Contains(err.Error(), "no BPF program") {
			t.Errorf("%s: %v", name, err)
		}
	}
	if err := InstallSeccompFilter(filepath.Join(dir, "missing"), anySum); err == nil {
		t.Error("missing file: no error")
	}
}

// TestInstallSeccompFilterFollowsNoSymlink: the filter's path is opened with no symlink
// followed in any component (a sandbox image's /.sandboxd or /.sandboxd/seccomp.bpf a
// symlink into a volume must not hand the agent another program): a symlink as the
// file or as a parent directory is refused before anything is read, as is a FIFO.
func TestInstallSeccompFilterFollowsNoSymlink(t *testing.T) {
	dir := t.TempDir()
	real := filepath.Join(dir, "real")
	if err := os.Mkdir(real, 0o755); err != nil {
		t.Fatal(err)
	}
	// Whole instructions, so that only the symlink check can refuse it.
	if err := os.WriteFile(filepath.Join(real, "f.bpf"), make([]byte, 8), 0o444); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(real, "f.bpf"), filepath.Join(dir, "file-link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(real, filepath.Join(dir, "dir-link")); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mkfifo(filepath.Join(dir, "fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{filepath.Join(dir, "file-link"), filepath.Join(dir, "dir-link", "f.bpf"), filepath.Join(dir, "fifo"), "relative/f.bpf", real + "/../real/f.bpf"} {
		if err := InstallSeccompFilter(p, anySum); err == nil {
			t.Errorf("%s: installed", p)
		} else if strings.Contains(err.Error(), "no BPF program") || strings.Contains(err.Error(), "seccomp:") {
			t.Errorf("%s: read it: %v", p, err)
		}
	}
	f, err := openNoSymlinks(filepath.Join(real, "f.bpf"))
	if err != nil {
		t.Fatalf("the real file: %v", err)
	}
	f.Close()
}

// TestInstallSeccompFilterChecksSum: a program whose bytes do not have the SHA-256 the
// backend gave (another of its mounts redirected onto the path) is refused before the
// kernel sees it, as is a missing or malformed sum.
func TestInstallSeccompFilterChecksSum(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f.bpf")
	if err := os.WriteFile(p, make([]byte, 8), 0o444); err != nil {
		t.Fatal(err)
	}
	for _, sum := range []string{anySum, "", "abc", strings.Repeat("zz", 32)} {
		err := InstallSeccompFilter(p, sum)
		if err == nil || strings.Contains(err.Error(), "seccomp:") || !strings.Contains(err.Error(), "SHA-256") {
			t.Errorf("sum %q: %v", sum, err)
		}
	}
}
