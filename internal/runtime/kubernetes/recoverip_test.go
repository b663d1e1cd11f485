package kubernetes

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// TestRecoverIPWaitBounded: Recover waits for the kubelet to report the IP of scheduled,
// not yet running Pods (a create that took its hello) within one shared deadline, not
// recoverIPWait per Pod, and not at all for a Pod older than StartTimeout.
func TestRecoverIPWaitBounded(t *testing.T) {
	waiting := corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}}
	lb, _ := newFakeBackend(t, Config{})
	mk := func(id string, created time.Time) []k8sruntime.Object {
		spec := &runtime.Spec{ID: id, Container: runtime.Container{Image: "busybox", Command: "sh"}}
		objs := recoverWriter(t, lb, spec, []corev1.ContainerStatus{{Name: containerGate, State: waiting}, {Name: containerMain, State: waiting}}, nil)
		pod := objs[1].(*corev1.Pod)
		pod.CreationTimestamp = metav1.NewTime(created)
		pod.Spec.NodeName = "n1"
		pod.Status.Phase = corev1.PodPending
		return objs
	}
	for _, tc := range []struct {
		name    string
		created time.Duration // before now
		max     time.Duration
	}{
		{"young Pods share one deadline", 0, recoverIPWait + 2*time.Second},
		{"old Pods are not waited for", time.Hour, time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var objs []k8sruntime.Object
			for _, id := range []string{"a1", "a2", "a3", "a4"} {
				objs = append(objs, mk(id, time.Now().Add(-tc.created))...)
			}
			b, _ := newFakeBackend(t, Config{StartTimeout: 10 * time.Minute}, objs...)
			start := time.Now()
			recs, err := b.Recover(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			if d := time.Since(start); d > tc.max {
				t.Errorf("Recover of 4 Pods without an IP took %s, want <= %s", d, tc.max)
			}
			if len(recs) != 4 {
				t.Fatalf("recovered %d, want 4", len(recs))
			}
			for _, r := range recs {
				if r.Alive {
					t.Errorf("%s alive without an agent", r.Spec.ID)
				}
			}
		})
	}
}
