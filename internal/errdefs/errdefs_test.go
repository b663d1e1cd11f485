package errdefs_test

import (
	"errors"
	"testing"

	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/image"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/store"
)

// TestSentinels: each package's sentinel is its kind (errors.Is) and keeps its text;
// no package's sentinel is another's.
func TestSentinels(t *testing.T) {
	for _, tc := range []struct {
		name      string
		err, kind error
		text      string
	}{
		{"runtime.ErrNotFound", runtime.ErrNotFound, errdefs.ErrNotFound, "sandbox not found"},
		{"runtime.ErrImageNotFound", runtime.ErrImageNotFound, errdefs.ErrNotFound, "image not found"},
		{"image.ErrNotFound", image.ErrNotFound, errdefs.ErrNotFound, "image not found"},
		{"store.ErrNotFound", store.ErrNotFound, errdefs.ErrNotFound, "not found"},
		{"runner.ErrAlreadyExists", runner.ErrAlreadyExists, errdefs.ErrAlreadyExists, "sandbox already exists"},
		{"store.ErrAlreadyExists", store.ErrAlreadyExists, errdefs.ErrAlreadyExists, "already exists"},
	} {
		if !errors.Is(tc.err, tc.kind) || tc.err.Error() != tc.text {
			t.Errorf("%s: %q, Is(%v) = %v; want %q", tc.name, tc.err, tc.kind, errors.Is(tc.err, tc.kind), tc.text)
		}
	}
	if errors.Is(image.ErrNotFound, runtime.ErrNotFound) || errors.Is(store.ErrNotFound, runtime.ErrNotFound) || errors.Is(runtime.ErrNotFound, store.ErrNotFound) {
		t.Error("one package's not-found matches another's")
	}
}
