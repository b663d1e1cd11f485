package sandbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
)

// ErrorDomain is the google.rpc.ErrorInfo domain whose reasons this package trusts.
const ErrorDomain = "cwsandbox.com"

// Reasons the API reports in ErrorInfo (not exhaustive).
const (
	ReasonSandboxNotFound      = "CWSANDBOX_SANDBOX_NOT_FOUND"
	ReasonSandboxNotRunning    = "CWSANDBOX_SANDBOX_NOT_RUNNING"
	ReasonUnauthenticated      = "CWSANDBOX_UNAUTHENTICATED"
	ReasonInvalidRequest       = "CWSANDBOX_INVALID_REQUEST"
	ReasonNotImplemented       = "CWSANDBOX_NOT_IMPLEMENTED"
	ReasonRunnerUnavailable    = "CWSANDBOX_RUNNER_UNAVAILABLE"
	ReasonBackendUnavailable   = "CWSANDBOX_BACKEND_UNAVAILABLE"
	ReasonCommandTimeout       = "CWSANDBOX_COMMAND_TIMEOUT"
	ReasonFileNotFound         = "CWSANDBOX_FILE_NOT_FOUND"
	ReasonFileIsDirectory      = "CWSANDBOX_FILE_IS_DIRECTORY"
	ReasonFilePermissionDenied = "CWSANDBOX_FILE_PERMISSION_DENIED"
	ReasonFileTooLarge         = "CWSANDBOX_FILE_TOO_LARGE"
	ReasonFileIOFailed         = "CWSANDBOX_FILE_IO_FAILED"
	// ReasonCheckpointNotSupported (sandboxd's own): the sandbox's runtime class cannot
	// be checkpointed on its runner.
	ReasonCheckpointNotSupported = "CWSANDBOX_CHECKPOINT_NOT_SUPPORTED"
	// ReasonNodeAgentUnavailable (sandboxd's own): on a Kubernetes runner, the node agent
	// of the sandbox's node could not be reached for a pause or resume (UNAVAILABLE, so
	// errors.Is(err, ErrUnavailable); retry after the RetryInfo delay).
	ReasonNodeAgentUnavailable = "CWSANDBOX_NODE_AGENT_UNAVAILABLE"
	// ReasonNodeAgentRefused (sandboxd's own): that node agent answered and refused the
	// pause or resume (FAILED_PRECONDITION; the reason is in the runner's log).
	ReasonNodeAgentRefused = "CWSANDBOX_NODE_AGENT_REFUSED"
	// ReasonCheckpointSpaceExhausted (sandboxd's own): the checkpoint store has no room
	// for the checkpoint of a pause releasing resources or a fork (on a Kubernetes
	// runner: the node agent's quota or free space on the sandbox's node);
	// RESOURCE_EXHAUSTED. The sandbox is left as it was; retry once checkpoints are
	// deleted.
	ReasonCheckpointSpaceExhausted = "CWSANDBOX_CHECKPOINT_SPACE_EXHAUSTED"
	// File-system snapshot reasons (the official client maps the same ones).
	ReasonSnapshotNotFound          = "CWSANDBOX_FSS_NOT_FOUND"
	ReasonSnapshotNotReady          = "CWSANDBOX_FSS_NOT_READY"
	ReasonSnapshotNotSupported      = "CWSANDBOX_FSS_NOT_SUPPORTED"
	ReasonSnapshotSizeExceeded      = "CWSANDBOX_FSS_SIZE_EXCEEDED"
	ReasonSnapshotQuotaExceeded     = "CWSANDBOX_FSS_QUOTA_EXCEEDED"
	ReasonSnapshotBucketMismatch    = "CWSANDBOX_FSS_BUCKET_MISMATCH"
	ReasonSnapshotBucketUnavailable = "CWSANDBOX_FSS_BUCKET_UNAVAILABLE"
	ReasonSnapshotRestoreFailed     = "CWSANDBOX_FSS_RESTORE_FAILED"
	ReasonSnapshotCreateFailed      = "CWSANDBOX_FSS_CREATE_FAILED"
	ReasonSnapshotCreateTimedOut    = "CWSANDBOX_FSS_CREATE_TIMED_OUT"
	ReasonSnapshotAuthFailed        = "CWSANDBOX_FSS_AUTH_FAILED"
	ReasonSnapshotTransportFailed   = "CWSANDBOX_FSS_TRANSPORT_FAILED"
	ReasonSnapshotWaitTimeout       = "CWSANDBOX_FSS_WAIT_TIMEOUT"
	ReasonSnapshotCanceled          = "CWSANDBOX_FSS_CANCELED"
	ReasonSnapshotBackendThrottled  = "CWSANDBOX_FSS_BACKEND_THROTTLED"
	ReasonSnapshotInflightLimit     = "CWSANDBOX_FSS_INFLIGHT_LIMIT"
	// ReasonEtagMismatch: an update named a revision (or etag) that is not the current
	// one (ABORTED); read again and retry.
	ReasonEtagMismatch = "CWSANDBOX_ETAG_MISMATCH"
	// ReasonTemplateNotFound: the call named a sandbox template the organization does
	// not have (or has deleted) (NOT_FOUND).
	ReasonTemplateNotFound = "CWSANDBOX_TEMPLATE_NOT_FOUND"
	// ReasonVolumeNotFound: the call named a registered volume the organization does
	// not have (NOT_FOUND).
	ReasonVolumeNotFound = "CWSANDBOX_VOLUME_NOT_FOUND"
	// ReasonVolumeInUse: a delete of a volume live sandboxes mount (FAILED_PRECONDITION).
	ReasonVolumeInUse = "CWSANDBOX_VOLUME_IN_USE"
	// ReasonAlreadyExists: the name is taken (ALREADY_EXISTS), e.g. a template's
	// display name in the organization.
	ReasonAlreadyExists = "CWSANDBOX_ALREADY_EXISTS"
	// ReasonBuildNotFound: the call named a build the organization does not have
	// (NOT_FOUND).
	ReasonBuildNotFound = "CWSANDBOX_BUILD_NOT_FOUND"
	// ReasonBuildNotSupported: no runner can build (none has the gvisor runtime class and
	// a builder image) or there is no platform registry (FAILED_PRECONDITION).
	ReasonBuildNotSupported = "CWSANDBOX_BUILD_NOT_SUPPORTED"
	// ReasonStartFailed is the in-band exec stream code of a command that could not
	// start (not found, not executable); Exec returns it with the shell's exit code.
	ReasonStartFailed = "START_FAILED"
)

