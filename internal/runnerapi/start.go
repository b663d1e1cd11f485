package runnerapi

import (
	"context"
	"errors"

	"connectrpc.com/connect"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
)

// errStartNotRelayed: AgentService.Start (starting a pooled sandbox's main command) is
// between a runner and its own agents; gateways never call it.
var errStartNotRelayed = connect.NewError(connect.CodePermissionDenied, errors.New("runnerapi: AgentService.Start is not relayed: only the runner starts its sandboxes' main commands"))

func (s *relay) Start(context.Context, *connect.Request[agentv1.StartRequest]) (*connect.Response[agentv1.StartResponse], error) {
	return nil, errStartNotRelayed
}

func (a sandboxAgent) Start(context.Context, *connect.Request[agentv1.StartRequest]) (*connect.Response[agentv1.StartResponse], error) {
	return nil, errStartNotRelayed
}
