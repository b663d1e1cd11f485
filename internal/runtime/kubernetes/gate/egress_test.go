package gate

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestInstallEgressBundle: without the CA nothing is written; with it ca.pem is the CA
// and bundle.pem the roots (a newline added when they lack one) then the CA, both mode
// 0444; without roots bundle.pem is the CA alone; an oversize source is refused.
func TestInstallEgressBundle(t *testing.T) {
	write := func(t *testing.T, dir, name, data string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	read := func(t *testing.T, dir, name string) (string, os.FileMode) {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		fi, _ := os.Stat(filepath.Join(dir, name))
		return string(b), fi.Mode().Perm()
	}
	t.Run("no CA", func(t *testing.T) {
		src, dst := t.TempDir(), t.TempDir()
		write(t, src, EgressRootsFile, "ROOTS\n")
		if err := InstallEgressBundle(src, dst); err != nil {
			t.Fatal(err)
		}
		if ents, _ := os.ReadDir(dst); len(ents) != 0 {
			t.Fatalf("wrote %v", ents)
		}
	})
	for _, c := range []struct{ name, roots, want string }{
		{"roots without newline", "ROOTS", "ROOTS\nCA\n"},
		{"roots with newline", "ROOTS\n", "ROOTS\nCA\n"},
		{"no roots", "", "CA\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			src, dst := t.TempDir(), t.TempDir()
			write(t, src, EgressCAFile, "CA\n")
			if c.roots != "" {
				write(t, src, EgressRootsFile, c.roots)
			}
			if err := InstallEgressBundle(src, dst); err != nil {
				t.Fatal(err)
			}
			if ca, mode := read(t, dst, "ca.pem"); ca != "CA\n" || mode != 0o444 {
				t.Errorf("ca.pem %q mode %v", ca, mode)
			}
			if b, mode := read(t, dst, "bundle.pem"); b != c.want || mode != 0o444 {
				t.Errorf("bundle.pem %q mode %v, want %q 0444", b, mode, c.want)
			}
			if ents, _ := os.ReadDir(dst); len(ents) != 2 {
				t.Errorf("%d files (temporary files left?)", len(ents))
			}
		})
	}
	t.Run("oversize", func(t *testing.T) {
		src, dst := t.TempDir(), t.TempDir()
		write(t, src, EgressCAFile, "CA\n")
		write(t, src, EgressRootsFile, strings.Repeat("x", maxEgressPEM+1))
		if err := InstallEgressBundle(src, dst); err == nil || !strings.Contains(err.Error(), "larger") {
			t.Fatalf("oversize roots: %v", err)
		}
		if _, err := os.Stat(filepath.Join(dst, "bundle.pem")); err == nil {
			t.Error("bundle.pem written from oversize roots")
		}
	})
}
