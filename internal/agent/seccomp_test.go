package agent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

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
		if err := InstallSeccompFilter(p); err == nil || !strings.Contains(err.Error(), "no BPF program") {
			t.Errorf("%s: %v", name, err)
		}
	}
	if err := InstallSeccompFilter(filepath.Join(dir, "missing")); err == nil {
		t.Error("missing file: no error")
	}
}