// Sentinel errors for errors.Is. An *Error matches those its status code and reason
// imply; a *StateError matches ErrSandboxFailed or ErrSandboxTerminated.
var (
	ErrNotFound          = errors.New("sandbox not found")
	ErrUnauthenticated   = errors.New("not authenticated")
	ErrInvalidArgument   = errors.New("invalid argument")
	ErrNotRunning        = errors.New("sandbox not running")
	ErrUnavailable       = errors.New("service unavailable")
	ErrTimeout           = errors.New("timed out")
	ErrResourceExhausted = errors.New("resource exhausted")
	ErrUnimplemented     = errors.New("not implemented")
	ErrFileNotFound      = errors.New("file not found")
	ErrFileTooLarge      = errors.New("file too large")
	ErrSandboxFailed     = errors.New("sandbox failed")
	ErrSandboxTerminated = errors.New("sandbox terminated")
	// ErrCheckpointNotSupported: the sandbox's runtime class cannot be checkpointed on
	// its runner (a pause releasing resources, a fork); the message names the class
	// that can. (An error with this reason is not ErrNotRunning, though it is
	// FAILED_PRECONDITION too.)
	ErrCheckpointNotSupported = errors.New("checkpoint not supported")

	// Snapshot errors: an *Error matches the one its CWSANDBOX_FSS_* reason names (a
	// snapshot's NOT_FOUND is not ErrNotFound, which is about sandboxes).
	ErrSnapshotNotFound       = errors.New("snapshot not found")
	ErrSnapshotNotReady       = errors.New("snapshot not ready")
	ErrSnapshotNotSupported   = errors.New("snapshots not supported")
	ErrSnapshotSizeExceeded   = errors.New("snapshot size exceeded")
	ErrSnapshotQuotaExceeded  = errors.New("snapshot quota exceeded")
	ErrSnapshotBucketMismatch = errors.New("snapshot bucket mismatch")
	// ErrSnapshotThrottled is a transient refusal (backend throttled, too many
	// snapshots in flight); calls retry it within their budget.
	ErrSnapshotThrottled = errors.New("snapshot backend throttled")
	// ErrSnapshotFailed is a snapshot or restore that failed for good: a *SnapshotError
	// (FAILED state), or an *Error with one of the internal FSS reasons.
	ErrSnapshotFailed = errors.New("snapshot failed")

	// ErrTemplateNotFound: a template call (or CreateFromTemplate) named a template the
	// organization does not have (or has deleted). It is not ErrNotFound, which is about
	// sandboxes.
	ErrTemplateNotFound = errors.New("template not found")
	// ErrVolumeNotFound: a volume call named a registered volume the organization does
	// not have. It is not ErrNotFound, which is about sandboxes.
	ErrVolumeNotFound = errors.New("volume not found")
	// ErrRevisionMismatch: an update's expected revision (etag) is not the current one.
	ErrRevisionMismatch = errors.New("revision mismatch")
	// ErrAlreadyExists: the name is taken.
	ErrAlreadyExists = errors.New("already exists")

	// ErrBuildNotFound: a build call named a build the organization does not have. It is
	// not ErrNotFound, which is about sandboxes.
	ErrBuildNotFound = errors.New("build not found")
	// ErrBuildNotSupported: the platform cannot build images (no runner can).
	ErrBuildNotSupported = errors.New("builds not supported")
	// ErrBuildFailed and ErrBuildCancelled match a *BuildError: a build that ended FAILED
	// or CANCELLED.
	ErrBuildFailed    = errors.New("build failed")
	ErrBuildCancelled = errors.New("build cancelled")
)

