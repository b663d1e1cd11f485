package runner

import (
	"context"
	"testing"

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
