// Package apierr builds the errors of the public API (AIP-193): a status code with
// google.rpc.ErrorInfo (domain cwsandbox.com, a CWSANDBOX_* reason, metadata), and where
// they fit google.rpc.BadRequest field violations and google.rpc.RetryInfo. The official
// clients map reasons in this domain to their exception classes.
package apierr

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Domain is the ErrorInfo domain the clients trust.
const Domain = "cwsandbox.com"

// Reasons.
const (
	InvalidRequest          = "CWSANDBOX_INVALID_REQUEST"
	InvalidPath             = "CWSANDBOX_INVALID_PATH"
	Unauthenticated         = "CWSANDBOX_UNAUTHENTICATED"
	PermissionDenied        = "CWSANDBOX_PERMISSION_DENIED"
	NotImplemented          = "CWSANDBOX_NOT_IMPLEMENTED"
	SandboxNotFound         = "CWSANDBOX_SANDBOX_NOT_FOUND"
	SandboxNotRunning       = "CWSANDBOX_SANDBOX_NOT_RUNNING"
	PlacementRejected       = "CWSANDBOX_PLACEMENT_REJECTED"
	NoSuitableRunner        = "CWSANDBOX_NO_SUITABLE_RUNNER"
	RunnerUnavailable       = "CWSANDBOX_RUNNER_UNAVAILABLE"
	RunnerNotFound          = "CWSANDBOX_RUNNER_NOT_FOUND"
	CommandTimeout          = "CWSANDBOX_COMMAND_TIMEOUT"
	FileNotFound            = "CWSANDBOX_FILE_NOT_FOUND"
	FileIsDirectory         = "CWSANDBOX_FILE_IS_DIRECTORY"
	FilePermissionDenied    = "CWSANDBOX_FILE_PERMISSION_DENIED"
	FileTooLarge            = "CWSANDBOX_FILE_TOO_LARGE"
	FileNotRegular          = "CWSANDBOX_FILE_NOT_REGULAR" // a FIFO, socket or device: not read through the API
	FileIOFailed            = "CWSANDBOX_FILE_IO_FAILED"
	FSSNotSupported         = "CWSANDBOX_FSS_NOT_SUPPORTED"
	ResourceCeilingExceeded = "CWSANDBOX_RESOURCE_CEILING_EXCEEDED"
	RunnerCapacityExhausted = "CWSANDBOX_RUNNER_CAPACITY_EXHAUSTED"
	// HTTPSShareTokenNotSupported: no runner that may take the sandbox can check the
	// share token of an HTTPS SHARE_TOKEN endpoint (FAILED_PRECONDITION).
	HTTPSShareTokenNotSupported = "CWSANDBOX_HTTPS_SHARE_TOKEN_NOT_SUPPORTED"
	// ServerBusy: the server buffers as many request bytes as it may (RESOURCE_EXHAUSTED).
	ServerBusy = "CWSANDBOX_SERVER_BUSY"
	// RouteNotFound: no REST route has the request's path (NOT_FOUND, HTTP 404).
	RouteNotFound = "CWSANDBOX_ROUTE_NOT_FOUND"
)

// Violation names a request field and what is wrong with it.
type Violation struct {
	Field       string
	Description string
}

// Describe joins violations as "FIELD DESCRIPTION; FIELD DESCRIPTION" for a message.
func Describe(vs []Violation) string {
	parts := make([]string, len(vs))
	for i, v := range vs {
		parts[i] = v.Field + " " + v.Description
	}
	return strings.Join(parts, "; ")
}

// New returns an error with code and an ErrorInfo of reason and metadata.
func New(code connect.Code, reason, msg string, meta map[string]string) *connect.Error {
	err := connect.NewError(code, errors.New(msg))
	if d, derr := connect.NewErrorDetail(&errdetails.ErrorInfo{Reason: reason, Domain: Domain, Metadata: meta}); derr == nil {
		err.AddDetail(d)
	}
	return err
}

// Newf is New with a formatted message and no metadata.
func Newf(code connect.Code, reason, format string, args ...any) *connect.Error {
	return New(code, reason, fmt.Sprintf(format, args...), nil)
}

// Invalid returns INVALID_ARGUMENT with reason and a BadRequest listing violations.
func Invalid(reason, msg string, vs []Violation) *connect.Error {
	return WithViolations(New(connect.CodeInvalidArgument, reason, msg, nil), vs)
}

// WithViolations adds a BadRequest listing vs (nothing when vs is empty).
func WithViolations(err *connect.Error, vs []Violation) *connect.Error {
	if len(vs) == 0 {
		return err
	}
	br := &errdetails.BadRequest{}
	for _, v := range vs {
		br.FieldViolations = append(br.FieldViolations, &errdetails.BadRequest_FieldViolation{Field: v.Field, Description: v.Description})
	}
	if d, derr := connect.NewErrorDetail(br); derr == nil {
		err.AddDetail(d)
	}
	return err
}

// WithRetry adds RetryInfo: the client should wait delay before trying again.
func WithRetry(err *connect.Error, delay time.Duration) *connect.Error {
	if d, derr := connect.NewErrorDetail(&errdetails.RetryInfo{RetryDelay: durationpb.New(delay)}); derr == nil {
		err.AddDetail(d)
	}
	return err
}

// Info returns the ErrorInfo of err in our domain, or nil.
func Info(err error) *errdetails.ErrorInfo {
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return nil
	}
	for _, d := range ce.Details() {
		v, derr := d.Value()
		if derr != nil {
			continue
		}
		if info, ok := v.(*errdetails.ErrorInfo); ok && info.GetDomain() == Domain {
			return info
		}
	}
	return nil
}

// RetryInfo returns the RetryInfo of err (what WithRetry adds), or nil.
func RetryInfo(err error) *errdetails.RetryInfo {
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return nil
	}
	for _, d := range ce.Details() {
		if v, derr := d.Value(); derr == nil {
			if ri, ok := v.(*errdetails.RetryInfo); ok {
				return ri
			}
		}
	}
	return nil
}

// Reason returns err's CWSANDBOX_* reason, or "".
func Reason(err error) string {
	return Info(err).GetReason()
}

// Violations returns the BadRequest field violations of err.
func Violations(err error) []Violation {
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return nil
	}
	var out []Violation
	for _, d := range ce.Details() {
		v, derr := d.Value()
		if derr != nil {
			continue
		}
		if br, ok := v.(*errdetails.BadRequest); ok {
			for _, fv := range br.GetFieldViolations() {
				out = append(out, Violation{Field: fv.GetField(), Description: fv.GetDescription()})
			}
		}
	}
	return out
}
