package gateway

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/blob"
	"github.com/sandboxd/sandboxd/internal/blob/dir"
	"github.com/sandboxd/sandboxd/internal/placement"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/runtimetest"
)

// TestGlobalVolumePlacement: in a fleet of a runner with a blob store and one without
// (which says so in its capacity: Support.NoGlobalVolumes), a sandbox mounting a GLOBAL
// volume is placed on the one that can mount it, every time; pinned to the other it is
// refused at placement (CWSANDBOX_NO_SUITABLE_RUNNER, a violation on the volume's field
// naming placement.ConstraintGlobalVolumes) rather than failing on that runner. A sandbox
// mounting no GLOBAL volume still goes to either.
func TestGlobalVolumePlacement(t *testing.T) {
	blobs, err := dir.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	realRunner := func(id string, st blob.Store) runner.Handle {
		be := runtimetest.NewFake()
		t.Cleanup(be.Close)
		rr, err := runner.New(context.Background(), runner.Config{Backend: be, DataDir: t.TempDir(), Blobs: st, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(rr.Close)
		return runner.NewLocal(id, rr)
	}
	s := newGlobalGateway(t, blobs, realRunner("with-blobs", blobs), realRunner("no-blobs", nil))
	user := tmplUser(testOrg)
	if _, err := s.CreateVolume(tmplAdmin(testOrg), connect.NewRequest(&sandboxv1.CreateVolumeRequest{Volume: pvcVolume("g", "*", "shared")})); err != nil {
		t.Fatal(err)
	}
	if v := waitVolume(t, s, user, "g"); v.GetStatus().GetState() != sandboxv1.VolumeState_VOLUME_STATE_READY {
		t.Fatalf("volume = %v", v)
	}
	spec := func(global bool, runnerIDs ...string) *sandboxv1.SandboxSpec {
		sp := &sandboxv1.SandboxSpec{RunnerIds: runnerIDs, Containers: []*sandboxv1.Container{{Name: "main", Image: "busybox"}}}
		if global {
			sp.Volumes = []*sandboxv1.SandboxVolume{{Name: "v", Source: &sandboxv1.SandboxVolume_VolumeId{VolumeId: "g"}}}
			sp.Containers[0].VolumeMounts = []*sandboxv1.VolumeMount{{Volume: "v", MountPath: "/data", ReadOnly: true}}
		}
		return sp
	}
	create := func(sp *sandboxv1.SandboxSpec) (*sandboxv1.Sandbox, error) {
		res, err := s.CreateSandbox(user, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: sp}}))
		if err != nil {
			return nil, err
		}
		return res.Msg, nil
	}

	// Ties between the runners are random: ten readers, each on the runner with the blob store.
	for i := range 10 {
		sb, err := create(spec(true))
		if err != nil {
			t.Fatalf("reader %d: %v", i, err)
		}
		if got := sb.GetStatus().GetRunnerId(); got != "with-blobs" {
			t.Fatalf("reader %d placed on %q, want with-blobs (the runner without a blob store cannot mount GLOBAL volumes)", i, got)
		}
	}

	_, err = create(spec(true, "no-blobs"))
	if connect.CodeOf(err) != connect.CodeFailedPrecondition || apierr.Reason(err) != apierr.NoSuitableRunner ||
		!strings.Contains(err.Error(), placement.ConstraintGlobalVolumes) {
		t.Fatalf("pinned to the runner without a blob store: %v, want FAILED_PRECONDITION %s naming %s", err, apierr.NoSuitableRunner, placement.ConstraintGlobalVolumes)
	}
	want := "runner[no-blobs].sandbox.spec.volumes[0].volume_id"
	if vs := apierr.Violations(err); len(vs) != 1 || vs[0].Field != want || !strings.Contains(vs[0].Description, placement.ConstraintGlobalVolumes) {
		t.Errorf("violations %v, want one on %s naming %s", vs, want, placement.ConstraintGlobalVolumes)
	}

	// Without a GLOBAL volume the runner without a blob store takes it.
	sb, err := create(spec(false, "no-blobs"))
	if err != nil || sb.GetStatus().GetRunnerId() != "no-blobs" {
		t.Fatalf("plain sandbox pinned to no-blobs: %v on %q", err, sb.GetStatus().GetRunnerId())
	}
}

