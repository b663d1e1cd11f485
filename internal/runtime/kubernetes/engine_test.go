package kubernetes

import (
	"context"
	"errors"
	"testing"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// TestEngineRefused: the Kubernetes backend runs no container engine yet: it says so
// (Support.NoContainerEngine, and it is no runtime.EngineHost) and refuses a spec with an
// engine before it creates anything.
func TestEngineRefused(t *testing.T) {
	b := &Backend{cfg: Config{Namespace: "ns", RunnerID: "r1", AgentImage: "agent:1"}, sandboxes: map[string]*sandbox{}}
	if !b.Support().NoContainerEngine {
		t.Error("Support does not say NoContainerEngine")
	}
	if _, ok := any(b).(runtime.EngineHost); ok {
		t.Error("the backend says it hosts a container engine")
	}
	spec := runtime.Spec{ID: "engine1", Container: runtime.Container{Name: runtime.EngineContainerName, Image: "engine:1"},
		Engine: &runtime.Engine{Compose: []byte("services: {a: {image: busybox}}"), Project: "sandbox", Images: []string{"busybox"}}}
	if _, err := b.Create(context.Background(), &spec); !errors.Is(err, runtime.ErrEngineUnsupported) {
		t.Fatalf("create: %v, want ErrEngineUnsupported", err)
	}
}
