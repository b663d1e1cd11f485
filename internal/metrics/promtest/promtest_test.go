package promtest

import (
	"os"
	"strings"
	"testing"
)

// TestVersionMatchesScript: the binaries Bin looks for are the ones `make prometheus` builds.
func TestVersionMatchesScript(t *testing.T) {
	b, err := os.ReadFile("../../../scripts/build-prometheus.sh")
	if err != nil {
		t.Fatal(err)
	}
	if want := `SANDBOXD_PROMETHEUS_VERSION:-` + Version + `}`; !strings.Contains(string(b), want) {
		t.Errorf("scripts/build-prometheus.sh does not default to %s (want %q in it)", Version, want)
	}
}
