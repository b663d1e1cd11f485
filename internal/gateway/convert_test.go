package gateway

import (
	"testing"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// TestCreateRequestChecksRunnerIDs: the gateway's conversion reports runner_ids'
// problems (placement's check) with the spec's own, after them, and before anything
// this sandboxd does not support.
func TestCreateRequestChecksRunnerIDs(t *testing.T) {
	_, err := toCreateRequest(&sandboxv1.SandboxSpec{
		Containers: []*sandboxv1.Container{{Image: "busybox"}},
		Tags:       []string{"bad tag"}, RunnerIds: []string{" "}, InstanceType: "gpu-large",
	}, nil, nil, nil)
	if connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("code %v, want INVALID_ARGUMENT (%v)", connect.CodeOf(err), err)
	}
	if got, want := fields(apierr.Violations(err)), "sandbox.spec.tags[0],sandbox.spec.runner_ids[0]"; got != want {
		t.Errorf("violations %q, want %q", got, want)
	}
}

// TestResourceUsageOnTheWire: a running sandbox's usage becomes status.resource_usage
// (memory in MiB rounded up, GPUs what it holds); other states and a runner that cannot
// tell leave it unset.
func TestResourceUsageOnTheWire(t *testing.T) {
	sp := &sandboxv1.SandboxSpec{Containers: []*sandboxv1.Container{{Name: "main", Image: "busybox",
		ResourceRequirements: &sandboxv1.ResourceRequirements{Limits: &sandboxv1.Resources{Cpu: "1", Memory: "1Gi", Gpu: &sandboxv1.Gpu{Count: 1}}}}}}
	r := &acceptingRunner{id: "r1"}
	u := &runner.Usage{CPUMillicores: 730, Usage: runtime.Usage{CPUUsec: 5, MemoryBytes: 5<<20 + 1}}
	got := sandboxProto("x", sp, runner.Sandbox{State: runner.StateRunning, Usage: u}, r).GetStatus().GetResourceUsage()
	if got.GetCpuMillicores() != 730 || got.GetMemoryMb() != 6 || got.GetGpuCount() != 1 {
		t.Errorf("running: %v", got)
	}
	for _, st := range []runner.State{runner.StatePaused, runner.StateCompleted, runner.StateTerminating} {
		if got := sandboxProto("x", sp, runner.Sandbox{State: st, Usage: u}, r).GetStatus().GetResourceUsage(); got != nil {
			t.Errorf("%s: %v", st, got)
		}
	}
	if got := sandboxProto("x", sp, runner.Sandbox{State: runner.StateRunning}, r).GetStatus().GetResourceUsage(); got != nil {
		t.Errorf("no usage: %v", got)
	}
}
