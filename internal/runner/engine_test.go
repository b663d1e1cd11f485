package runner

import (
	"context"
	"log/slog"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/runtimetest"
)

// engineHost is the fake backend saying it hosts a container engine under gvisor.
type engineHost struct{ *runtimetest.Fake }

func (engineHost) EngineUnavailable(class string) string {
	if class != "gvisor" {
		return "only under gvisor"
	}
	return ""
}

func engineRunner(t *testing.T, be runtime.Backend, image string) *Local {
	t.Helper()
	r, err := New(context.Background(), Config{Backend: be, DataDir: t.TempDir(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	l := NewLocal("r1", r)
	l.RuntimeClasses = []string{"runc", "gvisor"}
	l.EngineImage = image
	return l
}

func engineRequest() CreateRequest {
	return CreateRequest{Spec: runtime.Spec{
		Container: runtime.Container{Name: runtime.EngineContainerName},
		Engine:    &runtime.Engine{Compose: []byte("services: {a: {image: busybox}}"), Project: "sandbox", Images: []string{"busybox"}},
	}}
}

// TestEngineRefusedWithTheReason: a runner without an engine image, with an engine
// runtime class it does not offer, or over a backend that cannot host an engine says
// so in its capacity and refuses container-engine sandboxes with
// CWSANDBOX_NO_SUITABLE_RUNNER naming why (never runs them without the engine).
func TestEngineRefusedWithTheReason(t *testing.T) {
	fake := func() *runtimetest.Fake { f := runtimetest.NewFake(); t.Cleanup(f.Close); return f }
	for _, tc := range []struct {
		name string
		l    func() *Local
		why  string
	}{
		{"no image", func() *Local { return engineRunner(t, engineHost{fake()}, "") }, "--engine-image"},
		{"backend", func() *Local { return engineRunner(t, fake(), "localhost/engine:1") }, "backend cannot host a container engine"},
		{"class not offered", func() *Local {
			l := engineRunner(t, engineHost{fake()}, "localhost/engine:1")
			l.RuntimeClasses = []string{"runc"}
			return l
		}, `runtime class "gvisor"`},
		{"backend refuses the class", func() *Local {
			l := engineRunner(t, engineHost{fake()}, "localhost/engine:1")
			l.EngineRuntimeClass = "runc"
			return l
		}, "only under gvisor"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := tc.l()
			c, err := l.Capacity(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if !c.NoContainerEngine || c.EngineImage != "" || !strings.Contains(c.EngineUnavailable, tc.why) {
				t.Errorf("capacity: NoContainerEngine %v, engine image %q, why %q", c.NoContainerEngine, c.EngineImage, c.EngineUnavailable)
			}
			if p := l.Platform(); !p.NoContainerEngine || !strings.Contains(p.EngineUnavailable, tc.why) {
				t.Errorf("the runner's policy platform: NoContainerEngine %v, why %q", p.NoContainerEngine, p.EngineUnavailable)
			}
			_, err = l.Create(context.Background(), engineRequest())
			if connect.CodeOf(err) != connect.CodeFailedPrecondition || apierr.Reason(err) != apierr.NoSuitableRunner || !strings.Contains(err.Error(), tc.why) {
				t.Fatalf("err = %v, want FAILED_PRECONDITION %s naming %q", err, apierr.NoSuitableRunner, tc.why)
			}
			if len(l.R.List()) != 0 {
				t.Error("the refused sandbox exists")
			}
		})
	}
}

// TestEngineTakesTheRunnersImage: a runner that runs engines reports its image and class,
// gives a container-engine sandbox both, and refuses another image or class.
func TestEngineTakesTheRunnersImage(t *testing.T) {
	f := runtimetest.NewFake()
	t.Cleanup(f.Close)
	l := engineRunner(t, engineHost{f}, "localhost/engine:1")
	c, err := l.Capacity(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if c.NoContainerEngine || c.EngineImage != "localhost/engine:1" || c.EngineRuntimeClass != DefaultEngineRuntimeClass {
		t.Fatalf("capacity: NoContainerEngine %v, engine %q under %q", c.NoContainerEngine, c.EngineImage, c.EngineRuntimeClass)
	}
	if p := l.Platform(); p.NoContainerEngine || p.EngineImage != "localhost/engine:1" || p.EngineRuntimeClass != "gvisor" {
		t.Errorf("platform %+v", p)
	}
	sb, err := l.Create(context.Background(), engineRequest())
	if err != nil {
		t.Fatal(err)
	}
	got, err := l.R.Get(sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Spec.Container.Image != "localhost/engine:1" || got.Spec.RuntimeClass != "gvisor" || got.Spec.Engine == nil {
		t.Errorf("the sandbox runs %q under %q (engine %v)", got.Spec.Container.Image, got.Spec.RuntimeClass, got.Spec.Engine)
	}

	for _, tc := range []struct{ name, field string }{{"image", "sandbox.spec.containers[0].image"}, {"class", "sandbox.spec.runtime_class"}} {
		req := engineRequest()
		if tc.name == "image" {
			req.Spec.Container.Image = "docker.io/library/docker:dind"
		} else {
			req.Spec.RuntimeClass = "runc"
		}
		_, err := l.Create(context.Background(), req)
		if connect.CodeOf(err) != connect.CodeInvalidArgument || len(apierr.Violations(err)) != 1 || apierr.Violations(err)[0].Field != tc.field {
			t.Errorf("another %s: %v %v", tc.name, err, apierr.Violations(err))
		}
	}
}
