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
		{strings.Repeat("9", 200), ""}, {"v1.0.0", ""}, {"v1.0.0", "ok\u202edegrade\u200b\u2066x\u00ad\U000e0041"},
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
		if strings.IndexFunc(why, unicode.IsControl) >= 0 || strings.IndexFunc(why, isFormat) >= 0 {
			t.Fatalf("control or format character kept in %q", why)
		}
		if len(why) != len(reason) && strings.IndexFunc(reason, unicode.IsControl) < 0 && strings.IndexFunc(reason, isFormat) < 0 {
			t.Fatalf("reason without control or format characters changed: %q -> %q", reason, why)
		}
	})
}

func isFormat(r rune) bool { return unicode.Is(unicode.Cf, r) }

// TestOneLineReplacesFormatCharacters: a runner's reason is shown to people; bidi
// overrides (U+202E makes "gpj.exe" read "exe.jpg"), isolates, zero-width and other
// invisible format characters (Unicode category Cf) would make it read otherwise than it
// says, so they become spaces like control characters do.
func TestOneLineReplacesFormatCharacters(t *testing.T) {
	for in, want := range map[string]string{
		"ok":                           "ok",
		"a\u202eb":                     "a b",
		"zero\u200bwidth":              "zero width",
		"\u2066iso\u2069 \u200f\u200e": " iso    ",
		"soft\u00adhyphen\ufeffbom":    "soft hyphen bom",
		"tag\U000e0041":                "tag ",
		"line\nbreak\x1b[31m":          "line break [31m",
		"é ü 日本 – “quoted”":            "é ü 日本 – “quoted”",
	} {
		if got := oneLine(in); got != want {
			t.Errorf("oneLine(%q) = %q, want %q", in, got, want)
		}
	}
	_, why := checkSelfUpdateFailure(&violations{}, "v1.0.0", "checksum ok\u202e for real")
	if why != "checksum ok  for real" {
		t.Errorf("checkSelfUpdateFailure kept a bidi override: %q", why)
	}
}
