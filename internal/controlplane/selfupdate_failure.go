package controlplane

import (
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/sandboxd/sandboxd/internal/release"
	"github.com/sandboxd/sandboxd/internal/store"
)

// checkSelfUpdateFailure validates the self-update failure a heartbeat reports
// (HeartbeatRequest fields 10 and 11) and returns it as the store keeps it. The runner is
// authenticated but still untrusted input: the version must be a release version, the
// reason is bounded (store.MaxSelfUpdateFailureLen bytes) and needs a version. Control
// characters (a multi-line error, a terminal escape) and format characters (bidi
// overrides) become spaces, because the reason is
// shown as one line by `sbx admin runner get` and in halt reasons.
func checkSelfUpdateFailure(vs *violations, version, reason string) (string, string) {
	if version != "" {
		if _, err := release.ParseVersion(version); err != nil {
			vs.add("self_update_failed_version", "%v", err)
		}
	}
	switch {
	case !utf8.ValidString(reason):
		vs.add("self_update_failure", "must be valid UTF-8")
	case len(reason) > store.MaxSelfUpdateFailureLen:
		vs.add("self_update_failure", "must be at most %d bytes (got %d)", store.MaxSelfUpdateFailureLen, len(reason))
	case reason != "" && version == "":
		vs.add("self_update_failure", "needs self_update_failed_version")
	}
	return version, oneLine(reason)
}

// oneLine replaces control characters and Unicode format characters (category Cf: bidi
// overrides such as U+202E that make a reason read differently from what it says, zero
// width spaces U+200B that hide text) with spaces. Same length or shorter in bytes: every
// such character is at least one byte, a space one.
func oneLine(s string) string {
	return strings.Map(func(r rune) rune {
		if unicode.IsControl(r) || unicode.Is(unicode.Cf, r) {
			return ' '
		}
		return r
	}, s)
}
