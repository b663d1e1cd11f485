package s3_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/minio/minio-go/v7"

	"github.com/sandboxd/sandboxd/internal/blob"
	"github.com/sandboxd/sandboxd/internal/blob/blobtest"
	"github.com/sandboxd/sandboxd/internal/blob/s3"
	"github.com/sandboxd/sandboxd/internal/blob/s3/s3test"
)

// TestS3 runs everything against one SeaweedFS server (~10 s to start).
func TestS3(t *testing.T) {
	srv := s3test.Start(t)
	t.Run("Conformance", func(t *testing.T) { testConformance(t, srv) })
	t.Run("NoStagingLeft", func(t *testing.T) { testNoStagingLeft(t, srv) })
	t.Run("NewMissingBucket", func(t *testing.T) { testNewMissingBucket(t, srv) })
	t.Run("DeleteRemovesWhatAKilledPutLeft", func(t *testing.T) { testDeleteKilledPut(t, srv) })
}

func testConformance(t *testing.T, srv *s3test.Server) {
	var bucket string
	blobtest.Run(t, func(t *testing.T) blob.Store {
		cfg := srv.Bucket(t)
		bucket = cfg.Bucket
		cfg.PartSize = 5 << 20 // the 64 MiB object goes in 13 parts
		s, err := s3.New(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}, blobtest.Options{Tamper: func(t *testing.T, key string) {
		// Rewrite the object behind the store's back, keeping its recorded sha256.
		ctx := context.Background()
		oi, err := srv.Client.StatObject(ctx, bucket, key, minio.StatObjectOptions{})
		if err != nil {
			t.Fatal(err)
		}
		r, err := srv.Client.GetObject(ctx, bucket, key, minio.GetObjectOptions{})
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(r)
		if err != nil {
			t.Fatal(err)
		}
		b[0] ^= 1
		if _, err := srv.Client.PutObject(ctx, bucket, key, bytes.NewReader(b), int64(len(b)), minio.PutObjectOptions{UserMetadata: oi.UserMetadata}); err != nil {
			t.Fatal(err)
		}
	}})
}

// testNoStagingLeft: a Put leaves nothing under the staging prefix, a failed one neither,
// and an object without a recorded sha256 (written by something else) is corrupt, not
// trusted.
func testNoStagingLeft(t *testing.T, srv *s3test.Server) {
	ctx := context.Background()
	cfg := srv.Bucket(t)
	s, err := s3.New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Put(ctx, "k", strings.NewReader("abc"), 3); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Put(ctx, "k2", strings.NewReader("abc"), 4); !errors.Is(err, blob.ErrSizeMismatch) {
		t.Fatalf("short Put: %v", err)
	}
	var keys []string
	for oi := range srv.Client.ListObjects(ctx, cfg.Bucket, minio.ListObjectsOptions{Recursive: true}) {
		if oi.Err != nil {
			t.Fatal(oi.Err)
		}
		keys = append(keys, oi.Key)
	}
	if len(keys) != 1 || keys[0] != "k" {
		t.Errorf("bucket holds %q, want only k", keys)
	}
	if _, err := srv.Client.PutObject(ctx, cfg.Bucket, "foreign", strings.NewReader("x"), 1, minio.PutObjectOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, "foreign"); !errors.Is(err, blob.ErrCorrupt) {
		t.Errorf("Get of an object without sha256: %v, want ErrCorrupt", err)
	}
}

func testNewMissingBucket(t *testing.T, srv *s3test.Server) {
	cfg := srv.Bucket(t)
	cfg.Bucket = "no-such-bucket"
	if _, err := s3.New(context.Background(), cfg); !errors.Is(err, s3.ErrNoSuchBucket) || !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("New with a missing bucket: %v", err)
	}
	// A bucket removed after New: Delete says so (ErrNoSuchBucket; SeaweedFS creates a
	// bucket a Put names, so Put is not checked here).
	ctx := context.Background()
	cfg = srv.Bucket(t)
	st, err := s3.New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Client.RemoveBucket(ctx, cfg.Bucket); err != nil {
		t.Fatal(err)
	}
	if err := st.Delete(ctx, "fss/o/x.tar.zst"); !errors.Is(err, s3.ErrNoSuchBucket) {
		t.Errorf("Delete in a removed bucket: %v", err)
	}
}

// testDeleteKilledPut: a Put whose process was killed leaves a multipart upload (or, past
// it, a staged object) under the key's staging prefix; Delete of the key removes both,
// reports the key itself missing, and leaves other keys' staging alone.
func testDeleteKilledPut(t *testing.T, srv *s3test.Server) {
	ctx := context.Background()
	cfg := srv.Bucket(t)
	s, err := s3.New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	core := minio.Core{Client: srv.Client}
	part := bytes.Repeat([]byte("x"), 5<<20)
	killedUpload := func(key string) {
		t.Helper()
		obj := s3.StagingOf(key) + "killed"
		id, err := core.NewMultipartUpload(ctx, cfg.Bucket, obj, minio.PutObjectOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := core.PutObjectPart(ctx, cfg.Bucket, obj, id, 1, bytes.NewReader(part), int64(len(part)), minio.PutObjectPartOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	killedUpload("fss/o/a.tar.zst")
	killedUpload("fss/o/b.tar.zst")
	if _, err := srv.Client.PutObject(ctx, cfg.Bucket, s3.StagingOf("fss/o/a.tar.zst")+"staged", strings.NewReader("abc"), 3, minio.PutObjectOptions{}); err != nil {
		t.Fatal(err)
	}
	staged := func(key string) (uploads, objects int) {
		t.Helper()
		for u := range srv.Client.ListIncompleteUploads(ctx, cfg.Bucket, s3.StagingOf(key), true) {
			if u.Err != nil {
				t.Fatal(u.Err)
			}
			uploads++
		}
		for oi := range srv.Client.ListObjects(ctx, cfg.Bucket, minio.ListObjectsOptions{Prefix: s3.StagingOf(key), Recursive: true}) {
			if oi.Err != nil {
				t.Fatal(oi.Err)
			}
			objects++
		}
		return uploads, objects
	}
	if u, o := staged("fss/o/a.tar.zst"); u != 1 || o != 1 {
		t.Fatalf("before Delete: %d uploads, %d staged objects; want 1 and 1", u, o)
	}
	if err := s.Delete(ctx, "fss/o/a.tar.zst"); !errors.Is(err, blob.ErrNotFound) {
		t.Errorf("Delete of a key only a killed Put left: %v, want ErrNotFound", err)
	}
	if u, o := staged("fss/o/a.tar.zst"); u != 0 || o != 0 {
		t.Errorf("after Delete: %d uploads, %d staged objects of the key left", u, o)
	}
	if u, _ := staged("fss/o/b.tar.zst"); u != 1 {
		t.Errorf("another key's staged upload: %d, want 1 (untouched)", u)
	}
	// A key stored and deleted: the plain case still works.
	if _, err := s.Put(ctx, "fss/o/b.tar.zst", strings.NewReader("abc"), 3); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, "fss/o/b.tar.zst"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Stat(ctx, "fss/o/b.tar.zst"); !errors.Is(err, blob.ErrNotFound) {
		t.Errorf("Stat after Delete: %v", err)
	}
	if u, o := staged("fss/o/b.tar.zst"); u != 0 || o != 0 {
		t.Errorf("after Delete of b: %d uploads, %d staged objects left", u, o)
	}
}
