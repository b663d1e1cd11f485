package cabundle

import "testing"

func TestJoin(t *testing.T) {
	for _, c := range []struct{ roots, ca, want string }{
		{"R", "CA\n", "R\nCA\n"},
		{"R\n", "CA\n", "R\nCA\n"},
		{"", "CA\n", "CA\n"},
	} {
		if got := string(Join([]byte(c.roots), []byte(c.ca))); got != c.want {
			t.Errorf("Join(%q, %q) = %q, want %q", c.roots, c.ca, got, c.want)
		}
	}
}
