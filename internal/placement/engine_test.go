package placement

import (
	"strings"
	"testing"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/policy"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// withEngine is r running container-engine sandboxes with image under gvisor.
func withEngine(r Runner, image string) Runner {
	r.RuntimeClasses = []string{"runc", "gvisor"}
	r.EngineImage, r.EngineRuntimeClass = image, "gvisor"
	return r
}

func engineSpec() *sandboxv1.SandboxSpec {
	return &sandboxv1.SandboxSpec{Containers: []*sandboxv1.Container{{}}}
}

var testEngine = &runtime.Engine{Compose: []byte("services: {}"), Project: "sandbox", Images: []string{"docker.io/library/busybox:1", "ghcr.io/other/db:2"}}

// TestPlaceEngine: a container-engine sandbox goes only to runners that run engines
// (never a silent fallback to one that does not), takes each runner's engine image and
// runtime class, and is refused by a policy that forbids engines or one of its images.
func TestPlaceEngine(t *testing.T) {
	none := rn("none", nil)
	none.NoContainerEngine, none.EngineUnavailable = true, "it has no engine image (runner flag --engine-image)"
	noImage := rn("no-image", nil) // says it can, but has no image: not a candidate either
	yes := withEngine(rn("yes", nil), "localhost/engine:1")

	cands, err := Place(Request{Spec: engineSpec(), Engine: testEngine, Runners: []Runner{none, noImage, yes}, Platform: policy.RunnerPlatform(nil)})
	if err != nil {
		t.Fatal(err)
	}
	if got := ids(cands); len(got) != 1 || got[0] != "yes" {
		t.Fatalf("candidates %v, want only the runner with an engine", got)
	}
	s := cands[0].Result.Spec
	if s.GetContainers()[0].GetImage() != "localhost/engine:1" || s.GetRuntimeClass() != "gvisor" {
		t.Errorf("resolved engine container %v under %q, want the runner's engine image under gvisor", s.GetContainers()[0], s.GetRuntimeClass())
	}

	// No runner with an engine: FAILED_PRECONDITION CWSANDBOX_NO_SUITABLE_RUNNER naming
	// each runner's lack.
	_, err = Place(Request{Spec: engineSpec(), Engine: testEngine, Runners: []Runner{none, noImage}, Platform: policy.RunnerPlatform(nil)})
	if connect.CodeOf(err) != connect.CodeFailedPrecondition || apierr.Reason(err) != apierr.NoSuitableRunner {
		t.Fatalf("err = %v, want FAILED_PRECONDITION %s", err, apierr.NoSuitableRunner)
	}
	for _, id := range []string{"none", "no-image"} {
		if !hasField(err, "runner["+id+"].control", policy.ConstraintPlatformContainerEngine) {
			t.Errorf("violations %v, want runner[%s].control naming %s", apierr.Violations(err), id, policy.ConstraintPlatformContainerEngine)
		}
	}
	// One runner considered: the same reason (another runner may take it), and the
	// runner's own word for why.
	_, err = Place(Request{Spec: engineSpec(), Engine: testEngine, Runners: []Runner{none}, Platform: policy.RunnerPlatform(nil)})
	if apierr.Reason(err) != apierr.NoSuitableRunner || connect.CodeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), "--engine-image") {
		t.Errorf("one runner without an engine: %v", err)
	}

	// A policy that forbids engines, or an image of the engine's.
	for _, tc := range []struct{ name, doc, field, constraint string }{
		{"forbidden", `{"constraints":{"security":{"container_engine_allowed":false}}}`, "control", "constraints.security.container_engine_allowed"},
		{"image", `{"constraints":{"images":{"allowed_registries":["docker.io","localhost"]}}}`, "engine.images[1]", "constraints.images.allowed_registries"},
		{"engine image", `{"constraints":{"images":{"allowed_registries":["docker.io","ghcr.io"]}}}`, "sandbox.spec.containers[0].image", "constraints.images.allowed_registries"},
		{"runtime class", `{"constraints":{"security":{"allowed_runtime_classes":["runc"]}}}`, "sandbox.spec.runtime_class", "constraints.security.allowed_runtime_classes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := withEngine(rn("r", mustPolicy(t, tc.doc)), "localhost/engine:1")
			_, err := Place(Request{Spec: engineSpec(), Engine: testEngine, Runners: []Runner{r}, Platform: policy.RunnerPlatform(nil)})
			if connect.CodeOf(err) != connect.CodeInvalidArgument || !hasField(err, tc.field, tc.constraint) {
				t.Fatalf("err = %v (%v), want INVALID_ARGUMENT on %s naming %s", err, apierr.Violations(err), tc.field, tc.constraint)
			}
		})
	}

	// The same policy lets a platform sandbox through: the engine's images are checked
	// only for an engine.
	r := withEngine(rn("r", mustPolicy(t, `{"constraints":{"security":{"container_engine_allowed":false}}}`)), "localhost/engine:1")
	if _, err := Place(Request{Spec: spec("", ""), Runners: []Runner{r}, Platform: policy.RunnerPlatform(nil)}); err != nil {
		t.Errorf("a platform sandbox under a policy forbidding engines: %v", err)
	}
}

func hasField(err error, field, constraint string) bool {
	for _, v := range apierr.Violations(err) {
		if v.Field == field && strings.Contains(v.Description, constraint) {
			return true
		}
	}
	return false
}
