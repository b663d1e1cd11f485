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
