package local

import (
	"context"
	"errors"
	"testing"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// TestEngineRefused: the local backend runs no container engine yet, says so (it is no
// runtime.EngineHost, so runners report NoContainerEngine) and refuses a spec with an
// engine rather than running its container without it; nothing is left behind.
func TestEngineRefused(t *testing.T) {
	if _, ok := any((*Backend)(nil)).(runtime.EngineHost); ok {
		t.Fatal("the local backend says it hosts a container engine; this test must then run one")
	}
	e := newEnv(t)
	spec := runtime.Spec{ID: "engine1", Container: runtime.Container{Name: runtime.EngineContainerName, Image: "busybox"},
		Engine: &runtime.Engine{Compose: []byte("services: {a: {image: busybox}}"), Project: "sandbox", Images: []string{"busybox"}}}
	if _, err := e.b.Create(context.Background(), &spec); !errors.Is(err, runtime.ErrEngineUnsupported) {
		t.Fatalf("create: %v, want ErrEngineUnsupported", err)
	}
	if found, err := e.b.Recover(context.Background()); err != nil || len(found) != 0 {
		t.Errorf("after the refusal the backend has %d sandboxes (%v)", len(found), err)
	}
}
