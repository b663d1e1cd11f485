package security

import (
	"context"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes/fake"

	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes"
)

// TestK8sPolicyForgesNoPodState (review of lead12, L3): the Kubernetes backend keeps its
// own state on a sandbox's Pod in annotations under runtime.ReservedPodAnnotationPrefix
// (sandboxd.io/workload-started: a GLOBAL writer's copy is committed only then;
// sandboxd.io/warm-claimed: Recover asks a warm claim's agent whether it started, and
// takes the claim's time as the sandbox's start). The policy check refuses such keys,
// but a policy stored before it may hold them: a Create with such Pod settings never
// puts one on the Pod it makes (here against a fake cluster whose Pods never run: the
// Create fails, the Pod it created is what counts). The cluster's side of the restore
// trigger (anyone else setting it on a Pod of their own) is test/k8s
// TestSecurityRestoreAnnotation: this suite has no cluster.
func TestK8sPolicyForgesNoPodState(t *testing.T) {
	cs := fake.NewSimpleClientset()
	made := recordPods(cs)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	b, err := kubernetes.New(ctx, kubernetes.Config{Client: cs, Namespace: "sbx", RunnerID: "r1", AgentImage: "agent:1",
		StartTimeout: time.Second, MaxPrepull: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	spec := &runtime.Spec{ID: "forged", Container: runtime.Container{Image: "busybox", Command: "sh"},
		Pod: &runtime.PodSettings{Annotations: map[string]string{
			"sandboxd.io/warm-claimed":       "2020-01-01T00:00:00Z",
			"sandboxd.io/workload-started":   "true",
			"dev.gvisor.spec.mount.run.type": "bind",
			"dev.gvisor.flag.network":        "host",
			// The patched gVisor shim's restore trigger: a Pod with it would resume the
			// node's checkpoint of another sandbox.
			"dev.sandboxd.restore.checkpoint-id": "cp-1",
			"example.com/team":                   "a",
		}}}
	cctx, ccancel := context.WithTimeout(ctx, 3*time.Second)
	defer ccancel()
	_, _ = b.Create(cctx, spec)
	pods := made()
	if len(pods) == 0 {
		t.Fatal("the Create made no Pod (the test no longer reaches the Pod's annotations)")
	}
	for _, p := range pods {
		for k := range p.Annotations {
			if _, reserved := runtime.ReservedPodAnnotation(k); reserved {
				t.Errorf("Pod %s carries the policy's %s=%q", p.Name, k, p.Annotations[k])
			}
		}
		if v, ok := p.Annotations[runtime.RestoreCheckpointAnnotation]; ok {
			t.Errorf("Pod %s carries the policy's %s=%q: the gVisor shim would restore it from that checkpoint", p.Name, runtime.RestoreCheckpointAnnotation, v)
		}
		if p.Annotations["example.com/team"] != "a" {
			t.Errorf("Pod %s: annotations %v, the policy's own key missing", p.Name, p.Annotations)
		}
	}
}
