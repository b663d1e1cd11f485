package runner

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/blob"
	"github.com/sandboxd/sandboxd/internal/blob/blobconfig"
	"github.com/sandboxd/sandboxd/internal/blob/s3"
	"github.com/sandboxd/sandboxd/internal/blob/s3/s3test"
)

// TestForeignBucketOnADirStore: a runner whose store is a directory has no other bucket:
// a snapshot or restore naming one is refused CWSANDBOX_FSS_BUCKET_UNAVAILABLE (a delete's
// target is FAILED with it, the sandbox deleted anyway); a bucket name breaking S3's
// rules is invalid.
func TestForeignBucketOnADirStore(t *testing.T) {
	ctx := context.Background()
	be, store := newSnapBackend(t), openStore(t)
	r := snapRunner(t, be, t.TempDir(), store, func(c *Config) { c.BlobConfig = blobconfig.Config{Dir: "/unused"} })
	defer r.Close()
	sb := runningWithVolume(t, r, be)
	tgt := SnapshotTarget{Volume: "data", SnapshotID: "fss-own", BlobKey: "fss/o/fss-own.tar.zst", Bucket: "acme-fss"}
	if _, err := r.SnapshotVolume(ctx, sb.ID, tgt); reasonOf(err) != apierr.FSSBucketUnavailable {
		t.Fatalf("a foreign bucket on a dir store: %v", err)
	}
	if j := r.GetSnapshotJob(tgt.SnapshotID); !strings.Contains(j.Message, "unknown") {
		t.Fatalf("a refused snapshot left a job: %+v", j)
	}
	var verr *ValidationError
	for _, bad := range []string{"Bad_Name", "a..b", "10.0.0.1", "xn--abc"} {
		bt := tgt
		bt.Bucket = bad
		if _, err := r.SnapshotVolume(ctx, sb.ID, bt); !errors.As(err, &verr) || !strings.Contains(err.Error(), "bucket") {
			t.Errorf("bucket %q: %v", bad, err)
		}
	}
	// The runner's own bucket by name is its own store.
	local := tgt
	local.SnapshotID, local.Bucket = "fss-local", "local"
	if _, err := r.SnapshotVolume(ctx, sb.ID, local); err != nil {
		t.Fatalf("the runner's own bucket by name: %v", err)
	}
	if j := waitJob(t, r, "fss-local"); j.State != SnapshotReady {
		t.Fatalf("job = %+v", j)
	}
	src := SnapshotSource{SnapshotID: "fss-local", BlobKey: local.BlobKey, Digest: r.GetSnapshotJob("fss-local").Digest,
		SizeBytes: r.GetSnapshotJob("fss-local").SizeBytes, Bucket: "acme-fss"}
	restored, err := r.Create(ctx, restoreRequest(src))
	if err != nil {
		t.Fatal(err)
	}
	end, err := r.WaitTerminal(ctx, restored.ID)
	if err != nil || end.Reason != apierr.FSSRestoreFailed || !strings.Contains(end.Message, "bucket acme-fss cannot be used") {
		t.Fatalf("restore from a foreign bucket on a dir store: %+v, %v", end, err)
	}
	_, jobs, err := r.DeleteWithSnapshots(sb.ID, 0, []SnapshotTarget{{Volume: "data", SnapshotID: "fss-del", BlobKey: "fss/o/fss-del.tar.zst", Bucket: "acme-fss"}})
	if err != nil || len(jobs) != 1 || jobs[0].State != SnapshotFailed || jobs[0].Reason != apierr.FSSBucketUnavailable {
		t.Fatalf("DeleteWithSnapshots to a foreign bucket: %+v, %v", jobs, err)
	}
	if end, err := r.WaitTerminal(ctx, sb.ID); err != nil || !end.State.Terminal() {
		t.Fatalf("the sandbox was not deleted: %+v, %v", end, err)
	}
}

