package k8s

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/structpb"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8s "k8s.io/client-go/kubernetes"

	controlplanev1 "github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1"
	"github.com/sandboxd/sandboxd/internal/stack"
)

// TestApplyAvailableUpdate: the control plane's :applyAvailableUpdate reaches a
// Kubernetes runner (a `sandboxd runner --backend kubernetes --self-deployment` process
// registered with a bootstrap token) through its heartbeat reply, and the runner rolls its
// Deployment to the channel's version: the image tag changes and Kubernetes runs the new
// Pod. (The Deployment is a stand-in running busybox, tagged twice by up.sh.)
func TestApplyAvailableUpdate(t *testing.T) {
	c := needCluster(t)
	bin := buildSandboxd(t)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	const target = "update-test"

	// The runner's namespace and its Deployment (the chart's name and strategy).
	rc, err := stack.RESTConfig(c.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	admin := k8s.NewForConfigOrDie(rc)
	ns := randomID("sandboxd-update-")
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{}) })
	one := int32(1)
	sel := map[string]string{"app.kubernetes.io/name": "sandboxd-runner"}
	if _, err := admin.AppsV1().Deployments(ns).Create(ctx, &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "sandboxd-runner", Namespace: ns},
		Spec: appsv1.DeploymentSpec{Replicas: &one, Strategy: appsv1.DeploymentStrategy{Type: appsv1.RecreateDeploymentStrategyType},
			Selector: &metav1.LabelSelector{MatchLabels: sel},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: sel}, Spec: corev1.PodSpec{TerminationGracePeriodSeconds: ptrTo(int64(1)),
				Containers: []corev1.Container{{Name: "runner", Image: busybox, ImagePullPolicy: corev1.PullNever, Command: []string{"sleep", "3600"}}},
			}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// The control plane (TLS on loopback); its stable channel offers the target version.
	cp := startControlPlane(t, ctx, "127.0.0.1", target)
	api := cp.api
	runnerID := randomID("upd-")
	if _, err := api.CreateManagedRunner(ctx, connect.NewRequest(&controlplanev1.CreateManagedRunnerRequest{ManagedRunner: &controlplanev1.ManagedRunner{
		RunnerId: runnerID, ClusterId: "c-" + runnerID, Zone: "test", Policy: &structpb.Struct{}}})); err != nil {
		t.Fatal(err)
	}
	tok, err := api.CreateBootstrapToken(ctx, connect.NewRequest(&controlplanev1.CreateBootstrapTokenRequest{RunnerId: runnerID}))
	if err != nil {
		t.Fatal(err)
	}

	// The runner, as the chart runs it (POD_NAMESPACE from the downward API).
	rdir := t.TempDir()
	p := startRunner(t, bin, []string{"POD_NAMESPACE=" + ns}, "--backend", "kubernetes", "--kubeconfig", c.kubeconfig, "--namespace", c.namespace,
		"--agent-image", c.agentImage, "--image-pull-policy", "Never", "--listen", "127.0.0.1:0", "--data-dir", rdir,
		"--control-plane", cp.addr, "--bootstrap-token", tok.Msg.GetBootstrapToken(), "--heartbeat-interval", "200ms",
		"--self-deployment", "sandboxd-runner", "--leader-elect", "--leader-elect-lease", "sandboxd-runner", "--leader-elect-lease-duration", "3s")
	select {
	case <-p.listening:
	case <-ctx.Done():
		t.Fatalf("the runner does not serve:\n%s", p.log())
	}
	// It has heartbeated (the update needs its running version) before it serves.
	var etag string
	for {
		r, err := api.GetManagedRunner(ctx, connect.NewRequest(&controlplanev1.GetManagedRunnerRequest{RunnerId: runnerID}))
		if err != nil {
			t.Fatal(err)
		}
		if r.Msg.GetStatus().GetVersion() != "" {
			etag = r.Msg.GetEtag()
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	applied := time.Now()
	up, err := api.ApplyAvailableUpdate(ctx, connect.NewRequest(&controlplanev1.ApplyAvailableUpdateRequest{RunnerId: runnerID, Etag: etag}))
	if err != nil {
		t.Fatalf("applyAvailableUpdate: %v", err)
	}
	if d := up.Msg.GetStatus().GetDesiredVersion(); d != target {
		t.Errorf("desired version %q, want %q", d, target)
	}
	wantImage := stack.WithTag(busybox, target)
	for {
		pods, err := admin.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=sandboxd-runner"})
		if err != nil {
			t.Fatal(err)
		}
		var live []corev1.Pod
		for _, pod := range pods.Items {
			if pod.DeletionTimestamp == nil {
				live = append(live, pod)
			}
		}
		if len(live) == 1 && live[0].Spec.Containers[0].Image == wantImage && live[0].Status.Phase == corev1.PodRunning {
			t.Logf("rolled to %s, running, %s after :applyAvailableUpdate", wantImage, time.Since(applied).Round(time.Millisecond))
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the Deployment did not roll to %s; runner log:\n%s", wantImage, p.log())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func ptrTo[T any](v T) *T { return &v }
