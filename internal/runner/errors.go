package runner

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/textclip"
)

// A runner returns runtime.ErrNotFound for a sandbox it does not have (or that left the
// retention window).
var (
	// ErrNotRunning: the sandbox is terminating or terminal, so it cannot serve exec,
	// files or live logs.
	ErrNotRunning = errors.New("sandbox not running")
	// ErrAlreadyExists: a sandbox with that ID exists.
	ErrAlreadyExists = fmt.Errorf("sandbox %w", errdefs.ErrAlreadyExists)
)

// ContainerNotFoundError: sandbox Sandbox has no container called Container. It is a
// runtime.ErrContainerNotFound (not a runtime.ErrNotFound: the sandbox exists).
type ContainerNotFoundError struct{ Sandbox, Container string }

func (e *ContainerNotFoundError) Error() string {
	return fmt.Sprintf("sandbox %s has no container %q", e.Sandbox, ShownContainerName(e.Container))
}

// ShownContainerName is a container name a caller gave as it may be quoted back (in a
// message, in metadata): as it is when it is a valid container name (a DNS-1123 label),
// else clipped to 64 bytes of valid UTF-8, since the caller's string can be any length
// and any bytes.
func ShownContainerName(name string) string {
	if runtime.ValidContainerName(name) {
		return name
	}
	return textclip.Clip(name, 64)
}

func (e *ContainerNotFoundError) Unwrap() error { return runtime.ErrContainerNotFound }

// ContainerNotRunningError: a container other than the primary has exited (an init
// container, or a sidecar that ended) while its sandbox runs. It is an ErrNotRunning.
// Logs says the call was a read of its log, which the runner serves once the sandbox
// ended.
type ContainerNotRunningError struct {
	Sandbox, Container string
	Logs               bool
}

func (e *ContainerNotRunningError) Error() string {
	if e.Logs {
		return fmt.Sprintf("container %q of sandbox %s is not running (it has exited): its log is readable once the sandbox has ended", e.Container, e.Sandbox)
	}
	return fmt.Sprintf("container %q of sandbox %s is not running (it has exited)", e.Container, e.Sandbox)
}

func (e *ContainerNotRunningError) Unwrap() error { return ErrNotRunning }

// ValidationError lists every problem found in a request, so a caller fixes them all at
// once instead of one per round trip.
type ValidationError struct {
	Violations []apierr.Violation
}

func (e *ValidationError) Error() string {
	parts := make([]string, len(e.Violations))
	for i, v := range e.Violations {
		parts[i] = v.Field + ": " + v.Description
	}
	return "invalid sandbox spec: " + strings.Join(parts, "; ")
}

type violations []apierr.Violation

func (vs *violations) add(field, format string, args ...any) {
	*vs = append(*vs, apierr.Violation{Field: field, Description: fmt.Sprintf(format, args...)})
}

func (vs violations) err() error {
	if len(vs) == 0 {
		return nil
	}
	return &ValidationError{Violations: vs}
}

// SpecField is the prefix APIError puts before the runner's field names under "spec."
// on the public API, where the spec is a field of the request's sandbox. RunnerService
// sends the runner's own names (prefix ""), so its client maps them back unchanged.
const SpecField = "sandbox."

