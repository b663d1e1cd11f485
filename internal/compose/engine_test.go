package compose

import (
	"context"
	"slices"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

const engineFile = `
name: ignored-here
services:
  web:
    image: busybox:1
    command: ["sh", "-c", "echo $$HOME ${GREETING:-hi} && httpd -f -p 80"]
    ports: ["8080:80"]
    depends_on:
      db: {condition: service_healthy}
  db:
    image: registry.example/db:2
    healthcheck:
      test: ["CMD", "true"]
      interval: 1s
    volumes: [data:/data]
  other:
    image: busybox:1
volumes:
  data: {}
`

func engineReq(contents string) *sandboxv1.CreateSandboxFromFileRequest {
	r := req(contents)
	r.Control = sandboxv1.Control_CONTROL_CONTAINER_ENGINE
	return r
}

// TestEngineTranslation: control CONTROL_CONTAINER_ENGINE gives one container (unnamed
// on the public wire, where cws-engine is reserved; named by Apply; its image left to
// the runner), the published ports as the sandbox's services,
// default_resources as the engine's, and Extra.Engine with every service image
// (overrides applied, each once) and a file the engine's compose reads back to the same
// services: overrides in place, nothing pulled, and no second interpolation ($$ stays a
// literal $).
func TestEngineTranslation(t *testing.T) {
	r := engineReq(engineFile)
	r.ImageOverrides = map[string]string{"db": "registry.example/db:3"}
	r.DefaultResources = &sandboxv1.ResourceRequirements{Limits: &sandboxv1.Resources{Cpu: "2", Memory: "2Gi"}}
	r.MaxLifetimeSeconds = 120
	res, err := Convert(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	s := res.Spec
	if len(s.GetContainers()) != 1 {
		t.Fatalf("containers %v, want one", s.GetContainers())
	}
	c := s.Containers[0]
	if c.GetName() != "" || c.GetImage() != "" || !proto.Equal(c.GetResourceRequirements(), r.DefaultResources) {
		t.Errorf("engine container %v", c)
	}
	if len(s.GetServices()) != 1 || s.Services[0].GetPort() != 8080 {
		t.Errorf("services %v, want the published port 8080", s.GetServices())
	}
	if s.GetMaxLifetimeSeconds() != 120 {
		t.Errorf("lifetime %d", s.GetMaxLifetimeSeconds())
	}
	e := res.Extra.Engine
	if e == nil {
		t.Fatal("no Extra.Engine")
	}
	if e.Project != engineProject || !runtime.ValidContainerName(e.Project) {
		t.Errorf("project %q", e.Project)
	}
	want := []string{"registry.example/db:3", "busybox:1"}
	if !slices.Equal(e.Images, want) {
		t.Errorf("images %v, want %v (override applied, each once)", e.Images, want)
	}

	back, err := load(context.Background(), e.Compose)
	if err != nil {
		t.Fatalf("the engine's file does not load: %v\n%s", err, e.Compose)
	}
	if got := back.Services["db"].Image; got != "registry.example/db:3" {
		t.Errorf("db image %q in the engine's file, want the override", got)
	}
	for name, svc := range back.Services {
		if svc.PullPolicy != "never" {
			t.Errorf("%s pull_policy %q, want never (the runner hands images in)", name, svc.PullPolicy)
		}
	}
	if cmd := strings.Join(back.Services["web"].Command, " "); cmd != "sh -c echo $HOME hi && httpd -f -p 80" {
		t.Errorf("web command %q: $$ must reach the engine as a literal $, ${GREETING:-hi} as interpolated here", cmd)
	}
	if hc := back.Services["db"].HealthCheck; hc == nil || strings.Join(hc.Test, " ") != "CMD true" {
		t.Errorf("db healthcheck %v", hc)
	}
	if dep, ok := back.Services["web"].DependsOn["db"]; !ok || dep.Condition != "service_healthy" {
		t.Errorf("web depends_on %v", back.Services["web"].DependsOn)
	}

	// Apply gives the runtime spec its engine and the container its name.
	rs := runtime.Spec{Container: runtime.Container{Image: "engine:1"}}
	if err := res.Extra.Apply(&rs); err != nil {
		t.Fatal(err)
	}
	if rs.Name != runtime.EngineContainerName || rs.Engine == nil || rs.Engine == e || !slices.Equal(rs.Engine.Images, e.Images) {
		t.Errorf("applied: name %q engine %+v", rs.Name, rs.Engine)
	}
	multi := runtime.Spec{Container: runtime.Container{Name: "a"}, Sidecars: []runtime.Container{{Name: "b"}}}
	if err := res.Extra.Apply(&multi); err == nil {
		t.Error("Apply to a spec of two containers: no error")
	}
}

// TestEngineRefusals: under the engine the same keys are refused as under platform
// control (field violations naming the key), and what the engine cannot honour too.
func TestEngineRefusals(t *testing.T) {
	for _, tc := range []struct{ name, file, field string }{
		{"privileged", "services: {a: {image: x, privileged: true}}", "services.a.privileged"},
		{"network_mode", "services: {a: {image: x, network_mode: host}}", "services.a.network_mode"},
		{"pid", "services: {a: {image: x, pid: host}}", "services.a.pid"},
		{"cap_add", "services: {a: {image: x, cap_add: [SYS_ADMIN]}}", "services.a.cap_add"},
		{"env_file", "services: {a: {image: x, env_file: /etc/shadow}}", "services.a.env_file"},
		{"bind", "services: {a: {image: x, volumes: [\"/etc:/host\"]}}", "services.a.volumes[0]"},
		{"secrets", "secrets: {s: {file: /etc/shadow}}\nservices: {a: {image: x}}", "secrets"},
		{"profiles", "services: {a: {image: x, profiles: [dev]}}", "services.a.profiles"},
		{"restart", "services: {a: {image: x, restart: always}}", "services.a.restart"},
		{"unset variable", "services: {a: {image: \"${IMAGE}\"}}", "contents"},
		{"digest", "services: {a: {image: \"x@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\"}}", "services.a.image"},
		{"random published port", "services: {a: {image: x, ports: [\"80\"]}}", "services.a.ports[0].published"},
		{"published twice", "services: {a: {image: x, ports: [\"80:80\"]}, b: {image: x, ports: [\"80:81\"]}}", "services.b.ports[0].published"},
		{"service name", "services: {A_b: {image: x}}", "services.A_b"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Convert(context.Background(), engineReq(tc.file))
			if connect.CodeOf(err) != connect.CodeInvalidArgument || apierr.Reason(err) != apierr.InvalidRequest {
				t.Fatalf("err = %v, want INVALID_ARGUMENT %s", err, apierr.InvalidRequest)
			}
			for _, v := range apierr.Violations(err) {
				if v.Field == tc.field {
					return
				}
			}
			t.Fatalf("violations %v, want one on %s", apierr.Violations(err), tc.field)
		})
	}
	r := engineReq("services: {a: {image: x}}")
	r.ImageOverrides = map[string]string{"z": "y"}
	if _, err := Convert(context.Background(), r); !hasViolation(err, "image_overrides[z]") {
		t.Errorf("override of no service: %v", err)
	}
	r = engineReq("services: {a: {image: x}}")
	r.ImageOverrides = map[string]string{"a": " "}
	if _, err := Convert(context.Background(), r); !hasViolation(err, "services.a.image") {
		t.Errorf("an empty override: %v", err)
	}
	r = engineReq("services: {a: {build: ., command: [x]}}")
	if _, err := Convert(context.Background(), r); !hasViolation(err, "build_contexts[a]") {
		t.Errorf("a service to build from a context not sent: %v, want a violation on build_contexts[a]", err)
	}
}

// TestEngineBuild: under container-engine control a service with build: and no image is
// built like under platform control (Result.Builds); translated again with the built
// image as its image_overrides entry, the engine's file names that image, builds
// nothing, and the image is among those the runner hands in.
func TestEngineBuild(t *testing.T) {
	const file = "services: {app: {build: {dockerfile_inline: 'FROM busybox', args: {A: b}}, command: [sleep, '9']}, db: {image: 'redis:7'}}"
	res, err := Convert(context.Background(), engineReq(file))
	if err != nil {
		t.Fatal(err)
	}
	b, ok := res.Builds["app"]
	if len(res.Builds) != 1 || !ok || b.Dockerfile != "FROM busybox" || b.Args["A"] != "b" {
		t.Fatalf("builds %+v, want app's", res.Builds)
	}
	r := engineReq(file)
	r.ImageOverrides = map[string]string{"app": "reg.test:5000/org/compose-app:abc"}
	res, err = Convert(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Builds) != 0 {
		t.Errorf("builds %+v once the image is set, want none", res.Builds)
	}
	e := res.Extra.Engine
	if e == nil || !slices.Contains(e.Images, "reg.test:5000/org/compose-app:abc") || !slices.Contains(e.Images, "redis:7") {
		t.Fatalf("engine %+v, want both images handed in", e)
	}
	if strings.Contains(string(e.Compose), "dockerfile_inline") || strings.Contains(string(e.Compose), "build:") ||
		!strings.Contains(string(e.Compose), "reg.test:5000/org/compose-app:abc") {
		t.Errorf("the engine's file builds or lacks the image:\n%s", e.Compose)
	}
}

func hasViolation(err error, field string) bool {
	for _, v := range apierr.Violations(err) {
		if v.Field == field {
			return true
		}
	}
	return false
}
