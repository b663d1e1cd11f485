package gateway

import (
	"context"
	"errors"
	"path/filepath"
	"testing"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/blob"
	"github.com/sandboxd/sandboxd/internal/blob/dir"
	"github.com/sandboxd/sandboxd/internal/blob/s3"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/store"
)

// TestSnapshotsInOwnBucket: once an organization names its own bucket, its new snapshots
// (manual and on delete) go there (object_bucket, SnapshotTarget.Bucket), READY is
// checked against that bucket's object, a restore tells the runner the bucket, and a
// delete removes the archive there; once it clears the config, new snapshots go to the
// platform bucket again and a restore of one in the old bucket is
// CWSANDBOX_FSS_BUCKET_MISMATCH, while one in the platform bucket still restores. A
// DELETING snapshot whose bucket is gone is removed.
func TestSnapshotsInOwnBucket(t *testing.T) {
	e := newSnapEnv(t)
	own, err := dir.Open(filepath.Join(e.dir, "acme-fss"))
	if err != nil {
		t.Fatal(err)
	}
	r := newSnapRunner("r1", e.blobs)
	r.buckets["acme-fss"] = own
	keys, err := auth.OpenKeyring(filepath.Join(e.dir, "keys.json"))
	if err != nil {
		t.Fatal(err)
	}
	prober := &fakeProber{ok: map[string]bool{"acme-fss": true}}
	s, err := New(Config{Auth: keys, Runners: []runner.Handle{r}, Index: e.st.Sandboxes(), Orgs: e.st.Orgs(),
		Snapshots: e.st.Snapshots(), Blobs: e.blobs, SnapshotBucket: "local",
		FSS: FSSOptions{Limits: SnapshotLimits{MaxInFlightPerSandbox: 64}, BucketConfigs: e.st.FSSBucketConfigs(), ProbeBucket: prober.probe}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	var opened []string
	s.openBucket = func(_ context.Context, b string) (blob.Store, error) {
		opened = append(opened, b)
		if b == "acme-fss" {
			return own, nil
		}
		return nil, s3.ErrNoSuchBucket
	}
	ctx := asOrg(t.Context())
	admin := auth.WithPrincipal(t.Context(), auth.Principal{KeyID: "admin", Org: testOrg, Role: auth.RoleAdmin})
	setBucket := func(name string) {
		t.Helper()
		if _, err := s.UpdateFileSystemSnapshotBucketConfig(admin, connect.NewRequest(&sandboxv1.UpdateFileSystemSnapshotBucketConfigRequest{
			FileSystemSnapshotBucketConfig: &sandboxv1.FileSystemSnapshotBucketConfig{BucketName: name}})); err != nil {
			t.Fatal(err)
		}
	}

	// Before: the platform bucket.
	sb, err := createWith(t, s, ctx, scratch("workspace", "", ""))
	if err != nil {
		t.Fatal(err)
	}
	plat, err := snapshotOf(t, s, ctx, sb.GetSandboxId(), "", "")
	if err != nil || plat.GetObjectBucket() != "local" || r.targets[0].Bucket != "" {
		t.Fatalf("snapshot before the config = %v, %v (target %+v)", plat, err, r.targets)
	}
	r.finish(t, plat.GetFileSystemSnapshotId(), []byte("platform"), 8)

	setBucket("acme-fss")
	snap, err := snapshotOf(t, s, ctx, sb.GetSandboxId(), "", "")
	if err != nil || snap.GetObjectBucket() != "acme-fss" || r.targets[1].Bucket != "acme-fss" {
		t.Fatalf("snapshot with an own bucket = %v, %v (target %+v)", snap, err, r.targets)
	}
	id := snap.GetFileSystemSnapshotId()
	r.finish(t, id, []byte("own bucket"), 10)
	if got, err := getSnap(t, s, ctx, id); err != nil || got.GetState() != sandboxv1.SnapshotState_SNAPSHOT_STATE_READY {
		t.Fatalf("READY in the own bucket = %v, %v (opened %v)", got, err, opened)
	}
	if _, err := e.blobs.Stat(t.Context(), snapshotKey(testOrg, id)); !errors.Is(err, blob.ErrNotFound) {
		t.Fatalf("the archive is in the platform store: %v", err)
	}
	if _, err := createWith(t, s, ctx, scratch("workspace", "", id)); err != nil {
		t.Fatal(err)
	}
	if src := r.restores[len(r.restores)-1]["workspace"]; src.Bucket != "acme-fss" || src.SnapshotID != id {
		t.Fatalf("the runner restores %+v", src)
	}
	if _, err := createWith(t, s, ctx, scratch("workspace", "", plat.GetFileSystemSnapshotId())); err != nil {
		t.Fatalf("restore from the platform bucket with an own bucket: %v", err)
	}
	if src := r.restores[len(r.restores)-1]["workspace"]; src.Bucket != "" {
		t.Fatalf("the runner restores a platform snapshot from %q", src.Bucket)
	}
	// On delete too.
	sb2, _ := createWith(t, s, ctx, scratch("workspace", "", ""))
	out, err := s.DeleteSandbox(ctx, connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: sb2.GetSandboxId(), SnapshotVolumes: []string{"workspace"}}))
	if err != nil {
		t.Fatal(err)
	}
	onDel := out.Msg.GetFileSystemSnapshotIds()[0]
	if got, _ := getSnap(t, s, ctx, onDel); got.GetObjectBucket() != "acme-fss" || r.targets[len(r.targets)-1].Bucket != "acme-fss" {
		t.Fatalf("snapshot on delete = %v (target %+v)", got, r.targets[len(r.targets)-1])
	}
	r.finish(t, onDel, []byte("on delete"), 9)

	// Cleared: new snapshots go to the platform bucket; the old bucket's do not restore.
	setBucket("")
	_, err = createWith(t, s, ctx, scratch("workspace", "", id))
	wantReason(t, "restore from the old own bucket", err, connect.CodeFailedPrecondition, apierr.FSSBucketMismatch)
	if md := apierr.Info(err).GetMetadata(); md["object_bucket"] != "acme-fss" || md["current_bucket"] != "local" {
		t.Fatalf("metadata %v", md)
	}
	if vs := apierr.Violations(err); len(vs) != 1 || vs[0].Field != "sandbox.spec.volumes[0].scratch.restore_from_snapshot_id" {
		t.Fatalf("violations %v", vs)
	}
	after, err := snapshotOf(t, s, ctx, sb.GetSandboxId(), "", "")
	if err != nil || after.GetObjectBucket() != "local" || r.targets[len(r.targets)-1].Bucket != "" {
		t.Fatalf("snapshot after clearing = %v, %v", after, err)
	}
	// Deleting reaches the snapshot's own bucket, whatever the config says now.
	if _, err := s.DeleteFileSystemSnapshot(ctx, connect.NewRequest(&sandboxv1.DeleteFileSystemSnapshotRequest{FileSystemSnapshotId: id})); err != nil {
		t.Fatal(err)
	}
	if _, err := own.Stat(t.Context(), snapshotKey(testOrg, id)); !errors.Is(err, blob.ErrNotFound) {
		t.Fatalf("the archive is still in the own bucket: %v", err)
	}
	if _, err := own.Stat(t.Context(), snapshotKey(testOrg, onDel)); err != nil {
		t.Fatalf("another snapshot's archive went: %v", err)
	}
	// A DELETING snapshot whose bucket no longer exists: the reconciler removes the row.
	gone := store.Snapshot{ID: "fss-gone", Org: testOrg, State: store.SnapshotFailed, SourceSandboxID: sb.GetSandboxId(),
		SourceVolumeName: "workspace", Trigger: store.TriggerManual, ObjectBucket: "gone-bucket", ObjectKey: snapshotKey(testOrg, "fss-gone"), RunnerID: "r1"}
	if _, _, err := e.st.Snapshots().Create(t.Context(), gone); err != nil {
		t.Fatal(err)
	}
	if _, err := e.st.Snapshots().MarkDeleting(t.Context(), testOrg, gone.ID); err != nil {
		t.Fatal(err)
	}
	if _, n := s.ReconcileSnapshots(t.Context()); n != 1 {
		t.Fatalf("the reconciler removed %d, want the snapshot of the gone bucket", n)
	}
}
