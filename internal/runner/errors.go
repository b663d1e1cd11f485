package runner

import (
	"errors"
	"fmt"
	"strings"
)

var (
	// ErrNotFound: no such sandbox (or it left the retention window).
	ErrNotFound = errors.New("sandbox not found")
	// ErrNotRunning: the sandbox is terminating or terminal, so it cannot serve exec,
	// files or live logs.
	ErrNotRunning = errors.New("sandbox not running")
	// ErrAlreadyExists: a sandbox with that ID exists.
	ErrAlreadyExists = errors.New("sandbox already exists")
)

// Violation names one field of a request and what is wrong with it.
type Violation struct {
	Field       string
	Description string
}

// ValidationError lists every problem found in a request, so a caller fixes them all at
// once instead of one per round trip.
type ValidationError struct {
	Violations []Violation
}

func (e *ValidationError) Error() string {
	parts := make([]string, len(e.Violations))
	for i, v := range e.Violations {
		parts[i] = v.Field + ": " + v.Description
	}
	return "invalid sandbox spec: " + strings.Join(parts, "; ")
}

type violations []Violation

func (vs *violations) add(field, format string, args ...any) {
	*vs = append(*vs, Violation{Field: field, Description: fmt.Sprintf(format, args...)})
}

func (vs violations) err() error {
	if len(vs) == 0 {
		return nil
	}
	return &ValidationError{Violations: vs}
}
