package gateway

import (
	"context"
	"fmt"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1/agentv1connect"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runnerapi"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/spec"
)

// containerOf resolves the container a data call names (its container field) against
// the sandbox's spec sp: "" for the primary, by whatever name it goes by (empty, its
// own name, or "main" when it has none), else the sidecar's name. A name of no
// container is NOT_FOUND CWSANDBOX_CONTAINER_NOT_FOUND naming it, as the runner answers
// (the official client rewrites a NOT_FOUND's message, so metadata container carries
// the name).
func containerOf(id string, sp *sandboxv1.SandboxSpec, container string) (string, error) {
	if container == "" {
		return "", nil
	}
	if p := spec.Primary(sp); p != nil && (container == p.GetName() || p.GetName() == "" && container == runtime.DefaultContainerName) {
		return "", nil
	}
	for _, c := range sp.GetContainers() {
		if c.GetName() == container {
			return container, nil
		}
	}
	return "", apierr.New(apierr.ContainerNotFound, fmt.Sprintf("sandbox %s has no container %q", id, container),
		map[string]string{"sandbox_id": id, "container": container})
}

// runnerAgent is the agent of sandbox id's container ("" = the primary) on runner r:
// the runner relays the call to the container its runnerapi.ContainerHeader names.
func runnerAgent(ctx context.Context, r runner.Handle, id, container string) (agentv1connect.AgentServiceClient, error) {
	a, err := r.Agent(ctx, id)
	if err != nil || container == "" {
		return a, err
	}
	return containerAgent{c: a, name: container}, nil
}

// runnerLogs reads the log of sandbox id's container ("" = the primary) from runner r,
// naming the container in runnerapi.ContainerHeader of the runner call.
func runnerLogs(ctx context.Context, r runner.Handle, id, container string, req *agentv1.LogsRequest, send func(*agentv1.LogsResponse) error) error {
	if container != "" {
		var call connect.CallInfo
		ctx, call = connect.NewClientContext(ctx)
		call.RequestHeader().Set(runnerapi.ContainerHeader, container)
	}
	return r.Logs(ctx, id, req, send)
}

// containerAgent is the agent of one container of a sandbox: every call carries the
// container's name in runnerapi.ContainerHeader, next to the runner's own
// SandboxIDHeader. It lists every method (no embedding), so a method added to the agent
// fails to compile here rather than silently reaching the primary.
type containerAgent struct {
	c    agentv1connect.AgentServiceClient
	name string
}

var _ agentv1connect.AgentServiceClient = containerAgent{}

func (a containerAgent) Exec(ctx context.Context, req *connect.Request[agentv1.ExecRequest]) (*connect.Response[agentv1.ExecResponse], error) {
	req.Header().Set(runnerapi.ContainerHeader, a.name)
	return a.c.Exec(ctx, req)
}

func (a containerAgent) StreamExec(ctx context.Context) *connect.BidiStreamForClient[agentv1.StreamExecRequest, agentv1.StreamExecResponse] {
	s := a.c.StreamExec(ctx)
	s.RequestHeader().Set(runnerapi.ContainerHeader, a.name) // sent with the first message
	return s
}

func (a containerAgent) ReadFile(ctx context.Context, req *connect.Request[agentv1.ReadFileRequest]) (*connect.Response[agentv1.ReadFileResponse], error) {
	req.Header().Set(runnerapi.ContainerHeader, a.name)
	return a.c.ReadFile(ctx, req)
}

func (a containerAgent) WriteFile(ctx context.Context, req *connect.Request[agentv1.WriteFileRequest]) (*connect.Response[agentv1.WriteFileResponse], error) {
	req.Header().Set(runnerapi.ContainerHeader, a.name)
	return a.c.WriteFile(ctx, req)
}

func (a containerAgent) Logs(ctx context.Context, req *connect.Request[agentv1.LogsRequest]) (*connect.ServerStreamForClient[agentv1.LogsResponse], error) {
	req.Header().Set(runnerapi.ContainerHeader, a.name)
	return a.c.Logs(ctx, req)
}

