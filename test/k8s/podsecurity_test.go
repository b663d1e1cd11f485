package k8s

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

const psEnforce = "pod-security.kubernetes.io/enforce"

// TestPodSecurity: the sandboxes' namespace enforces the Pod Security Standard
// "baseline" (up.sh), and sandboxes start under it, with the default context and with a
// run-as user + drop ALL (the agent keeps its six capabilities); the gate reaches the
// agent's socket, which belongs to the gate's non-root user. The apiserver's own Pod
// Security admission, asked (dry run) in a namespace enforcing "restricted", names only
// the main container: the same Pod without it is admitted.
func TestPodSecurity(t *testing.T) {
	c, s, _ := setup(t)
	ctx := context.Background()
	ns, err := s.Client.CoreV1().Namespaces().Get(ctx, c.namespace, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ns.Labels[psEnforce] != "baseline" {
		t.Fatalf("namespace %s: %s=%q, want baseline (up.sh sets it)", c.namespace, psEnforce, ns.Labels[psEnforce])
	}
	u := uint32(1000)
	var pod *corev1.Pod
	for _, tc := range []struct {
		sec *runtime.Security
		uid string
	}{
		{nil, "0"},
		{&runtime.Security{RunAsUser: &u, ReadOnlyRootFS: true, CapDrop: []string{"ALL"}}, "1000"},
	} {
		sb, err := s.Runner.Create(ctx, runner.CreateRequest{Spec: runtime.Spec{Container: runtime.Container{Image: busybox, Command: "sleep", Args: []string{"3600"}, Security: tc.sec}}})
		if err != nil {
			t.Fatalf("create under baseline (%+v): %v", tc.sec, err)
		}
		res := exec(t, s.Runner, sb.ID, "sh", "-c", "id -u; stat -c '%u %a' /.sandboxd/run/agent.sock")
		if got, want := string(res.Stdout), tc.uid+"\n65532 600\n"; got != want {
			t.Errorf("%+v: id and agent socket %q, want %q (stderr %q)", tc.sec, got, want, res.Stderr)
		}
		pod, err = s.Client.CoreV1().Pods(c.namespace).Get(ctx, "sbx-"+sb.ID, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
	}

	rns := randomID("sandboxd-restricted-")
	if _, err := s.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
		Name: rns, Labels: map[string]string{psEnforce: "restricted"},
	}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Client.CoreV1().Namespaces().Delete(context.Background(), rns, metav1.DeleteOptions{}) })
	// The ServiceAccount admission wants the namespace's default service account.
	for end := time.Now().Add(30 * time.Second); ; {
		_, err := s.Client.CoreV1().ServiceAccounts(rns).Get(ctx, "default", metav1.GetOptions{})
		if err == nil {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("default service account of %s: %v", rns, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	dry := func(containers ...corev1.Container) error {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: rns}, Spec: *pod.Spec.DeepCopy()}
		p.Spec.NodeName, p.Spec.Containers = "", containers
		_, err := s.Client.CoreV1().Pods(rns).Create(ctx, p, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err
	}
	err = dry(pod.Spec.Containers...)
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), `"sandbox"`) || strings.Contains(err.Error(), `"gate"`) {
		t.Errorf("restricted: the sandbox Pod: %v; want forbidden for the main container \"sandbox\" only", err)
	}
	t.Logf("restricted refuses the main container: %v", err)
	if err := dry(pod.Spec.Containers[0]); err != nil {
		t.Errorf("restricted: the Pod with only its gate container: %v", err)
	}
}
