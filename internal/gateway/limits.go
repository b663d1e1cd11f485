package gateway

import (
	"fmt"

	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// Limits of a request's wire-only fields: request_id here; a spec's tags, annotations
// and container names are the spec package's (spec.MaxTags …). The bounds of what
// reaches its processes (command, args, env, files) are the runtime package's
// (runtime.MaxArgs …), checked by the runner at create and by the Relay at exec.
const (
	// MaxRequestIDBytes: the target system's idempotency tokens are at most 128 bytes.
	MaxRequestIDBytes = 128
)

// requestIDViolations checks an idempotency token at field.
func requestIDViolations(field, id string) []apierr.Violation {
	if len(id) > MaxRequestIDBytes {
		return []apierr.Violation{{Field: field, Description: fmt.Sprintf("is %d bytes, at most %d allowed", len(id), MaxRequestIDBytes)}}
	}
	return nil
}

// execViolations checks an exec's argv and environment with the runtime's limits (the
// same as the main command's at create). cmdField and envField name them in the request.
func execViolations(cmdField, envField string, argv []string, env map[string]string) []apierr.Violation {
	var vs []apierr.Violation
	add := func(field, format string, args ...any) {
		vs = append(vs, apierr.Violation{Field: field, Description: fmt.Sprintf(format, args...)})
	}
	if len(argv) == 0 {
		add(cmdField, "is required")
	}
	runtime.CheckArgs(cmdField, argv, 0, 0, add)
	runtime.CheckEnv(envField, env, add)
	return vs
}
