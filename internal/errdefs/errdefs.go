// Package errdefs holds the kinds of error every package shares, in the manner of
// containerd's errdefs: a package declares its own sentinel (runtime.ErrNotFound, "sandbox
// not found"; image.ErrNotFound; store.ErrNotFound) wrapping one of these with %w, so
// errors.Is finds both the package's sentinel and the kind. It imports nothing beyond
// the standard library: the agent, the backends and the store all use it.
package errdefs

import "errors"

var (
	// ErrNotFound: the thing asked for does not exist.
	ErrNotFound = errors.New("not found")
	// ErrAlreadyExists: a thing with that name or ID exists.
	ErrAlreadyExists = errors.New("already exists")
	// ErrNotImplemented: this implementation cannot do that (another may).
	ErrNotImplemented = errors.New("not implemented")
)
