package k8s

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/gateway"
	"github.com/sandboxd/sandboxd/internal/runner"
)

// policyMap gives each runner its policy document.
type policyMap map[string]string

func (p policyMap) Policy(_ context.Context, id string) ([]byte, int64, error) {
	return []byte(p[id]), 1, nil
}

// TestGatewayAcrossTwoClusters: two Kubernetes runners, each with a namespace of its own
// (two "clusters"), with different policies behind one gateway; sandboxes land where the
// policy allows, pins work, and each Pod is in its runner's namespace.
func TestGatewayAcrossTwoClusters(t *testing.T) {
	c, a, idA := setup(t)
	ctx := context.Background()

	// Cluster B: its own namespace (and the default service account Pods need).
	nsB := randomID("sandboxd-b-")
	if _, err := a.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: nsB}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = a.Client.CoreV1().Namespaces().Delete(context.Background(), nsB, metav1.DeleteOptions{})
	})
	for deadline := time.Now().Add(time.Minute); ; {
		_, err := a.Client.CoreV1().ServiceAccounts(nsB).Get(ctx, "default", metav1.GetOptions{})
		if err == nil {
			break
		}
		if !apierrors.IsNotFound(err) || time.Now().After(deadline) {
			t.Fatalf("default service account of %s: %v", nsB, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	cB := c
	cB.namespace = nsB
	idB := randomID("test-")
	b := newStack(t, cB, idB, t.TempDir())
	t.Cleanup(b.Close)

	_, api, _ := serveGateway(t, gateway.Config{
		Runners:  []runner.Handle{runner.NewLocal(idA, a.Runner), runner.NewLocal(idB, b.Runner)},
		Policies: policyMap{idA: `{"constraints": {"resources": {"max_cpu": "500m"}}}`, idB: `{}`}})

	create := func(cpu string, pins ...string) string {
		t.Helper()
		sp := &sandboxv1.SandboxSpec{RunnerIds: pins,
			Containers: []*sandboxv1.Container{{Name: "main", Image: busybox, Command: "/bin/sh", Args: []string{"-c", `trap "exit 0" TERM; sleep 3600 & wait`},
				Resources: &sandboxv1.Resources{Cpu: cpu, Memory: "64Mi"}}}}
		if len(pins) > 0 {
			sp.Mode = sandboxv1.SandboxMode_SANDBOX_MODE_CKS
		}
		res, err := api.CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: sp}}))
		if err != nil {
			t.Fatalf("create %s CPU %v: %v", cpu, pins, err)
		}
		id := res.Msg.GetSandboxId()
		t.Cleanup(func() {
			_, _ = api.DeleteSandbox(context.Background(), connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: id}))
		})
		return id
	}
	podOf := func(id, ns string) {
		t.Helper()
		deadline := time.Now().Add(2 * time.Minute)
		for {
			res, err := api.GetSandbox(ctx, connect.NewRequest(&sandboxv1.GetSandboxRequest{SandboxId: id}))
			if err != nil {
				t.Fatal(err)
			}
			if res.Msg.GetStatus().GetState() == sandboxv1.State_STATE_RUNNING {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("sandbox %s: %v", id, res.Msg.GetStatus())
			}
			time.Sleep(100 * time.Millisecond)
		}
		if _, err := a.Client.CoreV1().Pods(ns).Get(ctx, "sbx-"+id, metav1.GetOptions{}); err != nil {
			t.Errorf("the Pod of %s is not in namespace %s: %v", id, ns, err)
		}
		ex, err := api.Exec(ctx, connect.NewRequest(&sandboxv1.ExecRequest{SandboxId: id, Command: []string{"echo", "ok"}}))
		if err != nil || string(ex.Msg.GetStdout()) != "ok\n" {
			t.Errorf("exec in %s: %v", id, err)
		}
	}
	// 1 CPU: only cluster B's policy takes it.
	big := create("1")
	// Pinned to cluster A, within its policy.
	small := create("250m", idA)
	podOf(big, nsB)
	podOf(small, c.namespace)
	// Pinned to A beyond its policy: refused, naming the constraint.
	sp := &sandboxv1.SandboxSpec{RunnerIds: []string{idA}, Mode: sandboxv1.SandboxMode_SANDBOX_MODE_CKS,
		Containers: []*sandboxv1.Container{{Name: "main", Image: busybox, Resources: &sandboxv1.Resources{Cpu: "1", Memory: "64Mi"}}}}
	if _, err := api.CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: sp}})); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("1 CPU pinned to the strict cluster: %v", err)
	}
}
