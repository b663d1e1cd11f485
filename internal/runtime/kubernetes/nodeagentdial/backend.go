// Package nodeagentdial is the runner's side of the node agent (internal/nodeagent):
// how the Kubernetes backend reaches the agent of a sandbox Pod's node (the runner's
// --node-agent-* flags, DialConfig) and the adapter of the agent's client to the
// backend's kubernetes.NodeAgentDialer. It lives with the runner, not the agent: the
// agent's packages never import the runtime, the runner or the stack (internal/archtest).
package nodeagentdial

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/sandboxd/sandboxd/internal/nodeagent"
	"github.com/sandboxd/sandboxd/internal/nodeagent/store"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes"
)

// The join of the node agent's client and the Kubernetes backend: the backend asks for a
// kubernetes.NodeAgentDialer (its Config.NodeAgents, checkpoint.go) and knows nothing of
// the agent's wire; BackendDialer turns a dialer of *nodeagent.Client
// (nodeagent.StaticDialer, NodeDialer) into one.

// ClientDialer gives the client of a node's agent: *nodeagent.StaticDialer, *NodeDialer.
type ClientDialer interface {
	Agent(ctx context.Context, node string) (*nodeagent.Client, error)
}

// Options are the adapter's: RunnerID is the runner whose checkpoints the agents keep —
// a checkpoint ID an agent answers must be one of its (store.ValidID, prefix
// "c-"+store.OwnerHash(RunnerID)+"-"): an agent (or whoever answers in its place) naming
// another runner's or a malformed ID is an error, never an ID the backend records and
// later restores or deletes.
//
// CheckpointTimeout bounds a Checkpoint call (default DefaultCheckpointTimeout: the
// agent's own bound, nodeagent.DefaultCheckpointTimeout, plus a margin for the agent's
// wait for a free checkpoint slot and the answer); DeleteTimeout a DeleteCheckpoint call
// (default 30 s). A caller's earlier deadline wins. An agent that never answers fails the
// call then, instead of holding the sandbox's pause or resume forever.
//
// Log takes the agents' own errors (agentError: the runner's log keeps what the API
// caller is not told; nil: slog.Default).
type Options struct {
	RunnerID                         string
	CheckpointTimeout, DeleteTimeout time.Duration
	Log                              *slog.Logger
}

// The default call bounds (Options).
const (
	DefaultCheckpointTimeout = nodeagent.DefaultCheckpointTimeout + 2*time.Minute
	DefaultDeleteTimeout     = 30 * time.Second
)

