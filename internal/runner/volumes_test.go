package runner

import (
	"context"
	"strings"
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

// sizedFake is managedFake that tells a volume's size now (runtime.ManagedSizer).
type sizedFake struct{ *managedFake }

func (f sizedFake) ManagedSize(name string) (int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.made[name], nil
}

// TestRegisteredVolumeSizeBound: the runner refuses a size above its own bound
// (MaxRegisteredVolumeBytes) and above its policy's (MaxSizeBytes), whatever its caller
// checked, before the backend makes or grows anything; a volume it already holds larger
// than the policy now allows keeps its size (asked again at that size), but does not grow.
func TestRegisteredVolumeSizeBound(t *testing.T) {
	mf := &managedFake{Fake: runtimetest.NewFake(), made: map[string]int64{}}
	t.Cleanup(mf.Close)
	f := sizedFake{mf}
	l := engineRunner(t, f, "")
	ctx := context.Background()
	huge := RegisteredVolume{Org: "acme", ClaimName: "huge", Namespace: VolumeNamespace, SizeBytes: MaxRegisteredVolumeBytes + 1<<20}
	_, err := l.EnsureVolume(ctx, huge)
	if apierr.Reason(err) != apierr.InvalidRequest || len(apierr.Violations(err)) != 1 || apierr.Violations(err)[0].Field != "volume.spec.size" {
		t.Fatalf("above the runner's bound = %v (%v)", err, apierr.Violations(err))
	}
	if _, ok := mf.made[huge.ManagedName()]; ok {
		t.Fatal("the backend made a volume above the bound")
	}

	// The policy's bound: 1 GiB.
	v := RegisteredVolume{Org: "acme", ClaimName: "data", Namespace: VolumeNamespace, SizeBytes: 2 << 30, MaxSizeBytes: 1 << 30}
	_, err = l.EnsureVolume(ctx, v)
	if apierr.Reason(err) != apierr.PlacementRejected || !strings.Contains(err.Error(), "constraints.volumes.max_size") ||
		len(apierr.Violations(err)) != 1 || apierr.Violations(err)[0].Field != "volume.spec.size" {
		t.Fatalf("above the policy's bound = %v", err)
	}
	if _, ok := mf.made[v.ManagedName()]; ok {
		t.Fatal("the backend made a volume above the policy's bound")
	}
	v.SizeBytes = 1 << 30
	if st, err := l.EnsureVolume(ctx, v); err != nil || st.CapacityBytes != 1<<30 {
		t.Fatalf("at the bound = %+v, %v", st, err)
	}
	// Made at 2 GiB before the policy was lowered to 1 GiB: asked again at 2 GiB it is
	// fine, at 3 GiB it would grow past the bound.
	old := RegisteredVolume{Org: "acme", ClaimName: "old", Namespace: VolumeNamespace, SizeBytes: 2 << 30}
	if _, err := l.EnsureVolume(ctx, old); err != nil {
		t.Fatal(err)
	}
	old.MaxSizeBytes = 1 << 30
	if st, err := l.EnsureVolume(ctx, old); err != nil || st.CapacityBytes != 2<<30 {
		t.Fatalf("held larger = %+v, %v", st, err)
	}
	old.SizeBytes = 3 << 30
	if _, err := l.EnsureVolume(ctx, old); apierr.Reason(err) != apierr.PlacementRejected || mf.made[old.ManagedName()] != 2<<30 {
		t.Fatalf("grow past the policy's bound = %v (size %d)", err, mf.made[old.ManagedName()])
	}
}