// roGlobalBackend mounts GLOBAL volumes read-only only (as Kubernetes runners of earlier
// releases did).
type roGlobalBackend struct{ *runtimetest.Fake }

func (roGlobalBackend) Support() runtime.Support { return runtime.Support{NoGlobalVolumeWriters: true} }

// writerBackend takes GLOBAL writers (a VolumeCapturer, as the local backend); this
// test only places them, and a capture at their end fails (the commit is logged, not made).
type writerBackend struct{ *runtimetest.Fake }

func (writerBackend) CaptureVolume(context.Context, string, string) (runtime.VolumeCapture, error) {
	return nil, errors.New("not captured in this test")
}

// TestGlobalVolumeWriterPlacement: beside a runner that commits GLOBAL writers, one that
// mounts them read-only only (Support.NoGlobalVolumeWriters, an older Kubernetes runner) takes
// readers (pinned there, it is placed there), while a read-write mount pinned to it is
// refused at placement naming placement.ConstraintGlobalVolumeWriters, and unpinned goes
// to the other runner every time.
func TestGlobalVolumeWriterPlacement(t *testing.T) {
	blobs, err := dir.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	realRunner := func(id string, ro bool) runner.Handle {
		f := runtimetest.NewFake()
		t.Cleanup(f.Close)
		var be runtime.Backend = writerBackend{f}
		if ro {
			be = roGlobalBackend{f}
		}
		rr, err := runner.New(context.Background(), runner.Config{Backend: be, DataDir: t.TempDir(), Blobs: blobs, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(rr.Close)
		return runner.NewLocal(id, rr)
	}
	s := newGlobalGateway(t, blobs, realRunner("local", false), realRunner("kube", true))
	user := tmplUser(testOrg)
	if _, err := s.CreateVolume(tmplAdmin(testOrg), connect.NewRequest(&sandboxv1.CreateVolumeRequest{Volume: pvcVolume("g", "*", "shared")})); err != nil {
		t.Fatal(err)
	}
	if v := waitVolume(t, s, user, "g"); v.GetStatus().GetState() != sandboxv1.VolumeState_VOLUME_STATE_READY {
		t.Fatalf("volume = %v", v)
	}
	create := func(readOnly bool, runnerIDs ...string) (*sandboxv1.Sandbox, error) {
		sp := &sandboxv1.SandboxSpec{RunnerIds: runnerIDs, Containers: []*sandboxv1.Container{{Name: "main", Image: "busybox",
			VolumeMounts: []*sandboxv1.VolumeMount{{Volume: "v", MountPath: "/data", ReadOnly: readOnly}}}},
			Volumes: []*sandboxv1.SandboxVolume{{Name: "v", Source: &sandboxv1.SandboxVolume_VolumeId{VolumeId: "g"}}}}
		res, err := s.CreateSandbox(user, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: sp}}))
		if err != nil {
			return nil, err
		}
		return res.Msg, nil
	}
	if sb, err := create(true, "kube"); err != nil || sb.GetStatus().GetRunnerId() != "kube" {
		t.Fatalf("reader pinned to the read-only runner: %v on %q", err, sb.GetStatus().GetRunnerId())
	}
	_, err = create(false, "kube")
	if connect.CodeOf(err) != connect.CodeFailedPrecondition || apierr.Reason(err) != apierr.NoSuitableRunner ||
		!strings.Contains(err.Error(), placement.ConstraintGlobalVolumeWriters) {
		t.Fatalf("writer pinned to the read-only runner: %v, want FAILED_PRECONDITION %s naming %s", err, apierr.NoSuitableRunner, placement.ConstraintGlobalVolumeWriters)
	}
	want := "runner[kube].sandbox.spec.volumes[0].volume_id"
	if vs := apierr.Violations(err); len(vs) != 1 || vs[0].Field != want {
		t.Errorf("violations %v, want one on %s", vs, want)
	}
	for i := range 5 { // ties are random; each writer must go to the runner that commits
		sb, err := create(false)
		if err != nil {
			t.Fatalf("writer %d: %v", i, err)
		}
		if got := sb.GetStatus().GetRunnerId(); got != "local" {
			t.Fatalf("writer %d placed on %q, want local", i, got)
		}
		if _, err := s.DeleteSandbox(user, connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: sb.GetSandboxId()})); err != nil {
			t.Fatal(err)
		}
	}
}

