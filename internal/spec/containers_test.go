package spec

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

func res(cpu, mem string) *sandboxv1.Resources { return &sandboxv1.Resources{Cpu: cpu, Memory: mem} }

// TestSeveralContainers: the marked row is the primary (runtime Spec.Container), the
// others are the sidecars in their order, each with every field converted.
func TestSeveralContainers(t *testing.T) {
	spec := &sandboxv1.SandboxSpec{
		Volumes: []*sandboxv1.SandboxVolume{{Name: "shared"}},
		Containers: []*sandboxv1.Container{
			{Name: "db", Image: "redis", Args: []string{"--port", "6380"}, Resources: res("500m", "256Mi"),
				VolumeMounts: []*sandboxv1.VolumeMount{{Volume: "shared", MountPath: "/data"}},
				StartupProbe: &sandboxv1.Probe{Exec: []string{"redis-cli", "ping"}, PeriodSeconds: 2, FailureThreshold: 5}},
			{Name: "app", Primary: proto.Bool(true), Image: "busybox", Command: "sh", Resources: res("1", "512Mi"),
				EnvironmentVariables: map[string]string{"A": "1"}, WorkingDir: "/w",
				VolumeMounts: []*sandboxv1.VolumeMount{{Volume: "shared", MountPath: "/shared", ReadOnly: true}}},
			{Name: "py", Image: "python", Resources: res("250m", "128Mi"),
				SecurityContext: &sandboxv1.SecurityContext{RunAsUser: proto.Uint32(1000)}},
		},
	}
	req, err := ToCreateRequest(spec)
	if err != nil {
		t.Fatal(err)
	}
	s := req.Spec
	if s.Name != "app" || s.Image != "busybox" || s.Command != "sh" || s.WorkingDir != "/w" || s.Env["A"] != "1" {
		t.Errorf("primary = %+v, want the row marked primary (app)", s.Container)
	}
	if got := []string{s.Sidecars[0].Name, s.Sidecars[1].Name}; len(s.Sidecars) != 2 || got[0] != "db" || got[1] != "py" {
		t.Fatalf("sidecars %+v, want db then py", s.Sidecars)
	}
	db, py := s.Sidecars[0], s.Sidecars[1]
	if db.Image != "redis" || !reflect.DeepEqual(db.Args, []string{"--port", "6380"}) || db.Resources.MilliCPU != 500 || db.Resources.MemoryBytes != 256<<20 {
		t.Errorf("db = %+v", db)
	}
	if want := (&runtime.Probe{Exec: []string{"redis-cli", "ping"}, Period: 2 * time.Second, FailureThreshold: 5}); !reflect.DeepEqual(db.StartupProbe, want) {
		t.Errorf("db's startup probe = %+v, want %+v", db.StartupProbe, want)
	}
	if len(db.VolumeMounts) != 1 || db.VolumeMounts[0].Path != "/data" || len(s.VolumeMounts) != 1 || !s.VolumeMounts[0].ReadOnly {
		t.Errorf("mounts: db %+v, app %+v", db.VolumeMounts, s.VolumeMounts)
	}
	if py.Security == nil || py.Security.RunAsUser == nil || *py.Security.RunAsUser != 1000 {
		t.Errorf("py's security = %+v", py.Security)
	}
	if tot := s.TotalResources(); tot.MilliCPU != 1750 || tot.MemoryBytes != 896<<20 {
		t.Errorf("total = %+v, want 1750m and 896Mi", tot)
	}
	if err := runtime.ValidateSpec(&runtime.Spec{ID: "x", Container: s.Container, Sidecars: s.Sidecars, Volumes: s.Volumes}, 63); err != nil {
		t.Errorf("the converted group is not a valid runtime spec: %v", err)
	}

	// The reverse (ForPolicy) gives every row back, the primary first and marked.
	back := ForPolicy(req)
	var names []string
	for _, c := range back.GetContainers() {
		names = append(names, fmt.Sprintf("%s:%v", c.GetName(), c.GetPrimary()))
	}
	if got, want := strings.Join(names, ","), "app:true,db:false,py:false"; got != want {
		t.Errorf("ForPolicy rows %s, want %s", got, want)
	}
}