func (a containerAgent) Status(ctx context.Context, req *connect.Request[agentv1.StatusRequest]) (*connect.Response[agentv1.StatusResponse], error) {
	req.Header().Set(runnerapi.ContainerHeader, a.name)
	return a.c.Status(ctx, req)
}

func (a containerAgent) Watch(ctx context.Context, req *connect.Request[agentv1.WatchRequest]) (*connect.ServerStreamForClient[agentv1.StatusResponse], error) {
	req.Header().Set(runnerapi.ContainerHeader, a.name)
	return a.c.Watch(ctx, req)
}

func (a containerAgent) Start(ctx context.Context, req *connect.Request[agentv1.StartRequest]) (*connect.Response[agentv1.StartResponse], error) {
	req.Header().Set(runnerapi.ContainerHeader, a.name)
	return a.c.Start(ctx, req)
}

// containerState is the public state of a container the runner reports.
func containerState(c runtime.ContainerStatus) sandboxv1.State {
	switch c.State {
	case runtime.ContainerWaiting:
		return sandboxv1.State_STATE_CREATING
	case runtime.ContainerRunning:
		return sandboxv1.State_STATE_RUNNING
	case runtime.ContainerExited:
		if c.ExitCode != nil && *c.ExitCode == 0 {
			return sandboxv1.State_STATE_COMPLETED
		}
		return sandboxv1.State_STATE_FAILED
	}
	return sandboxv1.State_STATE_UNSPECIFIED
}

// containerStatuses are the status rows of sandbox sb's containers (sp its spec, state
// its public state): one per container of the spec, in the spec's order. A container
// the runner reports on (runner.Sandbox.Containers) has its report. The primary
// without a report (a single-container sandbox, whose runner reports the sandbox alone)
// has the sandbox's state, exit code and restarts; a sidecar without one is CREATING
// while the sandbox is, else UNSPECIFIED (unknown). Init containers have no public
// field, so no row: a failing one is named in state_reason.
func containerStatuses(sp *sandboxv1.SandboxSpec, sb runner.Sandbox, state sandboxv1.State) []*sandboxv1.ContainerStatus {
	reported := map[string]runtime.ContainerStatus{}
	for _, c := range sb.Containers {
		if !c.Init {
			reported[c.Name] = c
		}
	}
	cs := sp.GetContainers()
	if len(cs) == 0 {
		cs = []*sandboxv1.Container{{}} // a spec recorded without containers still ran one
	}
	primary := spec.Primary(sp)
	var out []*sandboxv1.ContainerStatus
	for _, c := range cs {
		name := c.GetName()
		if name == "" {
			name = runtime.DefaultContainerName
		}
		row := &sandboxv1.ContainerStatus{Name: name, State: state}
		if r, ok := reported[name]; ok {
			row.State, row.RestartCount = containerState(r), int32(r.Restarts)
			if r.ExitCode != nil {
				row.ExitCode = *r.ExitCode
			}
		} else if c == primary || primary == nil {
			row.RestartCount = int32(sb.Restarts)
			if sb.ExitCode != nil {
				row.ExitCode = *sb.ExitCode
			}
		} else if state != sandboxv1.State_STATE_CREATING {
			// A sidecar nobody reported on: its state is not known (never the sandbox's,
			// which would claim it runs).
			row.State = sandboxv1.State_STATE_UNSPECIFIED
		}
		out = append(out, row)
	}
	return out
}

// withPrimaryMarked is sp with its primary row marked primary=true when there are
// several rows and none is marked (a copy then; sp is the index's): Get and List echo
// every container with its primary flag.
func withPrimaryMarked(sp *sandboxv1.SandboxSpec) *sandboxv1.SandboxSpec {
	cs := sp.GetContainers()
	if len(cs) < 2 {
		return sp
	}
	for _, c := range cs {
		if c.GetPrimary() {
			return sp
		}
	}
	out := proto.CloneOf(sp)
	out.Containers[0].Primary = proto.Bool(true)
	return out
}
