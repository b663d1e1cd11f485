package stack

import "testing"

func TestWithTag(t *testing.T) {
	for _, tc := range []struct{ ref, tag, want string }{
		{"ghcr.io/sandboxd/sandboxd:v1.2.0", "v1.3.0", "ghcr.io/sandboxd/sandboxd:v1.3.0"},
		{"ghcr.io/sandboxd/sandboxd", "v1.3.0", "ghcr.io/sandboxd/sandboxd:v1.3.0"},
		{"localhost:5000/sandboxd", "v2", "localhost:5000/sandboxd:v2"},
		{"localhost:5000/sandboxd:v1", "v2", "localhost:5000/sandboxd:v2"},
		{"ghcr.io/sandboxd/sandboxd:v1@sha256:abcd", "v2", "ghcr.io/sandboxd/sandboxd:v2"},
	} {
		if got := WithTag(tc.ref, tc.tag); got != tc.want {
			t.Errorf("WithTag(%q, %q) = %q, want %q", tc.ref, tc.tag, got, tc.want)
		}
	}
}
