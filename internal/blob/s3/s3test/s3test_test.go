package s3test

import (
	"os"
	"strings"
	"testing"
)

// TestVersionMatchesScript: the binary Bin looks for is the one `make seaweedfs` builds.
func TestVersionMatchesScript(t *testing.T) {
	b, err := os.ReadFile("../../../../scripts/build-seaweedfs.sh")
	if err != nil {
		t.Fatal(err)
	}
	if want := `SANDBOXD_SEAWEEDFS_VERSION:-` + Version + `}`; !strings.Contains(string(b), want) {
		t.Errorf("scripts/build-seaweedfs.sh does not default to %s (want %q in it)", Version, want)
	}
}