// APIError translates an error of a Runner (in process, or remote through runnerapi's
// client, which maps the wire back to these sentinels) about sandbox id into the API's:
// the one translation the gateway, the runner's data plane and RunnerService share, so a
// runner error means the same thing to a user whichever way it travelled. fieldPrefix
// goes before each violation's field under "spec." (SpecField on the public API). An error that is
// already an API error (an agent's, a relayed one) passes unchanged.
func APIError(id string, err error, fieldPrefix string) error {
	var (
		verr *ValidationError
		cnf  *ContainerNotFoundError
		cnr  *ContainerNotRunningError
		ce   *connect.Error
	)
	switch {
	case err == nil:
		return nil
	case errors.As(err, &verr):
		vs := make([]apierr.Violation, len(verr.Violations))
		for i, v := range verr.Violations {
			if strings.HasPrefix(v.Field, "spec.") {
				v.Field = fieldPrefix + v.Field
			}
			vs[i] = v
		}
		return apierr.Invalid(apierr.InvalidRequest, "invalid sandbox spec: "+apierr.Describe(vs), vs)
	case errors.As(err, &cnf):
		return apierr.New(apierr.ContainerNotFound, cnf.Error(), map[string]string{"sandbox_id": id, "container": ShownContainerName(cnf.Container)})
	case errors.Is(err, runtime.ErrContainerNotFound):
		return apierr.New(apierr.ContainerNotFound, err.Error(), idMeta(id))
	case errors.As(err, &cnr):
		return apierr.New(apierr.SandboxNotRunning, cnr.Error(), map[string]string{"sandbox_id": id, "container": cnr.Container})
	case errors.Is(err, runtime.ErrNotFound):
		return apierr.New(apierr.SandboxNotFound, err.Error(), idMeta(id))
	case errors.Is(err, ErrCannotCheckpoint):
		if errors.As(err, &ce) && apierr.Reason(ce) == apierr.CheckpointNotSupported {
			return ce // with its details (a violation per fork target)
		}
		return apierr.New(apierr.CheckpointNotSupported, err.Error(), idMeta(id))
	case errors.Is(err, ErrPaused), errors.Is(err, ErrAlreadyPaused):
		md := idMeta(id)
		if md == nil {
			md = map[string]string{}
		}
		md["state"] = StatePaused.String()
		return apierr.New(apierr.SandboxNotRunning, err.Error(), md)
	case errors.Is(err, ErrNotRunning):
		return apierr.New(apierr.SandboxNotRunning, err.Error(), idMeta(id))
	case errors.Is(err, runtime.ErrNodeAgentUnavailable):
		if errors.As(err, &ce) && apierr.Reason(ce) == apierr.NodeAgentUnavailable {
			return ce // relayed (a remote runner's), with its RetryInfo
		}
		return apierr.WithRetry(apierr.New(apierr.NodeAgentUnavailable, err.Error(), idMeta(id)), NodeAgentRetryAfter)
	case errors.Is(err, runtime.ErrCheckpointSpaceExhausted): // before ErrNodeAgentRefused, which an agent's also is
		if errors.As(err, &ce) && apierr.Reason(ce) == apierr.CheckpointSpaceExhausted {
			return ce
		}
		return apierr.New(apierr.CheckpointSpaceExhausted, err.Error(), idMeta(id))
	case errors.Is(err, runtime.ErrNodeAgentRefused):
		if errors.As(err, &ce) && apierr.Reason(ce) == apierr.NodeAgentRefused {
			return ce
		}
		return apierr.New(apierr.NodeAgentRefused, err.Error(), idMeta(id))
	case errors.Is(err, ErrAlreadyExists):
		return connect.NewError(connect.CodeAlreadyExists, err)
	case errors.As(err, &ce):
		return ce
	case errors.Is(err, context.Canceled):
		return connect.NewError(connect.CodeCanceled, err)
	case errors.Is(err, context.DeadlineExceeded):
		return connect.NewError(connect.CodeDeadlineExceeded, err)
	}
	return connect.NewError(connect.CodeInternal, err)
}

// NodeAgentRetryAfter is the RetryInfo of CWSANDBOX_NODE_AGENT_UNAVAILABLE: a node agent
// that cannot be reached (restarting with its DaemonSet, a node rebooting, a node missing
// within --node-agent-node-gone-after) is not back at once.
const NodeAgentRetryAfter = 30 * time.Second

// NotFoundError is the API error for sandbox id when there is none the caller may see.
func NotFoundError(id string) error {
	return apierr.New(apierr.SandboxNotFound, fmt.Sprintf("sandbox %q not found", id), map[string]string{"sandbox_id": id})
}

func idMeta(id string) map[string]string {
	if id == "" {
		return nil
	}
	return map[string]string{"sandbox_id": id}
}

// ErrBadReply: a runner answered a call with a reply that cannot be right (a wrong ID,
// a negative count, an unknown state, ...). A runner is not trusted (an organization
// runs its own): such a reply fails the one call, as the runner's fault.
var ErrBadReply = errors.New("the runner answered wrongly")

// BadReply is the error of a call runner runnerID answered wrongly (why says how):
// UNAVAILABLE CWSANDBOX_RUNNER_UNAVAILABLE (the runner cannot be used for the call now;
// not the caller's fault), errors.Is ErrBadReply. It does not take the runner down for
// placement as a failure to reach it does: it answers.
func BadReply(runnerID, why string) error {
	return &badReplyError{apierr.New(apierr.RunnerUnavailable, fmt.Sprintf("runner %s answered wrongly: %s", runnerID, why),
		map[string]string{"runner_id": runnerID})}
}

type badReplyError struct{ wire *connect.Error }

func (e *badReplyError) Error() string   { return e.wire.Error() }
func (e *badReplyError) Unwrap() []error { return []error{ErrBadReply, e.wire} }