// TestSnapshotS3OwnBucket: with an S3 store, a snapshot naming another bucket of the
// same endpoint lands there (not in the runner's bucket), is restored from there, and a
// restart deletes an interrupted upload's object in that bucket; a bucket that does not
// exist is CWSANDBOX_FSS_BUCKET_UNAVAILABLE. Real SeaweedFS (skipped with -short).
func TestSnapshotS3OwnBucket(t *testing.T) {
	srv := s3test.Start(t)
	ctx := context.Background()
	pcfg, ocfg := srv.Bucket(t), srv.Bucket(t)
	platform, err := s3.New(ctx, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	own, err := s3.New(ctx, ocfg)
	if err != nil {
		t.Fatal(err)
	}
	withCfg := func(c *Config) { c.BlobConfig = blobconfig.Config{S3: &pcfg} }
	be, data := newSnapBackend(t), t.TempDir()
	r := snapRunner(t, be, data, platform, withCfg)
	sb := runningWithVolume(t, r, be)
	tgt := SnapshotTarget{Volume: "data", SnapshotID: "fss-own", BlobKey: "fss/org-1/fss-own.tar.zst", Bucket: ocfg.Bucket}
	if _, err := r.SnapshotVolume(ctx, sb.ID, tgt); err != nil {
		t.Fatal(err)
	}
	j := waitJob(t, r, tgt.SnapshotID)
	if j.State != SnapshotReady {
		t.Fatalf("job = %+v", j)
	}
	if info, err := own.Stat(ctx, tgt.BlobKey); err != nil || info.SHA256 != j.Digest || info.Size != j.SizeBytes {
		t.Fatalf("object in the own bucket %+v, %v; job %+v", info, err, j)
	}
	if _, err := platform.Stat(ctx, tgt.BlobKey); !errors.Is(err, blob.ErrNotFound) {
		t.Fatalf("the archive is in the platform bucket too: %v", err)
	}
	src := SnapshotSource{SnapshotID: j.SnapshotID, BlobKey: tgt.BlobKey, Digest: j.Digest, SizeBytes: j.SizeBytes, ContentBytes: j.ContentBytes, Bucket: ocfg.Bucket}
	restored, err := r.Create(ctx, restoreRequest(src))
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "restored sandbox running", func() bool { s, _ := r.Get(restored.ID); return s.State == StateRunning })
	// The same key from the platform bucket (where it is not) fails the restore: the
	// bucket named is the one read.
	wrong := src
	wrong.Bucket = ""
	wrong.Digest = strings.Repeat("ab", 32) // another digest: not served from the cache
	failed, err := r.Create(ctx, restoreRequest(wrong))
	if err != nil {
		t.Fatal(err)
	}
	if end, err := r.WaitTerminal(ctx, failed.ID); err != nil || end.Reason != apierr.FSSRestoreFailed || !strings.Contains(end.Message, "missing") {
		t.Fatalf("restore from the wrong bucket: %+v, %v", end, err)
	}

	missing := tgt
	missing.SnapshotID, missing.Bucket = "fss-missing", "no-such-bucket-here"
	if _, err := r.SnapshotVolume(ctx, sb.ID, missing); reasonOf(err) != apierr.FSSBucketUnavailable || !strings.Contains(err.Error(), "does not exist") {
		t.Fatalf("a missing bucket: %v", err)
	}

	// An upload under way at a restart: the next runner deletes its object in its bucket.
	be.mu.Lock()
	be.hold = make(chan struct{})
	be.mu.Unlock()
	partial := SnapshotTarget{Volume: "data", SnapshotID: "fss-partial", BlobKey: "fss/org-1/fss-partial.tar.zst", Bucket: ocfg.Bucket}
	if _, err := r.SnapshotVolume(ctx, sb.ID, partial); err != nil {
		t.Fatal(err)
	}
	if _, err := own.Put(ctx, partial.BlobKey, strings.NewReader("partial"), -1); err != nil {
		t.Fatal(err)
	}
	r.Close()
	r2 := snapRunner(t, be, data, platform, withCfg)
	defer r2.Close()
	eventually(t, "the partial object deleted from the own bucket", func() bool {
		_, err := own.Stat(ctx, partial.BlobKey)
		return errors.Is(err, blob.ErrNotFound)
	})
	if _, err := own.Stat(ctx, tgt.BlobKey); err != nil {
		t.Fatalf("a READY snapshot's object went with the restart: %v", err)
	}
}