// subPathGlobalBackend mounts GLOBAL volumes read-only and at their root only (as the
// Kubernetes backend does); placement does not see the latter (it is not on the wire).
type subPathGlobalBackend struct{ *runtimetest.Fake }

func (subPathGlobalBackend) Support() runtime.Support {
	return runtime.Support{NoGlobalVolumeWriters: true, NoGlobalVolumeSubPaths: true}
}

// TestGlobalVolumeSubPathRetry: a reader mounting a GLOBAL volume with a sub_path, placed
// on a runner that mounts a GLOBAL volume's root only (which refuses it at create,
// CWSANDBOX_VOLUME_TYPE_NOT_SUPPORTED), goes to the next runner: every one of ten lands
// on the runner that can mount it; pinned to the other, the runner's refusal comes back
// naming sub_path. A reader at the volume's root still goes to either.
func TestGlobalVolumeSubPathRetry(t *testing.T) {
	blobs, err := dir.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	realRunner := func(id string, kube bool) runner.Handle {
		f := runtimetest.NewFake()
		t.Cleanup(f.Close)
		var be runtime.Backend = f
		if kube {
			be = subPathGlobalBackend{f}
		}
		rr, err := runner.New(context.Background(), runner.Config{Backend: be, DataDir: t.TempDir(), Blobs: blobs, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(rr.Close)
		return runner.NewLocal(id, rr)
	}
	s := newGlobalGateway(t, blobs, realRunner("local", false), realRunner("kube", true))
	user := tmplUser(testOrg)
	if _, err := s.CreateVolume(tmplAdmin(testOrg), connect.NewRequest(&sandboxv1.CreateVolumeRequest{Volume: pvcVolume("g", "*", "shared")})); err != nil {
		t.Fatal(err)
	}
	if v := waitVolume(t, s, user, "g"); v.GetStatus().GetState() != sandboxv1.VolumeState_VOLUME_STATE_READY {
		t.Fatalf("volume = %v", v)
	}
	create := func(subPath string, runnerIDs ...string) (*sandboxv1.Sandbox, error) {
		sp := &sandboxv1.SandboxSpec{RunnerIds: runnerIDs, Containers: []*sandboxv1.Container{{Name: "main", Image: "busybox",
			VolumeMounts: []*sandboxv1.VolumeMount{{Volume: "v", MountPath: "/data", ReadOnly: true, SubPath: subPath}}}},
			Volumes: []*sandboxv1.SandboxVolume{{Name: "v", Source: &sandboxv1.SandboxVolume_VolumeId{VolumeId: "g"}}}}
		res, err := s.CreateSandbox(user, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: sp}}))
		if err != nil {
			return nil, err
		}
		return res.Msg, nil
	}
	for i := range 10 { // ties are random; each must end on the runner that takes it
		sb, err := create("sub")
		if err != nil {
			t.Fatalf("sub_path reader %d: %v", i, err)
		}
		if got := sb.GetStatus().GetRunnerId(); got != "local" {
			t.Fatalf("sub_path reader %d placed on %q, want local", i, got)
		}
		if _, err := s.DeleteSandbox(user, connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: sb.GetSandboxId()})); err != nil {
			t.Fatal(err)
		}
	}
	_, err = create("sub", "kube")
	if apierr.Reason(err) != apierr.VolumeTypeNotSupported || !strings.Contains(err.Error(), "sub_path") {
		t.Fatalf("sub_path reader pinned to kube: %v, want %s naming sub_path", err, apierr.VolumeTypeNotSupported)
	}
	if sb, err := create("", "kube"); err != nil || sb.GetStatus().GetRunnerId() != "kube" {
		t.Fatalf("reader at the root pinned to kube: %v on %q", err, sb.GetStatus().GetRunnerId())
	}
}
