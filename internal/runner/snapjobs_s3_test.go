package runner

import (
	"context"
	"testing"

	"github.com/sandboxd/sandboxd/internal/blob/s3"
	"github.com/sandboxd/sandboxd/internal/blob/s3/s3test"
)

// TestSnapshotS3: a snapshot job streams its archive into a real S3-compatible store
// (SeaweedFS, multipart with an unknown size) and is READY with the digest the store
// recorded; a sandbox restored from it downloads and checks it.
func TestSnapshotS3(t *testing.T) {
	srv := s3test.Start(t) // skipped with -short
	store, err := s3.New(context.Background(), srv.Bucket(t))
	if err != nil {
		t.Fatal(err)
	}
	be := newSnapBackend(t)
	r := snapRunner(t, be, t.TempDir(), store, nil)
	defer r.Close()
	sb := runningWithVolume(t, r, be)
	tgt := SnapshotTarget{Volume: "data", SnapshotID: "fss-s3", BlobKey: "fss/org-1/fss-s3.tar.zst"}
	if _, err := r.SnapshotVolume(context.Background(), sb.ID, tgt); err != nil {
		t.Fatal(err)
	}
	j := waitJob(t, r, tgt.SnapshotID)
	if j.State != SnapshotReady {
		t.Fatalf("job = %+v", j)
	}
	info, err := store.Stat(context.Background(), tgt.BlobKey)
	if err != nil || info.SHA256 != j.Digest || info.Size != j.SizeBytes {
		t.Fatalf("object %+v, %v; job %+v", info, err, j)
	}
	src := SnapshotSource{SnapshotID: j.SnapshotID, BlobKey: tgt.BlobKey, Digest: j.Digest, SizeBytes: j.SizeBytes, ContentBytes: j.ContentBytes}
	restored, err := r.Create(context.Background(), restoreRequest(src))
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "restored sandbox running", func() bool { s, _ := r.Get(restored.ID); return s.State == StateRunning })
	if got := r.CachedSnapshots(); len(got) != 1 || got[0] != j.Digest {
		t.Fatalf("cached %v, want %s", got, j.Digest)
	}
}
