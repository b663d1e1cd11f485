package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
)

// cgroupLimits reads the memory limit and CPU quota the host set in sandbox id's cgroup
// (cgroup v2 or v1; the e2e stack has no warm pool, so the cgroup is named after id).
func cgroupLimits(t *testing.T, id string) (memory, cpu string) {
	t.Helper()
	read := func(p string) string {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatalf("cgroup of %s: %v", id, err)
		}
		return strings.TrimSpace(string(b))
	}
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		dir := filepath.Join("/sys/fs/cgroup", env.CgroupParent, id)
		return read(filepath.Join(dir, "memory.max")), read(filepath.Join(dir, "cpu.max"))
	}
	return read(filepath.Join("/sys/fs/cgroup/memory", env.CgroupParent, id, "memory.limit_in_bytes")),
		read(filepath.Join("/sys/fs/cgroup/cpu", env.CgroupParent, id, "cpu.cfs_quota_us"))
}

// TestDefaultResources: a sandbox that asks for no CPU or memory runs limited by the
// runner's default limits (1 CPU, 1 GiB) in its cgroup, and reports the defaults it
// got: requests 100m/128Mi, limits 1/1Gi.
func TestDefaultResources(t *testing.T) {
	g := startGateway(t)
	sb := g.create(t, sleeperSpec(), "")
	st := g.waitState(t, sb.SandboxId, sandboxv1.State_STATE_RUNNING).GetStatus()
	rr := st.GetEffectiveResourceRequirements()
	if rr.GetRequests().GetCpu() != "100m" || rr.GetRequests().GetMemory() != "128Mi" || rr.GetLimits().GetCpu() != "1" || rr.GetLimits().GetMemory() != "1Gi" {
		t.Errorf("effective resource requirements %v, want requests 100m/128Mi, limits 1/1Gi", rr)
	}
	if r := st.GetEffectiveResources(); r.GetCpu() != "1" || r.GetMemory() != "1Gi" {
		t.Errorf("effective resources %v, want the limits 1/1Gi", r)
	}
	memory, cpu := cgroupLimits(t, sb.SandboxId)
	if memory != "1073741824" {
		t.Errorf("cgroup memory limit %s, want 1073741824 (1Gi)", memory)
	}
	if cpu != "100000" && cpu != "100000 100000" {
		t.Errorf("cgroup CPU quota %q, want 1 CPU (100000 per 100000 µs)", cpu)
	}
}

// TestRequestAboveCapacityFailsAtOnce: a sandbox asking for more CPU than the runner has
// at all is refused at once as FAILED_PRECONDITION CWSANDBOX_NO_SUITABLE_RUNNER naming
// the runner and its capacity, not RESOURCE_EXHAUSTED with RetryInfo ("try again later"),
// through the API and through sbx (whose SDK retries RESOURCE_EXHAUSTED for 25 s).
func TestRequestAboveCapacityFailsAtOnce(t *testing.T) {
	g := startGateway(t)
	huge := sleeperSpec()
	huge.Containers[0].Resources = &sandboxv1.Resources{Cpu: "64", Memory: "256Mi"}
	_, err := g.sandboxes.CreateSandbox(context.Background(), connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: huge}}))
	if connect.CodeOf(err) != connect.CodeFailedPrecondition || apierr.Reason(err) != apierr.NoSuitableRunner || apierr.RetryInfo(err) != nil {
		t.Fatalf("64 CPUs: %v (%s), want FAILED_PRECONDITION %s without RetryInfo", err, apierr.Reason(err), apierr.NoSuitableRunner)
	}
	vs := apierr.Violations(err)
	if len(vs) != 1 || vs[0].Field != "runner[local].sandbox.spec.containers[0].resources.cpu" || !strings.Contains(vs[0].Description, "requests 64 cpu") {
		t.Errorf("violations %v, want the runner, the request and the runner's CPU", vs)
	}

	start := time.Now()
	_, errs, code := sbx(g, "", "run", "--rm", "--cpu", "64", busybox(), "--", "true")
	if took := time.Since(start); code == 0 || took > 5*time.Second || !strings.Contains(errs, "CWSANDBOX_NO_SUITABLE_RUNNER") || !strings.Contains(errs, "runner local has") {
		t.Errorf("sbx run --cpu 64: exit %d after %s, stderr %q; want a failure at once naming the reason, the runner and its capacity", code, took, errs)
	}
}
