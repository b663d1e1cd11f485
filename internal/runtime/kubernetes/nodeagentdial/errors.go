package nodeagentdial

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"connectrpc.com/connect"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/nodeagent"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/textclip"
)

// What a failure at a node agent becomes on the runner's side. Every error of the
// adapter — reaching a node's agent (backendDialer.Agent) and each call to it
// (Checkpoint, DeleteCheckpoint) — goes through agentError, the one place that decides
// what travels up: an *AgentError, whose message is one fixed sentence per kind of
// failure naming the operation and the node, and which wraps runtime.ErrNodeAgentUnavailable
// (retryable: the agent cannot be reached) or runtime.ErrNodeAgentRefused (it answered
// and refused, or answered wrongly; a checkpoint refused RESOURCE_EXHAUSTED — the agent's
// --quota-bytes or --min-free-bytes — is runtime.ErrCheckpointSpaceExhausted too, which
// the API answers as every backend's full checkpoint store). It is no *connect.Error
// and wraps none: the agent's status code is the agent's, not the API's, and must not be
// taken for the runner's own (an agent's NOT_FOUND is no sandbox not found). The agent's
// own text and details (host paths, the shim's output, whatever a compromised agent
// says) are logged on the runner, clipped to MaxLoggedCause bytes, never passed on.

// AgentError is a failure at a node agent (see above). Error is its fixed sentence;
// errors.Is finds its runtime sentinel and, where one applies, the kind of the dialer's
// failure: nodeagent.ErrNoAgent, ErrNodeMissing, or errdefs.ErrNotFound for a node that
// is gone (the backend takes that for the loss of the checkpoints on it), or of the
// agent's refusal: runtime.ErrCheckpointSpaceExhausted. The agent's error itself is only
// Cause's.
type AgentError struct {
	Op   string // the operation: "checkpoint", "checkpoint deletion", "dial"
	Node string // the node whose agent it is

	msg      string
	sentinel error // runtime.ErrNodeAgentUnavailable or runtime.ErrNodeAgentRefused
	kind     error // nil, nodeagent.ErrNoAgent, ErrNodeMissing, errdefs.ErrNotFound, runtime.ErrCheckpointSpaceExhausted
	cause    error
}

func (e *AgentError) Error() string { return e.msg }

// Unwrap is the sentinel and the kind; never the cause.
func (e *AgentError) Unwrap() []error {
	if e.kind == nil {
		return []error{e.sentinel}
	}
	return []error{e.sentinel, e.kind}
}

// Cause is the error the agent (or the dial) gave: for the runner's log and tests,
// never for the API caller.
func (e *AgentError) Cause() error { return e.cause }

// Cause is the cause of the *AgentError in err's chain (nil when there is none).
func Cause(err error) error {
	var ae *AgentError
	if errors.As(err, &ae) {
		return ae.cause
	}
	return nil
}

// MaxLoggedCause bounds the agent's own error text in the runner's log (textclip.Clip:
// valid UTF-8, cut on a character boundary, marked): an agent's message is the agent's to
// choose, up to what a gRPC trailer carries (megabytes), and one failing call per pause
// would otherwise write all of it.
const MaxLoggedCause = 4 << 10

// The operations named in the sentences.
const (
	opDial       = "dial"
	opCheckpoint = "checkpoint"
	opDelete     = "checkpoint deletion"
	opList       = "checkpoint listing"
)

// agentError is err of op at node's agent as an *AgentError (nil for nil), logged with
// the agent's own error on log. ctx is the caller's (its end is the caller's, not the
// agent's failure). An *AgentError passes unchanged.
func agentError(ctx context.Context, log *slog.Logger, op, node string, err error) error {
	if err == nil {
		return nil
	}
	var ae *AgentError
	if errors.As(err, &ae) {
		return err
	}
	e := &AgentError{Op: op, Node: node, cause: err, sentinel: runtime.ErrNodeAgentUnavailable}
	var ce *connect.Error
	switch {
	case op == opDial && errors.Is(err, ErrNodeMissing):
		e.kind = ErrNodeMissing
		e.msg = fmt.Sprintf("node %s is missing from the cluster (not yet taken as gone): retry later", node)
	case op == opDial && apierrors.IsNotFound(err):
		e.kind = errdefs.ErrNotFound
		e.msg = fmt.Sprintf("node %s is gone from the cluster, and its node agent with it", node)
	case op == opDial && errors.Is(err, nodeagent.ErrNoAgent):
		e.kind = nodeagent.ErrNoAgent
		e.msg = fmt.Sprintf("no node agent is known on node %s (the node has no usable address, or the runner's --node-agent-addrs does not name it)", node)
	case op == opDial:
		e.msg = fmt.Sprintf("the node agent of node %s cannot be reached: retry later", node)
	case errors.As(err, &ce) && connect.IsWireError(ce) && refusal(ce.Code()):
		e.sentinel = runtime.ErrNodeAgentRefused
		if op == opCheckpoint && ce.Code() == connect.CodeResourceExhausted {
			e.kind = runtime.ErrCheckpointSpaceExhausted // its quota or free space: no room
		}
		e.msg = fmt.Sprintf("the node agent of node %s refused the %s: %s (the agent's reason is in the runner's log)", node, op, refusedWhy(ce.Code()))
	case errors.As(err, &ce) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled):
		// Not an answer of the agent's (the dial, the TLS handshake, the transport, a
		// timeout), or its UNAVAILABLE, DEADLINE_EXCEEDED or CANCELED.
		e.msg = fmt.Sprintf("the node agent of node %s could not be reached for the %s: retry later", node, op)
	default:
		// The adapter's own check of an answer (a checkpoint ID that is not this
		// runner's, none at all): the agent answered, wrongly.
		e.sentinel = runtime.ErrNodeAgentRefused
		e.msg = fmt.Sprintf("the node agent of node %s answered the %s wrongly (see the runner's log)", node, op)
	}
	if ctx.Err() != nil && errors.Is(e.sentinel, runtime.ErrNodeAgentUnavailable) && e.kind == nil {
		e.kind = ctx.Err() // the caller went away: say so to errors.Is
	}
	if log == nil {
		log = slog.Default()
	}
	code := ""
	if ce != nil {
		code = ce.Code().String()
	}
	log.Warn("node agent call failed", "op", op, "node", node, "code", code, "err", textclip.Clip(err.Error(), MaxLoggedCause), "error_sent", e.msg)
	return e
}

// refusal: an agent's answer of code is a refusal (it answered, and will answer the same
// until something changes), not a failure to reach it. UNAVAILABLE (its CRI runtime
// does not answer), DEADLINE_EXCEEDED and CANCELED are not.
func refusal(code connect.Code) bool {
	switch code {
	case connect.CodeUnavailable, connect.CodeDeadlineExceeded, connect.CodeCanceled:
		return false
	}
	return true
}

// refusedWhy is the fixed words for an agent's refusal of code.
func refusedWhy(code connect.Code) string {
	switch code {
	case connect.CodeInvalidArgument:
		return "the request is invalid"
	case connect.CodeNotFound:
		return "it does not find the sandbox or the checkpoint on its node"
	case connect.CodePermissionDenied, connect.CodeUnauthenticated:
		return "it does not take this runner's calls for the sandbox"
	case connect.CodeFailedPrecondition:
		return "the sandbox cannot be checkpointed on its node now"
	case connect.CodeResourceExhausted:
		return "the node's checkpoint space is used up"
	case connect.CodeUnimplemented:
		return "it does not implement the call"
	}
	return "it failed on the node"
}
