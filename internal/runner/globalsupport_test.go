package runner

import (
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/runtimetest"
)

// noGlobalFake is a backend that says it cannot hold GLOBAL volumes (as the Kubernetes
// backend does).
type noGlobalFake struct{ *runtimetest.Fake }

func (noGlobalFake) Support() runtime.Support { return runtime.Support{NoGlobalVolumes: true} }

// globalSpec mounts GLOBAL volume "data" (read-only: a reader's copy, nothing committed).
func globalSpec() runtime.Spec {
	return runtime.Spec{
		Container: runtime.Container{Name: "main", Image: "busybox", VolumeMounts: []runtime.VolumeMount{{Volume: "data", Path: "/data", ReadOnly: true}}},
		Volumes: []runtime.Volume{{Name: "data", SizeBytes: DefaultGlobalVolumeBytes,
			Global: &runtime.GlobalVolume{BlobPrefix: GlobalVolumePrefix("org-a", "shared"), MaxSizeBytes: DefaultGlobalVolumeBytes}}},
	}
}

// TestSupportGlobalVolumes: a runner says it mounts GLOBAL volumes only with a blob store
// and a backend that does not say it cannot (Support.NoGlobalVolumes, which its capacity
// carries to placement); one that cannot refuses a GLOBAL mount at create, read-only
// included, with CWSANDBOX_VOLUME_TYPE_NOT_SUPPORTED naming the volume (the backstop
// for a placement made on a stale view).
func TestSupportGlobalVolumes(t *testing.T) {
	newRunner := func(be runtime.Backend, blobs bool) *Runner {
		t.Helper()
		c := Config{Backend: be, DataDir: t.TempDir(), Logger: slog.New(slog.DiscardHandler)}
		if blobs {
			c.Blobs = openStore(t)
		}
		r, err := New(context.Background(), c)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(r.Close)
		return r
	}
	fake := func() *runtimetest.Fake { f := runtimetest.NewFake(); t.Cleanup(f.Close); return f }

	for _, c := range []struct {
		name  string
		be    runtime.Backend
		blobs bool
		lacks bool
		why   string
	}{
		{"blob store", fake(), true, false, ""},
		{"no blob store", fake(), false, true, "no blob store"},
		{"a backend that cannot", noGlobalFake{fake()}, true, true, "backend cannot hold GLOBAL volumes"},
	} {
		r := newRunner(c.be, c.blobs)
		if got := r.Support().NoGlobalVolumes; got != c.lacks {
			t.Errorf("%s: NoGlobalVolumes = %v, want %v", c.name, got, c.lacks)
		}
		if capa, err := NewLocal("r1", r).Capacity(context.Background()); err != nil || capa.NoGlobalVolumes != c.lacks {
			t.Errorf("%s: capacity's NoGlobalVolumes = %v (%v), want %v", c.name, capa.NoGlobalVolumes, err, c.lacks)
		}
		if !c.lacks {
			continue
		}
		_, err := r.Create(context.Background(), CreateRequest{Spec: globalSpec()})
		if apierr.Reason(err) != apierr.VolumeTypeNotSupported || !strings.Contains(err.Error(), `volume "data"`) || !strings.Contains(err.Error(), c.why) {
			t.Errorf("%s: read-only GLOBAL mount: %v, want %s naming the volume and %q", c.name, err, apierr.VolumeTypeNotSupported, c.why)
		}
		if len(r.List()) != 0 {
			t.Errorf("%s: a refused sandbox was made", c.name)
		}
	}
}

// roGlobalFake mounts GLOBAL volumes read-only only (as the Kubernetes backend did before
// it committed writers).
type roGlobalFake struct{ *runtimetest.Fake }

func (roGlobalFake) Support() runtime.Support { return runtime.Support{NoGlobalVolumeWriters: true} }