// snapshotFailedReasons are the terminal FSS reasons without a sentinel of their own.
var snapshotFailedReasons = map[string]bool{
	ReasonSnapshotBucketUnavailable: true, ReasonSnapshotRestoreFailed: true, ReasonSnapshotCreateFailed: true,
	ReasonSnapshotCreateTimedOut: true, ReasonSnapshotAuthFailed: true, ReasonSnapshotTransportFailed: true,
	ReasonSnapshotCanceled: true,
}

// Violation is one google.rpc.BadRequest field violation.
type Violation struct {
	Field       string
	Description string
}

// Error is an API error: the gRPC status code, and from the status details the
// CWSANDBOX_* reason with its metadata (ErrorInfo), field violations (BadRequest) and
// how long to wait before retrying (RetryInfo). In-band stream errors (exec and log
// streams) carry their code, e.g. STREAM_BACKPRESSURE, as Reason.
type Error struct {
	Code       connect.Code
	Reason     string
	Message    string
	Metadata   map[string]string
	Violations []Violation
	RetryDelay time.Duration
	// Domain of the ErrorInfo the reason came from.
	Domain string
	err    error
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.Message)
	if b.Len() == 0 {
		b.WriteString(e.Code.String())
	}
	if len(e.Violations) > 0 && !strings.Contains(e.Message, e.Violations[0].Field) {
		for i, v := range e.Violations {
			if i == 0 {
				b.WriteString(": ")
			} else {
				b.WriteString("; ")
			}
			b.WriteString(v.Field + " " + v.Description)
		}
	}
	return b.String()
}

// Unwrap returns the underlying transport error.
func (e *Error) Unwrap() error { return e.err }

// Is matches the sentinel errors of this package.
func (e *Error) Is(target error) bool {
	other := strings.HasPrefix(e.Reason, "CWSANDBOX_FILE_") || strings.HasPrefix(e.Reason, "CWSANDBOX_FSS_") || e.Reason == ReasonTemplateNotFound ||
		e.Reason == ReasonBuildNotFound || strings.HasPrefix(e.Reason, "CWSANDBOX_VOLUME_")
	switch target {
	case ErrNotFound:
		return e.Reason == ReasonSandboxNotFound || (e.Code == connect.CodeNotFound && !other)
	case ErrTemplateNotFound:
		return e.Reason == ReasonTemplateNotFound
	case ErrVolumeNotFound:
		return e.Reason == ReasonVolumeNotFound
	case ErrBuildNotFound:
		return e.Reason == ReasonBuildNotFound
	case ErrBuildNotSupported:
		return e.Reason == ReasonBuildNotSupported
	case ErrRevisionMismatch:
		return e.Reason == ReasonEtagMismatch
	case ErrAlreadyExists:
		return e.Code == connect.CodeAlreadyExists || e.Reason == ReasonAlreadyExists
	case ErrUnauthenticated:
		return e.Code == connect.CodeUnauthenticated || e.Code == connect.CodePermissionDenied
	case ErrInvalidArgument:
		return e.Code == connect.CodeInvalidArgument
	case ErrNotRunning:
		return e.Reason == ReasonSandboxNotRunning || e.Code == connect.CodeCanceled
	case ErrUnavailable:
		return e.Code == connect.CodeUnavailable || e.Reason == ReasonRunnerUnavailable || e.Reason == ReasonBackendUnavailable
	case ErrTimeout:
		return e.Code == connect.CodeDeadlineExceeded || e.Reason == ReasonCommandTimeout || e.Reason == ReasonSnapshotWaitTimeout
	case ErrResourceExhausted:
		return e.Code == connect.CodeResourceExhausted
	case ErrUnimplemented:
		return e.Code == connect.CodeUnimplemented || e.Reason == ReasonNotImplemented
	case ErrFileNotFound:
		return e.Reason == ReasonFileNotFound
	case ErrCheckpointNotSupported:
		return e.Reason == ReasonCheckpointNotSupported
	case ErrFileTooLarge:
		return e.Reason == ReasonFileTooLarge
	case ErrSnapshotNotFound:
		return e.Reason == ReasonSnapshotNotFound
	case ErrSnapshotNotReady:
		return e.Reason == ReasonSnapshotNotReady
	case ErrSnapshotNotSupported:
		return e.Reason == ReasonSnapshotNotSupported
	case ErrSnapshotSizeExceeded:
		return e.Reason == ReasonSnapshotSizeExceeded
	case ErrSnapshotQuotaExceeded:
		return e.Reason == ReasonSnapshotQuotaExceeded
	case ErrSnapshotBucketMismatch:
		return e.Reason == ReasonSnapshotBucketMismatch
	case ErrSnapshotThrottled:
		return e.Reason == ReasonSnapshotBackendThrottled || e.Reason == ReasonSnapshotInflightLimit
	case ErrSnapshotFailed:
		return snapshotFailedReasons[e.Reason]
	}
	return false
}

