package k8s

import (
	"context"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"connectrpc.com/connect"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1/sandboxv1connect"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/connecttest"
	"github.com/sandboxd/sandboxd/internal/gateway"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes"
)

// serveGateway serves a gateway over cfg.Runners (cfg.Auth is set here) on loopback,
// HTTP/1.1 and h2c as `sandboxd gateway` does, and returns its URL, a gRPC client of it
// and the user key of organization org-a that client sends.
func serveGateway(t *testing.T, cfg gateway.Config) (url string, api sandboxv1connect.SandboxServiceClient, key string) {
	t.Helper()
	keys, err := auth.OpenKeyring(filepath.Join(t.TempDir(), "keys.json"))
	if err != nil {
		t.Fatal(err)
	}
	key, _, _ = keys.Create("org-a", auth.RoleUser, "")
	cfg.Auth = keys
	g, err := gateway.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Close)
	srv := httptest.NewUnstartedServer(g.Handler())
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetHTTP1(true)
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	srv.Start()
	t.Cleanup(srv.Close)
	return srv.URL, sandboxv1connect.NewSandboxServiceClient(h2cClient(), srv.URL, connect.WithGRPC(), connect.WithInterceptors(connecttest.Bearer(key))), key
}

// TestGateway: the public API (coreweave.sandbox.v1 through the gateway) on a runner
// with the Kubernetes backend: create, RUNNING, exec, files, delete, TERMINATED.
func TestGateway(t *testing.T) {
	c, s, runnerID := setup(t)
	_, api, _ := serveGateway(t, gateway.Config{Runners: []runner.Handle{runner.NewLocal(runnerID, s.Runner)}})
	ctx := context.Background()

	res, err := api.CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: &sandboxv1.SandboxSpec{
		Containers: []*sandboxv1.Container{{Name: "main", Image: busybox, Command: "/bin/sh", Args: []string{"-c", `trap "exit 0" TERM; sleep 3600 & wait`},
			Resources: &sandboxv1.Resources{Cpu: "250m", Memory: "64Mi"}}},
	}}}))
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	id := res.Msg.GetSandboxId()
	wait := func(want sandboxv1.State) *sandboxv1.Sandbox {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for {
			res, err := api.GetSandbox(ctx, connect.NewRequest(&sandboxv1.GetSandboxRequest{SandboxId: id}))
			if err != nil {
				t.Fatalf("get: %v", err)
			}
			if st := res.Msg.GetStatus(); st.GetState() == want {
				return res.Msg
			} else if time.Now().After(deadline) {
				t.Fatalf("sandbox %s is %s (%s), want %s", id, st.GetState(), st.GetStateReason(), want)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	sb := wait(sandboxv1.State_STATE_RUNNING)
	if sb.GetStatus().GetRunnerId() != runnerID {
		t.Errorf("runner %q, want %q", sb.GetStatus().GetRunnerId(), runnerID)
	}
	pod, err := s.Client.CoreV1().Pods(c.namespace).Get(ctx, "sbx-"+id, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pod.Labels[kubernetes.LabelOrg] != "org-a" || pod.Labels[kubernetes.LabelRunner] != runnerID {
		t.Errorf("pod labels %v: want org org-a, runner %s", pod.Labels, runnerID)
	}
	ex, err := api.Exec(ctx, connect.NewRequest(&sandboxv1.ExecRequest{SandboxId: id, Command: []string{"sh", "-c", "echo hello; exit 4"}}))
	if err != nil {
		t.Fatal(err)
	}
	if ex.Msg.GetExitCode() != 4 || string(ex.Msg.GetStdout()) != "hello\n" {
		t.Errorf("exec: exit %d stdout %q", ex.Msg.GetExitCode(), ex.Msg.GetStdout())
	}
	if _, err := api.DeleteSandbox(ctx, connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: id, GracePeriodSeconds: 5})); err != nil {
		t.Fatal(err)
	}
	wait(sandboxv1.State_STATE_TERMINATED)
}