// TestOneContainerKeepsItsShape: a lone container, named or not, marked or not, is the
// primary with no sidecars (today's single-container path).
func TestOneContainerKeepsItsShape(t *testing.T) {
	for _, c := range []*sandboxv1.Container{
		{Image: "busybox"},
		{Name: "main", Image: "busybox"},
		{Name: "app", Image: "busybox", Primary: proto.Bool(false)},
		{Name: "app", Image: "busybox", Primary: proto.Bool(true)},
	} {
		req, err := ToCreateRequest(&sandboxv1.SandboxSpec{Containers: []*sandboxv1.Container{c}})
		if err != nil {
			t.Fatalf("%v: %v", c, err)
		}
		if req.Spec.Multi() || req.Spec.Name != c.GetName() || req.Spec.Image != "busybox" {
			t.Errorf("%v: spec %+v", c, req.Spec)
		}
	}
}

// TestContainerViolations: every problem of the group at once, each under the field of
// the container it belongs to.
func TestContainerViolations(t *testing.T) {
	ok := func(name string) *sandboxv1.Container { return &sandboxv1.Container{Name: name, Image: "busybox"} }
	for _, tc := range []struct {
		name string
		cs   []*sandboxv1.Container
		want string
	}{
		{"two primaries", []*sandboxv1.Container{
			{Name: "a", Image: "busybox", Primary: proto.Bool(true)}, ok("b"), {Name: "c", Image: "busybox", Primary: proto.Bool(true)},
		}, "sandbox.spec.containers[2].primary"},
		{"unnamed among several", []*sandboxv1.Container{ok("a"), {Image: "busybox"}}, "sandbox.spec.containers[1].name"},
		{"duplicate", []*sandboxv1.Container{ok("a"), ok("a")}, "sandbox.spec.containers[1].name"},
		{"reserved", []*sandboxv1.Container{ok("a"), ok("cws-engine"), ok("dns-egress"), ok("dns-egress-probe"), ok("cw-object-store-agent"), ok("cw-object-store-agent-restore-1")},
			"sandbox.spec.containers[1].name,sandbox.spec.containers[2].name,sandbox.spec.containers[3].name,sandbox.spec.containers[4].name,sandbox.spec.containers[5].name"},
		{"a sidecar's fields", []*sandboxv1.Container{ok("a"), {Name: "b", Resources: res("lots", "1Gi"),
			VolumeMounts:    []*sandboxv1.VolumeMount{{Volume: "nope", MountPath: "/v"}},
			SecurityContext: &sandboxv1.SecurityContext{CapabilitiesAdd: []string{"CAP_BOGUS"}}}},
			"sandbox.spec.containers[1].image,sandbox.spec.containers[1].resources.cpu,sandbox.spec.containers[1].volume_mounts[0].volume,sandbox.spec.containers[1].security_context.capabilities_add[0]"},
		{"probes", []*sandboxv1.Container{
			{Name: "a", Image: "busybox", StartupProbe: &sandboxv1.Probe{}},
			{Name: "b", Image: "busybox", StartupProbe: &sandboxv1.Probe{Exec: []string{""}, PeriodSeconds: -1, TimeoutSeconds: maxProbeSeconds + 1, InitialDelaySeconds: -5, FailureThreshold: -1}},
		}, "sandbox.spec.containers[0].startup_probe.exec,sandbox.spec.containers[1].startup_probe.exec[0],sandbox.spec.containers[1].startup_probe.initial_delay_seconds," +
			"sandbox.spec.containers[1].startup_probe.period_seconds,sandbox.spec.containers[1].startup_probe.timeout_seconds,sandbox.spec.containers[1].startup_probe.failure_threshold"},
	} {
		_, err := ToCreateRequest(&sandboxv1.SandboxSpec{Containers: tc.cs})
		if connect.CodeOf(err) != connect.CodeInvalidArgument {
			t.Errorf("%s: %v, want INVALID_ARGUMENT", tc.name, err)
			continue
		}
		if got := fields(apierr.Violations(err)); got != tc.want {
			t.Errorf("%s: violations\n  %s\nwant\n  %s", tc.name, got, tc.want)
		}
	}

	// More than the runtime's limit: refused, without converting the rest.
	var many []*sandboxv1.Container
	for i := range runtime.MaxContainers + 1 {
		many = append(many, ok(fmt.Sprintf("c%d", i)))
	}
	_, err := ToCreateRequest(&sandboxv1.SandboxSpec{Containers: many})
	if got := fields(apierr.Violations(err)); got != "sandbox.spec.containers" {
		t.Errorf("%d containers: violations %q (%v)", len(many), got, err)
	}
}

