package e2e

import (
	"context"
	"strings"
	"sync"
	"testing"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/gateway"
)

// policies is a policy.Source an administrator changes during the test.
type policies struct {
	mu  sync.Mutex
	doc string
	rev int64
}

func (p *policies) set(doc string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.doc, p.rev = doc, p.rev+1
}

func (p *policies) Policy(context.Context, string) ([]byte, int64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return []byte(p.doc), p.rev, nil
}

func TestGatewayEnforcesPolicy(t *testing.T) {
	pol := &policies{}
	pol.set(`{
		"base": {"max_lifetime_seconds": 120, "env": {"TEAM": "blue"}},
		"constraints": {
			"lifetime": {"max_seconds": 600},
			"resources": {"max_cpu": "1", "max_memory": "512Mi"}
		}
	}`)
	g := startGateway(t, func(c *gateway.Config) { c.Policies = pol })
	ctx := context.Background()

	greedy := sleeperSpec()
	greedy.MaxLifetimeSeconds = 3600
	greedy.Containers[0].Resources = &sandboxv1.Resources{Cpu: "4", Memory: "2Gi"}
	_, err := g.sandboxes.CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: greedy}}))
	if connect.CodeOf(err) != connect.CodeInvalidArgument || apierr.Reason(err) != apierr.PlacementRejected {
		t.Fatalf("greedy sandbox: %v, want INVALID_ARGUMENT %s", err, apierr.PlacementRejected)
	}
	// Every violation at once, each naming the field, the constraint and the limit.
	want := map[string]string{
		"sandbox.spec.max_lifetime_seconds":           "constraints.lifetime.max_seconds",
		"sandbox.spec.containers[0].resources.cpu":    "constraints.resources.max_cpu",
		"sandbox.spec.containers[0].resources.memory": "constraints.resources.max_memory",
	}
	for _, v := range apierr.Violations(err) {
		if c, ok := want[v.Field]; ok && strings.Contains(v.Description, c) {
			delete(want, v.Field)
		}
	}
	if len(want) > 0 {
		t.Errorf("violations %v miss %v", apierr.Violations(err), want)
	}

	// A modest sandbox gets the base attachments and defaults.
	modest := sleeperSpec()
	modest.Containers[0].Resources = &sandboxv1.Resources{Cpu: "500m", Memory: "256Mi"}
	sb := g.create(t, modest, "")
	running := g.waitState(t, sb.SandboxId, sandboxv1.State_STATE_RUNNING)
	if got := running.GetStatus().GetEffectiveMaxLifetimeSeconds(); got != 120 {
		t.Errorf("effective lifetime %d, want the base default 120", got)
	}
	res, err := g.sandboxes.Exec(ctx, connect.NewRequest(&sandboxv1.ExecRequest{SandboxId: sb.SandboxId, Command: []string{"sh", "-c", "echo $TEAM"}}))
	if err != nil || string(res.Msg.Stdout) != "blue\n" {
		t.Errorf("base env in the sandbox: %q %v", res.Msg.GetStdout(), err)
	}

	// A stricter policy applies to new sandboxes only.
	pol.set(`{"constraints": {"resources": {"max_cpu": "100m"}}}`)
	if _, err := g.sandboxes.CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: modest}})); apierr.Reason(err) != apierr.PlacementRejected {
		t.Errorf("create under the stricter policy: %v, want %s", err, apierr.PlacementRejected)
	}
	still, err := g.sandboxes.Exec(ctx, connect.NewRequest(&sandboxv1.ExecRequest{SandboxId: sb.SandboxId, Command: []string{"true"}}))
	if err != nil || still.Msg.ExitCode != 0 {
		t.Errorf("the running sandbox is affected by the new policy: %v", err)
	}
}
