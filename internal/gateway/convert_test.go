package gateway

import (
	"testing"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
)

// TestCreateRequestChecksRunnerIDs: the gateway's conversion reports runner_ids'
// problems (placement's check) with the spec's own, after them, and before anything
// this sandboxd does not support.
func TestCreateRequestChecksRunnerIDs(t *testing.T) {
	_, err := toCreateRequest(&sandboxv1.SandboxSpec{
		Containers: []*sandboxv1.Container{{Image: "busybox"}},
		Tags:       []string{"bad tag"}, RunnerIds: []string{" "}, InstanceType: "gpu-large",
	}, nil)
	if connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("code %v, want INVALID_ARGUMENT (%v)", connect.CodeOf(err), err)
	}
	if got, want := fields(apierr.Violations(err)), "sandbox.spec.tags[0],sandbox.spec.runner_ids[0]"; got != want {
		t.Errorf("violations %q, want %q", got, want)
	}
}
