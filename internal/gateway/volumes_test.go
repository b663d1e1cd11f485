package gateway

import (
	"context"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/store"
)

// volumeRunner is an acceptingRunner that holds registered volumes: claims named
// "broken" fail validation.
type volumeRunner struct {
	acceptingRunner
	vmu     sync.Mutex
	ensured []runner.RegisteredVolume
	deleted []string
	// modes: the access modes EnsureVolume reports per claim name (a Kubernetes
	// runner's); none: a local runner's.
	modes map[string][]string
	// during, when set, runs at the start of each EnsureVolume (outside the lock): what
	// happens elsewhere while the runner works; an error is the call's.
	during func(v runner.RegisteredVolume) error
}

func (r *volumeRunner) EnsureVolume(_ context.Context, v runner.RegisteredVolume) (runner.VolumeState, error) {
	if r.during != nil {
		if err := r.during(v); err != nil {
			return runner.VolumeState{}, err
		}
	}
	r.vmu.Lock()
	defer r.vmu.Unlock()
	r.ensured = append(r.ensured, v)
	if v.ClaimName == "broken" {
		return runner.VolumeState{}, apierr.Newf(apierr.VolumeTypeNotSupported, "broken on purpose")
	}
	if v.ClaimName == "nogrow" && v.SizeBytes > 256<<20 {
		return runner.VolumeState{}, apierr.New(apierr.VolumeInUse, "cannot grow on purpose", nil)
	}
	out := runner.VolumeState{CapacityBytes: 10 << 30, AccessModes: r.modes[v.ClaimName]}
	if v.SizeBytes > 0 {
		out.CapacityBytes = v.SizeBytes
	}
	return out, nil
}

func (r *volumeRunner) DeleteVolume(_ context.Context, v runner.RegisteredVolume, force bool) error {
	r.vmu.Lock()
	defer r.vmu.Unlock()
	r.deleted = append(r.deleted, v.ClaimName)
	return nil
}

