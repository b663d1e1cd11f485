package security

import (
	"encoding/json"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes"
)

// recordPods makes cs keep a copy of every Pod created through it (a fake cluster whose
// Pods never run: the Pod a Create made is what counts); the func returns those so far.
func recordPods(cs *fake.Clientset) func() []*corev1.Pod {
	var mu sync.Mutex
	var made []*corev1.Pod
	cs.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, k8sruntime.Object, error) {
		if p, ok := a.(k8stesting.CreateAction).GetObject().(*corev1.Pod); ok {
			mu.Lock()
			made = append(made, p.DeepCopy())
			mu.Unlock()
		}
		return false, nil, nil
	})
	return func() []*corev1.Pod {
		mu.Lock()
		defer mu.Unlock()
		return append([]*corev1.Pod(nil), made...)
	}
}

// recoverEnded is a Kubernetes runner (RunnerID runner) restarting over a fake cluster
// that holds sandbox spec as the backend keeps it (its Secret: spec, pinned keys, agent
// config; organization org-a) and its Pod with status as the cluster reports it. It
// runs Recover and returns the backend (closed when t ends) and the exit of the one
// sandbox recovered, failing t unless exactly one, ended, is.
func recoverEnded(t *testing.T, runner string, spec runtime.Spec, status corev1.PodStatus) (*kubernetes.Backend, runtime.Exit) {
	t.Helper()
	specJSON, err := json.Marshal(&spec)
	if err != nil {
		t.Fatal(err)
	}
	clientCert, clientKey := selfSignedPEM(t, "sandboxd-runner")
	serverCert, _ := selfSignedPEM(t, "sandbox-"+spec.ID)
	labels := map[string]string{kubernetes.LabelManagedBy: kubernetes.ManagedBy, kubernetes.LabelRunner: runner,
		kubernetes.LabelSandbox: spec.ID, kubernetes.LabelOrg: "org-a"}
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "sbx-" + spec.ID, Namespace: "sbx", Labels: labels},
		Data: map[string][]byte{"spec.json": specJSON, "client.crt": clientCert, "client.key": clientKey, "tls.crt": serverCert, "config.json": []byte("{}")}}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "sbx-" + spec.ID, Namespace: "sbx", Labels: labels, UID: "u1"}, Status: status}
	b, err := kubernetes.New(t.Context(), kubernetes.Config{Client: fake.NewSimpleClientset(secret, pod), Namespace: "sbx", RunnerID: runner, AgentImage: "agent:1"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	recs, err := b.Recover(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 || recs[0].Exit == nil || recs[0].Alive {
		t.Fatalf("recovered %+v, want the ended sandbox with its exit", recs)
	}
	return b, *recs[0].Exit
}
