package kubernetes

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/errdefs"
)

// TestPauseRefused: the Kubernetes backend can neither freeze nor checkpoint, says why,
// and refuses Pause as not implemented.
func TestPauseRefused(t *testing.T) {
	b := &Backend{}
	for _, class := range []string{"", "runc", "gvisor"} {
		s := b.PauseSupport(class)
		if s.Freeze || s.Checkpoint || !strings.Contains(s.Why, "Kubernetes") {
			t.Errorf("PauseSupport(%q) = %+v, want nothing with a reason naming Kubernetes", class, s)
		}
	}
	if _, err := b.Pause(context.Background(), "x", true); !errors.Is(err, errdefs.ErrNotImplemented) {
		t.Errorf("Pause = %v, want ErrNotImplemented", err)
	}
}
