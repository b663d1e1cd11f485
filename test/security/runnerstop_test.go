package security

import (
	"context"
	"net/http/httptest"
	"testing"

	"connectrpc.com/connect"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1/agentv1connect"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runnerapi"
	"github.com/sandboxd/sandboxd/internal/runtime/runtimetest"
)

// TestRunnerAPIAgentStopNotRelayed: AgentService.Stop (the Kubernetes backend's way to
// stop a GLOBAL writer's workload without deleting its Pod) is between a runner and its
// own agents: a caller of the runner API's agent relay (the gateway or anyone holding
// its credentials) asking it for a sandbox, primary or sidecar, is refused
// PERMISSION_DENIED, never forwarded.
func TestRunnerAPIAgentStopNotRelayed(t *testing.T) {
	be := runtimetest.NewFake()
	t.Cleanup(be.Close)
	r, err := runner.New(context.Background(), runner.Config{Backend: be, DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	srv := httptest.NewServer(runnerapi.NewServer("r1", r, nil).Handler())
	t.Cleanup(srv.Close)
	c := agentv1connect.NewAgentServiceClient(srv.Client(), srv.URL)
	for _, container := range []string{"", "web", "cw-object-store-agent-volumes"} {
		req := connect.NewRequest(&agentv1.StopRequest{})
		req.Header().Set(runnerapi.SandboxIDHeader, "abc")
		if container != "" {
			req.Header().Set(runnerapi.ContainerHeader, container)
		}
		if _, err := c.Stop(context.Background(), req); connect.CodeOf(err) != connect.CodePermissionDenied {
			t.Errorf("Stop of %q through the relay: %v, want PERMISSION_DENIED", container, err)
		}
	}
}
