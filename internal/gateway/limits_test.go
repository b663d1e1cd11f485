package gateway

import (
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

func fields(vs []apierr.Violation) string {
	var out []string
	for _, v := range vs {
		out = append(out, v.Field)
	}
	return strings.Join(out, ",")
}

func TestRequestIDViolations(t *testing.T) {
	if vs := requestIDViolations("request_id", strings.Repeat("r", MaxRequestIDBytes)); vs != nil {
		t.Errorf("128 bytes: %v", vs)
	}
	if vs := requestIDViolations("request_id", "0b9a6c1e-2f2e-4a44-9d1d-3d6c5c7b1a20"); vs != nil {
		t.Errorf("a UUID: %v", vs)
	}
	if got := fields(requestIDViolations("request_id", strings.Repeat("r", MaxRequestIDBytes+1))); got != "request_id" {
		t.Errorf("129 bytes: violations %q", got)
	}
}

func TestExecViolations(t *testing.T) {
	for _, tc := range []struct {
		name string
		argv []string
		env  map[string]string
		want string
	}{
		{"plain", []string{"sh", "-c", "echo $A"}, map[string]string{"A": "b"}, ""},
		{"no command", nil, nil, "command"},
		{"NUL in argv", []string{"echo", "a\x00b"}, nil, "command[1]"},
		{"NUL in env value", []string{"true"}, map[string]string{"A": "\x00"}, "env[A]"},
		{"= in env name", []string{"true"}, map[string]string{"A=B": "c"}, "env"},
		{"empty env name", []string{"true"}, map[string]string{"": "c"}, "env"},
		{"too many args", make([]string, runtime.MaxArgs+1), nil, "command"},
	} {
		if got := fields(execViolations("command", "env", tc.argv, tc.env)); got != tc.want {
			t.Errorf("%s: violations %q, want %q", tc.name, got, tc.want)
		}
	}
}
