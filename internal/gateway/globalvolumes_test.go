package gateway

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	statev1 "github.com/sandboxd/sandboxd/gen/sandboxd/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/blob"
	"github.com/sandboxd/sandboxd/internal/blob/dir"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/store"
)

func newGlobalGateway(t *testing.T, blobs blob.Store, runners ...runner.Handle) *Server {
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
	s, err := New(Config{Auth: keys, Runners: runners, Index: st.Sandboxes(), Orgs: st.Orgs(), Volumes: st.Volumes(), Blobs: blobs, Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// setState makes the accepting runner report sandbox id in state st.
func (r *acceptingRunner) setState(id string, st runner.State) {
	r.mu.Lock()
	defer r.mu.Unlock()
	sb := r.got[id]
	sb.State = st
	r.got[id] = sb
}

func TestGlobalVolumes(t *testing.T) {
	blobs, err := dir.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	r1, r2 := &acceptingRunner{id: "r1"}, &acceptingRunner{id: "r2"}
	s := newGlobalGateway(t, blobs, r1, r2)
	admin, user := tmplAdmin(testOrg), tmplUser(testOrg)
	ctx := context.Background()

	// runner_id "*" is GLOBAL: any namespace but default is refused; validation writes
	// the empty generation 0 and makes it READY with the default capacity.
	ns := pvcVolume("g", "*", "shared")
	ns.Spec.GetPvc().Namespace = "other"
	if _, err := s.CreateVolume(admin, connect.NewRequest(&sandboxv1.CreateVolumeRequest{Volume: ns})); apierr.Reason(err) != apierr.VolumeRunnerIneligible {
		t.Fatalf("other namespace = %v", err)
	}
	if _, err := s.CreateVolume(admin, connect.NewRequest(&sandboxv1.CreateVolumeRequest{Volume: pvcVolume("g", "*", "shared")})); err != nil {
		t.Fatal(err)
	}
	v := waitVolume(t, s, user, "g")
	if st := v.GetStatus(); st.GetState() != sandboxv1.VolumeState_VOLUME_STATE_READY || st.GetLocality() != sandboxv1.VolumeLocality_VOLUME_LOCALITY_GLOBAL ||
		st.GetCapacity() != "10Gi" || v.GetSpec().GetPvc().GetRunnerId() != "*" {
		t.Fatalf("volume = %v", v)
	}
	prefix := runner.GlobalVolumePrefix(testOrg, "shared")
	if m, err := runner.ReadGlobalManifest(ctx, blobs, prefix); err != nil || m.Generation != 0 || m.BlobKey != "" {
		t.Fatalf("generation 0 = %+v, %v", m, err)
	}

	mount := func(readOnly bool, runnerIDs ...string) *sandboxv1.SandboxSpec {
		return &sandboxv1.SandboxSpec{RunnerIds: runnerIDs,
			Volumes:    []*sandboxv1.SandboxVolume{{Name: "v", Source: &sandboxv1.SandboxVolume_VolumeId{VolumeId: "g"}}},
			Containers: []*sandboxv1.Container{{Name: "main", Image: "busybox", VolumeMounts: []*sandboxv1.VolumeMount{{Volume: "v", MountPath: "/data", ReadOnly: readOnly}}}}}
	}
	sbx := func(sp *sandboxv1.SandboxSpec) (*sandboxv1.Sandbox, error) {
		res, err := s.CreateSandbox(user, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: sp}}))
		if err != nil {
			return nil, err
		}
		return res.Msg, nil
	}
	runnerOf := func(sb *sandboxv1.Sandbox) *acceptingRunner {
		if sb.GetStatus().GetRunnerId() == "r1" {
			return r1
		}
		return r2
	}
	// The writer: no placement pin, a 10 GiB copy committed as generation 1, nothing to restore.
	w1, err := sbx(mount(false, "r2"))
	if err != nil {
		t.Fatal(err)
	}
	got := r2.spec(w1.GetSandboxId())
	if len(got.Spec.Volumes) != 1 || got.Spec.Volumes[0].Global == nil || got.Spec.Volumes[0].Global.CommitGeneration != 1 ||
		got.Spec.Volumes[0].Global.BlobPrefix != prefix || got.Spec.Volumes[0].SizeBytes != 10<<30 || got.Spec.Volumes[0].Managed != "" {
		t.Fatalf("writer's volumes = %+v", got.Spec.Volumes)
	}
	if h, _, _ := s.volumes.LeaseHolder(ctx, testOrg, "g"); h != w1.GetSandboxId() {
		t.Fatalf("lease holder = %q, want %s", h, w1.GetSandboxId())
	}
	// A second writer, anywhere: VOLUME_BUSY naming the holder.
	_, err = sbx(mount(false, "r1"))
	if apierr.Reason(err) != apierr.VolumeBusy || connect.CodeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), w1.GetSandboxId()) {
		t.Fatalf("second writer = %v", err)
	}
	// Readers: any number, no lease, nothing committed.
	rd, err := sbx(mount(true, "r1"))
	if err != nil {
		t.Fatal(err)
	}
	if g := r1.spec(rd.GetSandboxId()).Spec.Volumes[0].Global; g == nil || g.CommitGeneration != 0 {
		t.Fatalf("reader's volume = %+v", g)
	}
	if h, _, _ := s.volumes.LeaseHolder(ctx, testOrg, "g"); h != w1.GetSandboxId() {
		t.Fatalf("lease holder after a reader = %q", h)
	}
	// Neither is forked: a fork would be another copy the lease knows nothing of.
	if _, err := s.ForkSandbox(user, connect.NewRequest(&statev1.ForkSandboxRequest{SandboxId: rd.GetSandboxId()})); apierr.Reason(err) != apierr.VolumeTypeNotSupported {
		t.Fatalf("fork = %v", err)
	}
	// The writer ends, its runner having committed generation 1: the lease is free, and
	// the next writer restores generation 1 and commits generation 2.
	key := runner.GlobalArchiveKey(prefix, 1, w1.GetSandboxId())
	info, err := blobs.Put(ctx, key, bytes.NewReader([]byte("archive")), 7)
	if err != nil {
		t.Fatal(err)
	}
	if err := runner.WriteGlobalManifest(ctx, blobs, prefix, runner.GlobalManifest{Generation: 1, BlobKey: key, Digest: info.SHA256, SizeBytes: 7,
		ContentBytes: 3, CommitTime: time.Now()}); err != nil {
		t.Fatal(err)
	}
	runnerOf(w1).setState(w1.GetSandboxId(), runner.StateTerminated)
	w2, err := sbx(mount(false))
	if err != nil {
		t.Fatalf("writer after the first ended = %v", err)
	}
	req := runnerOf(w2).spec(w2.GetSandboxId())
	if g := req.Spec.Volumes[0].Global; g == nil || g.CommitGeneration != 2 || req.Spec.Volumes[0].RestoreDigest != "" && req.Spec.Volumes[0].RestoreDigest != info.SHA256 {
		t.Fatalf("second writer's volume = %+v", req.Spec.Volumes[0])
	}
	// A writer that is ending (its upload committing) makes the next mount wait for it.
	runnerOf(w2).setState(w2.GetSandboxId(), runner.StateTerminating)
	go func() {
		time.Sleep(300 * time.Millisecond)
		runnerOf(w2).setState(w2.GetSandboxId(), runner.StateTerminated)
	}()
	start := time.Now()
	if _, err := sbx(mount(false)); err != nil {
		t.Fatalf("writer after an ending one = %v", err)
	}
	if time.Since(start) < 250*time.Millisecond {
		t.Fatalf("did not wait for the ending writer")
	}
	// A GLOBAL volume named twice by one sandbox is refused.
	two := mount(true)
	two.Volumes = append(two.Volumes, &sandboxv1.SandboxVolume{Name: "w", Source: &sandboxv1.SandboxVolume_VolumeId{VolumeId: "g"}})
	if _, err := sbx(two); apierr.Reason(err) != apierr.InvalidRequest {
		t.Fatalf("named twice = %v", err)
	}
	// Delete (forced: sandboxes still mount it) removes its content from the blob store.
	if _, err := s.DeleteVolume(admin, connect.NewRequest(&sandboxv1.DeleteVolumeRequest{VolumeId: "g", Force: true})); err != nil {
		t.Fatal(err)
	}
	for info, err := range blobs.List(ctx, prefix) {
		t.Fatalf("left in the blob store: %v %v", info.Key, err)
	}
	if h, _, _ := s.volumes.LeaseHolder(ctx, testOrg, "g"); h != "" {
		t.Fatalf("lease left: %q", h)
	}
}

