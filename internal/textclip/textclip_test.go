package textclip

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestClip(t *testing.T) {
	for _, tc := range []struct {
		name, s string
		n       int
		want    string
	}{
		{"empty", "", 5, ""},
		{"fits", "hello", 5, "hello"},
		{"fits with room", "hello", 64, "hello"},
		{"one over", "hello!", 5, "he…"},
		{"ascii cut", strings.Repeat("a", 100), 10, "aaaaaaa…"},
		// é is 2 bytes: 7 bytes of room before the marker would split the fourth.
		{"two-byte rune at the cut", strings.Repeat("é", 10), 10, "ééé…"},
		{"three-byte rune at the cut", "€€€€", 8, "€…"},
		{"four-byte rune at the cut", "😀😀😀", 9, "😀…"},
		{"four-byte rune fits exactly", "😀😀", 8, "😀😀"},
		{"invalid byte replaced", "a\xffb", 10, "a\uFFFDb"},
		{"invalid run replaced once", "a\xff\xfe\xfdb", 10, "a\uFFFDb"},
		{"truncated rune in input", "ab\xe2\x82", 10, "ab\uFFFD"},
		{"invalid input grows past n", "\xff\xff a \xff", 6, "\uFFFD…"},
		{"replacement makes it not fit", "abc\xff", 5, "ab…"},
		{"n equals marker", "hello", 3, "…"},
		{"n smaller than marker", "hello", 2, "he"},
		{"n smaller than marker, rune", "éé", 1, ""},
		{"n smaller than marker, fits", "é", 2, "é"},
		{"zero", "hello", 0, ""},
		{"negative", "hello", -4, ""},
		{"marker in input kept", "a…", 4, "a…"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Clip(tc.s, tc.n)
			if got != tc.want {
				t.Errorf("Clip(%q, %d) = %q, want %q", tc.s, tc.n, got, tc.want)
			}
			if !utf8.ValidString(got) || len(got) > max(tc.n, 0) {
				t.Errorf("Clip(%q, %d) = %q: %d bytes, valid %v", tc.s, tc.n, got, len(got), utf8.ValidString(got))
			}
		})
	}
}

// TestClipReturnsInputUncopied: the common case (a short valid string) costs nothing.
func TestClipReturnsInputUncopied(t *testing.T) {
	s := strings.Repeat("x", 64)
	if allocs := testing.AllocsPerRun(100, func() { _ = Clip(s, 64) }); allocs != 0 {
		t.Errorf("%v allocations for a string that fits", allocs)
	}
}

// TestClipReadsOnlyWhatFits: a huge input costs what the output does.
func TestClipReadsOnlyWhatFits(t *testing.T) {
	huge := strings.Repeat("\xff", 1<<20)
	if got := Clip(huge, 16); got != "\uFFFD" {
		t.Errorf("Clip(1 MiB of 0xff, 16) = %q", got)
	}
	huge = strings.Repeat("é", 1<<20)
	if got := Clip(huge, 16); got != strings.Repeat("é", 6)+Marker {
		t.Errorf("Clip(1 MiB of é, 16) = %q", got)
	}
}

func FuzzClip(f *testing.F) {
	for _, s := range []string{"", "hello", "é€😀", "a\xffb", "\xe2\x82", strings.Repeat("é", 40), "…"} {
		for _, n := range []int{-1, 0, 1, 2, 3, 4, 5, 8, 64} {
			f.Add(s, n)
		}
	}
	f.Fuzz(func(t *testing.T, s string, n int) {
		n %= 1 << 16
		got := Clip(s, n)
		if !utf8.ValidString(got) {
			t.Fatalf("Clip(%q, %d) = %q: not UTF-8", s, n, got)
		}
		if len(got) > max(n, 0) {
			t.Fatalf("Clip(%q, %d) = %q: %d bytes", s, n, got, len(got))
		}
		valid := strings.ToValidUTF8(s, replacement)
		switch {
		case len(valid) <= n:
			// It fits: nothing is lost, nothing added.
			if got != valid {
				t.Fatalf("Clip(%q, %d) = %q, want %q", s, n, got, valid)
			}
		case n >= len(Marker):
			// Cut: a prefix of the valid text, marked, as long as fits.
			body, ok := strings.CutSuffix(got, Marker)
			if !ok || !strings.HasPrefix(valid, body) {
				t.Fatalf("Clip(%q, %d) = %q: not a marked prefix of %q", s, n, got, valid)
			}
			if r, size := utf8.DecodeRuneInString(valid[len(body):]); len(body)+size+len(Marker) <= n {
				t.Fatalf("Clip(%q, %d) = %q: %q would have fit too", s, n, got, r)
			}
		default:
			if !strings.HasPrefix(valid, got) {
				t.Fatalf("Clip(%q, %d) = %q: not a prefix of %q", s, n, got, valid)
			}
		}
	})
}

func TestAllPrintable(t *testing.T) {
	for s, want := range map[string]bool{
		"":                 true,
		"plain text 123":   true,
		"naïve 東京 ✓":       true,
		"tab\there":        false,
		"new\nline":        false,
		"esc\x1b[31m":      false,
		"bidi\u202eevil":   false,
		"bad utf8 \xff":    false,
		"nul\x00":          false,
		"zero width\u200b": false,
	} {
		if got := AllPrintable(s); got != want {
			t.Errorf("AllPrintable(%q) = %v, want %v", s, got, want)
		}
	}
}
