package runner

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// endedBackend reports one sandbox that ended while the runner was down, and fails its
// first Destroys like a teardown step that is busy for a moment.
type endedBackend struct {
	mu        sync.Mutex
	failFirst int
	destroys  int
	destroyed chan struct{}
}

func (b *endedBackend) Create(context.Context, *runtime.Spec) (runtime.Info, error) {
	return runtime.Info{}, errors.New("not used")
}
func (b *endedBackend) DialAgent(context.Context, string) (net.Conn, error) {
	return nil, errors.New("not used")
}
func (b *endedBackend) Wait(context.Context, string) (runtime.Exit, error) {
	return runtime.Exit{}, errors.New("not used")
}
func (b *endedBackend) Stop(context.Context, string, time.Duration) error { return nil }
func (b *endedBackend) Destroy(_ context.Context, id string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.destroys++
	if b.destroys <= b.failFirst {
		return errors.New("remove cgroup: device or resource busy")
	}
	close(b.destroyed)
	return nil
}
func (b *endedBackend) Recover(context.Context) ([]runtime.Recovered, error) {
	return []runtime.Recovered{{Spec: runtime.Spec{ID: "ended-1"},
		Exit: &runtime.Exit{Reason: "Vanished", Message: "the container is gone", At: time.Now()}}}, nil
}

// TestRecoveredEndedSandboxIsDestroyedDespiteTransientErrors: a sandbox a crash left
// half-made is destroyed by the restarted runner, and a teardown that fails for a
// moment is tried again rather than leaving the sandbox's mounts and files behind.
func TestRecoveredEndedSandboxIsDestroyedDespiteTransientErrors(t *testing.T) {
	be := &endedBackend{failFirst: 2, destroyed: make(chan struct{})}
	r, err := New(context.Background(), Config{Backend: be, DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	select {
	case <-be.destroyed:
	case <-time.After(10 * time.Second):
		t.Fatalf("not destroyed after %d attempts", be.destroys)
	}
	sb, err := r.WaitTerminal(context.Background(), "ended-1")
	if err != nil {
		t.Fatal(err)
	}
	if sb.State != StateFailed || sb.Reason != "Vanished" {
		t.Errorf("recovered sandbox: %s %s, want FAILED Vanished", sb.State, sb.Reason)
	}
	if be.destroys != 3 {
		t.Errorf("destroys = %d, want 3 (two failures, then success)", be.destroys)
	}
}
