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

// TestCheckMetricsComplains: CheckMetrics reports what promtool finds wrong (so a clean
// result means something).
func TestCheckMetricsComplains(t *testing.T) {
	if testing.Short() {
		t.Skip("runs promtool")
	}
	out := CheckMetrics(t, []byte("# HELP bad_total a\n# TYPE bad_total gauge\nbad_total 1\n"))
	if !strings.Contains(out, "bad_total") {
		t.Errorf("promtool found nothing wrong with a gauge named _total: %q", out)
	}
}
