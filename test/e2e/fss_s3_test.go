package e2e

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/minio/minio-go/v7"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1/sandboxv1connect"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/blob"
	"github.com/sandboxd/sandboxd/internal/blob/blobconfig"
	"github.com/sandboxd/sandboxd/internal/blob/s3"
	"github.com/sandboxd/sandboxd/internal/blob/s3/s3test"
	"github.com/sandboxd/sandboxd/internal/connecttest"
	"github.com/sandboxd/sandboxd/internal/gateway"
	"github.com/sandboxd/sandboxd/internal/pki"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runnerapi"
	"github.com/sandboxd/sandboxd/internal/runtime/local/network"
	"github.com/sandboxd/sandboxd/internal/stack"
	"github.com/sandboxd/sandboxd/internal/stack/stacktest"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/testenv/logbuf"
)

// File-system snapshots end to end against a real S3-compatible server (SeaweedFS,
// s3test): the local backend captures scratch volumes into its btrfs volume pool, the
// runner uploads the archives to the bucket, the gateway keeps the index in SQLite; all
// driven through the public API.

// fssS3 is SeaweedFS with one bucket as the blob store, a SQLite store with
// organizations org-a and org-b, and the data dir of the stacks the test starts.
type fssS3 struct {
	srv        *s3test.Server
	cfg        s3.Config // of the platform bucket
	bucket     string
	blobs      *s3.Store
	st         store.Store
	keys       *auth.Keyring
	keyA, keyB string
	dir        string
}

func newFSSS3(t *testing.T) *fssS3 {
	t.Helper()
	srv := s3test.Start(t) // skips in -short or without the binary (unless SANDBOXD_REQUIRE_S3=1)
	cfg := srv.Bucket(t)
	blobs, err := s3.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	e := &fssS3{srv: srv, cfg: cfg, bucket: cfg.Bucket, blobs: blobs, dir: t.TempDir()}
	e.st, e.keys, e.keyA = indexStore(t)
	if _, err := e.st.Orgs().Create(context.Background(), store.Org{ID: "org-b"}); err != nil {
		t.Fatal(err)
	}
	if e.keyB, _, err = e.keys.Create("org-b", auth.RoleUser, ""); err != nil {
		t.Fatal(err)
	}
	return e
}

// stack starts a stack on the data dir with the S3 blob store. The caller closes it, or
// hands it to finishClosed.
func (e *fssS3) stack(t *testing.T) *stack.Stack {
	t.Helper()
	cfg := env.StackConfig(e.dir)
	cfg.Blobs, cfg.BlobConfig = e.blobs, blobconfig.Config{S3: &e.cfg}
	s, err := stack.NewLocal(context.Background(), cfg)
	if err != nil {
		t.Fatalf("start stack: %v", err)
	}
	return s
}

// finishClosed deletes every sandbox of s, closes it (the volume pool holds restored
// snapshots' cache entries, so it is mounted until the backend closes) and then checks
// that nothing is left under the data dir: no sandbox, no mount, no loop device.
func (e *fssS3) finishClosed(t *testing.T, s *stack.Stack) {
	t.Helper()
	var ids []string
	for _, sb := range s.Runner.List() {
		ids = append(ids, sb.ID)
	}
	deleteAll(t, s)
	s.Close()
	assertNoLeaks(t, e.dir, ids)
	if left := stacktest.Leftovers(e.dir); len(left) > 0 {
		t.Errorf("left behind after the stack closed: %q", left)
		stacktest.ForceClean(e.dir)
	}
	if err := s.Network.Cleanup(); err != nil {
		t.Errorf("network cleanup: %v", err)
	}
}

