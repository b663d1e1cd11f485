package runtime

import (
	"errors"
	"fmt"
	"testing"
)

func TestCreateFailureReason(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{fmt.Errorf("pull: %w", ErrImageNotFound), FailureImagePull},
		{fmt.Errorf("pull: %w", ErrImageUnauthorized), FailureImagePull},
		{fmt.Errorf("pull: %w", ErrRegistry), FailureImagePull},
		{fmt.Errorf("ref: %w", ErrInvalidImageRef), FailureImagePull},
		{fmt.Errorf("x: %w", ErrInvalidSpec), FailureStart},
		{fmt.Errorf("x: %w", ErrUnknownRuntime), FailureStart},
		{fmt.Errorf("x: %w", ErrEngineUnsupported), FailureStart},
		{errors.New("the runner's gate container could not be created"), FailureBackend},
	} {
		if got := CreateFailureReason(tc.err); got != tc.want {
			t.Errorf("CreateFailureReason(%v) = %q, want %q", tc.err, got, tc.want)
		}
	}
}
