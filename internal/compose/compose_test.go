package compose

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/spec"
)

const threeServices = `
services:
  redis:
    image: redis:7
    command: ["redis-server", "--save", ""]
    healthcheck:
      test: ["CMD", "redis-cli", "ping"]
      interval: 500ms
      timeout: 2s
      retries: 20
  api:
    image: python:3
    entrypoint: ["python3", "-u"]
    command: ["/app/api.py", "--port", "8000"]
    environment:
      REDIS_HOST: redis
      GREETING: ${GREETING:-hello}
    expose: ["8000"]
    depends_on:
      redis:
        condition: service_healthy
    healthcheck:
      test: curl -fs http://localhost:8000/healthz
      start_period: 1s
    volumes:
      - shared:/data
    tmpfs: /scratch
  app:
    image: python:3
    command: sleep infinity
    user: "1000:1001"
    working_dir: /work
    depends_on:
      api:
        condition: service_healthy
      redis:
        condition: service_started
    ports: ["8080:8080"]
    volumes:
      - type: volume
        source: shared
        target: /shared
        read_only: true
    deploy:
      resources:
        limits: {cpus: "0.5", memory: 256M}
        reservations: {cpus: "0.25", memory: 128M}
volumes:
  shared: {}
x-note: extensions are allowed
`

func req(contents string) *sandboxv1.CreateSandboxFromFileRequest {
	return &sandboxv1.CreateSandboxFromFileRequest{Type: sandboxv1.SandboxFileType_SANDBOX_FILE_TYPE_COMPOSE, Contents: []byte(contents)}
}

