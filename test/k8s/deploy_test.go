package k8s

import (
	"bytes"
	"context"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8s "k8s.io/client-go/kubernetes"

	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes"
	"github.com/sandboxd/sandboxd/internal/stack"
)

const chartDir = "../../deploy/helm/sandboxd-runner"

// needHelm finds helm: $HELM, else scripts/build-helm.sh's cache (make k8s-test builds it).
func needHelm(t *testing.T) string {
	t.Helper()
	if h := os.Getenv("HELM"); h != "" {
		return h
	}
	out, err := osexec.Command("bash", "../../scripts/build-helm.sh").Output()
	if err != nil {
		t.Fatalf("helm: scripts/build-helm.sh: %v", err)
	}
	return strings.TrimSpace(string(out))
}

func kubectl(t *testing.T, c cluster, stdin []byte, args ...string) string {
	t.Helper()
	cmd := osexec.Command("kubectl", args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+c.kubeconfig)
	cmd.Stdin = bytes.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func helmTemplate(t *testing.T, helm, ns string, args ...string) []byte {
	t.Helper()
	out, err := osexec.Command(helm, append([]string{"template", "sandboxd-runner", chartDir, "--namespace", ns}, args...)...).Output()
	if err != nil {
		t.Fatalf("helm template: %v", err)
	}
	return out
}

// TestRunnerDeployment: the Helm chart and the plain manifests rendered from it.
//   - deploy/kubernetes/runner.yaml is what the chart renders (scripts/render-k8s-manifests.sh);
//   - both pass the API server's validation (server-side dry run);
//   - the chart's RBAC, really applied in a fresh namespace, is enough for the runner: a
//     backend acting as the chart's service account runs a sandbox with a NetworkPolicy,
//     holds the Lease and rolls its own Deployment to another image tag (the control
//     plane's :applyAvailableUpdate), which Kubernetes then runs; it may not touch
//     another Deployment.
func TestRunnerDeployment(t *testing.T) {
	c := needCluster(t)
	helm := needHelm(t)
	ctx := context.Background()

	rendered := filepath.Join(t.TempDir(), "runner.yaml")
	if out, err := osexec.Command("bash", "../../scripts/render-k8s-manifests.sh", rendered).CombinedOutput(); err != nil {
		t.Fatalf("render: %v\n%s", err, out)
	}
	want, _ := os.ReadFile(rendered)
	if got, _ := os.ReadFile("../../deploy/kubernetes/runner.yaml"); !bytes.Equal(got, want) {
		t.Error("deploy/kubernetes/runner.yaml is not what the chart renders: run scripts/render-k8s-manifests.sh")
	}
	// The plain manifests use the namespace sandboxd, which the test cluster has.
	kubectl(t, c, want, "apply", "--dry-run=server", "-f", "-")

	// A fresh namespace, the chart's namespace, service account and RBAC for real.
	ns := randomID("sandboxd-deploy-")
	rc, err := stack.RESTConfig(c.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	admin := k8s.NewForConfigOrDie(rc)
	t.Cleanup(func() { _ = admin.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{}) })
	// The pre-pull's ClusterRole (list nodes) and its binding are cluster-wide.
	nodesRole := "sandboxd-runner-" + ns + "-nodes"
	t.Cleanup(func() {
		_ = admin.RbacV1().ClusterRoleBindings().Delete(context.Background(), nodesRole, metav1.DeleteOptions{})
		_ = admin.RbacV1().ClusterRoles().Delete(context.Background(), nodesRole, metav1.DeleteOptions{})
	})
	kubectl(t, c, helmTemplate(t, helm, ns, "--set", "namespace.create=true",
		"--show-only", "templates/namespace.yaml", "--show-only", "templates/serviceaccount.yaml", "--show-only", "templates/rbac.yaml"),
		"apply", "-f", "-")
	// The rest (Deployment, Service, Secret, PVC) validated in that namespace.
	kubectl(t, c, helmTemplate(t, helm, ns, "--set", "controlPlane.address=cp.example.com:8443",
		"--show-only", "templates/deployment.yaml", "--show-only", "templates/service.yaml",
		"--show-only", "templates/secret.yaml", "--show-only", "templates/pvc.yaml"),
		"apply", "--dry-run=server", "-f", "-")
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		// Sandbox Pods need the namespace's default service account.
		if _, err := admin.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{}); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatal(err)
		}
	}

	// The runner as the chart's service account.
	asRunner := *rc
	asRunner.Impersonate.UserName = "system:serviceaccount:" + ns + ":sandboxd-runner"
	client := k8s.NewForConfigOrDie(&asRunner)
	// Image pre-pull lists the nodes (the chart's ClusterRole).
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		_, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("list nodes as the runner: %v", err)
		}
	}

	lease, err := stack.AcquireLease(ctx, stack.LeaseConfig{Client: client, Namespace: ns, Name: "sandboxd-runner", Identity: "pod-1", LeaseDuration: 3 * time.Second})
	if err != nil {
		t.Fatalf("lease as the runner: %v", err)
	}
	defer lease.Release()

	runnerID := randomID("deploy-")
	s, err := stack.NewKubernetes(ctx, stack.KubernetesConfig{Kubeconfig: c.kubeconfig, DataDir: t.TempDir(),
		Backend: &kubernetes.Config{Client: client, Namespace: ns, RunnerID: runnerID, AgentImage: c.agentImage,
			ImagePullPolicy: corev1.PullNever, ImageConfig: localImageConfig, TerminationGrace: 5 * time.Second}})
	if err != nil {
		t.Fatalf("runner as the chart's service account: %v", err)
	}
	defer s.Close()
	sb, err := s.Runner.Create(ctx, runner.CreateRequest{Spec: runtime.Spec{Container: runtime.Container{Image: busybox, Command: "sleep", Args: []string{"3600"}},
		Network: &runtime.Network{Egress: runtime.DefaultEgress()}}})
	if err != nil {
		t.Fatal(err)
	}
	if sb = waitState(t, s.Runner, sb.ID, 2*time.Minute, running); sb.State != runner.StateRunning {
		t.Fatalf("sandbox as the runner: %s %s: %s", sb.State, sb.Reason, sb.Message)
	}
	if res := exec(t, s.Runner, sb.ID, "echo", "ok"); string(res.Stdout) != "ok\n" {
		t.Errorf("exec: %q", res.Stdout)
	}
	if _, err := s.Runner.Delete(sb.ID, time.Second); err != nil {
		t.Fatal(err)
	}
	terminal(t, s.Runner, sb.ID)

	// :applyAvailableUpdate: the runner patches its own Deployment's image tag. A stand-in
	// Deployment with the chart's name and strategy, running a local image (sleep ignores
	// SIGTERM: a short grace period keeps the rollout short).
	one := int32(1)
	sel := map[string]string{"app.kubernetes.io/name": "sandboxd-runner"}
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "sandboxd-runner", Namespace: ns},
		Spec: appsv1.DeploymentSpec{Replicas: &one, Strategy: appsv1.DeploymentStrategy{Type: appsv1.RecreateDeploymentStrategyType},
			Selector: &metav1.LabelSelector{MatchLabels: sel},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: sel}, Spec: corev1.PodSpec{TerminationGracePeriodSeconds: ptrTo(int64(1)),
				Containers: []corev1.Container{{Name: "runner", Image: busybox, ImagePullPolicy: corev1.PullNever, Command: []string{"sleep", "3600"}}},
			}}},
	}
	if _, err := admin.AppsV1().Deployments(ns).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	other := map[string]string{"app": "someone-else"}
	dep.Name, dep.Spec.Selector.MatchLabels, dep.Spec.Template.Labels = "someone-else", other, other
	if _, err := admin.AppsV1().Deployments(ns).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	desired := "update-test" // up.sh tags the busybox image with it too
	u := &stack.SelfUpdater{Client: client, Namespace: ns, Deployment: "sandboxd-runner", Container: "runner"}
	uctx, stopUpdater := context.WithCancel(ctx)
	defer stopUpdater()
	go u.Run(uctx, "dev", func() string { return desired }, 500*time.Millisecond)
	wantImage := stack.WithTag(busybox, desired)
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(250 * time.Millisecond) {
		pods, err := admin.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=sandboxd-runner"})
		if err != nil {
			t.Fatal(err)
		}
		var states []string
		rolled := false
		for _, p := range pods.Items {
			if p.DeletionTimestamp != nil {
				continue
			}
			states = append(states, p.Spec.Containers[0].Image+" "+string(p.Status.Phase))
			if p.Spec.Containers[0].Image == wantImage && p.Status.Phase == corev1.PodRunning {
				rolled = true
			}
		}
		if rolled && len(states) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the Deployment did not roll to %s: pods %v", wantImage, states)
		}
	}
	if changed, err := u.Apply(ctx, desired); err != nil || changed {
		t.Errorf("second apply of the same version: changed %v, %v", changed, err)
	}
	foreign := &stack.SelfUpdater{Client: client, Namespace: ns, Deployment: "someone-else"}
	if _, err := foreign.Apply(ctx, desired); err == nil || !strings.Contains(err.Error(), "forbidden") {
		t.Errorf("the runner may patch another Deployment: %v", err)
	}
}
