package runner

import (
	"fmt"
	"slices"

	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// DefaultEngineRuntimeClass is the runtime class container-engine sandboxes run under
// unless the runner is told otherwise: gVisor hosts Docker Engine inside its own kernel,
// so the engine's privileges never reach the host's.
const DefaultEngineRuntimeClass = "gvisor"

// engineRuntimeClass is the runtime class container-engine sandboxes run under.
func (l *Local) engineRuntimeClass() string {
	if l.EngineRuntimeClass != "" {
		return l.EngineRuntimeClass
	}
	return DefaultEngineRuntimeClass
}

// engineUnavailable is "" when the runner runs container-engine sandboxes, else why not:
// no engine image, an engine runtime class it does not offer, or a backend that cannot
// host the engine safely under it (runtime.EngineHost).
func (l *Local) engineUnavailable() string {
	class := l.engineRuntimeClass()
	switch {
	case l.EngineImage == "":
		return "it has no engine image (runner flag --engine-image)"
	case l.R.Support().NoContainerEngine:
		return "its backend runs no container engine"
	case !slices.Contains(l.Classes(), class):
		return fmt.Sprintf("its engine runtime class %q is not one it offers (%v)", class, l.Classes())
	}
	h, ok := l.R.backend.(runtime.EngineHost)
	if !ok {
		return "its backend cannot host a container engine"
	}
	if why := h.EngineUnavailable(class); why != "" {
		return "its backend cannot host a container engine under runtime class " + class + ": " + why
	}
	return ""
}

// engineSpec completes a container-engine spec with the runner's engine image and
// runtime class, or refuses it: FAILED_PRECONDITION CWSANDBOX_NO_SUITABLE_RUNNER naming
// why the runner runs none (the gateway then tries its next candidate), INVALID_ARGUMENT
// for an image or class other than the runner's (the gateway gives the runner's own).
func (l *Local) engineSpec(s *runtime.Spec) error {
	if why := l.engineUnavailable(); why != "" {
		return apierr.New(apierr.NoSuitableRunner,
			fmt.Sprintf("runner %s runs no container-engine sandboxes (control CONTROL_CONTAINER_ENGINE): %s", l.RunnerID, why),
			map[string]string{"runner_id": l.RunnerID})
	}
	class := l.engineRuntimeClass()
	var vs []apierr.Violation
	if img := s.Container.Image; img != "" && img != l.EngineImage {
		vs = append(vs, apierr.Violation{Field: "sandbox.spec.containers[0].image",
			Description: fmt.Sprintf("a container-engine sandbox runs the runner's engine image %q, not %q", l.EngineImage, img)})
	}
	if rc := s.RuntimeClass; rc != "" && rc != class {
		vs = append(vs, apierr.Violation{Field: "sandbox.spec.runtime_class",
			Description: fmt.Sprintf("a container-engine sandbox runs under the runner's engine runtime class %q, not %q", class, rc)})
	}
	if len(vs) > 0 {
		return apierr.Invalid(apierr.InvalidRequest, "invalid container-engine sandbox: "+apierr.Describe(vs), vs)
	}
	s.Container.Image, s.RuntimeClass = l.EngineImage, class
	return nil
}