// gateway serves a gateway on runner s with the SQLite index and the S3 blob store.
func (e *fssS3) gateway(t *testing.T, s *stack.Stack) *gw {
	t.Helper()
	g, err := gateway.New(gateway.Config{
		Auth: e.keys, Runners: []runner.Handle{runner.NewLocal("local", s.Runner)},
		Index: e.st.Sandboxes(), Orgs: e.st.Orgs(), Snapshots: e.st.Snapshots(),
		Blobs: e.blobs, SnapshotBucket: e.bucket, BlobConfig: blobconfig.Config{S3: &e.cfg},
		FSS: gateway.FSSOptions{BucketConfigs: e.st.FSSBucketConfigs(), ProbeBucket: blobconfig.Config{S3: &e.cfg}.BucketProber()},
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(g.Handler())
	srv.EnableHTTP2 = true
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetHTTP1(true)
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	srv.Start()
	t.Cleanup(srv.Close)
	return gwClients(srv.URL, e.keyA, e.keyB)
}

// objectKey is where snapshot id of org-a is stored (from the index).
func (e *fssS3) objectKey(t *testing.T, id string) string {
	t.Helper()
	x, err := e.st.Snapshots().Get(context.Background(), "org-a", id)
	if err != nil {
		t.Fatalf("snapshot %s in the index: %v", id, err)
	}
	return x.ObjectKey
}

// incompleteUploads lists the multipart uploads in progress in the bucket (staging keys
// included).
func (e *fssS3) incompleteUploads(t *testing.T) []string {
	t.Helper()
	var out []string
	for u := range e.srv.Client.ListIncompleteUploads(context.Background(), e.bucket, "", true) {
		if u.Err != nil {
			t.Fatalf("list multipart uploads: %v", u.Err)
		}
		out = append(out, u.Key+" "+u.UploadID)
	}
	return out
}

// uploadedParts counts the parts stored of the multipart uploads in progress.
func (e *fssS3) uploadedParts(t *testing.T) int {
	t.Helper()
	core := minio.Core{Client: e.srv.Client}
	n := 0
	for u := range e.srv.Client.ListIncompleteUploads(context.Background(), e.bucket, "", true) {
		if u.Err != nil {
			t.Fatalf("list multipart uploads: %v", u.Err)
		}
		res, err := core.ListObjectParts(context.Background(), e.bucket, u.Key, u.UploadID, 0, 1000)
		if err != nil {
			continue // completed or aborted meanwhile
		}
		n += len(res.ObjectParts)
	}
	return n
}

// objects lists every object in the bucket (staging keys included).
func (e *fssS3) objects(t *testing.T) []string {
	t.Helper()
	var out []string
	for oi := range e.srv.Client.ListObjects(context.Background(), e.bucket, minio.ListObjectsOptions{Recursive: true}) {
		if oi.Err != nil {
			t.Fatalf("list objects: %v", oi.Err)
		}
		out = append(out, oi.Key)
	}
	return out
}

// scratchSpec is a sleeper with scratch volume name of size at /data, restored from
// restore when not empty.
func scratchSpec(name, size, restore string) *sandboxv1.SandboxSpec {
	sp := sleeperSpec()
	sp.Volumes = []*sandboxv1.SandboxVolume{{Name: name, Source: &sandboxv1.SandboxVolume_Scratch{
		Scratch: &sandboxv1.ScratchVolume{Size: size, RestoreFromSnapshotId: restore}}}}
	sp.Containers[0].VolumeMounts = []*sandboxv1.VolumeMount{{Volume: name, MountPath: "/data"}}
	return sp
}

func (g *gw) sh(t *testing.T, id, script string) string {
	t.Helper()
	res, err := g.sandboxes.Exec(context.Background(), connect.NewRequest(&sandboxv1.ExecRequest{SandboxId: id, Command: []string{"sh", "-c", script}}))
	if err != nil {
		t.Fatalf("exec %q: %v", script, err)
	}
	if res.Msg.ExitCode != 0 {
		t.Fatalf("exec %q: exit %d: %s%s", script, res.Msg.ExitCode, res.Msg.Stdout, res.Msg.Stderr)
	}
	return string(res.Msg.Stdout)
}

func (g *gw) snapshot(t *testing.T, sandboxID, volume, requestID string) *sandboxv1.FileSystemSnapshot {
	t.Helper()
	res, err := g.sandboxes.CreateFileSystemSnapshot(context.Background(), connect.NewRequest(&sandboxv1.CreateFileSystemSnapshotRequest{
		SandboxId: sandboxID, ScratchVolumeName: volume, RequestId: requestID}))
	if err != nil {
		t.Fatalf("create snapshot of %s/%s: %v", sandboxID, volume, err)
	}
	return res.Msg
}

func (g *gw) getSnapshot(id string) (*sandboxv1.FileSystemSnapshot, error) {
	res, err := g.sandboxes.GetFileSystemSnapshot(context.Background(), connect.NewRequest(&sandboxv1.GetFileSystemSnapshotRequest{FileSystemSnapshotId: id}))
	if err != nil {
		return nil, err
	}
	return res.Msg, nil
}

// waitSnapshot waits until snapshot id leaves CREATING and returns it.
func (g *gw) waitSnapshot(t *testing.T, id string, within time.Duration) *sandboxv1.FileSystemSnapshot {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		x, err := g.getSnapshot(id)
		if err != nil {
			t.Fatalf("get snapshot %s: %v", id, err)
		}
		if x.GetState() != sandboxv1.SnapshotState_SNAPSHOT_STATE_CREATING {
			return x
		}
		if time.Now().After(deadline) {
			t.Fatalf("snapshot %s still CREATING after %s", id, within)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// wantReady checks that x is READY with its archive in the bucket, of its size.
func (e *fssS3) wantReady(t *testing.T, x *sandboxv1.FileSystemSnapshot) {
	t.Helper()
	if x.GetState() != sandboxv1.SnapshotState_SNAPSHOT_STATE_READY {
		t.Fatalf("snapshot %s is %s (%s), want READY", x.GetFileSystemSnapshotId(), x.GetState(), x.GetStateReason())
	}
	if x.GetSizeBytes() <= 0 || x.GetObjectBucket() != e.bucket || x.GetCompleteTime() == nil {
		t.Errorf("READY snapshot: size %d, bucket %q (want %q), complete time %v", x.GetSizeBytes(), x.GetObjectBucket(), e.bucket, x.GetCompleteTime())
	}
	key := e.objectKey(t, x.GetFileSystemSnapshotId())
	oi, err := e.srv.Client.StatObject(context.Background(), e.bucket, key, minio.StatObjectOptions{})
	if err != nil || oi.Size != x.GetSizeBytes() {
		t.Errorf("object %s in SeaweedFS: %d bytes (%v), want %d", key, oi.Size, err, x.GetSizeBytes())
	}
}

const fssFiles = `mkdir -p /data/sub/deeper && printf hello > /data/a.txt && printf nested > /data/sub/deeper/b.txt &&
ln -s sub/deeper/b.txt /data/link && head -c 65536 /dev/urandom > /data/sub/rand.bin && chmod 0640 /data/a.txt`

// fssCheck prints what fssFiles wrote, in a form two volumes are compared by.
const fssCheck = `cd /data && cat a.txt && echo && cat sub/deeper/b.txt && echo && readlink link && cat link && echo &&
stat -c '%a %s' a.txt sub/rand.bin && md5sum sub/rand.bin && test -d sub/deeper && echo dir`

// TestFSSOnS3 runs the snapshot flows with SeaweedFS as the blob store: snapshot, READY
// with its object in the bucket, restore into a new sandbox, list/get, snapshot on
// delete, delete (the object goes), another organization's snapshot NOT_FOUND.
func TestFSSOnS3(t *testing.T) {
	e := newFSSS3(t)
	s := e.stack(t)
	t.Cleanup(func() { e.finishClosed(t, s) })
	g := e.gateway(t, s)
	ctx := context.Background()

	src := g.create(t, scratchSpec("work", "256Mi", ""), "")
	g.waitState(t, src.SandboxId, sandboxv1.State_STATE_RUNNING)
	g.sh(t, src.SandboxId, fssFiles)
	want := g.sh(t, src.SandboxId, fssCheck)

	created := g.snapshot(t, src.SandboxId, "work", "snap-1")
	id := created.GetFileSystemSnapshotId()
	if created.GetState() != sandboxv1.SnapshotState_SNAPSHOT_STATE_CREATING || created.GetSourceSandboxId() != src.SandboxId ||
		created.GetSourceVolumeName() != "work" || created.GetTrigger() != sandboxv1.SnapshotTrigger_SNAPSHOT_TRIGGER_MANUAL {
		t.Errorf("created snapshot: %v", created)
	}
	if again := g.snapshot(t, src.SandboxId, "work", "snap-1"); again.GetFileSystemSnapshotId() != id {
		t.Errorf("same request_id: snapshot %s, want %s", again.GetFileSystemSnapshotId(), id)
	}
	ready := g.waitSnapshot(t, id, time.Minute)
	e.wantReady(t, ready)

	// Restored into a new sandbox: the same files, the symlink and the subdirectories.
	fork := g.create(t, scratchSpec("work", "256Mi", id), "")
	g.waitState(t, fork.SandboxId, sandboxv1.State_STATE_RUNNING)
	if got := g.sh(t, fork.SandboxId, fssCheck); got != want {
		t.Errorf("restored volume:\n%s\nwant:\n%s", got, want)
	}

	list, err := g.sandboxes.ListFileSystemSnapshots(ctx, connect.NewRequest(&sandboxv1.ListFileSystemSnapshotsRequest{SourceSandboxId: src.SandboxId}))
	if err != nil || len(list.Msg.GetFileSystemSnapshots()) != 1 || list.Msg.GetFileSystemSnapshots()[0].GetFileSystemSnapshotId() != id {
		t.Errorf("list by source sandbox: %v %v", list.Msg.GetFileSystemSnapshots(), err)
	}
	if got, err := g.getSnapshot(id); err != nil || got.GetSizeBytes() != ready.GetSizeBytes() || got.GetObjectBucket() != e.bucket {
		t.Errorf("get: %v %v", got, err)
	}

	// Another organization: NOT_FOUND on get, delete, and restore; its list is empty.
	_, err = g.other.GetFileSystemSnapshot(ctx, connect.NewRequest(&sandboxv1.GetFileSystemSnapshotRequest{FileSystemSnapshotId: id}))
	wantCode(t, "get of another organization's snapshot", err, connect.CodeNotFound, apierr.FSSNotFound)
	_, err = g.other.DeleteFileSystemSnapshot(ctx, connect.NewRequest(&sandboxv1.DeleteFileSystemSnapshotRequest{FileSystemSnapshotId: id}))
	wantCode(t, "delete of another organization's snapshot", err, connect.CodeNotFound, apierr.FSSNotFound)
	_, err = g.other.CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: scratchSpec("work", "256Mi", id)}}))
	wantCode(t, "restore of another organization's snapshot", err, connect.CodeNotFound, apierr.FSSNotFound)
	if l, err := g.other.ListFileSystemSnapshots(ctx, connect.NewRequest(&sandboxv1.ListFileSystemSnapshotsRequest{})); err != nil || len(l.Msg.GetFileSystemSnapshots()) != 0 {
		t.Errorf("another organization lists %v (%v)", l.Msg.GetFileSystemSnapshots(), err)
	}

	// Snapshot on delete: the fork's volume (changed after the restore) is taken as it was
	// when the sandbox stopped; the sandbox ends whatever.
	g.sh(t, fork.SandboxId, `printf changed > /data/a.txt && rm /data/link`)
	del, err := g.sandboxes.DeleteSandbox(ctx, connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: fork.SandboxId, SnapshotVolumes: []string{"work"}}))
	if err != nil || len(del.Msg.GetFileSystemSnapshotIds()) != 1 {
		t.Fatalf("delete with snapshot_volumes: %v %v", del.Msg.GetFileSystemSnapshotIds(), err)
	}
	onDelete := g.waitSnapshot(t, del.Msg.FileSystemSnapshotIds[0], time.Minute)
	e.wantReady(t, onDelete)
	if onDelete.GetTrigger() != sandboxv1.SnapshotTrigger_SNAPSHOT_TRIGGER_ON_DELETE || onDelete.GetSourceSandboxId() != fork.SandboxId {
		t.Errorf("snapshot on delete: trigger %s, source %s", onDelete.GetTrigger(), onDelete.GetSourceSandboxId())
	}
	g.waitState(t, fork.SandboxId, sandboxv1.State_STATE_TERMINATED)
	third := g.create(t, scratchSpec("work", "256Mi", onDelete.GetFileSystemSnapshotId()), "")
	g.waitState(t, third.SandboxId, sandboxv1.State_STATE_RUNNING)
	if got := g.sh(t, third.SandboxId, `cat /data/a.txt; test -e /data/link || echo " no link"; cat /data/sub/deeper/b.txt`); got != "changed no link\nnested" {
		t.Errorf("restored from the snapshot on delete: %q", got)
	}

	// Delete: the object leaves the bucket, the snapshot is gone.
	key := e.objectKey(t, id)
	if _, err := g.sandboxes.DeleteFileSystemSnapshot(ctx, connect.NewRequest(&sandboxv1.DeleteFileSystemSnapshotRequest{FileSystemSnapshotId: id})); err != nil {
		t.Fatalf("delete snapshot: %v", err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := e.blobs.Stat(ctx, key)
		if errors.Is(err, blob.ErrNotFound) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("object %s after the snapshot was deleted: Stat %v, want not found", key, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	_, err = g.getSnapshot(id)
	wantCode(t, "get of a deleted snapshot", err, connect.CodeNotFound, apierr.FSSNotFound)
	_, err = g.sandboxes.CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: scratchSpec("work", "256Mi", id)}}))
	wantCode(t, "restore of a deleted snapshot", err, connect.CodeNotFound, apierr.FSSNotFound)
	// What is left in the bucket: the snapshot on delete's archive, nothing staged.
	if objs := e.objects(t); len(objs) != 1 || objs[0] != e.objectKey(t, onDelete.GetFileSystemSnapshotId()) {
		t.Errorf("bucket holds %q, want only the snapshot on delete's archive", objs)
	}
	if ups := e.incompleteUploads(t); len(ups) != 0 {
		t.Errorf("multipart uploads left in the bucket: %q", ups)
	}

	// Bring your own bucket: an administrator names the organization's own bucket (on the
	// platform's S3 endpoint, reached with its credentials); a new snapshot lands there,
	// not in the platform bucket, and restores from there.
	ownCfg := e.srv.Bucket(t)
	own, err := s3.New(ctx, ownCfg)
	if err != nil {
		t.Fatal(err)
	}
	adminKey, _, err := e.keys.Create("org-a", auth.RoleAdmin, "")
	if err != nil {
		t.Fatal(err)
	}
	settings := sandboxv1connect.NewSettingsServiceClient(http.DefaultClient, g.url, connect.WithInterceptors(connecttest.Bearer(adminKey)))
	setBucket := func(name string) {
		t.Helper()
		res, err := settings.UpdateFileSystemSnapshotBucketConfig(ctx, connect.NewRequest(&sandboxv1.UpdateFileSystemSnapshotBucketConfigRequest{
			FileSystemSnapshotBucketConfig: &sandboxv1.FileSystemSnapshotBucketConfig{BucketName: name}}))
		if err != nil {
			t.Fatalf("set the snapshot bucket to %q: %v", name, err)
		}
		if want := map[bool]string{true: e.bucket, false: name}[name == ""]; res.Msg.GetEffectiveBucketName() != want {
			t.Fatalf("effective bucket %q, want %q", res.Msg.GetEffectiveBucketName(), want)
		}
	}
	setBucket(ownCfg.Bucket)
	ownSnap := g.waitSnapshot(t, g.snapshot(t, third.SandboxId, "work", "").GetFileSystemSnapshotId(), time.Minute)
	ownID := ownSnap.GetFileSystemSnapshotId()
	ownKey := e.objectKey(t, ownID)
	if ownSnap.GetState() != sandboxv1.SnapshotState_SNAPSHOT_STATE_READY || ownSnap.GetObjectBucket() != ownCfg.Bucket {
		t.Fatalf("snapshot with an own bucket: %s (%s) in %q, want READY in %q", ownSnap.GetState(), ownSnap.GetStateReason(), ownSnap.GetObjectBucket(), ownCfg.Bucket)
	}
	if info, err := own.Stat(ctx, ownKey); err != nil || info.Size != ownSnap.GetSizeBytes() {
		t.Errorf("object %s in the own bucket: %+v, %v; want %d bytes", ownKey, info, err, ownSnap.GetSizeBytes())
	}
	if _, err := e.blobs.Stat(ctx, ownKey); !errors.Is(err, blob.ErrNotFound) {
		t.Errorf("the own bucket's snapshot is in the platform bucket too: %v", err)
	}
	fromOwn := g.create(t, scratchSpec("work", "256Mi", ownID), "")
	g.waitState(t, fromOwn.SandboxId, sandboxv1.State_STATE_RUNNING)
	if got := g.sh(t, fromOwn.SandboxId, `cat /data/a.txt`); got != "changed" {
		t.Errorf("restored from the own bucket: %q", got)
	}
	// Cleared (back to the platform's bucket): the own bucket's snapshot does not restore,
	// CWSANDBOX_FSS_BUCKET_MISMATCH (the official client's SnapshotBucketMismatchError,
	// reversible by setting the bucket back), though the platform could still read it.
	setBucket("")
	_, err = g.sandboxes.CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: scratchSpec("work", "256Mi", ownID)}}))
	wantCode(t, "restore from the bucket no longer the organization's", err, connect.CodeFailedPrecondition, apierr.FSSBucketMismatch)
	if md := apierr.Info(err).GetMetadata(); md["object_bucket"] != ownCfg.Bucket || md["current_bucket"] != e.bucket {
		t.Errorf("BUCKET_MISMATCH metadata %v", md)
	}
	setBucket(ownCfg.Bucket)
	back := g.create(t, scratchSpec("work", "256Mi", ownID), "")
	g.waitState(t, back.SandboxId, sandboxv1.State_STATE_RUNNING)
	// Deleted (whatever the config says): the object leaves the own bucket.
	setBucket("")
	if _, err := g.sandboxes.DeleteFileSystemSnapshot(ctx, connect.NewRequest(&sandboxv1.DeleteFileSystemSnapshotRequest{FileSystemSnapshotId: ownID})); err != nil {
		t.Fatalf("delete the own bucket's snapshot: %v", err)
	}
	if _, err := own.Stat(ctx, ownKey); !errors.Is(err, blob.ErrNotFound) {
		t.Errorf("object %s in the own bucket after the delete: %v, want not found", ownKey, err)
	}
}

