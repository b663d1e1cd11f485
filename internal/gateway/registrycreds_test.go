package gateway

import (
	"strings"
	"testing"

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
}
