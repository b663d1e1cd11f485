package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/gateway"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/stack"
)

// perRunner is a policy.Source with a fixed policy per runner.
type perRunner map[string]string

func (p perRunner) Policy(_ context.Context, id string) ([]byte, int64, error) {
	return []byte(p[id]), 1, nil
}

// secondStack starts this process's second independent stack (own bridge, subnet,
// nftables table, cgroup parent); its sandboxes are deleted when the test ends.
func secondStack(t *testing.T) *stack.Stack {
	t.Helper()
	dir := t.TempDir()
	cfg := env.StackConfigN(dir, 1)
	s, err := stack.NewLocal(context.Background(), cfg)
	if err != nil {
		t.Fatalf("start second stack: %v", err)
	}
	t.Cleanup(func() {
		deleteAll(t, s)
		if err := s.Network.Cleanup(); err != nil {
			t.Errorf("network cleanup: %v", err)
		}
		s.Close()
		parents, _ := filepath.Glob("/sys/fs/cgroup/*/" + cfg.CgroupParent)
		for _, p := range parents {
			_ = os.Remove(p)
		}
	})
	return s
}

// TestPlacementAcrossRunners runs two real stacks behind one gateway: r1 with a strict
// policy (max 1 CPU) and the host's capacity, r2 permissive with room for 3 CPUs.
func TestPlacementAcrossRunners(t *testing.T) {
	s2 := secondStack(t)
	r2 := runner.NewLocal("r2", s2.Runner)
	r2.MilliCPU, r2.MemoryBytes = 3000, 4<<30
	r2.CPUOvercommit = 1 // requests up to its 3 CPUs: two 2-CPU sandboxes do not fit
	g := startGateway(t, func(c *gateway.Config) {
		c.Runners[0].(*runner.Local).RunnerID = "r1"
		c.Runners = append(c.Runners, r2)
		c.Policies = perRunner{"r1": `{"constraints": {"resources": {"max_cpu": "1"}}}`, "r2": `{}`}
	})
	ctx := context.Background()
	create := func(cpu string, pins ...string) (*sandboxv1.Sandbox, error) {
		sp := sleeperSpec()
		sp.Containers[0].Resources = &sandboxv1.Resources{Cpu: cpu, Memory: "128Mi"}
		sp.RunnerIds = pins
		res, err := g.sandboxes.CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: sp}}))
		if err != nil {
			return nil, err
		}
		return res.Msg, nil
	}
	free := func(id string) int64 {
		t.Helper()
		res, err := g.discovery.GetAvailableRunner(ctx, connect.NewRequest(&sandboxv1.GetAvailableRunnerRequest{
			RunnerId: id, OrganizationId: "org-a", View: sandboxv1.RunnerView_RUNNER_VIEW_FULL}))
		if err != nil {
			t.Fatalf("discovery of %s: %v", id, err)
		}
		return res.Msg.GetResources().GetAvailableCpuMillicores()
	}

	before := free("r2")
	if before != 3000 {
		t.Errorf("r2 free CPU %d, want 3000", before)
	}
	// Only r2's policy takes 2 CPUs.
	big, err := create("2")
	if err != nil {
		t.Fatalf("create 2 CPUs: %v", err)
	}
	if got := big.GetStatus().GetRunnerId(); got != "r2" {
		t.Fatalf("2-CPU sandbox on %s, want r2", got)
	}
	g.waitState(t, big.SandboxId, sandboxv1.State_STATE_RUNNING)
	if after := free("r2"); after != before-2000 {
		t.Errorf("r2 free CPU %d after a 2-CPU sandbox, want %d", after, before-2000)
	}

	// Pinned to r1, its policy answers with the violated constraint.
	_, err = create("2", "r1")
	if connect.CodeOf(err) != connect.CodeInvalidArgument || apierr.Reason(err) != apierr.PlacementRejected {
		t.Fatalf("pinned to r1: %v, want INVALID_ARGUMENT %s", err, apierr.PlacementRejected)
	}
	if vs := apierr.Violations(err); len(vs) == 0 || vs[0].Field != "sandbox.spec.containers[0].resources.cpu" || !strings.Contains(vs[0].Description, "constraints.resources.max_cpu") {
		t.Errorf("pinned to r1: violations %v", vs)
	}

	// r2 is full for another 2 CPUs, and r1's policy refuses them.
	_, err = create("2")
	if connect.CodeOf(err) != connect.CodeResourceExhausted || apierr.Reason(err) != apierr.RunnerCapacityExhausted {
		t.Fatalf("second 2-CPU sandbox: %v, want RESOURCE_EXHAUSTED %s", err, apierr.RunnerCapacityExhausted)
	}
	if ri := apierr.RetryInfo(err); ri == nil || ri.GetRetryDelay().AsDuration() <= 0 {
		t.Errorf("capacity exhausted without RetryInfo: %v", err)
	}

	// A small one goes to the least loaded runner that takes it: r1.
	small, err := create("500m")
	if err != nil {
		t.Fatalf("create 500m: %v", err)
	}
	if got := small.GetStatus().GetRunnerId(); got != "r1" {
		t.Errorf("small sandbox on %s, want r1", got)
	}
	g.waitState(t, small.SandboxId, sandboxv1.State_STATE_RUNNING)

	// Not a runner's policy but none: a request for no known runner.
	if _, err := create("100m", "nope"); apierr.Reason(err) != apierr.NoSuitableRunner {
		t.Errorf("pinned to an unknown runner: %v, want %s", err, apierr.NoSuitableRunner)
	}
	// Deleting the big one frees r2 again.
	if _, err := g.sandboxes.DeleteSandbox(ctx, connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: big.SandboxId})); err != nil {
		t.Fatal(err)
	}
	g.waitState(t, big.SandboxId, sandboxv1.State_STATE_TERMINATED)
	if after := free("r2"); after != before {
		t.Errorf("r2 free CPU %d after the delete, want %d", after, before)
	}
}