// retryable reports whether a poll may try again after err.
func (e *Error) retryable() bool {
	switch e.Code {
	case connect.CodeUnavailable, connect.CodeDeadlineExceeded, connect.CodeResourceExhausted:
		// Limits do not lift by waiting.
		return e.Reason != ReasonFileTooLarge && e.Reason != ReasonSnapshotSizeExceeded && e.Reason != ReasonSnapshotQuotaExceeded &&
			e.Reason != ReasonCheckpointSpaceExhausted
	}
	return e.Reason == ReasonRunnerUnavailable || e.Reason == ReasonBackendUnavailable ||
		e.Reason == ReasonSnapshotBackendThrottled || e.Reason == ReasonSnapshotInflightLimit
}

// fromRPC turns an RPC error into an *Error (context errors stay as they are).
func fromRPC(err error) error {
	if err == nil {
		return nil
	}
	var e *Error
	if errors.As(err, &e) || errors.Is(err, context.Canceled) {
		return err
	}
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return err
	}
	e = &Error{Code: ce.Code(), Message: ce.Message(), err: err}
	if e.Code == connect.CodeDeadlineExceeded && errors.Is(err, context.DeadlineExceeded) && e.Message == "" {
		e.Message = "deadline exceeded"
	}
	var reasonInfo *errdetails.ErrorInfo
	for _, d := range ce.Details() {
		v, derr := d.Value()
		if derr != nil {
			continue
		}
		switch x := v.(type) {
		case *errdetails.ErrorInfo:
			if x.GetReason() == "" {
				continue
			}
			// Prefer our domain; otherwise keep the first reason seen.
			if reasonInfo == nil || (reasonInfo.GetDomain() != ErrorDomain && x.GetDomain() == ErrorDomain) {
				reasonInfo = x
			}
		case *errdetails.BadRequest:
			for _, fv := range x.GetFieldViolations() {
				e.Violations = append(e.Violations, Violation{Field: fv.GetField(), Description: fv.GetDescription()})
			}
		case *errdetails.RetryInfo:
			if e.RetryDelay == 0 && x.GetRetryDelay() != nil {
				e.RetryDelay = x.GetRetryDelay().AsDuration()
			}
		}
	}
	if reasonInfo != nil {
		e.Reason, e.Domain, e.Metadata = reasonInfo.GetReason(), reasonInfo.GetDomain(), reasonInfo.GetMetadata()
	}
	return e
}

// ReasonOf returns the CWSANDBOX_* reason (or in-band stream code) of err, or "".
func ReasonOf(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Reason
	}
	return ""
}

// StateError reports a sandbox that ended while the caller waited for it to run.
type StateError struct {
	ID       string
	State    State
	Reason   string
	ExitCode *int
}

func (e *StateError) Error() string {
	msg := fmt.Sprintf("sandbox %s is %s", e.ID, e.State)
	if e.Reason != "" {
		msg += ": " + e.Reason
	}
	if e.ExitCode != nil {
		msg += fmt.Sprintf(" (exit code %d)", *e.ExitCode)
	}
	return msg
}

// Is matches ErrSandboxFailed and ErrSandboxTerminated.
func (e *StateError) Is(target error) bool {
	return (target == ErrSandboxFailed && e.State == StateFailed) ||
		(target == ErrSandboxTerminated && e.State == StateTerminated)
}