// TestFSSOnS3RunnerRestartMidUpload: the runner stops (its stack closes, as on a
// restart) while a snapshot's archive is being uploaded. The upload is cut off (the
// multipart upload aborted), the next runner on the same data dir fails the job, and the
// gateway reports the snapshot FAILED with the reason; nothing of it is left in the
// bucket, the source sandbox is re-adopted and a new snapshot of it succeeds.
func TestFSSOnS3RunnerRestartMidUpload(t *testing.T) {
	e := newFSSS3(t)
	first := e.stack(t)
	closed := false
	t.Cleanup(func() {
		if !closed {
			e.finishClosed(t, first)
		}
	})
	g := e.gateway(t, first)
	src := g.create(t, scratchSpec("work", "1Gi", ""), "")
	g.waitState(t, src.SandboxId, sandboxv1.State_STATE_RUNNING)
	// Incompressible, so the archive is as large (zstd cannot shrink it).
	g.sh(t, src.SandboxId, `dd if=/dev/urandom of=/data/big bs=1M count=384 2>/dev/null && printf small > /data/small && sync`)

	x := g.snapshot(t, src.SandboxId, "work", "")
	id := x.GetFileSystemSnapshotId()
	key := e.objectKey(t, id)
	// Mid-upload: the archive's multipart upload exists in SeaweedFS and holds parts
	// already (of the 384 MiB archive, in 16 MiB parts).
	deadline := time.Now().Add(30 * time.Second)
	parts := 0
	for parts < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("the upload did not get 2 parts into the bucket within 30 s (uploads %q)", e.incompleteUploads(t))
		}
		time.Sleep(20 * time.Millisecond)
		parts = e.uploadedParts(t)
	}
	if x, err := g.getSnapshot(id); err != nil || x.GetState() != sandboxv1.SnapshotState_SNAPSHOT_STATE_CREATING {
		t.Fatalf("snapshot mid-upload: %v (%v), want CREATING", x, err)
	}
	started := time.Now()
	first.Close() // the runner stops: its upload is cancelled
	closed = true
	t.Logf("runner stopped with %d parts uploaded; its stack closed in %s", parts, time.Since(started).Round(time.Millisecond))
	if job := first.Runner.GetSnapshotJob(id); job.State != runner.SnapshotCreating {
		t.Fatalf("job after the runner closed mid-upload: state %d (%s: %s), want still CREATING (the upload was cut off)", job.State, job.Reason, job.Message)
	}

	second := e.stack(t)
	t.Cleanup(func() { e.finishClosed(t, second) })
	g2 := e.gateway(t, second) // the gateway restarts too, on the same store
	got := g2.waitSnapshot(t, id, 30*time.Second)
	if got.GetState() != sandboxv1.SnapshotState_SNAPSHOT_STATE_FAILED ||
		!strings.HasPrefix(got.GetStateReason(), apierr.FSSCreateFailed+": ") || !strings.Contains(got.GetStateReason(), "runner restarted during the upload") {
		t.Errorf("snapshot after the runner restarted mid-upload: %s (%q), want FAILED with %s: the runner restarted during the upload",
			got.GetState(), got.GetStateReason(), apierr.FSSCreateFailed)
	}
	if got.GetSizeBytes() != 0 {
		t.Errorf("FAILED snapshot reports %d bytes", got.GetSizeBytes())
	}
	// Nothing of the interrupted upload is left: no object, no multipart upload, nothing
	// staged.
	deadline = time.Now().Add(30 * time.Second)
	for {
		_, statErr := e.blobs.Stat(context.Background(), key)
		objs, ups := e.objects(t), e.incompleteUploads(t)
		if errors.Is(statErr, blob.ErrNotFound) && len(objs) == 0 && len(ups) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the restart: Stat %s: %v; objects %q; multipart uploads %q; want none", key, statErr, objs, ups)
		}
		time.Sleep(200 * time.Millisecond)
	}
	_, err := g2.sandboxes.CreateSandbox(context.Background(), connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: scratchSpec("work", "1Gi", id)}}))
	wantCode(t, "restore of the FAILED snapshot", err, connect.CodeFailedPrecondition, apierr.FSSNotReady)

	// The source sandbox was re-adopted and runs, its data intact; a new snapshot of it
	// succeeds.
	g2.waitState(t, src.SandboxId, sandboxv1.State_STATE_RUNNING)
	if out := g2.sh(t, src.SandboxId, `cat /data/small; stat -c ' %s' /data/big`); out != "small 402653184\n" {
		t.Errorf("source volume after the restart: %q", out)
	}
	g2.sh(t, src.SandboxId, `rm /data/big`) // keep the second upload short
	again := g2.waitSnapshot(t, g2.snapshot(t, src.SandboxId, "work", "").GetFileSystemSnapshotId(), time.Minute)
	e.wantReady(t, again)
	if ups := e.incompleteUploads(t); len(ups) != 0 {
		t.Errorf("multipart uploads left after the second snapshot: %q", ups)
	}
}

