package spec

import (
	"slices"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/policy"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// The runner's own policy check sees the security context it is asked to run with.
func TestForPolicySecurity(t *testing.T) {
	uid, gid := uint32(1000), uint32(0)
	sec := &runtime.Security{RunAsUser: &uid, RunAsGroup: &gid, ReadOnlyRootFS: true, CapAdd: []string{"CAP_NET_ADMIN"},
		CapDrop: []string{"ALL"}, AllowPrivilegeEscalation: true, SeccompProfile: runtime.SeccompRuntimeDefault}
	req := runner.CreateRequest{Spec: runtime.Spec{Container: runtime.Container{Image: "busybox", Security: sec}}}
	if got := ForPolicy(req).GetContainers()[0].GetSecurityContext(); got.GetRunAsUser() != 1000 || !got.GetReadOnlyRootFilesystem() ||
		got.GetCapabilitiesAdd()[0] != "CAP_NET_ADMIN" || got.Privileged != nil {
		t.Errorf("the policy sees security context %v", got)
	}
}

// TestPolicyOverTheGroup: a runner checks its policy against ForPolicy of what it is
// asked to run, so every container is checked: images and security per container (a
// violation names that container's field), the per-container maximum per container,
// and the per-sandbox ceilings on the sum of the containers' limits
// (runtime.Spec.TotalResources for a group without init containers).
func TestPolicyOverTheGroup(t *testing.T) {
	p, err := policy.Parse([]byte(`{"constraints": {
		"resources": {"max_cpu": "2", "total_cpu": "3", "total_memory": "3Gi"},
		"images": {"allowed_registries": ["docker.io"]},
		"security": {"privileged_allowed": false}}}`))
	if err != nil {
		t.Fatal(err)
	}
	c := func(name, image string, milli int64, mem int64) runtime.Container {
		return runtime.Container{Name: name, Image: image, Resources: runtime.Resources{MilliCPU: milli, MemoryBytes: mem}}
	}
	group := runtime.Spec{Container: c("app", "busybox", 1000, 1<<30), Sidecars: []runtime.Container{c("db", "redis", 1000, 1<<30), c("py", "python", 1000, 1<<30)}}
	req := runner.CreateRequest{Spec: group}
	if _, vs := policy.Resolve(p, ForPolicy(req), policy.DefaultPlatform()); len(vs) != 0 {
		t.Fatalf("3 containers of 1 CPU and 1Gi under ceilings of 3 and 3Gi: %v", vs)
	}

	// One more CPU anywhere breaks the sum; a sidecar above the per-container maximum,
	// from another registry and privileged is named by its own fields.
	group.Sidecars[1].Resources.MilliCPU = 2500
	group.Sidecars[1].Image = "ghcr.io/x/py"
	group.Sidecars[1].Security = &runtime.Security{Privileged: true}
	req.Spec = group
	if tot := group.TotalResources(); tot.MilliCPU != 4500 {
		t.Fatalf("total %d", tot.MilliCPU)
	}
	_, vs := policy.Resolve(p, ForPolicy(req), policy.DefaultPlatform())
	var got []string
	for _, v := range vs {
		got = append(got, v.Field+" "+v.Constraint)
	}
	want := []string{
		"sandbox.spec.containers[2].resource_requirements.limits.cpu constraints.resources.max_cpu",
		"sandbox.spec.containers constraints.resources.total_cpu",
		"sandbox.spec.containers[2].image constraints.images.allowed_registries",
		"sandbox.spec.containers[2].security_context.privileged constraints.security.privileged_allowed",
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("violations\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}

	// An init container is checked like any container (its image here).
	req.Spec = runtime.Spec{Container: c("app", "busybox", 500, 1<<29), InitContainers: []runtime.Container{c("setup", "quay.io/x/setup", 500, 1<<29)}}
	_, vs = policy.Resolve(p, ForPolicy(req), policy.DefaultPlatform())
	if len(vs) != 1 || vs[0].Field != "sandbox.spec.containers[1].image" {
		t.Errorf("init container from another registry: %v", vs)
	}
}