func TestThreeServices(t *testing.T) {
	r := req(threeServices)
	r.PrimaryService = "app"
	r.Tags = []string{"t"}
	r.DefaultResources = &sandboxv1.ResourceRequirements{Limits: &sandboxv1.Resources{Cpu: "1", Memory: "1Gi"}}
	res, err := Convert(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	s := res.Spec
	var names []string
	for _, c := range s.GetContainers() {
		names = append(names, c.GetName())
	}
	if strings.Join(names, ",") != "app,api,redis" {
		t.Fatalf("containers %v, want the primary first then by name", names)
	}
	app, api, redis := s.Containers[0], s.Containers[1], s.Containers[2]
	if !app.GetPrimary() || api.Primary != nil || redis.Primary != nil {
		t.Errorf("primary marks: %v %v %v", app.Primary, api.Primary, redis.Primary)
	}
	if app.GetCommand() != "" || strings.Join(app.GetArgs(), " ") != "sleep infinity" {
		t.Errorf("app command %q args %q: the command replaces the image's cmd", app.GetCommand(), app.GetArgs())
	}
	if api.GetCommand() != "python3" || strings.Join(api.GetArgs(), " ") != "-u /app/api.py --port 8000" {
		t.Errorf("api command %q args %q: entrypoint[0], then the rest and the command", api.GetCommand(), api.GetArgs())
	}
	if api.GetEnvironmentVariables()["GREETING"] != "hello" || api.GetEnvironmentVariables()["REDIS_HOST"] != "redis" {
		t.Errorf("api env %v", api.GetEnvironmentVariables())
	}
	if p := redis.GetStartupProbe(); strings.Join(p.GetExec(), " ") != "redis-cli ping" || p.GetPeriodSeconds() != 1 || p.GetTimeoutSeconds() != 2 || p.GetFailureThreshold() != 20 {
		t.Errorf("redis probe %v", p)
	}
	if p := api.GetStartupProbe(); strings.Join(p.GetExec(), "|") != "/bin/sh|-c|curl -fs http://localhost:8000/healthz" || p.GetInitialDelaySeconds() != 1 {
		t.Errorf("api probe %v", p)
	}
	if sc := app.GetSecurityContext(); sc.GetRunAsUser() != 1000 || sc.GetRunAsGroup() != 1001 {
		t.Errorf("app security %v", sc)
	}
	if app.GetWorkingDir() != "/work" {
		t.Errorf("working dir %q", app.GetWorkingDir())
	}
	rr := app.GetResourceRequirements()
	if rr.GetLimits().GetCpu() != "500m" || rr.GetLimits().GetMemory() != "268435456" || rr.GetRequests().GetCpu() != "250m" || rr.GetRequests().GetMemory() != "134217728" {
		t.Errorf("app resources %v", rr)
	}
	if !proto.Equal(redis.GetResourceRequirements(), r.DefaultResources) {
		t.Errorf("redis resources %v, want default_resources", redis.GetResourceRequirements())
	}
	if len(s.GetVolumes()) != 1 || s.Volumes[0].GetName() != "shared" {
		t.Errorf("volumes %v", s.GetVolumes())
	}
	if m := app.GetVolumeMounts(); len(m) != 1 || m[0].GetVolume() != "shared" || m[0].GetMountPath() != "/shared" || !m[0].GetReadOnly() {
		t.Errorf("app mounts %v", m)
	}
	if m := api.GetVolumeMounts(); len(m) != 1 || m[0].GetMountPath() != "/data" {
		t.Errorf("api mounts %v", m)
	}
	var ports []int32
	for _, sv := range s.GetServices() {
		ports = append(ports, sv.GetPort())
	}
	if len(ports) != 2 || ports[0] != 8000 || ports[1] != 8080 {
		t.Errorf("services %v", ports)
	}
	if strings.Join(s.GetTags(), ",") != "t" {
		t.Errorf("tags %v", s.GetTags())
	}
	e := res.Extra
	if e.Primary != "app" || strings.Join(e.HostAliases, ",") != "app,api,redis" {
		t.Errorf("extra %+v", e)
	}
	if d := e.DependsOn["app"]; len(d) != 2 || d[0] != (runtime.Dependency{Container: "api", Condition: "healthy"}) || d[1] != (runtime.Dependency{Container: "redis", Condition: "started"}) {
		t.Errorf("app depends on %v", d)
	}
	if d := e.DependsOn["api"]; len(d) != 1 || d[0] != (runtime.Dependency{Container: "redis", Condition: "healthy"}) {
		t.Errorf("api depends on %v", d)
	}
	if strings.Join(e.Tmpfs["api"], ",") != "/scratch" {
		t.Errorf("tmpfs %v", e.Tmpfs)
	}
}

// TestSingleServiceRunsLikeAHandWrittenSpec: a one-service file goes through the same
// conversion as CreateSandbox, and Extra lands on the runtime spec, which validates.
func TestSingleServiceRunsLikeAHandWrittenSpec(t *testing.T) {
	res, err := Convert(context.Background(), req(`
services:
  web:
    image: python:3
    command: ["python3", "-m", "http.server", "8000"]
    expose: [8000]
    tmpfs: ["/cache"]
`))
	if err != nil {
		t.Fatal(err)
	}
	cr, err := spec.ToCreateRequest(res.Spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := res.Extra.Apply(&cr.Spec); err != nil {
		t.Fatal(err)
	}
	if cr.Spec.Image != "python:3" || strings.Join(cr.Spec.Args, " ") != "python3 -m http.server 8000" || strings.Join(cr.Spec.Tmpfs, ",") != "/cache" ||
		strings.Join(cr.Spec.HostAliases, ",") != "web" || len(cr.Spec.Services) != 1 || cr.Spec.Services[0].Port != 8000 {
		t.Errorf("runtime spec %+v", cr.Spec)
	}
	cr.Spec.ID, cr.Spec.Name = "sbx-compose", "web"
	if err := runtime.ValidateSpec(&cr.Spec, 64); err != nil {
		t.Errorf("ValidateSpec: %v", err)
	}
}

func TestApplyNamesAMissingContainer(t *testing.T) {
	e := Extra{Primary: "app", DependsOn: map[string][]runtime.Dependency{"db": {{Container: "app", Condition: "started"}}}}
	s := runtime.Spec{Container: runtime.Container{Image: "x"}}
	if err := e.Apply(&s); err == nil || !strings.Contains(err.Error(), `"db"`) {
		t.Fatalf("Apply = %v, want the missing container named", err)
	}
}

// refused holds files with one refused key each and the field the violation names.
var refused = []struct{ name, file, field string }{
	{"privileged", "services: {a: {image: x, privileged: true}}", "services.a.privileged"},
	{"network_mode", "services: {a: {image: x, network_mode: host}}", "services.a.network_mode"},
	{"pid", "services: {a: {image: x, pid: host}}", "services.a.pid"},
	{"ipc", "services: {a: {image: x, ipc: host}}", "services.a.ipc"},
	{"cap_add", "services: {a: {image: x, cap_add: [SYS_ADMIN]}}", "services.a.cap_add"},
	{"devices", "services: {a: {image: x, devices: [/dev/kvm]}}", "services.a.devices"},
	{"env_file", "services: {a: {image: x, env_file: /etc/shadow}}", "services.a.env_file"},
	{"extends", "services: {a: {image: x, extends: {file: /etc/passwd, service: b}}}", "services.a.extends"},
	{"include", "include: [/etc/compose.yaml]\nservices: {a: {image: x}}", "include"},
	{"secrets", "secrets: {s: {file: /etc/shadow}}\nservices: {a: {image: x}}", "secrets"},
	{"configs", "configs: {c: {file: /etc/passwd}}\nservices: {a: {image: x}}", "configs"},
	{"service secrets", "services: {a: {image: x, secrets: [s]}}", "services.a.secrets"},
	{"profiles", "services: {a: {image: x, profiles: [dev]}}", "services.a.profiles"},
	{"bind short", "services: {a: {image: x, volumes: [\"/etc:/host\"]}}", "services.a.volumes[0]"},
	{"bind relative", "services: {a: {image: x, volumes: [\"./src:/src\"]}}", "services.a.volumes[0]"},
	{"bind long", "services: {a: {image: x, volumes: [{type: bind, source: /, target: /host}]}}", "services.a.volumes[0]"},
	{"networks", "services: {a: {image: x, networks: [back]}}\nnetworks: {back: {}}", "networks.back"},
	{"service networks", "services: {a: {image: x, networks: [back]}}", "services.a.networks"},
	{"env without value", "services: {a: {image: x, environment: [HOME]}}", "services.a.environment[0]"},
	{"env null", "services: {a: {image: x, environment: {HOME: null}}}", "services.a.environment.HOME"},
	{"deploy replicas", "services: {a: {image: x, deploy: {replicas: 2}}}", "services.a.deploy.replicas"},
	{"gpu devices", "services: {a: {image: x, deploy: {resources: {reservations: {devices: [{capabilities: [gpu]}]}}}}}", "services.a.deploy.resources.reservations.devices"},
	{"healthcheck start_interval", "services: {a: {image: x, healthcheck: {test: [CMD, x], start_interval: 1s}}}", "services.a.healthcheck.start_interval"},
	{"restart", "services: {a: {image: x, restart: always}}", "services.a.restart"},
	{"named user", "services: {a: {image: x, user: root}}", "services.a.user"},
	{"depends restart", "services: {a: {image: x, depends_on: {b: {condition: service_started, restart: true}}}, b: {image: x}}", "services.a.depends_on.b.restart"},
	{"healthy without healthcheck", "services: {a: {image: x, depends_on: {b: {condition: service_healthy}}}, b: {image: x}}", "services.a.depends_on.b.condition"},
	{"unset variable", "services: {a: {image: \"${IMAGE}\"}}", "contents"},
	{"required variable", "services: {a: {image: \"${IMAGE:?set it}\"}}", "contents"},
	{"published elsewhere", "services: {a: {image: x, ports: [\"8080:80\"]}}", "services.a.ports[0].published"},
	{"udp", "services: {a: {image: x, expose: [\"53/udp\"]}}", "services.a.expose[0]"},
	{"port twice", "services: {a: {image: x, expose: [80]}, b: {image: x, expose: [80]}}", "services.b.expose[0]"},
	{"anonymous volume", "services: {a: {image: x, volumes: [/data]}}", "services.a.volumes[0]"},
	{"service name", "services: {A_b: {image: x}}", "services.A_b"},
	{"no image", "services: {a: {command: [x]}}", "contents"},
	{"volume driver", "services: {a: {image: x, volumes: [v:/v]}}\nvolumes: {v: {driver: nfs}}", "volumes.v.driver"},
	{"unused volume", "services: {a: {image: x}}\nvolumes: {v: {}}", "volumes.v"},
	{"not yaml", "services: [", "contents"},
	{"not a mapping", "- a\n- b", "contents"},
}

func TestRefusedKeys(t *testing.T) {
	for _, tc := range refused {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Convert(context.Background(), req(tc.file))
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
}

func TestRequestChecks(t *testing.T) {
	two := "services: {a: {image: x}, b: {image: y}}"
	for _, tc := range []struct {
		name  string
		r     func() *sandboxv1.CreateSandboxFromFileRequest
		code  connect.Code
		field string
	}{
		{"no primary of two", func() *sandboxv1.CreateSandboxFromFileRequest { return req(two) }, connect.CodeInvalidArgument, "primary_service"},
		{"unknown primary", func() *sandboxv1.CreateSandboxFromFileRequest {
			r := req(two)
			r.PrimaryService = "c"
			return r
		}, connect.CodeInvalidArgument, "primary_service"},
		{"override of no service", func() *sandboxv1.CreateSandboxFromFileRequest {
			r := req(two)
			r.PrimaryService = "a"
			r.ImageOverrides = map[string]string{"z": "img"}
			return r
		}, connect.CodeInvalidArgument, "image_overrides[z]"},
		{"empty", func() *sandboxv1.CreateSandboxFromFileRequest { return req("") }, connect.CodeInvalidArgument, "contents"},
		{"too big", func() *sandboxv1.CreateSandboxFromFileRequest {
			return req("x-pad: " + strings.Repeat("a", MaxContentsBytes) + "\nservices: {a: {image: x}}")
		}, connect.CodeInvalidArgument, "contents"},
		{"no type", func() *sandboxv1.CreateSandboxFromFileRequest {
			r := req(two)
			r.Type = 0
			return r
		}, connect.CodeInvalidArgument, "type"},
		{"engine with primary", func() *sandboxv1.CreateSandboxFromFileRequest {
			r := req(two)
			r.Control = sandboxv1.Control_CONTROL_CONTAINER_ENGINE
			r.PrimaryService = "a"
			return r
		}, connect.CodeInvalidArgument, "primary_service"},
		{"build without bytes", func() *sandboxv1.CreateSandboxFromFileRequest {
			r := req("services: {a: {build: ., command: [x]}, b: {image: y}}")
			r.PrimaryService = "b"
			return r
		}, connect.CodeInvalidArgument, "build_contexts[a]"},
		{"build key", func() *sandboxv1.CreateSandboxFromFileRequest {
			return req("services: {a: {build: {dockerfile_inline: 'FROM x', network: host}}}")
		}, connect.CodeInvalidArgument, "services.a.build.network"},
		{"build arg without a value", func() *sandboxv1.CreateSandboxFromFileRequest {
			return req("services: {a: {build: {dockerfile_inline: 'FROM x', args: [V]}}}")
		}, connect.CodeInvalidArgument, "services.a.build.args.V"},
		{"builder size of an image", func() *sandboxv1.CreateSandboxFromFileRequest {
			r := req("services: {a: {build: {dockerfile_inline: 'FROM x'}}, b: {image: y}}")
			r.PrimaryService = "a"
			r.BuilderSizes = map[string]string{"b": "small"}
			return r
		}, connect.CodeInvalidArgument, "builder_sizes[b]"},
		{"build context objects", func() *sandboxv1.CreateSandboxFromFileRequest {
			r := req(two)
			r.PrimaryService = "a"
			r.BuildContextObjects = map[string]*sandboxv1.BuildContextObject{"a": {}}
			return r
		}, connect.CodeUnimplemented, ""},
		{"build context of an image", func() *sandboxv1.CreateSandboxFromFileRequest {
			r := req(two)
			r.PrimaryService = "a"
			r.BuildContexts = map[string][]byte{"a": []byte("tar")}
			return r
		}, connect.CodeInvalidArgument, "build_contexts[a]"},
		{"build context of no service", func() *sandboxv1.CreateSandboxFromFileRequest {
			r := req("services: {a: {build: .}}")
			r.BuildContexts = map[string][]byte{"a": []byte("tar"), "nope": []byte("tar")}
			return r
		}, connect.CodeInvalidArgument, "build_contexts[nope]"},
		{"remote context", func() *sandboxv1.CreateSandboxFromFileRequest {
			r := req("services: {a: {build: 'https://github.com/x/y.git'}}")
			r.BuildContexts = map[string][]byte{"a": []byte("tar")}
			return r
		}, connect.CodeInvalidArgument, "services.a.build.context"},
		{"git context", func() *sandboxv1.CreateSandboxFromFileRequest {
			return req("services: {a: {build: {context: 'git@github.com:x/y.git', dockerfile_inline: 'FROM x'}}}")
		}, connect.CodeInvalidArgument, "services.a.build.context"},
		{"dockerfile outside the context", func() *sandboxv1.CreateSandboxFromFileRequest {
			r := req("services: {a: {build: {context: ., dockerfile: ../Dockerfile}}}")
			r.BuildContexts = map[string][]byte{"a": []byte("tar")}
			return r
		}, connect.CodeInvalidArgument, "services.a.build.dockerfile"},
		{"absolute dockerfile", func() *sandboxv1.CreateSandboxFromFileRequest {
			r := req("services: {a: {build: {context: ., dockerfile: /etc/Dockerfile}}}")
			r.BuildContexts = map[string][]byte{"a": []byte("tar")}
			return r
		}, connect.CodeInvalidArgument, "services.a.build.dockerfile"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Convert(context.Background(), tc.r())
			if connect.CodeOf(err) != tc.code {
				t.Fatalf("err = %v, want %v", err, tc.code)
			}
			if tc.field == "" {
				return
			}
			for _, v := range apierr.Violations(err) {
				if v.Field == tc.field {
					return
				}
			}
			t.Fatalf("violations %v, want one on %s", apierr.Violations(err), tc.field)
		})
	}
}

// A service with build: {dockerfile_inline} and no image is a Build (its container has
// no image yet); builder_sizes and the args travel with it.
func TestBuildInline(t *testing.T) {
	r := req("services: {app: {build: {dockerfile_inline: \"FROM x\\nRUN touch /y\\n\", args: {A: '1'}, target: t1}, command: [sleep, '1']}, db: {image: reg/db:1}}")
	r.PrimaryService = "app"
	r.BuilderSizes = map[string]string{"app": "medium"}
	res, err := Convert(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]Build{"app": {Dockerfile: "FROM x\nRUN touch /y\n", Args: map[string]string{"A": "1"}, Target: "t1", BuilderSize: "medium"}}
	if !reflect.DeepEqual(res.Builds, want) {
		t.Errorf("builds %+v, want %+v", res.Builds, want)
	}
	for _, c := range res.Spec.GetContainers() {
		if c.GetName() == "app" && c.GetImage() != "" || c.GetName() == "db" && c.GetImage() != "reg/db:1" {
			t.Errorf("container %s image %q", c.GetName(), c.GetImage())
		}
	}
}

// A service whose Dockerfile is in its context takes build_contexts[service] (the
// bytes as sent: the gateway converts them) and the Dockerfile's path; an inline
// Dockerfile takes the context too.
func TestBuildContext(t *testing.T) {
	for _, tc := range []struct {
		file string
		want Build
	}{
		{"services: {a: {build: .}}", Build{DockerfilePath: "Dockerfile", Context: []byte("tar")}},
		{"services: {a: {build: {context: ./app, dockerfile: d/./Dockerfile.x, target: t}}}", Build{DockerfilePath: "d/Dockerfile.x", Target: "t", Context: []byte("tar")}},
		{"services: {a: {build: {dockerfile_inline: 'FROM x'}}}", Build{Dockerfile: "FROM x", Context: []byte("tar")}},
	} {
		r := req(tc.file)
		r.BuildContexts = map[string][]byte{"a": []byte("tar")}
		res, err := Convert(context.Background(), r)
		if err != nil {
			t.Fatalf("%s: %v", tc.file, err)
		}
		if !reflect.DeepEqual(res.Builds["a"], tc.want) {
			t.Errorf("%s: build %+v, want %+v", tc.file, res.Builds["a"], tc.want)
		}
	}
}

func TestBuildWithAnImageUsesTheImage(t *testing.T) {
	for _, r := range []*sandboxv1.CreateSandboxFromFileRequest{
		req("services: {a: {build: ., image: reg/a:1}}"),
		func() *sandboxv1.CreateSandboxFromFileRequest {
			r := req("services: {a: {build: .}}")
			r.ImageOverrides = map[string]string{"a": "reg/a:1"}
			return r
		}(),
	} {
		res, err := Convert(context.Background(), r)
		if err != nil {
			t.Fatal(err)
		}
		if res.Spec.Containers[0].GetImage() != "reg/a:1" {
			t.Errorf("image %q", res.Spec.Containers[0].GetImage())
		}
	}
}

func TestNoServerEnvironment(t *testing.T) {
	t.Setenv("SANDBOXD_COMPOSE_SECRET", "leaked")
	res, err := Convert(context.Background(), req(`services: {a: {image: x, environment: {A: "${SANDBOXD_COMPOSE_SECRET:-safe}", B: "$${X}"}}}`))
	if err != nil {
		t.Fatal(err)
	}
	env := res.Spec.Containers[0].GetEnvironmentVariables()
	if env["A"] != "safe" || env["B"] != "${X}" {
		t.Fatalf("env %v: the server's environment must never be read", env)
	}
}

func FuzzConvert(f *testing.F) {
	f.Add([]byte(threeServices), "app")
	f.Add([]byte("services: {a: {image: x}}"), "")
	f.Add([]byte("services: {a: {build: {dockerfile_inline: \"FROM x\\nRUN y\", args: {A: '1'}, target: t}}, b: {image: y}}"), "a")
	f.Add([]byte("services: {a: {build: .}}"), "")
	for _, tc := range refused {
		f.Add([]byte(tc.file), "a")
	}
	f.Fuzz(func(t *testing.T, contents []byte, primary string) {
		r := req(string(contents))
		r.PrimaryService = primary
		res, err := Convert(context.Background(), r)
		if err != nil {
			switch connect.CodeOf(err) {
			case connect.CodeInvalidArgument, connect.CodeUnimplemented:
			default:
				t.Fatalf("unexpected error %v", err)
			}
			return
		}
		if len(res.Spec.GetContainers()) == 0 || res.Extra.Primary == "" {
			t.Fatalf("accepted without a container or primary: %+v", res)
		}
		for _, c := range res.Spec.GetContainers() {
			b, built := res.Builds[c.GetName()]
			if !dnsLabel.MatchString(c.GetName()) || (c.GetImage() == "") != built || built && strings.TrimSpace(b.Dockerfile) == "" {
				t.Fatalf("accepted container %q image %q build %+v", c.GetName(), c.GetImage(), b)
			}
		}
		for name := range res.Builds {
			if !slices.ContainsFunc(res.Spec.GetContainers(), func(c *sandboxv1.Container) bool { return c.GetName() == name }) {
				t.Fatalf("a build of %q, which has no container", name)
			}
		}
	})
}

// TestAliasBombIsRefused: nine levels of nine aliases (9^10 strings) are refused at once
// rather than expanded.
func TestAliasBombIsRefused(t *testing.T) {
	var b strings.Builder
	b.WriteString(`x-a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]` + "\n")
	for i := 1; i < 10; i++ {
		fmt.Fprintf(&b, "x-a%d: &a%d [%s]\n", i, i, strings.TrimSuffix(strings.Repeat(fmt.Sprintf("*a%d,", i-1), 9), ","))
	}
	b.WriteString("services: {a: {image: x, command: *a9}}\n")
	_, err := Convert(context.Background(), req(b.String()))
	if connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("err = %v, want INVALID_ARGUMENT", err)
	}
}
