package runtime

import "errors"

// The reasons a sandbox whose Create failed ends with, by the backend's error
// (CreateFailureReason). The runner's own table names them alike (runner.Reason*).
const (
	FailureImagePull = "ImagePullFailed" // the image cannot be had: the caller's
	FailureStart     = "StartError"      // the spec cannot start: the caller's
	FailureBackend   = "BackendError"    // anything else: the runner's or the node's
)

// CreateFailureReason is the one mapping of a backend's create error to the reason the
// sandbox ends with: an image pull failure ImagePullFailed; a spec the backend cannot
// start (ErrInvalidSpec, an unknown runtime class, an engine it does not support)
// StartError; anything else BackendError, which counts against the runner's health.
// The runner's create (runner.createFailureReason, after a start sequence's own reason
// and a cancellation) and a backend's re-adoption of a failed create (the Kubernetes
// backend's Recover) both use it, so the two cannot differ.
func CreateFailureReason(err error) string {
	switch {
	case errors.Is(err, ErrImageNotFound), errors.Is(err, ErrImageUnauthorized),
		errors.Is(err, ErrRegistry), errors.Is(err, ErrInvalidImageRef):
		return FailureImagePull
	case errors.Is(err, ErrInvalidSpec), errors.Is(err, ErrUnknownRuntime), errors.Is(err, ErrEngineUnsupported):
		return FailureStart
	}
	return FailureBackend
}