// runnerProc is a `sandboxd runner` process the test can kill.
type runnerProc struct {
	cmd    *exec.Cmd
	exited chan struct{}
	out    *logbuf.Buffer
}

// startRunnerProc starts bin with args and waits until it listens.
func startRunnerProc(t *testing.T, bin string, args ...string) *runnerProc {
	t.Helper()
	return startRunnerProcEnv(t, bin, nil, args...)
}

// startRunnerProcEnv is startRunnerProc with extraEnv in the process's environment.
func startRunnerProcEnv(t *testing.T, bin string, extraEnv []string, args ...string) *runnerProc {
	t.Helper()
	p := &runnerProc{cmd: exec.Command(bin, args...), exited: make(chan struct{}), out: new(logbuf.Buffer)}
	p.cmd.Env = append(append(os.Environ(), "SANDBOXD_AGENT="+env.AgentBin), extraEnv...)
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = p.cmd.Wait(); close(p.exited) }()
	deadline := time.Now().Add(60 * time.Second)
	for !strings.Contains(p.out.String(), "runner r1 listening on") {
		select {
		case <-p.exited:
			t.Fatalf("runner exited early:\n%s", p.out.String())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			p.stop(syscall.SIGKILL)
			t.Fatalf("runner not listening after 60 s:\n%s", p.out.String())
		}
	}
	return p
}