// FuzzContainers: whatever the rows, ToCreateRequest either refuses with violations
// naming fields, or gives a group whose names are unique and valid and whose primary is
// the marked row (or the first).
func FuzzContainers(f *testing.F) {
	f.Add("a", "b", "", true, false, 1)
	f.Add("", "", "", false, false, 0)
	f.Add("main", "main", "x", true, true, 2)
	f.Add("cws-engine", "b", "c", false, true, 3)
	f.Fuzz(func(t *testing.T, n0, n1, n2 string, p0, p1 bool, count int) {
		names, prim := []string{n0, n1, n2}, []bool{p0, p1, false}
		count = 1 + (count%3+3)%3
		var cs []*sandboxv1.Container
		for i := range count {
			cs = append(cs, &sandboxv1.Container{Name: names[i], Image: "busybox", Primary: proto.Bool(prim[i])})
		}
		req, err := ToCreateRequest(&sandboxv1.SandboxSpec{Containers: cs})
		if err != nil {
			for _, v := range apierr.Violations(err) {
				if !strings.HasPrefix(v.Field, "sandbox.spec.containers[") {
					t.Fatalf("violation of %q", v.Field)
				}
			}
			return
		}
		if got, want := len(req.Spec.Containers()), count; got != want {
			t.Fatalf("%d containers, want %d", got, want)
		}
		if want := cs[primaryIndex(cs)].GetName(); req.Spec.Name != want {
			t.Fatalf("primary %q, want %q", req.Spec.Name, want)
		}
		seen := map[string]bool{}
		for _, c := range req.Spec.Containers() {
			if count > 1 && !runtime.ValidContainerName(c.Name) || ReservedContainerName(c.Name) || seen[c.Name] && c.Name != "" {
				t.Fatalf("accepted container name %q among %q", c.Name, names[:count])
			}
			seen[c.Name] = true
		}
	})
}

// TestContainerFieldsNotAppliedAreRefused: container fields that no backend applies are
// refused UNIMPLEMENTED CWSANDBOX_NOT_IMPLEMENTED, each named by a field violation (never
// accepted and dropped).
func TestContainerFieldsNotAppliedAreRefused(t *testing.T) {
	spec := &sandboxv1.SandboxSpec{Containers: []*sandboxv1.Container{
		{Name: "app", Image: "busybox", Primary: proto.Bool(true), Resources: &sandboxv1.Resources{Gpu: &sandboxv1.Gpu{Count: 1}}},
		{Name: "side", Image: "busybox",
			ResourceRequirements: &sandboxv1.ResourceRequirements{Limits: &sandboxv1.Resources{Cpu: "1", Gpu: &sandboxv1.Gpu{Count: 2}}},
			SecretStores:         []*sandboxv1.SecretStoreReference{{StoreName: "vault"}},
			ImagePullCredentials: &sandboxv1.ImagePullCredentials{Registry: "r.example"}},
	}, InstanceType: "gpu-large"}
	_, err := ToCreateRequest(spec)
	if connect.CodeOf(err) != connect.CodeUnimplemented || apierr.Reason(err) != apierr.NotImplemented {
		t.Fatalf("ToCreateRequest: %v, want UNIMPLEMENTED %s", err, apierr.NotImplemented)
	}
	var got []string
	for _, v := range apierr.Violations(err) {
		got = append(got, v.Field+": "+v.Description)
	}
	want := []string{
		"sandbox.spec.containers[0].resources.gpu: GPUs",
		"sandbox.spec.containers[1].resource_requirements.limits.gpu: GPUs",
		"sandbox.spec.containers[1].secret_stores: secret stores",
		"sandbox.spec.containers[1].image_pull_credentials: image pull credentials from secret stores",
		"sandbox.spec.instance_type: instance types",
	}
	if !slices.Equal(got, want) {
		t.Errorf("violations %q, want %q", got, want)
	}
	for _, w := range []string{"GPUs", "secret stores", "image pull credentials"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("message %q does not name %s", err.Error(), w)
		}
	}
}
