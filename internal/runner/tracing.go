package runner

import (
	"connectrpc.com/connect"

	"github.com/sandboxd/sandboxd/internal/tracing"
)

// agentTracing makes the runner's calls to a sandbox's agent client spans of the trace
// they are made in, with its W3C trace context in the call's headers (tracing.Client).
// The runner records the agent hop on the agent's behalf: the agent runs inside the
// sandbox, is untrusted and cannot reach the collector, so it exports nothing.
var agentTracing = connect.WithInterceptors(tracing.Client())
