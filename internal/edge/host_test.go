package edge

import (
	"errors"
	"strings"
	"testing"
)

func TestParseHost(t *testing.T) {
	for _, tc := range []struct {
		host    string
		id      string
		port    int
		wantErr error
	}{
		{"8080-" + sbxA + ".r1.edge.test", sbxA, 8080, nil},
		{"1-" + sbxA + ".r1.edge.test", sbxA, 1, nil},
		{"65535-" + sbxA + ".r1.edge.test", sbxA, 65535, nil},
		{"8080-" + strings.ToUpper(sbxA) + ".R1.Edge.TEST", sbxA, 8080, nil},
		{"8080-" + sbxA + ".r1.edge.test.", sbxA, 8080, nil}, // absolute DNS name
		{"0-" + sbxA + ".r1.edge.test", "", 0, ErrMalformedHost},
		{"65536-" + sbxA + ".r1.edge.test", "", 0, ErrMalformedHost},
		{"08080-" + sbxA + ".r1.edge.test", "", 0, ErrMalformedHost},
		{"+80-" + sbxA + ".r1.edge.test", "", 0, ErrMalformedHost},
		{"8080" + sbxA + ".r1.edge.test", "", 0, ErrMalformedHost},
		{"8080-" + sbxA[:15] + ".r1.edge.test", "", 0, ErrMalformedHost},
		{"8080-" + sbxA + "a.r1.edge.test", "", 0, ErrMalformedHost},
		{"8080-abcdefghijklmn01.r1.edge.test", "", 0, ErrMalformedHost}, // 0 and 1 are not base32
		{"8080-abcdefghijklmn2-.r1.edge.test", "", 0, ErrMalformedHost},
		{"8080-" + sbxA + ".r2.edge.test", "", 0, ErrForeignHost},
		{"8080-" + sbxA + ".r1.edge.tes", "", 0, ErrForeignHost},
		{"8080-" + sbxA + ".r1.xedge.test", "", 0, ErrForeignHost},
		{"8080-" + sbxA + "xr1.edge.test", "", 0, ErrForeignHost},
		{"a.8080-" + sbxA + ".r1.edge.test", "", 0, ErrForeignHost},
		{".r1.edge.test", "", 0, ErrForeignHost},
		{"r1.edge.test", "", 0, ErrForeignHost},
		{"", "", 0, ErrForeignHost},
	} {
		id, port, err := ParseHost(tc.host, testRunner, testDomain)
		if !errors.Is(err, tc.wantErr) || id != tc.id || port != tc.port {
			t.Errorf("ParseHost(%q) = %q, %d, %v; want %q, %d, %v", tc.host, id, port, err, tc.id, tc.port, tc.wantErr)
		}
	}
}

func TestHostRoundTrips(t *testing.T) {
	h := Host(443, strings.ToUpper(sbxB), "R1", "Edge.Test")
	if want := "443-" + sbxB + ".r1.edge.test"; h != want {
		t.Fatalf("Host = %q, want %q", h, want)
	}
	id, port, err := ParseHost(h, "r1", "edge.test")
	if err != nil || id != sbxB || port != 443 {
		t.Errorf("ParseHost(Host(...)) = %q, %d, %v", id, port, err)
	}
}

func FuzzParseHost(f *testing.F) {
	for _, s := range []string{
		"8080-" + sbxA + ".r1.edge.test", "0-a.r1.edge.test", "r1.edge.test", "..r1.edge.test",
		"65535-" + strings.ToUpper(sbxA) + ".R1.edge.test.", "8080-\u212a" + sbxA[1:] + ".r1.edge.test",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, host string) {
		id, port, err := ParseHost(host, testRunner, testDomain)
		if err != nil {
			if !errors.Is(err, ErrForeignHost) && !errors.Is(err, ErrMalformedHost) {
				t.Fatalf("ParseHost(%q): unexpected error %v", host, err)
			}
			return
		}
		if !validSandboxID(id) || port < 1 || port > 65535 {
			t.Fatalf("ParseHost(%q) = %q, %d: not a valid sandbox port", host, id, port)
		}
		// Only the canonical name (up to case and a trailing dot) parses.
		if canon := Host(port, id, testRunner, testDomain); !strings.EqualFold(strings.TrimSuffix(host, "."), canon) {
			t.Fatalf("ParseHost(%q) = %q, %d, whose name is %q", host, id, port, canon)
		}
	})
}
