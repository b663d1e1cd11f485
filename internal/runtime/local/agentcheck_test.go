package local

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/testenv"
)

func TestCheckStaticExecutable(t *testing.T) {
	dir := t.TempDir()
	agent, err := testenv.Agent(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := checkStaticExecutable(agent); err != nil {
		t.Fatalf("the static agent `make agent` builds: %v", err)
	}
	script := filepath.Join(dir, "script")
	if err := os.WriteFile(script, []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct{ path, want string }{
		"a shell script":            {script, "not an ELF executable"},
		"a dynamically linked file": {"/bin/sh", "dynamically linked"},
		"missing":                   {filepath.Join(dir, "nope"), "not an ELF executable"},
	} {
		if err := checkStaticExecutable(tc.path); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error with %q", name, err, tc.want)
		}
	}
}
