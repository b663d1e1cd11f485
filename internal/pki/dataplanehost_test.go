package pki_test

import (
	"net"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/pki"
)

func TestCheckTenantDataPlaneHost(t *testing.T) {
	const d = "sandboxd.example.com"
	for _, tc := range []struct {
		host, runner string
		ok           bool
	}{
		{"r1.sandboxd.example.com", "r1", true},
		{"dp.r1.sandboxd.example.com", "r1", true},
		{"a-1.b2.r1.sandboxd.example.com", "r1", true},
		{"xn--bcher-kva.r1.sandboxd.example.com", "r1", true}, // punycode is plain ASCII

		{"", "r1", false},
		{"r2.sandboxd.example.com", "r1", false},          // another runner's name
		{"dp.r2.sandboxd.example.com", "r1", false},       // under another runner's name
		{"xr1.sandboxd.example.com", "r1", false},         // not a label boundary
		{"r1.sandboxd.example.com.evil.com", "r1", false}, // suffix, not under
		{"sandboxd.example.com", "r1", false},
		{"platform-dp.internal", "r1", false},
		{"localhost", "r1", false},
		{"127.0.0.1", "r1", false},
		{"10.0.0.7", "r1", false},
		{"::1", "r1", false},
		{"[::1]", "r1", false},
		{"*.r1.sandboxd.example.com", "r1", false}, // wildcard
		{"r1.sandboxd.example.com.", "r1", false},  // trailing dot
		{"R1.sandboxd.example.com", "r1", false},   // upper case
		{"dp.R1.SANDBOXD.EXAMPLE.COM", "r1", false},
		{"dp.r1.sandboxd.example.com\x00", "r1", false},
		{"dр.r1.sandboxd.example.com", "r1", false},       // Cyrillic р
		{"dp.r1.sandboxd.example.com\u200b", "r1", false}, // zero-width space
		{"dp.r1。sandboxd.example.com", "r1", false},       // ideographic full stop
		{"dp..r1.sandboxd.example.com", "r1", false},
		{".r1.sandboxd.example.com", "r1", false},
		{"-dp.r1.sandboxd.example.com", "r1", false},
		{"dp_x.r1.sandboxd.example.com", "r1", false},
		{"dp.r1.sandboxd.example.com:443", "r1", false},
		{"user@dp.r1.sandboxd.example.com", "r1", false},
		{strings.Repeat("a", 64) + ".r1.sandboxd.example.com", "r1", false},
		{strings.Repeat("a.", 120) + "r1.sandboxd.example.com", "r1", false}, // > 253 bytes
		{"r1.r1.sandboxd.example.com", "r1", true},
		{"x.y.sandboxd.example.com", "x.y", false}, // a runner ID never holds a dot
		{"sandboxd.example.com", "", false},
	} {
		err := pki.CheckTenantDataPlaneHost(tc.host, tc.runner, d)
		if (err == nil) != tc.ok {
			t.Errorf("CheckTenantDataPlaneHost(%q, %q) = %v, want ok %v", tc.host, tc.runner, err, tc.ok)
		}
	}
	if pki.CheckTenantDataPlaneHost("r1.Sandboxd.localhost", "r1", "Sandboxd.localhost") == nil {
		t.Error("a base domain in upper case is accepted")
	}
	if pki.CheckBaseDomain(pki.DefaultBaseDomain) != nil || pki.CheckBaseDomain("example.com.") == nil || pki.CheckBaseDomain("") == nil {
		t.Error("CheckBaseDomain")
	}
}

// FuzzCheckTenantDataPlaneHost: whatever the host, an accepted one is a lowercase ASCII
// DNS name, no IP, and ends in .<runner>.<domain> at a label boundary (or is exactly it).
func FuzzCheckTenantDataPlaneHost(f *testing.F) {
	for _, s := range []string{"r1.sandboxd.localhost", "dp.r1.sandboxd.localhost", "*.r1.sandboxd.localhost", "127.0.0.1", "R1.sandboxd.localhost.", "dp.r2.sandboxd.localhost"} {
		f.Add(s)
	}
	const d, id = "sandboxd.localhost", "r1"
	want := id + "." + d
	f.Fuzz(func(t *testing.T, host string) {
		if pki.CheckTenantDataPlaneHost(host, id, d) != nil {
			return
		}
		if host != want && !strings.HasSuffix(host, "."+want) {
			t.Fatalf("%q accepted: not under %s", host, want)
		}
		if net.ParseIP(host) != nil || len(host) > 253 || strings.HasSuffix(host, ".") || strings.Contains(host, "..") {
			t.Fatalf("%q accepted", host)
		}
		for _, c := range []byte(host) {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '.') {
				t.Fatalf("%q accepted: byte %q", host, c)
			}
		}
	})
}
