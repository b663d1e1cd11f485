package controlplane

import (
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/sandboxd/sandboxd/internal/release"
	"github.com/sandboxd/sandboxd/internal/store"
)

// FuzzCheckSelfUpdateFailure: whatever a runner sends, an accepted report is a release
// version (or none) and a reason the store takes (bounded, valid UTF-8, one line, needing a
// version), and a refused one names its field.
func FuzzCheckSelfUpdateFailure(f *testing.F) {
	for _, s := range [][2]string{
		{"", ""}, {"v0.0.3", "release binaries refused: checksum mismatch"}, {"v1.2.3-rc.1", "line\nline\t\x1b[31m"},
		{"", "reason only"}, {"1.2", "x"}, {"v1.0.0", strings.Repeat("é", 600)}, {"v1.0.0", "\xff\xfe"},
		{strings.Repeat("9", 200), ""}, {"v1.0.0", ""},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, version, reason string) {
		var vs violations
		v, why := checkSelfUpdateFailure(&vs, version, reason)
		if len(vs) > 0 {
			for _, x := range vs {
				if x.Field != "self_update_failed_version" && x.Field != "self_update_failure" {
					t.Fatalf("violation on %q", x.Field)
				}
			}
			return
		}
		if v != version {
			t.Fatalf("version changed: %q -> %q", version, v)
		}
		if v != "" {
			if _, err := release.ParseVersion(v); err != nil {
				t.Fatalf("accepted version %q: %v", v, err)
			}
		}
		if len(v) > store.MaxSelfUpdateFailedVersionLen || len(why) > store.MaxSelfUpdateFailureLen || !utf8.ValidString(why) || (why != "" && v == "") {
			t.Fatalf("accepted %q %q", v, why)
		}
		if strings.IndexFunc(why, unicode.IsControl) >= 0 {
			t.Fatalf("control character kept in %q", why)
		}
		if len(why) != len(reason) && strings.IndexFunc(reason, unicode.IsControl) < 0 {
			t.Fatalf("reason without control characters changed: %q -> %q", reason, why)
		}
	})
}