// TestSupportGlobalVolumeWriters: a runner whose backend mounts GLOBAL volumes read-only
// only says so in its capacity (placement sends writers elsewhere), takes a reader's
// copy, and refuses a writer's at create with CWSANDBOX_VOLUME_TYPE_NOT_SUPPORTED naming
// the volume and why.
func TestSupportGlobalVolumeWriters(t *testing.T) {
	f := runtimetest.NewFake()
	t.Cleanup(f.Close)
	r, err := New(context.Background(), Config{Backend: roGlobalFake{f}, DataDir: t.TempDir(), Logger: slog.New(slog.DiscardHandler), Blobs: openStore(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	if s := r.Support(); s.NoGlobalVolumes || !s.NoGlobalVolumeWriters {
		t.Errorf("support %+v, want GLOBAL volumes read-only only", s)
	}
	if capa, err := NewLocal("r1", r).Capacity(context.Background()); err != nil || capa.NoGlobalVolumes || !capa.NoGlobalVolumeWriters {
		t.Errorf("capacity %+v (%v), want GLOBAL volumes read-only only", capa.Support, err)
	}
	reader := globalSpec()
	if err := r.checkGlobals(&reader); err != nil {
		t.Errorf("a reader's copy: %v", err)
	}
	writer := globalSpec()
	writer.Container.VolumeMounts[0].ReadOnly = false
	writer.Volumes[0].Global.CommitGeneration = 1
	_, err = r.Create(context.Background(), CreateRequest{Spec: writer})
	if apierr.Reason(err) != apierr.VolumeTypeNotSupported || !strings.Contains(err.Error(), `volume "data"`) || !strings.Contains(err.Error(), "read-only only") {
		t.Errorf("a writer's copy: %v, want %s naming the volume and read-only only", err, apierr.VolumeTypeNotSupported)
	}
	if len(r.List()) != 0 {
		t.Error("a refused sandbox was made")
	}
}

// subPathGlobalFake mounts GLOBAL volumes read-only and at their root only (as
// Kubernetes runners of earlier releases did).
type subPathGlobalFake struct{ *runtimetest.Fake }

func (subPathGlobalFake) Support() runtime.Support {
	return runtime.Support{NoGlobalVolumeWriters: true, NoGlobalVolumeSubPaths: true}
}

// TestSupportGlobalVolumeSubPaths: a runner whose backend mounts a GLOBAL volume's root
// only takes a reader's copy mounted at its root and refuses one mounted with a sub_path
// (the mount's, or the registered volume's joined into it) at create with
// CWSANDBOX_VOLUME_TYPE_NOT_SUPPORTED naming the volume and the field, for the primary
// and a sidecar alike; a backend that can keeps taking it.
func TestSupportGlobalVolumeSubPaths(t *testing.T) {
	newRunner := func(be runtime.Backend) *Runner {
		t.Helper()
		r, err := New(context.Background(), Config{Backend: be, DataDir: t.TempDir(), Logger: slog.New(slog.DiscardHandler), Blobs: openStore(t)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(r.Close)
		return r
	}
	f := runtimetest.NewFake()
	t.Cleanup(f.Close)
	r := newRunner(subPathGlobalFake{f})
	root := globalSpec()
	if err := r.checkGlobals(&root); err != nil {
		t.Errorf("a reader's copy at its root: %v", err)
	}
	primary := globalSpec()
	primary.Container.VolumeMounts[0].SubPath = "sub/dir"
	sidecar := globalSpec()
	sidecar.Sidecars = []runtime.Container{{Name: "side", Image: "busybox", VolumeMounts: []runtime.VolumeMount{{Volume: "data", Path: "/d", ReadOnly: true, SubPath: "x"}}}}
	for name, spec := range map[string]runtime.Spec{"primary": primary, "sidecar": sidecar} {
		_, err := r.Create(context.Background(), CreateRequest{Spec: spec})
		if apierr.Reason(err) != apierr.VolumeTypeNotSupported || !strings.Contains(err.Error(), `volume "data"`) || !strings.Contains(err.Error(), "sub_path") {
			t.Errorf("%s: a GLOBAL mount with a sub_path: %v, want %s naming the volume and sub_path", name, err, apierr.VolumeTypeNotSupported)
		}
		if other := newRunner(roGlobalFake{f}); other.checkGlobals(&spec) != nil {
			t.Errorf("%s: a backend that fills sub_path mounts refuses it: %v", name, other.checkGlobals(&spec))
		}
	}
	if len(r.List()) != 0 {
		t.Error("a refused sandbox was made")
	}
}
