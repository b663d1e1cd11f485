package policy

import (
	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// ConstraintPlatformContainerEngine: the runner runs no container-engine sandboxes (no
// engine image, or a backend that cannot host Docker Engine safely).
const ConstraintPlatformContainerEngine = "platform.container_engine"

// EngineField is the field a container-engine refusal names: the request's control.
const EngineField = "control"

// ResolveEngine is ResolveRevision for a sandbox that runs engine (nil: ResolveRevision
// itself): the spec's one container takes the runner's engine image and the sandbox the
// runner's engine runtime class (the platform's, not the caller's pin), and on top of
// every check of a spec the runner must run container-engine sandboxes, the policy must
// not forbid them (constraints.security.container_engine_allowed), and every image the
// engine runs (engine.images[i]) must pass the policy's image rules like a container's.
func ResolveEngine(p *Policy, revision string, spec *sandboxv1.SandboxSpec, engine *runtime.Engine, platform Platform) Result {
	s, vs := resolve(p, spec, engine, platform)
	res := Result{Spec: s, Violations: vs, PolicyRevision: revision}
	if p != nil && !p.Base.Pod.IsZero() {
		res.Pod = p.Base.Pod
	}
	if p != nil {
		res.meta = pauseMeta(p.Base.Pause)
	}
	return res
}

// engine gives s the runner's engine and checks that the runner and the policy allow
// container-engine sandboxes.
func (r *resolver) engine(s *sandboxv1.SandboxSpec, _ *runtime.Engine) {
	if r.pl.NoContainerEngine || r.pl.EngineImage == "" {
		why := r.pl.EngineUnavailable
		if why == "" {
			why = "it has no engine image or its backend cannot host Docker Engine safely"
		}
		r.add(EngineField, ConstraintPlatformContainerEngine, "none", false,
			"this runner runs no container-engine sandboxes (control CONTROL_CONTAINER_ENGINE): %s; "+
				"use control CONTROL_PLATFORM or pick a runner that runs them", why)
	}
	if sec := r.c.Security; sec != nil && sec.ContainerEngineAllowed != nil && !*sec.ContainerEngineAllowed {
		r.add(EngineField, "constraints.security.container_engine_allowed", "false", false,
			"this runner's policy forbids container-engine sandboxes (control CONTROL_CONTAINER_ENGINE); use control CONTROL_PLATFORM")
	}
	if len(s.GetContainers()) == 1 {
		s.Containers[0].Image = r.pl.EngineImage
	}
	s.RuntimeClass = r.pl.EngineRuntimeClass
}
