// Package textclip bounds text that is quoted back to someone (in an error, a status
// reason, a stored message): a caller's or a cluster's string can be any length and any
// bytes, and what quotes it must stay short and valid UTF-8. Protobuf strings must be
// valid UTF-8, so an invalid byte in an error's detail makes the whole detail fail to
// marshal; cutting a string in the middle of a character makes such a byte out of valid
// input. One function does both right, so no package keeps a copy that does it wrong.
package textclip

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// Marker ends a string that Clip cut, so a reader knows there was more.
const Marker = "…"

// replacement stands for a run of bytes that are not UTF-8 (as strings.ToValidUTF8).
const replacement = "\uFFFD"

// Clip returns s as valid UTF-8 of at most n bytes: every run of invalid bytes becomes
// U+FFFD, and when that does not fit in n bytes it is cut on a character boundary and
// ends with Marker (the marker counts toward n). When n is smaller than the marker there
// is no room to mark the cut: Clip returns the longest whole-character prefix that fits.
// A negative n is 0. s itself is returned, without copying, when it is valid and fits.
func Clip(s string, n int) string {
	n = max(n, 0)
	if len(s) <= n && utf8.ValidString(s) {
		return s
	}
	// Read s only as far as n bytes of output reach: s may be huge.
	var b strings.Builder
	b.Grow(min(len(s), n) + len(replacement))
	i, invalid := 0, false
	for i < len(s) && b.Len() <= n {
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			if !invalid {
				b.WriteString(replacement)
			}
			invalid = true
		} else {
			b.WriteString(s[i : i+size])
			invalid = false
		}
		i += size
	}
	out := b.String()
	if i == len(s) && len(out) <= n {
		return out
	}
	if n < len(Marker) {
		return out[:runeCut(out, n)]
	}
	return out[:runeCut(out, n-len(Marker))] + Marker
}

// runeCut is the largest k <= max that is a character boundary of the valid UTF-8 s.
func runeCut(s string, limit int) int {
	if limit >= len(s) {
		return len(s)
	}
	for limit > 0 && !utf8.RuneStart(s[limit]) {
		limit--
	}
	return limit
}

// AllPrintable reports whether s is valid UTF-8 holding only printable runes
// (unicode.IsPrint: no control characters, tabs, newlines, escape sequences or
// bidirectional overrides). It is the one test of "safe to show as it is" for text a
// caller or a sandbox controls.
func AllPrintable(s string) bool {
	return utf8.ValidString(s) && !strings.ContainsFunc(s, func(r rune) bool { return !unicode.IsPrint(r) })
}
