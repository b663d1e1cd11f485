package kubernetes

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// TestRecoverProbesInParallel: Recover asks the agents of running sandboxes with
// host-name egress rules whether they are still held in standby (a Create cut short)
// all at once (up to recoverProbes), not one after another: every probe is in flight
// before any of them is answered. The answers keep their meaning and order: a sandbox
// whose agent is held is vanished, one whose agent is not stays alive.
func TestRecoverProbesInParallel(t *testing.T) {
	const n = 4
	running := corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}}
	lb, _ := newFakeBackend(t, Config{Egress: testEgress()})
	var objs []k8sruntime.Object
	for i := range n {
		spec := hostNameSpec(fmt.Sprintf("e%d", i), runtime.EgressRule{DNSName: "api.example.com"})
		o := recoverWriter(t, lb, spec, []corev1.ContainerStatus{{Name: containerGate, State: running}, {Name: containerMain, State: running}}, nil)
		o[1].(*corev1.Pod).Status.PodIP = fmt.Sprintf("10.244.0.%d", 10+i)
		objs = append(objs, o...)
	}
	b, _ := newFakeBackend(t, Config{Egress: testEgress()}, objs...)
	var (
		mu          sync.Mutex
		inFlight    int
		peak        int
		allInFlight = make(chan struct{})
	)
	b.standbyProbe = func(ctx context.Context, s *sandbox, _ string) bool {
		// As heldInStandby: bounded by its own timeout.
		ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		mu.Lock()
		inFlight++
		peak = max(peak, inFlight)
		if inFlight == n {
			close(allInFlight)
		}
		mu.Unlock()
		defer func() {
			mu.Lock()
			inFlight--
			mu.Unlock()
		}()
		// Answered only once every probe is in flight (else: the probe's timeout, not held).
		select {
		case <-allInFlight:
			return s.id == "e1" // e1's agent still holds its main command
		case <-ctx.Done():
			return false
		}
	}
	recs, err := b.Recover(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	if peak != n {
		t.Errorf("at most %d of %d probes were in flight at once: Recover probes one after another", peak, n)
	}
	mu.Unlock()
	if len(recs) != n {
		t.Fatalf("recovered %d, want %d", len(recs), n)
	}
	for i, r := range recs {
		want := fmt.Sprintf("e%d", i)
		if r.Spec.ID != want {
			t.Fatalf("recovered[%d] = %s, want %s", i, r.Spec.ID, want)
		}
		if held := want == "e1"; held != (!r.Alive && r.Exit != nil && r.Exit.Reason == "Vanished") || !held && (!r.Alive || r.Exit != nil) {
			t.Errorf("%s (held %v): alive %v exit %+v", want, held, r.Alive, r.Exit)
		}
	}
}
