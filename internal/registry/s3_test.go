package registry

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/minio/minio-go/v7"
	"github.com/opencontainers/go-digest"

	"github.com/sandboxd/sandboxd/internal/blob/s3/s3test"
)

// TestS3Storage pushes, pulls and collects with the storage in a SeaweedFS bucket (the
// multi-host configuration), through Distribution's s3-aws driver.
func TestS3Storage(t *testing.T) {
	srv := s3test.Start(t)
	bucket := srv.Bucket(t)
	f := newFixture(t, Config{S3: &bucket})
	img := push(t, f, "org-a/app:v1", basic(adminA))
	gone := push(t, f, "org-a/app:gone", basic(adminA))
	want, _ := img.Digest()
	got, err := remote.Image(f.ref(t, "org-a/app:v1"), basic(userA))
	if err != nil {
		t.Fatal(err)
	}
	if d, _ := got.Digest(); d != want {
		t.Fatalf("pulled %s, pushed %s", d, want)
	}
	layers, _ := got.Layers()
	for _, l := range layers {
		rc, err := l.Compressed()
		if err != nil {
			t.Fatal(err)
		}
		_ = rc.Close()
	}
	f.now = time.Now().Add(2 * DefaultGCGrace) // both pushes are old now
	if _, err := f.reg.GC(context.Background(), GCOptions{Keep: func(_, _ string, d digest.Digest, _ []string) bool { return d.String() == want.String() }}); err != nil {
		t.Fatal(err)
	}
	if _, err := remote.Image(f.ref(t, "org-a/app:v1"), basic(userA)); err != nil {
		t.Fatalf("kept image after GC: %v", err)
	}
	gd, _ := gone.Digest()
	if _, err := remote.Image(f.ref(t, "org-a/app@"+gd.String()), basic(userA)); status(err) != http.StatusNotFound {
		t.Fatalf("collected image: %v, want 404", err)
	}
	// The objects live under the registry's prefix of the bucket.
	n := 0
	for o := range srv.Client.ListObjects(context.Background(), bucket.Bucket, minioListAll()) {
		if o.Err != nil {
			t.Fatal(o.Err)
		}
		if len(o.Key) < len(S3Prefix) || "/"+o.Key[:len(S3Prefix)-1] != S3Prefix {
			t.Errorf("object %q outside %s", o.Key, S3Prefix)
		}
		n++
	}
	if n == 0 {
		t.Error("no objects in the bucket")
	}
}

func minioListAll() minio.ListObjectsOptions { return minio.ListObjectsOptions{Recursive: true} }
