package gateway

import "testing"

func TestParseCPU(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		bad  bool
	}{
		{"", 0, false}, {"500m", 500, false}, {"2", 2000, false}, {"1.5", 1500, false}, {"0.1", 100, false},
		{"-1", 0, true}, {"m", 0, true}, {"1x", 0, true}, {"NaN", 0, true}, {"-5m", 0, true}, {"1e99", 0, true},
	} {
		got, err := parseCPU(tc.in)
		if (err != nil) != tc.bad || got != tc.want {
			t.Errorf("parseCPU(%q) = %d, %v; want %d (error %v)", tc.in, got, err, tc.want, tc.bad)
		}
	}
}

func TestParseMemory(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		bad  bool
	}{
		{"", 0, false}, {"512Mi", 512 << 20, false}, {"1Gi", 1 << 30, false}, {"1G", 1e9, false},
		{"1048576", 1 << 20, false}, {"1.5Gi", 3 << 29, false}, {"100k", 100000, false},
		{"-1Mi", 0, true}, {"Mi", 0, true}, {"12Xi", 0, true}, {"1e30", 0, true},
	} {
		got, err := parseMemory(tc.in)
		if (err != nil) != tc.bad || got != tc.want {
			t.Errorf("parseMemory(%q) = %d, %v; want %d (error %v)", tc.in, got, err, tc.want, tc.bad)
		}
	}
}

func TestFormat(t *testing.T) {
	for _, tc := range []struct {
		got, want string
	}{
		{formatCPU(500), "500m"}, {formatCPU(2000), "2"}, {formatCPU(1500), "1500m"},
		{formatMemory(512 << 20), "512Mi"}, {formatMemory(1 << 30), "1Gi"}, {formatMemory(1000), "1000"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
}

func FuzzParseQuantities(f *testing.F) {
	for _, s := range []string{"500m", "2", "1.5Gi", "-1", "1e400", "0x10", " 3 "} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if n, err := parseCPU(s); err == nil && n < 0 {
			t.Fatalf("parseCPU(%q) = %d", s, n)
		}
		if n, err := parseMemory(s); err == nil && n < 0 {
			t.Fatalf("parseMemory(%q) = %d", s, n)
		}
	})
}
