package gateway

import (
	"fmt"

	"google.golang.org/protobuf/proto"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/runner"
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
	shown := runner.ShownContainerName(container) // the caller's string: any length, any bytes
	return "", apierr.New(apierr.ContainerNotFound, fmt.Sprintf("sandbox %s has no container %q", id, shown),
		map[string]string{"sandbox_id": id, "container": shown})
}

// containerState is the public state of a container the runner reports. A container
// waiting to start again (restarts so far, or a restart reason: the local backend's
// Restarting, the kubelet's CrashLoopBackOff) is RUNNING, as a restarting sandbox is:
// it started once, and its restart policy brings it back.
func containerState(c runtime.ContainerStatus) sandboxv1.State {
	switch c.State {
	case runtime.ContainerWaiting:
		if c.Restarts > 0 || restartReasons[c.Reason] {
			return sandboxv1.State_STATE_RUNNING
		}
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

// restartReasons are the reasons a backend gives a container waiting to be restarted.
var restartReasons = map[string]bool{"Restarting": true, "CrashLoopBackOff": true}

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
			if state == sandboxv1.State_STATE_PAUSED && row.State == sandboxv1.State_STATE_RUNNING {
				row.State = state // its processes are paused with the sandbox
			}
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
