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

// errArchiveNotRelayed: ArchivePath and ExtractPath (file-system snapshots of a volume,
// sandbox-made archives) are between a runner and its own agents; no gateway or user
// reaches them.
var errArchiveNotRelayed = connect.NewError(connect.CodePermissionDenied, errors.New("runnerapi: AgentService.ArchivePath and ExtractPath are not relayed: only the runner snapshots and restores its sandboxes' volumes"))

func (s *relay) ArchivePath(context.Context, *connect.Request[agentv1.ArchivePathRequest], *connect.ServerStream[agentv1.ArchivePathResponse]) error {
	return errArchiveNotRelayed
}

func (s *relay) ExtractPath(context.Context, *connect.ClientStream[agentv1.ExtractPathRequest]) (*connect.Response[agentv1.ExtractPathResponse], error) {
	return nil, errArchiveNotRelayed
}

func (a sandboxAgent) ArchivePath(context.Context, *connect.Request[agentv1.ArchivePathRequest]) (*connect.ServerStreamForClient[agentv1.ArchivePathResponse], error) {
	return nil, errArchiveNotRelayed
}

// ExtractPath goes to the relay, which refuses it (a client stream cannot fail before
// it is used).
func (a sandboxAgent) ExtractPath(ctx context.Context) *connect.ClientStreamForClient[agentv1.ExtractPathRequest, agentv1.ExtractPathResponse] {
	return a.c.ExtractPath(a.ctx(ctx))
}

// errStopNotRelayed: Stop (the Kubernetes backend stopping a Pod's workload without
// deleting the Pod) is between a runner and its own agents.
var errStopNotRelayed = connect.NewError(connect.CodePermissionDenied, errors.New("runnerapi: AgentService.Stop is not relayed: only the runner stops its sandboxes' main commands"))

func (s *relay) Stop(context.Context, *connect.Request[agentv1.StopRequest]) (*connect.Response[agentv1.StopResponse], error) {
	return nil, errStopNotRelayed
}

func (a sandboxAgent) Stop(context.Context, *connect.Request[agentv1.StopRequest]) (*connect.Response[agentv1.StopResponse], error) {
	return nil, errStopNotRelayed
}