func newVolumeGateway(t *testing.T, runners ...runner.Handle) *Server {
	t.Helper()
	st, err := store.Open(t.Context(), filepath.Join(t.TempDir(), "sandboxd.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	keys, err := auth.OpenKeyring(filepath.Join(t.TempDir(), "keys.json"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Orgs().Create(t.Context(), store.Org{ID: testOrg, Name: testOrg}); err != nil {
		t.Fatal(err)
	}
	s, err := New(Config{Auth: keys, Runners: runners, Index: st.Sandboxes(), Orgs: st.Orgs(), Volumes: st.Volumes(), Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

func pvcVolume(id, runnerID, claim string) *sandboxv1.Volume {
	return &sandboxv1.Volume{VolumeId: id, Spec: &sandboxv1.VolumeSpec{Source: &sandboxv1.VolumeSpec_Pvc{Pvc: &sandboxv1.PvcVolumeSource{
		RunnerId: runnerID, Namespace: "default", ClaimName: claim}}}}
}

func waitVolume(t *testing.T, s *Server, ctx context.Context, id string) *sandboxv1.Volume {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		v, err := s.GetVolume(ctx, connect.NewRequest(&sandboxv1.GetVolumeRequest{VolumeId: id}))
		if err != nil {
			t.Fatal(err)
		}
		if v.Msg.GetStatus().GetState() != sandboxv1.VolumeState_VOLUME_STATE_VALIDATING || time.Now().After(deadline) {
			return v.Msg
		}
	}
}

func TestVolumeService(t *testing.T) {
	r1 := &volumeRunner{acceptingRunner: acceptingRunner{id: "r1"}}
	r2 := &acceptingRunner{id: "r2"} // holds no volumes
	s := newVolumeGateway(t, r1, r2)
	admin, user, other := tmplAdmin(testOrg), tmplUser(testOrg), tmplAdmin("globex")
	create := func(ctx context.Context, v *sandboxv1.Volume, rid string) (*sandboxv1.Volume, error) {
		res, err := s.CreateVolume(ctx, connect.NewRequest(&sandboxv1.CreateVolumeRequest{Volume: v, RequestId: rid}))
		if err != nil {
			return nil, err
		}
		return res.Msg, nil
	}
	// Writes need an admin key; bad input names its field.
	if _, err := create(user, pvcVolume("data", "r1", "c1"), ""); connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Fatalf("user create = %v", err)
	}
	for _, tc := range []struct {
		v     *sandboxv1.Volume
		field string
	}{
		{nil, "volume"},
		{pvcVolume("Bad ID", "r1", "c1"), "volume.volume_id"},
		{pvcVolume("data", "", "c1"), "volume.spec.pvc.runner_id"},
		{pvcVolume("data", "r1", "../etc"), "volume.spec.pvc.claim_name"},
		{&sandboxv1.Volume{VolumeId: "data", Spec: &sandboxv1.VolumeSpec{}}, "volume.spec.pvc"},
		{&sandboxv1.Volume{VolumeId: "data", Spec: &sandboxv1.VolumeSpec{Source: &sandboxv1.VolumeSpec_Pvc{Pvc: &sandboxv1.PvcVolumeSource{
			RunnerId: "r1", Namespace: "default", ClaimName: "c1", SubPath: "../up"}}}}, "volume.spec.pvc.sub_path"},
	} {
		_, err := create(admin, tc.v, "")
		if apierr.Reason(err) != apierr.InvalidRequest || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%v: %v, want a violation of %s", tc.v, err, tc.field)
		}
	}
	if _, err := create(admin, pvcVolume("data", "nope", "c1"), ""); apierr.Reason(err) != apierr.VolumeRunnerIneligible {
		t.Fatalf("unknown runner = %v", err)
	}
	ns := pvcVolume("data", "r1", "c1")
	ns.Spec.GetPvc().Namespace = "kube-system"
	if _, err := create(admin, ns, ""); apierr.Reason(err) != apierr.VolumeRunnerIneligible {
		t.Fatalf("other namespace = %v", err)
	}
	// Create: VALIDATING, then READY with the runner's capacity; request_id replays.
	v, err := create(admin, pvcVolume("data", "r1", "c1"), "req-1")
	if err != nil || v.GetStatus().GetState() != sandboxv1.VolumeState_VOLUME_STATE_VALIDATING {
		t.Fatalf("create = %v, %v", v, err)
	}
	if again, err := create(admin, pvcVolume("data", "r1", "c1"), "req-1"); err != nil || again.GetVolumeId() != "data" {
		t.Fatalf("replay = %v, %v", again, err)
	}
	if _, err := create(admin, pvcVolume("data2", "r1", "c9"), "req-1"); apierr.Reason(err) != apierr.RequestIDConflict {
		t.Fatalf("request_id reuse = %v", err)
	}
	if _, err := create(admin, pvcVolume("data", "r1", "c2"), ""); connect.CodeOf(err) != connect.CodeAlreadyExists {
		t.Fatalf("taken id = %v", err)
	}
	if _, err := create(admin, pvcVolume("data3", "r1", "c1"), ""); connect.CodeOf(err) != connect.CodeAlreadyExists {
		t.Fatalf("taken claim = %v", err)
	}
	got := waitVolume(t, s, user, "data")
	if st := got.GetStatus(); st.GetState() != sandboxv1.VolumeState_VOLUME_STATE_READY || st.GetCapacity() != "10Gi" ||
		st.GetLocality() != sandboxv1.VolumeLocality_VOLUME_LOCALITY_CLUSTER_LOCAL || st.GetLastValidatedTime() == nil {
		t.Fatalf("ready = %v", got)
	}
	// ERROR with the runner's reason; a runner without volumes too.
	if _, err := create(admin, pvcVolume("bad", "r1", "broken"), ""); err != nil {
		t.Fatal(err)
	}
	if b := waitVolume(t, s, user, "bad"); b.GetStatus().GetState() != sandboxv1.VolumeState_VOLUME_STATE_ERROR || !strings.Contains(b.GetStatus().GetStateReason(), "broken on purpose") {
		t.Fatalf("error = %v", b)
	}
	if _, err := create(admin, pvcVolume("k8s", "r2", "c1"), ""); err != nil {
		t.Fatal(err)
	}
	if b := waitVolume(t, s, user, "k8s"); b.GetStatus().GetState() != sandboxv1.VolumeState_VOLUME_STATE_ERROR {
		t.Fatalf("runner without volumes = %v", b)
	}
	// Another organization: NOT_FOUND everywhere.
	if _, err := s.GetVolume(other, connect.NewRequest(&sandboxv1.GetVolumeRequest{VolumeId: "data"})); apierr.Reason(err) != apierr.VolumeNotFound {
		t.Fatalf("other get = %v", err)
	}
	if _, err := s.DeleteVolume(other, connect.NewRequest(&sandboxv1.DeleteVolumeRequest{VolumeId: "data", Force: true})); apierr.Reason(err) != apierr.VolumeNotFound {
		t.Fatalf("other delete = %v", err)
	}
	// List: by state.
	l, err := s.ListVolumes(user, connect.NewRequest(&sandboxv1.ListVolumesRequest{States: []sandboxv1.VolumeState{sandboxv1.VolumeState_VOLUME_STATE_ERROR}}))
	if err != nil || len(l.Msg.GetVolumes()) != 2 {
		t.Fatalf("list errors = %v, %v", l, err)
	}
	// Update: spec.description only.
	upd := func(mask ...string) (*sandboxv1.Volume, error) {
		res, err := s.UpdateVolume(admin, connect.NewRequest(&sandboxv1.UpdateVolumeRequest{VolumeId: "data",
			Volume: &sandboxv1.Volume{Spec: &sandboxv1.VolumeSpec{Description: "new", ReadOnly: true}}, UpdateMask: &fieldmaskpb.FieldMask{Paths: mask}}))
		if err != nil {
			return nil, err
		}
		return res.Msg, nil
	}
	if _, err := upd("spec.read_only"); apierr.Reason(err) != apierr.InvalidRequest || !strings.Contains(err.Error(), "update_mask.paths[0]") {
		t.Fatalf("update read_only = %v", err)
	}
	if u, err := upd("spec.description"); err != nil || u.GetSpec().GetDescription() != "new" || u.GetSpec().GetReadOnly() {
		t.Fatalf("update = %v, %v", u, err)
	}
	// Sandboxes: placement follows the volume; READY only; pinned elsewhere refused.
	mount := func(id string, runnerIDs ...string) *sandboxv1.SandboxSpec {
		return &sandboxv1.SandboxSpec{RunnerIds: runnerIDs,
			Volumes:    []*sandboxv1.SandboxVolume{{Name: "v", Source: &sandboxv1.SandboxVolume_VolumeId{VolumeId: id}}},
			Containers: []*sandboxv1.Container{{Name: "main", Image: "busybox", VolumeMounts: []*sandboxv1.VolumeMount{{Volume: "v", MountPath: "/data", SubPath: "x"}}}}}
	}
	sbx := func(sp *sandboxv1.SandboxSpec) (*sandboxv1.Sandbox, error) {
		res, err := s.CreateSandbox(user, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: sp}}))
		if err != nil {
			return nil, err
		}
		return res.Msg, nil
	}
	if _, err := sbx(mount("data", "r2")); apierr.Reason(err) != apierr.VolumePlacementConflict || !strings.Contains(err.Error(), `"data"`) {
		t.Fatalf("pinned elsewhere = %v", err)
	}
	if _, err := sbx(mount("bad")); apierr.Reason(err) != apierr.VolumeNotReady {
		t.Fatalf("not ready = %v", err)
	}
	if _, err := sbx(mount("nope")); apierr.Reason(err) != apierr.VolumeNotFound {
		t.Fatalf("missing = %v", err)
	}
	if _, err := s.CreateSandbox(tmplUser("globex"), connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: mount("data")}})); apierr.Reason(err) != apierr.VolumeNotFound {
		t.Fatalf("other org mounts = %v", err)
	}
	sb, err := sbx(mount("data"))
	if err != nil {
		t.Fatal(err)
	}
	if sb.GetStatus().GetRunnerId() != "r1" || len(sb.GetStatus().GetAttachedVolumeIds()) != 1 {
		t.Fatalf("sandbox = %v", sb.GetStatus())
	}
	given := r1.got[sb.GetSandboxId()].Spec
	if len(given.Volumes) != 1 || given.Volumes[0].Managed == "" || given.VolumeMounts[0].SubPath != "x" {
		t.Fatalf("runner got %+v %+v", given.Volumes, given.VolumeMounts)
	}
	l2, err := s.ListSandboxes(user, connect.NewRequest(&sandboxv1.ListSandboxesRequest{VolumeIds: []string{"data"}}))
	if err != nil || len(l2.Msg.GetSandboxes()) != 1 {
		t.Fatalf("list by volume = %v, %v", l2, err)
	}
	if got := waitVolume(t, s, user, "data"); got.GetStatus().GetAttachedSandboxCount() != 1 {
		t.Fatalf("attached = %v", got.GetStatus())
	}
	// Delete: refused while mounted (naming the sandbox), unless force.
	if _, err := s.DeleteVolume(admin, connect.NewRequest(&sandboxv1.DeleteVolumeRequest{VolumeId: "data"})); apierr.Reason(err) != apierr.VolumeInUse ||
		!strings.Contains(err.Error(), sb.GetSandboxId()) {
		t.Fatalf("delete in use = %v", err)
	}
	if _, err := s.DeleteVolume(admin, connect.NewRequest(&sandboxv1.DeleteVolumeRequest{VolumeId: "data", Force: true})); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetVolume(user, connect.NewRequest(&sandboxv1.GetVolumeRequest{VolumeId: "data"})); apierr.Reason(err) != apierr.VolumeNotFound {
		t.Fatalf("after delete = %v", err)
	}
	if _, err := s.DeleteVolume(admin, connect.NewRequest(&sandboxv1.DeleteVolumeRequest{VolumeId: "data"})); apierr.Reason(err) != apierr.VolumeNotFound {
		t.Fatalf("delete missing = %v", err)
	}
	if _, err := s.DeleteVolume(admin, connect.NewRequest(&sandboxv1.DeleteVolumeRequest{VolumeId: "data", AllowMissing: true})); err != nil {
		t.Fatalf("allow_missing = %v", err)
	}
	if len(r1.deleted) != 1 || r1.deleted[0] != "c1" {
		t.Fatalf("runner deletes = %v", r1.deleted)
	}
}
