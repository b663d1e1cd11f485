package runner

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/runtimetest"
)

// lateBackend's Create returns without the image digest; WaitInfo gives it once
// released (the Kubernetes backend's agent answering before the kubelet's report).
type lateBackend struct {
	*runtimetest.Fake
	release chan struct{}
}

func (b *lateBackend) Create(ctx context.Context, spec *runtime.Spec) (runtime.Info, error) {
	info, err := b.Fake.Create(ctx, spec)
	info.ImageDigest = ""
	return info, err
}

func (b *lateBackend) WaitInfo(ctx context.Context, id string) (runtime.Info, error) {
	select {
	case <-b.release:
		return runtime.Info{ID: id, ImageDigest: "sha256:late"}, nil
	case <-ctx.Done():
		return runtime.Info{}, ctx.Err()
	}
}

// TestLateImageDigest: a sandbox RUNNING before its backend knew the image digest gets
// it as soon as the backend does (runtime.LateInfoWaiter).
func TestLateImageDigest(t *testing.T) {
	be := &lateBackend{Fake: runtimetest.NewFake(), release: make(chan struct{})}
	t.Cleanup(be.Close)
	r, err := New(context.Background(), Config{Backend: be, DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	sb, err := r.Create(context.Background(), CreateRequest{Spec: runtime.Spec{Container: runtime.Container{Image: "busybox", Command: "sleep"}}})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "running", func() bool {
		g, err := r.Get(sb.ID)
		return err == nil && g.State == StateRunning
	})
	if g, _ := r.Get(sb.ID); g.ImageDigest != "" {
		t.Fatalf("digest %q before the backend knew it", g.ImageDigest)
	}
	close(be.release)
	eventually(t, "the late digest", func() bool {
		g, err := r.Get(sb.ID)
		return err == nil && g.ImageDigest == "sha256:late"
	})
}

// lateRecoverBackend also recovers its sandboxes without the digest (a runner restarted
// between a Create that took the hello and the kubelet's report).
type lateRecoverBackend struct{ *lateBackend }

func (b *lateRecoverBackend) Recover(ctx context.Context) ([]runtime.Recovered, error) {
	recs, err := b.Fake.Recover(ctx)
	for i := range recs {
		recs[i].Info.ImageDigest = ""
	}
	return recs, err
}

// TestLateImageDigestRecovered: a recovered live sandbox without its image digest gets
// it once the backend knows it.
func TestLateImageDigestRecovered(t *testing.T) {
	be := &lateRecoverBackend{&lateBackend{Fake: runtimetest.NewFake(), release: make(chan struct{})}}
	t.Cleanup(be.Close)
	be.Put(runtime.Recovered{Spec: runtime.Spec{ID: "rec-1", Container: runtime.Container{Image: "busybox", Command: "sleep"}}, Alive: true})
	r, err := New(context.Background(), Config{Backend: be, DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	if g, err := r.Get("rec-1"); err != nil || g.State != StateRunning || g.ImageDigest != "" {
		t.Fatalf("recovered: %+v %v", g, err)
	}
	close(be.release)
	eventually(t, "the late digest", func() bool {
		g, err := r.Get("rec-1")
		return err == nil && g.ImageDigest == "sha256:late"
	})
}

// TestHoldForLateInfo: a fork or export waits for the late digest as long as the
// background wait runs (not a fixed 1.5 s), and no longer than its ctx.
func TestHoldForLateInfo(t *testing.T) {
	r := &Runner{}
	e := newEntry(Sandbox{ID: "s"})
	done := make(chan struct{})
	e.lateInfo = done
	go func() {
		time.Sleep(2 * time.Second)
		r.mu.Lock()
		e.sb.ImageDigest = "sha256:late"
		r.mu.Unlock()
		close(done)
	}()
	sb, err := r.holdForLateInfo(context.Background(), e)
	if err != nil || sb.ImageDigest != "sha256:late" {
		t.Errorf("hold: %q, %v; want the late digest", sb.ImageDigest, err)
	}
	e2 := newEntry(Sandbox{ID: "s2"})
	e2.lateInfo = make(chan struct{})
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := r.holdForLateInfo(ctx, e2); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("hold past its ctx: %v", err)
	}
}
