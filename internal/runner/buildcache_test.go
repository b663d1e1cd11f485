package runner

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/runtimetest"
)

// TestBuildCacheName: a cache's name is a hash of the organization ID, the same for the
// same ID, another for another, and a valid kept volume name whatever the ID holds.
func TestBuildCacheName(t *testing.T) {
	seen := map[string]string{}
	for _, org := range []string{"org-1", "org-2", "../../etc", "a/b", strings.Repeat("x", MaxOrganizationIDBytes), "ORG-1", "org-1\x00"} {
		n := BuildCacheName(org)
		if !runtime.KeepNamePattern.MatchString(n) || !strings.HasPrefix(n, buildCachePrefix) || strings.Contains(n, org) {
			t.Errorf("%q: cache name %q", org, n)
		}
		if n != BuildCacheName(org) {
			t.Errorf("%q: not deterministic", org)
		}
		if other, ok := seen[n]; ok {
			t.Errorf("%q and %q share cache %s", org, other, n)
		}
		seen[n] = org
	}
}

// TestKeyedLock: a second holder of a key waits until the first lets go or its context
// ends; other keys do not wait.
func TestKeyedLock(t *testing.T) {
	var k keyedLock
	unlock, err := k.lock(context.Background(), "a")
	if err != nil {
		t.Fatal(err)
	}
	if u, err := k.lock(context.Background(), "b"); err != nil {
		t.Fatal(err)
	} else {
		u()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := k.lock(ctx, "a"); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("second holder: %v, want to wait until its deadline", err)
	}
	got := make(chan error, 1)
	go func() {
		u, err := k.lock(context.Background(), "a")
		if err == nil {
			u()
		}
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("second holder did not wait: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	unlock()
	unlock() // idempotent
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if k.isHeld("a") {
		t.Error("a still held")
	}
}

type fakeKept struct {
	vols    []runtime.KeptVolume
	removed []string
}

func (f *fakeKept) KeepUnavailable() string { return "" }
func (f *fakeKept) ListKept() ([]runtime.KeptVolume, error) {
	return slices.Clone(f.vols), nil
}
func (f *fakeKept) RemoveKept(name string) error {
	f.removed = append(f.removed, name)
	return nil
}

// TestEvictBuildCaches: beyond BuildCaches, the least recently used idle build caches
// go (never the one about to be used, one in use or locked, or another kept volume).
func TestEvictBuildCaches(t *testing.T) {
	now := time.Now()
	f := &fakeKept{vols: []runtime.KeptVolume{
		{Name: "bc-old-busy", LastUsed: now.Add(-5 * time.Hour), InUse: true},
		{Name: "other", LastUsed: now.Add(-4 * time.Hour)},
		{Name: "bc-old", LastUsed: now.Add(-3 * time.Hour)},
		{Name: "bc-locked", LastUsed: now.Add(-2 * time.Hour)},
		{Name: "bc-mid", LastUsed: now.Add(-90 * time.Minute)},
		{Name: "bc-new", LastUsed: now.Add(-time.Hour)},
		{Name: "bc-this", LastUsed: now.Add(-30 * time.Minute)},
	}}
	l := &Local{BuildCaches: 3}
	unlock, _ := l.buildLocks.lock(context.Background(), "bc-locked")
	defer unlock()
	if err := l.evictBuildCaches(f, "bc-this"); err != nil {
		t.Fatal(err)
	}
	// 5 others besides bc-this, 2 may stay: 3 go, the busy and locked ones skipped.
	if want := []string{"bc-old", "bc-mid", "bc-new"}; !slices.Equal(f.removed, want) {
		t.Errorf("removed %v, want %v", f.removed, want)
	}
	f.removed = nil
	l.BuildCaches = 0 // the default: nothing to evict here
	if err := l.evictBuildCaches(f, "bc-this"); err != nil || len(f.removed) != 0 {
		t.Errorf("default bound: removed %v (%v)", f.removed, err)
	}
}

// TestCreateClearsKeep: a caller's spec cannot name a kept volume (another sandbox's,
// an organization's layer cache): Create clears Volume.Keep; only the runner's own
// builds set it, through Runner.create's keep.
func TestCreateClearsKeep(t *testing.T) {
	f := runtimetest.NewFake()
	t.Cleanup(f.Close)
	l := engineRunner(t, f, "")
	spec := runtime.Spec{ID: "k1", Container: runtime.Container{Image: "busybox", Command: "sleep"},
		Volumes: []runtime.Volume{{Name: "v", SizeBytes: 1 << 20, Keep: BuildCacheName("victim-org")}},
	}
	sb, err := l.R.Create(context.Background(), CreateRequest{Spec: spec})
	if err != nil {
		t.Fatal(err)
	}
	if k := sb.Spec.Volumes[0].Keep; k != "" {
		t.Errorf("a caller's Keep survived Create: %q", k)
	}
	spec.ID = "k2"
	sb, err = l.R.create(context.Background(), CreateRequest{Spec: spec}, map[string]string{"v": "bc-own"})
	if err != nil || sb.Spec.Volumes[0].Keep != "bc-own" {
		t.Errorf("the runner's own keep: %+v %v", sb.Spec.Volumes, err)
	}
	spec.ID = "k3"
	if _, err := l.R.create(context.Background(), CreateRequest{Spec: spec}, map[string]string{"w": "bc-own"}); !errors.Is(err, runtime.ErrInvalidSpec) {
		t.Errorf("keep of no volume: %v", err)
	}
}
