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
	b := probedSandboxes(t, n)
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
			return s.id == sandboxName(1) // its agent still holds its main command
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
		want := sandboxName(i)
		if r.Spec.ID != want {
			t.Fatalf("recovered[%d] = %s, want %s", i, r.Spec.ID, want)
		}
		if held := want == sandboxName(1); held != (!r.Alive && r.Exit != nil && r.Exit.Reason == "Vanished") || !held && (!r.Alive || r.Exit != nil) {
			t.Errorf("%s (held %v): alive %v exit %+v", want, held, r.Alive, r.Exit)
		}
	}
}

// sandboxName is the ID of probedSandboxes' sandbox i (e00, e01, ...: listed in order).
func sandboxName(i int) string { return fmt.Sprintf("e%02d", i) }

// probedSandboxes is a fake backend with n running sandboxes e00, e01, ... that have
// host-name egress rules (whose agents Recover probes).
func probedSandboxes(t *testing.T, n int) *Backend {
	t.Helper()
	running := corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}}
	lb, _ := newFakeBackend(t, Config{Egress: testEgress()})
	var objs []k8sruntime.Object
	for i := range n {
		spec := hostNameSpec(sandboxName(i), runtime.EgressRule{DNSName: "api.example.com"})
		o := recoverWriter(t, lb, spec, []corev1.ContainerStatus{{Name: containerGate, State: running}, {Name: containerMain, State: running}}, nil)
		o[1].(*corev1.Pod).Status.PodIP = fmt.Sprintf("10.%d.%d.%d", 244+i/250/250, i/250%250, 10+i%250)
		objs = append(objs, o...)
	}
	b, _ := newFakeBackend(t, Config{Egress: testEgress()}, objs...)
	return b
}

// TestRecoverProbesBounded: with more sandboxes to probe than recoverProbes, at most
// recoverProbes probes are in flight at once, and that many are: each probe is
// answered only once a full batch (recoverProbes, or every probe left) has been in
// flight for a while, so that without the bound every probe would be in flight.
func TestRecoverProbesBounded(t *testing.T) {
	const n = 2*recoverProbes + 3
	b := probedSandboxes(t, n)
	const settle = 30 * time.Millisecond
	var (
		mu       sync.Mutex
		inFlight int
		done     int
		peak     int
	)
	b.standbyProbe = func(ctx context.Context, s *sandbox, _ string) bool {
		ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		mu.Lock()
		inFlight++
		peak = max(peak, inFlight)
		mu.Unlock()
		defer func() {
			mu.Lock()
			inFlight--
			done++
			mu.Unlock()
		}()
		var fullSince time.Time
		for {
			mu.Lock()
			full := inFlight >= min(recoverProbes, n-done)
			mu.Unlock()
			switch {
			case !full:
				fullSince = time.Time{}
			case fullSince.IsZero():
				fullSince = time.Now()
			case time.Since(fullSince) >= settle:
				return false
			}
			select {
			case <-ctx.Done():
				return false
			case <-time.After(time.Millisecond):
			}
		}
	}
	recs, err := b.Recover(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	if peak != recoverProbes {
		t.Errorf("%d of %d probes were in flight at once, want recoverProbes = %d", peak, n, recoverProbes)
	}
	if done != n {
		t.Errorf("%d probes, want %d", done, n)
	}
	mu.Unlock()
	if len(recs) != n {
		t.Fatalf("recovered %d, want %d", len(recs), n)
	}
	for i, r := range recs {
		if want := sandboxName(i); r.Spec.ID != want || !r.Alive || r.Exit != nil {
			t.Errorf("recovered[%d] = %s alive %v exit %+v, want %s alive", i, r.Spec.ID, r.Alive, r.Exit, want)
		}
	}
}
