package runner

import (
	"context"
	"errors"
	"testing"

	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/runtimetest"
)

// TestAwaitStartWakesOnRunning: an AwaitStart of a sandbox still being created answers
// RUNNING once the sandbox runs (woken by the runner's change, within one call).
func TestAwaitStartWakesOnRunning(t *testing.T) {
	f := runtimetest.NewFake()
	release := make(chan struct{})
	f.OnCreate = releaseCreate(release)
	r := newQuietRunner(t, f)
	sb, err := r.Create(context.Background(), CreateRequest{Spec: runtime.Spec{Container: runtime.Container{Image: "busybox"}}})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := r.Get(sb.ID); err != nil || got.State != StateCreating {
		t.Fatalf("before the create ends: %v %v, want CREATING", got.State, err)
	}
	type answer struct {
		sb  Sandbox
		err error
	}
	done := make(chan answer, 1)
	go func() {
		got, err := r.AwaitStart(context.Background(), sb.ID, MaxAwaitStart)
		done <- answer{got, err}
	}()
	close(release)
	if a := <-done; a.err != nil || a.sb.State != StateRunning {
		t.Errorf("await start: %v %v, want RUNNING", a.sb.State, a.err)
	}
}

// TestAwaitStartEnds: a cancelled caller is answered the current state at once, an
// unknown sandbox is not found, and a running one is not waited for.
func TestAwaitStartEnds(t *testing.T) {
	f := runtimetest.NewFake()
	f.OnCreate = blockCreate
	r := newQuietRunner(t, f)
	sb, err := r.Create(context.Background(), CreateRequest{Spec: runtime.Spec{Container: runtime.Container{Image: "busybox"}}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if got, err := r.AwaitStart(ctx, sb.ID, MaxAwaitStart); err != nil || got.State != StateCreating {
		t.Errorf("cancelled await: %v %v, want CREATING at once", got.State, err)
	}
	if _, err := r.AwaitStart(context.Background(), "nosuch", MaxAwaitStart); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("await of an unknown sandbox: %v, want not found", err)
	}
	if _, err := r.Delete(sb.ID, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := r.WaitTerminal(context.Background(), sb.ID); err != nil {
		t.Fatal(err)
	}
}
