package gateway

import (
	"fmt"

	"github.com/sandboxd/sandboxd/internal/apierr"
)

// Limits of a request's wire-only fields: request_id here; a spec's tags, annotations
// and container names are the spec package's (spec.MaxTags …). The bounds of what
// reaches its processes (command, args, env, files) are the runtime package's
// (runtime.MaxArgs …), checked by the runner at create and by the relay at exec
// (relay.Relay).
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
