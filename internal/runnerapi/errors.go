package runnerapi

import (
	"context"
	"errors"
	"fmt"
	"time"

	"connectrpc.com/connect"

	runnerv1 "github.com/sandboxd/sandboxd/gen/sandboxd/runner/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// toStatus turns a runner error into the wire error the Client maps back
// (runner.APIError with the runner's own field names): the CWSANDBOX_* reasons the gateway
// would send for it anyway, so an error relayed further unchanged still means the right
// thing to a user.
func toStatus(id string, err error) error { return runner.APIError(id, err, "") }

// remoteError is a runner error that came over the wire: errors.Is finds the runner's
// sentinel (or context error) and errors.As the *connect.Error with its details.
type remoteError struct {
	sentinel error
	wire     *connect.Error
}

func (e *remoteError) Error() string   { return e.wire.Message() }
func (e *remoteError) Unwrap() []error { return []error{e.sentinel, e.wire} }

// reasonSentinels are the runner's errors a remote runner's answer of each reason stands
// for, in fromStatus (after its cases that read more than the reason) and in
// forkErrorFromProto alike.
var reasonSentinels = map[string]error{
	apierr.SandboxNotFound:          runtime.ErrNotFound,
	apierr.SandboxNotRunning:        runner.ErrNotRunning,
	apierr.CheckpointNotSupported:   runner.ErrCannotCheckpoint,
	apierr.NodeAgentUnavailable:     runtime.ErrNodeAgentUnavailable,
	apierr.NodeAgentRefused:         runtime.ErrNodeAgentRefused,
	apierr.CheckpointSpaceExhausted: runtime.ErrCheckpointSpaceExhausted,
}

// fromStatus maps an error of a RunnerService call back to what *runner.Runner returns
// (the inverse of runner.APIError; a reason implies its code), so the gateway treats a
// remote runner exactly like an in-process one. runnerID names the runner in transport
// failures.
func fromStatus(ctx context.Context, runnerID string, err error) error {
	var ce *connect.Error
	if err == nil {
		return nil
	}
	if ctx.Err() != nil {
		return err // our own context ended, not the runner
	}
	if tooManyElements(err) {
		return runner.BadReply(runnerID, errTooManyElements.Error())
	}
	if !errors.As(err, &ce) || !connect.IsWireError(err) {
		return transportError(runnerID, err)
	}
	reason := apierr.Reason(err)
	switch code := ce.Code(); {
	case reason == apierr.InvalidRequest:
		if vs := apierr.Violations(err); len(vs) > 0 {
			return &runner.ValidationError{Violations: vs}
		}
	case reason == apierr.ContainerNotFound:
		md := apierr.Info(err).GetMetadata()
		return &remoteError{&runner.ContainerNotFoundError{Sandbox: md["sandbox_id"], Container: md["container"]}, ce}
	case reason == apierr.SandboxNotRunning && apierr.Info(err).GetMetadata()["state"] == runner.StatePaused.String():
		return &remoteError{runner.ErrPaused, ce}
	case reasonSentinels[reason] != nil:
		return &remoteError{reasonSentinels[reason], ce}
	case code == connect.CodeAlreadyExists:
		return &remoteError{runner.ErrAlreadyExists, ce}
	case code == connect.CodeCanceled:
		return &remoteError{context.Canceled, ce}
	case code == connect.CodeDeadlineExceeded:
		return &remoteError{context.DeadlineExceeded, ce}
	}
	return transportError(runnerID, err)
}

// transportError explains a failure to reach the runner itself (not an error the runner
// or an agent behind it answered with): UNAVAILABLE CWSANDBOX_RUNNER_UNAVAILABLE, retry.
func transportError(runnerID string, err error) error {
	if err == nil || connect.IsWireError(err) || apierr.Reason(err) != "" {
		return err
	}
	if tooManyElements(err) { // an answer, wrong
		return runner.BadReply(runnerID, errTooManyElements.Error())
	}
	// Not an answer from the runner: a refused or broken connection (a TLS 1.3 handshake
	// the runner rejects can surface as a broken pipe on the first write, which connect
	// reports as CANCELED). Callers have ruled out their own context ending.
	return apierr.WithRetry(apierr.New(apierr.RunnerUnavailable,
		fmt.Sprintf("runner %s is unreachable: %v", runnerID, err), map[string]string{"runner_id": runnerID}),
		5*time.Second)
}

// forkErrorToProto is one fork's error on the wire, as the API would answer it.
func forkErrorToProto(id string, err error) *runnerv1.ForkError {
	var ce *connect.Error
	if !errors.As(toStatus(id, err), &ce) {
		ce = connect.NewError(connect.CodeInternal, err)
	}
	// The message is the backend's text (runsc's, the kubelet's) as often as ours: clipped
	// to what the gateway takes (checkForkError), or it refuses the whole Fork reply.
	return &runnerv1.ForkError{Code: clipShort(ce.Code().String()), Reason: clipShort(apierr.Reason(ce)), Message: clipText(ce.Message())}
}

// forkErrorFromProto is one fork's error as *runner.Runner returns it (errors.Is its
// sentinel, errors.As the *connect.Error with its reason).
func forkErrorFromProto(id string, p *runnerv1.ForkError) error {
	var code connect.Code
	if err := code.UnmarshalText([]byte(p.GetCode())); err != nil || code == 0 {
		code = connect.CodeUnknown
	}
	msg := p.GetMessage()
	if msg == "" {
		msg = "the fork failed"
	}
	var ce *connect.Error
	if r := p.GetReason(); r != "" && apierr.Known(r) {
		ce = apierr.New(r, msg, map[string]string{"sandbox_id": id})
		if r == apierr.NodeAgentUnavailable { // its RetryInfo is not on the fork's wire
			ce = apierr.WithRetry(ce, runner.NodeAgentRetryAfter)
		}
	} else {
		ce = connect.NewError(code, errors.New(msg))
	}
	if sentinel := reasonSentinels[apierr.Reason(ce)]; sentinel != nil {
		return &remoteError{sentinel, ce}
	}
	return ce
}
