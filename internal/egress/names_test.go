package egress

import (
	"strings"
	"testing"
)

func TestMatchName(t *testing.T) {
	for _, tc := range []struct {
		pattern, name string
		want          bool
	}{
		{"api.example.com", "api.example.com", true},
		{"api.example.com", "API.Example.COM", true},
		{"API.example.com.", "api.example.com", true},
		{"api.example.com", "api.example.com.", true},
		{"api.example.com", "example.com", false},
		{"api.example.com", "x.api.example.com", false},
		{"api.example.com", "api.example.co", false},
		{"api.example.com", "api-example.com", false},
		{"*.example.com", "a.example.com", true},
		{"*.example.com", "A.EXAMPLE.com.", true},
		{"*.example.com", "a.b.example.com", false}, // exactly one extra label
		{"*.example.com", "example.com", false},     // the apex is not under the wildcard
		{"*.example.com", ".example.com", false},
		{"*.example.com", "aexample.com", false},
		{"*.example.com", "a.example.com.evil.net", false},
		{"*.example.com", "*.example.com", false}, // a wildcard is never a host name
		{"*.example.com", "", false},
		{"", "", false},
		{"*.", "a.", false},
		{"example.com", "*.com", false},
		{"k.example.com", "\u212a.example.com", false}, // Kelvin sign: no Unicode folding
	} {
		if got := MatchName(tc.pattern, tc.name); got != tc.want {
			t.Errorf("MatchName(%q, %q) = %v, want %v", tc.pattern, tc.name, got, tc.want)
		}
	}
}

func TestValidPattern(t *testing.T) {
	long := strings.Repeat("a", 63)
	for _, tc := range []struct {
		pattern string
		wantErr string // "" for valid; else a substring of the error
	}{
		{"example.com", ""},
		{"api.example.com", ""},
		{"*.example.com", ""},
		{"*.api.example.com", ""},
		{"Example.COM", ""},
		{"example.com.", ""},
		{"xn--bcher-kva.example", ""},
		{"a-b.c0.io", ""},
		{"123.example.com", ""}, // numeric labels are fine, just not the last one
		{long + ".com", ""},
		{strings.Repeat(long+".", 3) + strings.Repeat("a", 61), ""}, // 253 characters
		{strings.Repeat(long+".", 3) + strings.Repeat("a", 62), "more than 253"},
		{long + "a.com", "more than 63"},
		{"", "is empty"},
		{".", "is empty"},
		{"com", "at least two labels"},
		{"localhost", "at least two labels"},
		{"*.com", "every name under the top-level domain"},
		{"*", "at least two labels"},
		{"*.*.example.com", "wildcard"},
		{"a.*.example.com", "wildcard"},
		{"a*.example.com", "wildcard"},
		{"*a.example.com", "wildcard"},
		{"example.*", "wildcard"},
		{"**.example.com", "wildcard"},
		{"a..example.com", "empty label"},
		{".example.com", "empty label"},
		{"example.com..", "empty label"},
		{"-a.example.com", "starts or ends with '-'"},
		{"a-.example.com", "starts or ends with '-'"},
		{"a_b.example.com", "only letters, digits and '-'"},
		{"a b.example.com", "only letters, digits and '-'"},
		{"bücher.example", "only letters, digits and '-'"},
		{"example.com/path", "only letters, digits and '-'"},
		{"example.com:443", "only letters, digits and '-'"},
		{"https://example.com", "only letters, digits and '-'"},
		{"203.0.113.7", "IP address"},
		{"2001:db8::1", "IP address"},
		{"[2001:db8::1]", "IP address"},
		{"::ffff:1.2.3.4", "IP address"},
		{"10.1", "all digits"},
		{"0x7f.1", "all digits"},
		{"1.2.3.4.5", "all digits"},
		{"*.10.0.0", "all digits"},
	} {
		err := ValidPattern(tc.pattern)
		switch {
		case tc.wantErr == "" && err != nil:
			t.Errorf("ValidPattern(%q) = %v, want valid", tc.pattern, err)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("ValidPattern(%q) = %v, want an error containing %q", tc.pattern, err, tc.wantErr)
		}
	}
}

// FuzzValidPattern: whatever ValidPattern accepts has the documented shape, and grants
// through MatchName exactly the names that shape says.
func FuzzValidPattern(f *testing.F) {
	for _, s := range []string{"example.com", "*.example.com", "a-b.c.d.", "1.2.3.4", "*.com", "a..b", "A.B.c", "0x7f.1"} {
		f.Add(s, "x.example.com")
	}
	f.Fuzz(func(t *testing.T, pattern, name string) {
		matched := MatchName(pattern, name)
		if err := ValidPattern(pattern); err != nil {
			if err.Error() == "" {
				t.Fatal("empty error message")
			}
			return
		}
		p := strings.ToLower(strings.TrimSuffix(pattern, "."))
		rest, wild := strings.CutPrefix(p, "*.")
		if len(p) > maxNameLen || strings.Count(rest, ".") < 1 || strings.ContainsAny(rest, "*_ /:[]") {
			t.Fatalf("accepted %q", pattern)
		}
		for i := range len(rest) {
			if c := rest[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '.') {
				t.Fatalf("accepted %q with %q", pattern, c)
			}
		}
		// A valid pattern grants its own name (or one label under it), and nothing
		// that is not that name or one label under it.
		self := rest
		if wild {
			self = "x." + rest
		}
		if !MatchName(pattern, self) || !MatchName(pattern, strings.ToUpper(self)+".") {
			t.Fatalf("%q does not grant %q", pattern, self)
		}
		if matched {
			n := asciiLower(strings.TrimSuffix(name, "."))
			if !wild && n != rest {
				t.Fatalf("%q granted %q", pattern, name)
			}
			if label, ok := strings.CutSuffix(n, "."+rest); wild && (!ok || label == "" || strings.Contains(label, ".")) {
				t.Fatalf("%q granted %q", pattern, name)
			}
		}
	})
}
