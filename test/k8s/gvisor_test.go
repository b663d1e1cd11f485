package k8s

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes"
)

// TestGVisorRuntimeClass: a sandbox of the `gvisor` runtime class runs as a Pod of the
// cluster's gVisor RuntimeClass (up.sh: handler runsc, gVisor's containerd shim) — its
// kernel is gVisor's sentry, not the host's — and answers exec and files like a runc one;
// a runc sandbox beside it stays on the host kernel.
func TestGVisorRuntimeClass(t *testing.T) {
	c := needCluster(t)
	runnerID := randomID("test-")
	s := newStack(t, c, runnerID, t.TempDir(), func(cfg *kubernetes.Config) {
		cfg.RuntimeClasses = map[string]string{"runc": "", "gvisor": "gvisor"}
	})
	t.Cleanup(func() {
		s.Close()
		deleteRunnerObjects(s.Client, c.namespace, runnerID)
	})
	r := s.Runner
	if got := r.RuntimeClasses(); !slices.Equal(got, []string{"runc", "gvisor"}) {
		t.Errorf("runner offers %v, want [runc gvisor]", got)
	}
	start := time.Now()
	sb, err := r.Create(context.Background(), runner.CreateRequest{Spec: runtime.Spec{
		Container:    runtime.Container{Image: busybox, Command: "sleep", Args: []string{"3600"}},
		RuntimeClass: "gvisor",
		Meta:         map[string]string{runtime.MetaOrg: "org-1"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	sb = waitState(t, r, sb.ID, 2*time.Minute, running)
	if sb.State != runner.StateRunning {
		t.Fatalf("state %s (%s: %s), want RUNNING", sb.State, sb.Reason, sb.Message)
	}
	t.Logf("gvisor: create -> RUNNING %s (ip %s)", time.Since(start).Round(time.Millisecond), sb.IP)
	pod, err := s.Client.CoreV1().Pods(c.namespace).Get(context.Background(), "sbx-"+sb.ID, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pod.Spec.RuntimeClassName == nil || *pod.Spec.RuntimeClassName != "gvisor" {
		t.Errorf("Pod runtimeClassName %v, want gvisor", pod.Spec.RuntimeClassName)
	}
	res := exec(t, r, sb.ID, "dmesg")
	if res.ExitCode != 0 || !strings.Contains(string(res.Stdout), "gVisor") {
		t.Errorf("dmesg in the gvisor sandbox: exit %d %q %q, want gVisor's boot messages", res.ExitCode, res.Stdout, res.Stderr)
	}
	res = exec(t, r, sb.ID, "sh", "-c", "echo hi > /tmp/f && cat /tmp/f")
	if res.ExitCode != 0 || string(res.Stdout) != "hi\n" {
		t.Errorf("exec in the gvisor sandbox: exit %d %q %q", res.ExitCode, res.Stdout, res.Stderr)
	}

	rc, err := r.Create(context.Background(), runner.CreateRequest{Spec: runtime.Spec{
		Container: runtime.Container{Image: busybox, Command: "sleep", Args: []string{"3600"}},
		Meta:      map[string]string{runtime.MetaOrg: "org-1"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	rc = waitState(t, r, rc.ID, 2*time.Minute, running)
	if rc.State != runner.StateRunning {
		t.Fatalf("runc: state %s (%s: %s), want RUNNING", rc.State, rc.Reason, rc.Message)
	}
	if res := exec(t, r, rc.ID, "dmesg"); strings.Contains(string(res.Stdout), "gVisor") {
		t.Errorf("the runc sandbox runs under gVisor: %q", res.Stdout)
	}
	for _, id := range []string{sb.ID, rc.ID} {
		if _, err := r.Delete(id, 2*time.Second); err != nil {
			t.Errorf("delete %s: %v", id, err)
		}
		terminal(t, r, id)
		podGone(t, s, c, id)
	}
}