func (o Options) withDefaults() Options {
	if o.CheckpointTimeout <= 0 {
		o.CheckpointTimeout = DefaultCheckpointTimeout
	}
	if o.DeleteTimeout <= 0 {
		o.DeleteTimeout = DefaultDeleteTimeout
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	return o
}

// BackendDialer adapts d to the Kubernetes backend's kubernetes.NodeAgentDialer.
func BackendDialer(d ClientDialer, o Options) kubernetes.NodeAgentDialer {
	return backendDialer{d: d, o: o.withDefaults()}
}

type backendDialer struct {
	d ClientDialer
	o Options
}

// Agent implements kubernetes.NodeAgentDialer; its errors are *AgentError (agentError).
func (b backendDialer) Agent(ctx context.Context, node string) (kubernetes.NodeAgent, error) {
	c, err := b.d.Agent(ctx, node)
	if err == nil && c == nil {
		err = fmt.Errorf("%w %q", nodeagent.ErrNoAgent, node)
	}
	if err != nil {
		return nil, agentError(ctx, b.o.Log, opDial, node, err)
	}
	return BackendAgent(c, node, b.o), nil
}

// BackendAgent adapts c, the client of node's agent, to kubernetes.NodeAgent; its errors
// are *AgentError (agentError).
func BackendAgent(c *nodeagent.Client, node string, o Options) kubernetes.NodeAgent {
	return backendAgent{c: c, node: node, o: o.withDefaults()}
}

type backendAgent struct {
	c    *nodeagent.Client
	node string
	o    Options
}

// Checkpoint implements kubernetes.NodeAgent. The agent's SandboxRunning (*bool: nil when
// it could not tell, or never touched the sandbox) becomes kubernetes.Running: nil is
// RunningUnknown, distinct from RunningNo (it ended). The backend never ends a sandbox on
// either (a failed pause re-evaluates the sandbox from its Pod's status); it logs which.
func (a backendAgent) Checkpoint(ctx context.Context, req kubernetes.NodeCheckpointRequest) (kubernetes.NodeCheckpoint, error) {
	out, err := a.checkpoint(ctx, req)
	if err == nil {
		return out, nil
	}
	werr := agentError(ctx, a.o.Log, opCheckpoint, a.node, err)
	var (
		ce *connect.Error
		ae *AgentError
	)
	if errors.As(werr, &ae) && errors.As(err, &ce) && ce.Meta().Get(nodeagent.SandboxRunningMeta) == "unknown" {
		ae.msg += " (the agent could not tell whether the sandbox still runs)"
	}
	return out, werr
}

// checkpoint is Checkpoint with the client's and the answer's own errors.
func (a backendAgent) checkpoint(ctx context.Context, req kubernetes.NodeCheckpointRequest) (kubernetes.NodeCheckpoint, error) {
	ctx, cancel := context.WithTimeout(ctx, a.o.CheckpointTimeout)
	defer cancel()
	res, err := a.c.Checkpoint(ctx, nodeagent.CheckpointRequest{
		Namespace: req.Namespace, Name: req.Name, UID: req.UID, SandboxID: req.SandboxID, LeaveRunning: req.LeaveRunning,
	})
	out := kubernetes.NodeCheckpoint{
		ID: res.ID, Node: res.Node, Bytes: res.Bytes, Took: res.Took,
		SandboxRunning: running(res.SandboxRunning),
	}
	if err != nil {
		return out, err
	}
	if res.ID == "" {
		return kubernetes.NodeCheckpoint{}, errors.New("node agent checkpoint: the agent answered no checkpoint ID")
	}
	if err := ownCheckpointID(res.ID, a.o.RunnerID); err != nil {
		return kubernetes.NodeCheckpoint{}, fmt.Errorf("node agent checkpoint: %w", err)
	}
	return out, nil
}

// running is the agent's *bool as kubernetes.Running.
func running(r *bool) kubernetes.Running {
	switch {
	case r == nil:
		return kubernetes.RunningUnknown
	case *r:
		return kubernetes.RunningYes
	}
	return kubernetes.RunningNo
}

// ownCheckpointID: id is a valid checkpoint ID of runnerID's (the agent's store names
// every image "c-"+OwnerHash(owner)+"-"+random).
func ownCheckpointID(id, runnerID string) error {
	if err := store.ValidID(id); err != nil {
		return fmt.Errorf("the agent answered an invalid checkpoint ID: %w", err)
	}
	if runnerID == "" || !strings.HasPrefix(id, "c-"+store.OwnerHash(runnerID)+"-") {
		return fmt.Errorf("the agent answered checkpoint ID %q, which is not runner %q's", id, runnerID)
	}
	return nil
}

// DeleteCheckpoint implements kubernetes.NodeAgent (an unknown ID is no error).
func (a backendAgent) DeleteCheckpoint(ctx context.Context, checkpointID string) error {
	dctx, cancel := context.WithTimeout(ctx, a.o.DeleteTimeout)
	defer cancel()
	return agentError(ctx, a.o.Log, opDelete, a.node, a.c.DeleteCheckpoint(dctx, checkpointID))
}

// ListCheckpoints implements kubernetes.NodeAgent: the caller's complete images on the
// node (at most maxListed are taken).
func (a backendAgent) ListCheckpoints(ctx context.Context) ([]kubernetes.NodeCheckpointEntry, error) {
	lctx, cancel := context.WithTimeout(ctx, a.o.DeleteTimeout)
	defer cancel()
	list, err := a.c.ListCheckpoints(lctx)
	if err != nil {
		return nil, agentError(ctx, a.o.Log, opList, a.node, err)
	}
	if len(list) > maxListed {
		list = list[:maxListed]
	}
	out := make([]kubernetes.NodeCheckpointEntry, 0, len(list))
	for _, e := range list {
		out = append(out, kubernetes.NodeCheckpointEntry{
			ID: e.GetCheckpointId(), SandboxID: e.GetSandboxId(), LeaveRunning: e.GetLeaveRunning(),
			Namespace: e.GetPod().GetNamespace(), Name: e.GetPod().GetName(), UID: e.GetPod().GetUid(),
		})
	}
	return out, nil
}

// maxListed bounds the entries ListCheckpoints takes of an agent's answer (an agent's
// store holds far fewer: its quota bounds it).
const maxListed = 100000

var (
	_ ClientDialer = (*nodeagent.StaticDialer)(nil)
)
