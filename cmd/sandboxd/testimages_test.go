package main

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestTestImageMirrorIsDevOnly: `sandboxd dev`, the single-machine demo, serves the test
// images as docker.io by default; `sandboxd runner` has no way to, so a runner on a host
// where `make images` ran still pulls docker.io images from Docker Hub. (That no code
// path of runner, gateway or controlplane reaches internal/testimage at all is
// internal/archtest's TestDependencyRules.)
func TestTestImageMirrorIsDevOnly(t *testing.T) {
	if cmd := os.Getenv("SANDBOXD_TEST_HELP_OF"); cmd != "" {
		// The child: print the subcommand's flags (-h exits 0).
		err := map[string]func([]string) error{"dev": dev, "runner": runnerCmd}[cmd]([]string{"-h"})
		t.Fatalf("%s -h returned %v instead of exiting", cmd, err)
	}
	help := func(cmd string) string {
		c := exec.Command(os.Args[0], "-test.run=^TestTestImageMirrorIsDevOnly$")
		c.Env = append(os.Environ(), "SANDBOXD_TEST_HELP_OF="+cmd)
		out, err := c.CombinedOutput()
		if err != nil {
			t.Fatalf("%s -h: %v\n%s", cmd, err, out)
		}
		if !strings.Contains(string(out), "-data-dir") {
			t.Fatalf("%s -h printed no flags:\n%s", cmd, out)
		}
		return string(out)
	}
	if out := help("runner"); strings.Contains(out, "test-image") {
		t.Errorf("sandboxd runner offers a test image flag:\n%s", out)
	}
	_, usage, _ := strings.Cut(help("dev"), "-test-image-mirror\n")
	if usage, _, _ = strings.Cut(usage, "\n"); !strings.Contains(usage, "dev only") || !strings.HasSuffix(usage, "(default true)") {
		t.Errorf("sandboxd dev -test-image-mirror: %q, want a dev-only flag on by default", usage)
	}
}
