package gateway

import (
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/apierr"
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
