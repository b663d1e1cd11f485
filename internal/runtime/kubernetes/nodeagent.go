package kubernetes

import (
	"context"
	"time"
)

// Pause and resume of `gvisor` sandboxes (checkpoint.go) go through a node agent on the
// sandbox's node: the process that reaches the node's gVisor shim (its hibernate server,
// internal/nodeagent/hibernate) and the checkpoint directory the patched shim restores
// Pods from (runtime.RestoreCheckpointAnnotation). The backend needs only this of it.

// NodeAgent is what the backend needs of the node agent on one node.
type NodeAgent interface {
	// Checkpoint checkpoints the gVisor Pod sandbox of the Pod req names (the agent
	// resolves it on its node, never from the caller) into a new, complete image the
	// agent names.
	Checkpoint(ctx context.Context, req NodeCheckpointRequest) (NodeCheckpoint, error)
	// DeleteCheckpoint removes an image; idempotent.
	DeleteCheckpoint(ctx context.Context, checkpointID string) error
	// ListCheckpoints lists the caller's complete images on the node, each with what the
	// agent recorded when it took it (the sandbox and the Pod it resolved on its node).
	ListCheckpoints(ctx context.Context) ([]NodeCheckpointEntry, error)
}

// NodeCheckpointEntry is a complete image on a node as its agent recorded it: its ID, the
// sandbox ID and the Pod (namespace, name, UID) it was taken of, and whether it is a
// fork's (LeaveRunning) or a pause's.
type NodeCheckpointEntry struct {
	ID, SandboxID        string
	Namespace, Name, UID string
	LeaveRunning         bool
}

// NodeCheckpointRequest names the Pod whose sandbox is checkpointed: the Pod's
// namespace, name and UID and the sandbox ID its sandboxd.io/sandbox-id label carries.
// LeaveRunning: the sandbox runs on after the checkpoint (a fork's); false: it ends with
// the checkpoint (a pause's).
type NodeCheckpointRequest struct {
	Namespace, Name, UID, SandboxID string
	LeaveRunning                    bool
}

// NodeCheckpoint is a checkpoint taken: its ID (what the restore annotation names), the
// node it is on, its size and how long it took. SandboxRunning: whether the sandbox is
// known to still run after the checkpoint (after a failed one, whether it survived it):
// RunningUnknown when the agent could not tell or never touched it — the backend never
// ends a sandbox on anything but its Pod's status.
type NodeCheckpoint struct {
	ID, Node       string
	Bytes          int64
	Took           time.Duration
	SandboxRunning Running
}

// Running is what a node agent knows of whether a sandbox still runs.
type Running int8

const (
	// RunningUnknown: the agent could not tell (or it never touched the sandbox).
	RunningUnknown Running = iota
	// RunningYes: a container of the sandbox still runs.
	RunningYes
	// RunningNo: the sandbox's containers have ended.
	RunningNo
)

func (r Running) String() string {
	switch r {
	case RunningYes:
		return "running"
	case RunningNo:
		return "ended"
	}
	return "unknown"
}

// NodeAgentDialer reaches the node agent of a node.
type NodeAgentDialer interface {
	Agent(ctx context.Context, node string) (NodeAgent, error)
}
