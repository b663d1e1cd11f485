package runtime_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// TestValidateEngine: a container-engine spec is one container named cws-engine with a
// bounded file, a DNS-label project and bounded images; anything else is ErrInvalidSpec.
func TestValidateEngine(t *testing.T) {
	ok := func() *runtime.Spec {
		return &runtime.Spec{ID: "sb1", Container: runtime.Container{Name: runtime.EngineContainerName, Image: "engine"},
			Engine: &runtime.Engine{Compose: []byte("services: {}"), Project: "sandbox", Images: []string{"busybox"}}}
	}
	if err := runtime.ValidateSpec(ok(), 63); err != nil {
		t.Fatalf("a valid engine spec: %v", err)
	}
	many := make([]string, runtime.MaxEngineImages+1)
	for i := range many {
		many[i] = "busybox"
	}
	for name, mutate := range map[string]func(*runtime.Spec){
		"sidecar":        func(s *runtime.Spec) { s.Sidecars = []runtime.Container{{Name: "b", Image: "x"}} },
		"init container": func(s *runtime.Spec) { s.InitContainers = []runtime.Container{{Name: "b", Image: "x"}} },
		"other name":     func(s *runtime.Spec) { s.Name = "main" },
		"no file":        func(s *runtime.Spec) { s.Engine.Compose = nil },
		"huge file":      func(s *runtime.Spec) { s.Engine.Compose = make([]byte, runtime.MaxEngineComposeBytes+1) },
		"bad project":    func(s *runtime.Spec) { s.Engine.Project = "Bad_Project" },
		"empty image":    func(s *runtime.Spec) { s.Engine.Images = []string{""} },
		"long image":     func(s *runtime.Spec) { s.Engine.Images = []string{strings.Repeat("a", 1025)} },
		"many images":    func(s *runtime.Spec) { s.Engine.Images = many },
	} {
		s := ok()
		mutate(s)
		if err := runtime.ValidateSpec(s, 63); !errors.Is(err, runtime.ErrInvalidSpec) {
			t.Errorf("%s: %v, want ErrInvalidSpec", name, err)
		}
	}
}
