package k8s

import (
	"context"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sclient "k8s.io/client-go/kubernetes"

	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes"
	"github.com/sandboxd/sandboxd/internal/runtime/runtimetest"
	"github.com/sandboxd/sandboxd/internal/stack"
	"github.com/sandboxd/sandboxd/internal/testimage"
)

// TestConformance runs the backend contract (runtimetest.Run) on the cluster: the same
// tests the local backend passes.
func TestConformance(t *testing.T) {
	c := needCluster(t)
	rc, err := stack.RESTConfig(c.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	rc.QPS, rc.Burst = 50, 100
	client, err := k8sclient.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	runners := map[*testing.T]string{} // each test's state: its runner ID
	newBackend := func(t *testing.T) runtime.Backend {
		mu.Lock()
		runnerID, ok := runners[t]
		if !ok {
			runnerID = randomID("conf-")
			runners[t] = runnerID
		}
		mu.Unlock()
		if !ok {
			t.Cleanup(func() { deleteRunnerObjects(client, c.namespace, runnerID) })
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		b, err := kubernetes.New(ctx, kubernetes.Config{
			Client: client, Namespace: c.namespace, RunnerID: runnerID, AgentImage: c.agentImage,
			ImagePullPolicy: corev1.PullNever, ImageConfig: localImageConfig, TerminationGrace: 5 * time.Second,
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(b.Close)
		return b
	}
	runtimetest.Run(t, newBackend, runtimetest.Options{
		SecondImage: python, // the group tests (multi-container Pods)
		Image:       busybox, ImagePath: testimage.DefaultPath, WorkDirImage: "localhost/" + testimage.BusyboxWorkDir, WorkDir: testimage.WorkDir,
		MissingImage: "localhost/sandboxd/missing:1", StartTimeout: 2 * time.Minute, StopLatency: 10 * time.Second, Parallel: true,
	})
}

// deleteRunnerObjects deletes what runner runnerID's sandboxes left in the cluster.
func deleteRunnerObjects(client k8sclient.Interface, namespace, runnerID string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sel := metav1.ListOptions{LabelSelector: kubernetes.LabelRunner + "=" + runnerID}
	zero := int64(0)
	_ = client.CoreV1().Pods(namespace).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, sel)
	_ = client.CoreV1().Secrets(namespace).DeleteCollection(ctx, metav1.DeleteOptions{}, sel)
}