// stop sends sig (SIGTERM: a clean stop; SIGKILL: a crash) and waits for the exit.
func (p *runnerProc) stop(sig syscall.Signal) {
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.exited:
	case <-time.After(60 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
}

// TestFSSOnS3RunnerKilledMidUpload: a `sandboxd runner` process is killed (SIGKILL, no
// chance to clean up) while it uploads a snapshot to SeaweedFS, and started again on the
// same data dir. The snapshot ends FAILED with the reason; the next runner removes what
// the dead one left (the multipart upload in the bucket, the volume capture in its
// volume pool), re-adopts the source sandbox, and a new snapshot of it succeeds; at the
// end nothing is left mounted.
func TestFSSOnS3RunnerKilledMidUpload(t *testing.T) {
	e := newFSSS3(t)
	dir := t.TempDir()
	bin := filepath.Join(dir, "sandboxd")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/sandboxd/sandboxd/cmd/sandboxd").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	for name, v := range map[string]string{"ak": e.srv.AccessKey, "sk": e.srv.SecretKey} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(v), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	pkiDir, dataDir := filepath.Join(dir, "pki"), filepath.Join(dir, "runner")
	sc := env.StackConfigN(dataDir, 1) // its own bridge, subnet and cgroup parent
	addr := freeAddr(t)
	args := []string{"runner", "--data-dir", dataDir, "--pki-dir", pkiDir, "--listen", addr, "--runner-id", "r1",
		"--insecure-registry", env.Registry, "--bridge", sc.Bridge, "--subnet", sc.Subnet.String(),
		"--cgroup-parent", sc.CgroupParent, "--no-egress",
		"--blob-s3-endpoint", e.srv.Endpoint, "--blob-s3-bucket", e.bucket, "--blob-s3-path-style", "--blob-s3-insecure",
		"--blob-s3-access-key-file", filepath.Join(dir, "ak"), "--blob-s3-secret-key-file", filepath.Join(dir, "sk")}
	proc := startRunnerProc(t, bin, args...)
	t.Cleanup(func() {
		if proc != nil {
			proc.stop(syscall.SIGTERM)
			if t.Failed() {
				t.Logf("runner output:\n%s", proc.out.String())
			}
		}
		// What a stopped runner leaves (the volume pool is mounted while it runs).
		if left := stacktest.Leftovers(dataDir); len(left) > 0 {
			t.Errorf("left behind after the runner stopped: %q", left)
		}
		stacktest.ForceClean(dataDir)
		if nw, err := network.New(network.Config{Bridge: sc.Bridge, Subnet: sc.Subnet, Table: sc.NetTable,
			StateDir: filepath.Join(dataDir, "network"), Nameservers: []string{}}); err == nil {
			if err := nw.Cleanup(); err != nil {
				t.Errorf("network cleanup: %v", err)
			}
		}
		parents, _ := filepath.Glob("/sys/fs/cgroup/*/" + sc.CgroupParent)
		for _, p := range parents {
			_ = os.Remove(p)
		}
	})

	ca, err := pki.LoadOrCreateCA(pkiDir, "sandboxd platform CA")
	if err != nil {
		t.Fatal(err)
	}
	clientTLS, err := runnerapi.ClientTLSConfig(ca, "gw-test", "r1")
	if err != nil {
		t.Fatal(err)
	}
	rc, err := runnerapi.NewClient(runnerapi.ClientConfig{ID: "r1", Addr: addr, TLS: clientTLS})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rc.Close)
	gwy, err := gateway.New(gateway.Config{
		Auth: e.keys, Runners: []runner.Handle{rc},
		Index: e.st.Sandboxes(), Orgs: e.st.Orgs(), Snapshots: e.st.Snapshots(),
		Blobs: e.blobs, SnapshotBucket: e.bucket,
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(gwy.Handler())
	srv.EnableHTTP2 = true
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetHTTP1(true)
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	srv.Start()
	t.Cleanup(srv.Close)
	g := gwClients(srv.URL, e.keyA, e.keyB)
	t.Cleanup(func() {
		// Before the runner stops: its sandboxes are deleted and gone.
		ctx := context.Background()
		list, err := g.sandboxes.ListSandboxes(ctx, connect.NewRequest(&sandboxv1.ListSandboxesRequest{}))
		if err != nil {
			t.Errorf("list: %v", err)
			return
		}
		for _, sb := range list.Msg.Sandboxes {
			if _, err := g.sandboxes.DeleteSandbox(ctx, connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: sb.SandboxId})); err != nil {
				t.Errorf("delete %s: %v", sb.SandboxId, err)
				continue
			}
			g.waitState(t, sb.SandboxId, sandboxv1.State_STATE_TERMINATED)
		}
	})

	src := g.create(t, scratchSpec("work", "1Gi", ""), "")
	g.waitState(t, src.SandboxId, sandboxv1.State_STATE_RUNNING)
	g.sh(t, src.SandboxId, `dd if=/dev/urandom of=/data/big bs=1M count=384 2>/dev/null && printf small > /data/small && sync`)
	id := g.snapshot(t, src.SandboxId, "work", "").GetFileSystemSnapshotId()
	key := e.objectKey(t, id)
	deadline := time.Now().Add(30 * time.Second)
	parts := 0
	for parts < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("the upload did not get 2 parts into the bucket within 30 s (uploads %q)", e.incompleteUploads(t))
		}
		time.Sleep(20 * time.Millisecond)
		parts = e.uploadedParts(t)
	}
	proc.stop(syscall.SIGKILL) // a crash: no cleanup at all
	if len(e.incompleteUploads(t)) == 0 {
		t.Fatal("no multipart upload left by the killed runner: the upload was not cut off mid-way")
	}
	if caps, _ := os.ReadDir(filepath.Join(dataDir, "sandboxes", ".volumes", "mnt", "captures")); len(caps) != 1 {
		t.Errorf("the killed runner left %d volume captures, want 1 (the test's premise)", len(caps))
	}
	t.Logf("runner killed with %d parts uploaded", parts)

	proc = startRunnerProc(t, bin, args...)
	got := g.waitSnapshot(t, id, 30*time.Second)
	if got.GetState() != sandboxv1.SnapshotState_SNAPSHOT_STATE_FAILED ||
		!strings.HasPrefix(got.GetStateReason(), apierr.FSSCreateFailed+": ") || !strings.Contains(got.GetStateReason(), "runner restarted during the upload") {
		t.Errorf("snapshot after the runner was killed mid-upload: %s (%q), want FAILED with %s: the runner restarted during the upload",
			got.GetState(), got.GetStateReason(), apierr.FSSCreateFailed)
	}
	deadline = time.Now().Add(30 * time.Second)
	for {
		_, statErr := e.blobs.Stat(context.Background(), key)
		objs, ups := e.objects(t), e.incompleteUploads(t)
		if errors.Is(statErr, blob.ErrNotFound) && len(objs) == 0 && len(ups) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the restart: Stat %s: %v; objects %q; multipart uploads %q; want none", key, statErr, objs, ups)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if caps, err := os.ReadDir(filepath.Join(dataDir, "sandboxes", ".volumes", "mnt", "captures")); err != nil || len(caps) != 0 {
		t.Errorf("volume captures after the restart: %d (%v), want none", len(caps), err)
	}
	g.waitState(t, src.SandboxId, sandboxv1.State_STATE_RUNNING)
	if out := g.sh(t, src.SandboxId, `cat /data/small; stat -c ' %s' /data/big`); out != "small 402653184\n" {
		t.Errorf("source volume after the restart: %q", out)
	}
	g.sh(t, src.SandboxId, `rm /data/big`)
	again := g.waitSnapshot(t, g.snapshot(t, src.SandboxId, "work", "").GetFileSystemSnapshotId(), time.Minute)
	e.wantReady(t, again)
	fork := g.createRetrying(t, scratchSpec("work", "1Gi", again.GetFileSystemSnapshotId()))
	g.waitState(t, fork.SandboxId, sandboxv1.State_STATE_RUNNING)
	if out := g.sh(t, fork.SandboxId, `cat /data/small; test -e /data/big || echo " no big"`); out != "small no big\n" {
		t.Errorf("restored from the snapshot after the restart: %q", out)
	}
}

// createRetrying creates like the official clients do after a runner restart: the gateway
// places only on runners its periodic probe saw up, so until that probe has run again a
// create is UNAVAILABLE (CWSANDBOX_RUNNER_UNAVAILABLE), which the clients retry.
func (g *gw) createRetrying(t *testing.T, sp *sandboxv1.SandboxSpec) *sandboxv1.Sandbox {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		res, err := g.sandboxes.CreateSandbox(context.Background(), connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: sp}}))
		if err == nil {
			return res.Msg
		}
		if connect.CodeOf(err) != connect.CodeUnavailable || time.Now().After(deadline) {
			t.Fatalf("create: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
