package gateway

import (
	"strings"
	"testing"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

func TestAddRegistryCredentials(t *testing.T) {
	s := &Server{registryCreds: func(org, image string) (string, string, bool) {
		if !strings.HasPrefix(image, "reg.example:8080/") {
			return "", "", false
		}
		return "u", "token-of-" + org, true
	}}
	own := &runtime.Credentials{Username: "mine", Password: "p"}
	sp := runtime.Spec{Container: runtime.Container{Image: "reg.example:8080/org-a/app:v1"},
		Sidecars:       []runtime.Container{{Image: "docker.io/library/busybox"}, {Image: "reg.example:8080/org-a/side", PullCredentials: own}},
		InitContainers: []runtime.Container{{Image: "reg.example:8080/org-a/init"}}}
	s.addRegistryCredentials(&sp, "org-a")
	if c := sp.PullCredentials; c == nil || c.Password != "token-of-org-a" {
		t.Errorf("primary: %+v", c)
	}
	if sp.Sidecars[0].PullCredentials != nil {
		t.Error("credentials for another registry's image")
	}
	if sp.Sidecars[1].PullCredentials != own {
		t.Error("the spec's own credentials replaced")
	}
	if c := sp.InitContainers[0].PullCredentials; c == nil || c.Password != "token-of-org-a" {
		t.Errorf("init container: %+v", c)
	}
	(&Server{}).addRegistryCredentials(&sp, "org-a") // no registry: nothing to do

	// A container-engine sandbox: each of the engine's images of the platform registry
	// (a Compose build's) gets the organization's token, for that image only.
	eng := runtime.Spec{Engine: &runtime.Engine{Images: []string{"reg.example:8080/org-a/compose-app:abc", "redis:7"}}}
	s.addRegistryCredentials(&eng, "org-a")
	if c := eng.Engine.PullCredentials["reg.example:8080/org-a/compose-app:abc"]; c == nil || c.Password != "token-of-org-a" {
		t.Errorf("engine image of the platform registry: %+v", eng.Engine.PullCredentials)
	}
	if _, ok := eng.Engine.PullCredentials["redis:7"]; ok || len(eng.Engine.PullCredentials) != 1 {
		t.Errorf("engine credentials %+v: only the platform registry's image gets them", eng.Engine.PullCredentials)
	}
}

func TestEngineBuilt(t *testing.T) {
	req := &sandboxv1.CreateSandboxFromFileRequest{ImageOverrides: map[string]string{"db": "redis:7"},
		BuildContexts: map[string][]byte{"app": []byte("tar"), "other": []byte("x")}, BuilderSizes: map[string]string{"app": "small"},
		BuildContextObjects: map[string]*sandboxv1.BuildContextObject{"app": {Key: "k"}}}
	out := engineBuilt(req, map[string]string{"app": "reg.example:8080/org-a/compose-app:abc"})
	if out.ImageOverrides["app"] != "reg.example:8080/org-a/compose-app:abc" || out.ImageOverrides["db"] != "redis:7" {
		t.Errorf("overrides %v", out.ImageOverrides)
	}
	if _, ok := out.BuildContexts["app"]; ok || len(out.BuilderSizes) != 0 || len(out.BuildContextObjects) != 0 || len(out.BuildContexts) != 1 {
		t.Errorf("what built app is still sent: %v %v %v", out.BuildContexts, out.BuilderSizes, out.BuildContextObjects)
	}
	if _, ok := req.ImageOverrides["app"]; ok || len(req.BuildContexts) != 2 {
		t.Error("the caller's request changed")
	}
}
