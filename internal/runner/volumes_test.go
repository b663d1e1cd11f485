package runner

import (
	"context"
	"sync"
	"testing"

	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/runtimetest"
)

// managedFake is a fake backend that holds managed volumes.
type managedFake struct {
	*runtimetest.Fake
	mu      sync.Mutex
	made    map[string]int64
	removed []string
}

func (f *managedFake) ManagedUnavailable() string { return "" }
func (f *managedFake) EnsureManaged(name string, size int64) (int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if size == 0 {
		size = 10 << 30
	}
	f.made[name] = size
	return size, nil
}
func (f *managedFake) RemoveManaged(name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.removed = append(f.removed, name)
	return nil
}

// TestRegisteredVolumesOnTheRunner: EnsureVolume checks the names and namespace and makes
// the backend's volume under a name derived from (organization, claim); DeleteVolume is
// refused while a live sandbox mounts it, unless forced; a backend without managed volumes
// says so.
func TestRegisteredVolumesOnTheRunner(t *testing.T) {
	f := &managedFake{Fake: runtimetest.NewFake(), made: map[string]int64{}}
	t.Cleanup(f.Close)
	l := engineRunner(t, f, "")
	ctx := context.Background()
	v := RegisteredVolume{Org: "acme", ClaimName: "data", Namespace: VolumeNamespace}
	if n, err := l.EnsureVolume(ctx, v); err != nil || n.CapacityBytes != 10<<30 || n.AccessModes != nil || f.made[v.ManagedName()] == 0 {
		t.Fatalf("ensure = %+v, %v (%v)", n, err, f.made)
	}
	if (RegisteredVolume{Org: "other", ClaimName: "data"}).ManagedName() == v.ManagedName() {
		t.Fatal("two organizations' claims share a backend name")
	}
	for _, bad := range []RegisteredVolume{
		{Org: "acme", ClaimName: "../x", Namespace: VolumeNamespace},
		{Org: "acme", ClaimName: "Data", Namespace: VolumeNamespace},
		{Org: "", ClaimName: "data", Namespace: VolumeNamespace},
	} {
		if _, err := l.EnsureVolume(ctx, bad); apierr.Reason(err) != apierr.InvalidRequest {
			t.Errorf("%+v: %v", bad, err)
		}
	}
	if _, err := l.EnsureVolume(ctx, RegisteredVolume{Org: "acme", ClaimName: "data", Namespace: "kube-system"}); apierr.Reason(err) != apierr.VolumeRunnerIneligible {
		t.Errorf("namespace: %v", err)
	}
	spec := runtime.Spec{Container: runtime.Container{Image: "busybox", Command: "sleep", VolumeMounts: []runtime.VolumeMount{{Volume: "v", Path: "/data"}}},
		Volumes: []runtime.Volume{{Name: "v", Managed: v.ManagedName()}}}
	if _, err := l.Create(ctx, CreateRequest{Spec: spec}); err != nil {
		t.Fatal(err)
	}
	if err := l.DeleteVolume(ctx, v, false); apierr.Reason(err) != apierr.VolumeInUse {
		t.Fatalf("delete in use = %v", err)
	}
	if err := l.DeleteVolume(ctx, v, true); err != nil || len(f.removed) != 1 {
		t.Fatalf("forced delete = %v (%v)", err, f.removed)
	}
	pf := runtimetest.NewFake()
	t.Cleanup(pf.Close)
	plain := engineRunner(t, pf, "")
	if _, err := plain.EnsureVolume(ctx, v); apierr.Reason(err) != apierr.VolumeTypeNotSupported {
		t.Fatalf("backend without volumes = %v", err)
	}
}