func TestGlobalVolumeWithoutBlobStore(t *testing.T) {
	s := newGlobalGateway(t, nil, &acceptingRunner{id: "r1"})
	if _, err := s.CreateVolume(tmplAdmin(testOrg), connect.NewRequest(&sandboxv1.CreateVolumeRequest{Volume: pvcVolume("g", "*", "shared")})); err != nil {
		t.Fatal(err)
	}
	v := waitVolume(t, s, tmplUser(testOrg), "g")
	if st := v.GetStatus(); st.GetState() != sandboxv1.VolumeState_VOLUME_STATE_ERROR || !strings.Contains(st.GetStateReason(), "blob store") {
		t.Fatalf("volume = %v", v)
	}
}

// A lease taken by a create whose gateway died is free after pendingLeaseTTL; a live
// holder's never.
func TestGlobalLeaseStaleness(t *testing.T) {
	r1 := &acceptingRunner{id: "r1"}
	s := newGlobalGateway(t, nil, r1)
	ctx := context.Background()
	if st := s.holderState(ctx, testOrg, pendingLeasePrefix+"x", time.Now()); st != "live" {
		t.Fatalf("fresh placeholder = %s", st)
	}
	if st := s.holderState(ctx, testOrg, pendingLeasePrefix+"x", time.Now().Add(-pendingLeaseTTL-time.Second)); st != "gone" {
		t.Fatalf("old placeholder = %s", st)
	}
	if st := s.holderState(ctx, testOrg, "nosuchsandbox", time.Now()); st != "gone" {
		t.Fatalf("unknown holder = %s", st)
	}
}
