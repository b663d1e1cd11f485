package quantity

import "testing"

func TestParseCPU(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		bad  bool
	}{
		{"", 0, false}, {" 2 ", 2000, false}, {"500m", 500, false}, {"2", 2000, false}, {"1.5", 1500, false},
		{"0.1", 100, false}, {".5", 500, false}, {"0", 0, false}, {"0m", 0, false}, {"0.0001", 1, false},
		{"4611686018427387", 4611686018427387000, false},
		{"-1", 0, true}, {"+1", 0, true}, {"m", 0, true}, {"1x", 0, true}, {"NaN", 0, true}, {"Inf", 0, true},
		{"-5m", 0, true}, {"1e3", 0, true}, {"1e99", 0, true}, {"0x10", 0, true}, {"1.", 0, true}, {".", 0, true},
		{"1.5m", 2, false}, {"1.2.3", 0, true}, {"2 m", 0, true}, {"1_000", 0, true}, {"99999999999999999999", 0, true},
	} {
		got, err := ParseCPU(tc.in)
		if (err != nil) != tc.bad || got != tc.want {
			t.Errorf("ParseCPU(%q) = %d, %v; want %d (error %v)", tc.in, got, err, tc.want, tc.bad)
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
		{"1048576", 1 << 20, false}, {"1.5Gi", 3 << 29, false}, {"100k", 100000, false}, {"100K", 100000, false},
		{"2Ti", 2 << 40, false}, {"1Ei", 1 << 60, false}, {"4Ei", 1 << 62, false}, {"0.5", 1, false},
		{"-1Mi", 0, true}, {"Mi", 0, true}, {"12Xi", 0, true}, {"1e30", 0, true}, {"5Ei", 0, true},
		{"1m", 0, true}, {"1mi", 0, true}, {"1 Gi", 0, true}, {"Gi1", 0, true}, {"1GiB", 0, true},
	} {
		got, err := ParseMemory(tc.in)
		if (err != nil) != tc.bad || got != tc.want {
			t.Errorf("ParseMemory(%q) = %d, %v; want %d (error %v)", tc.in, got, err, tc.want, tc.bad)
		}
	}
}

func TestFormat(t *testing.T) {
	for _, tc := range []struct {
		got, want string
	}{
		{FormatCPU(500), "500m"}, {FormatCPU(2000), "2"}, {FormatCPU(1500), "1500m"}, {FormatCPU(0), "0"},
		{FormatMemory(512 << 20), "512Mi"}, {FormatMemory(1 << 30), "1Gi"}, {FormatMemory(1000), "1000"},
		{FormatMemory(3 << 29), "1536Mi"}, {FormatMemory(0), "0"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{"500m", "2", "1.5Gi", "-1", "1e400", "0x10", " 3 ", "4Ei", ".5"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if n, err := ParseCPU(s); err == nil {
			if n < 0 || n > Max {
				t.Fatalf("ParseCPU(%q) = %d", s, n)
			}
			if back, err := ParseCPU(FormatCPU(n)); err != nil || back != n {
				t.Fatalf("CPU round trip %q -> %d -> %q -> %d, %v", s, n, FormatCPU(n), back, err)
			}
		}
		if n, err := ParseMemory(s); err == nil {
			if n < 0 || n > Max {
				t.Fatalf("ParseMemory(%q) = %d", s, n)
			}
			if back, err := ParseMemory(FormatMemory(n)); err != nil || back != n {
				t.Fatalf("memory round trip %q -> %d -> %q -> %d, %v", s, n, FormatMemory(n), back, err)
			}
		}
	})
}
