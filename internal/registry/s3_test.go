package registry

import (
	"context"
	"errors"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/minio/minio-go/v7"
	"github.com/opencontainers/go-digest"

	"github.com/sandboxd/sandboxd/internal/blob/s3"
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

// TestOrgStorage: an organization with its own bucket (Config.OrgStorage) has its pushes
// land there and nowhere else, pulls them back, still pulls what it pushed before the
// switch (from the platform storage), and GC collects its bucket for its repositories
// only. Another organization stays on the platform storage.
func TestOrgStorage(t *testing.T) {
	srv := s3test.Start(t)
	platform, own := srv.Bucket(t), srv.Bucket(t)
	var mu sync.Mutex
	where := map[string]*s3.Config{}
	var failing error
	f := newFixture(t, Config{S3: &platform, OrgStorage: func(_ context.Context, org string) (*s3.Config, error) {
		mu.Lock()
		defer mu.Unlock()
		if failing != nil {
			return nil, failing
		}
		return where[org], nil
	}})
	set := func(org string, c *s3.Config) {
		mu.Lock()
		where[org] = c
		mu.Unlock()
		f.reg.ForgetOrgStorage(org)
	}
	keys := func(bucket, sub string) []string {
		t.Helper()
		var out []string
		for o := range srv.Client.ListObjects(context.Background(), bucket, minio.ListObjectsOptions{Recursive: true, Prefix: "registry/docker/registry/v2/" + sub}) {
			if o.Err != nil {
				t.Fatal(o.Err)
			}
			out = append(out, o.Key)
		}
		return out
	}
	pull := func(repo, key string) v1.Hash {
		t.Helper()
		img, err := remote.Image(f.ref(t, repo), basic(key))
		if err != nil {
			t.Fatalf("pull %s: %v", repo, err)
		}
		layers, _ := img.Layers()
		for _, l := range layers {
			rc, err := l.Compressed()
			if err != nil {
				t.Fatalf("pull %s: layer: %v", repo, err)
			}
			if _, err := io.Copy(io.Discard, rc); err != nil {
				t.Fatalf("pull %s: layer: %v", repo, err)
			}
			_ = rc.Close()
		}
		d, _ := img.Digest()
		return d
	}

	before := push(t, f, "org-a/old:v1", basic(adminA)) // on the platform storage
	set("org-a", &own)
	img := push(t, f, "org-a/app:v1", basic(adminA))
	if len(keys(own.Bucket, "repositories/org-a/app/")) == 0 {
		t.Fatal("org-a's push is not in its bucket")
	}
	if k := keys(platform.Bucket, "repositories/org-a/app/"); len(k) != 0 {
		t.Fatalf("org-a's push is in the platform storage too: %v", k)
	}
	// Every blob of the image is in the bucket, none in the platform's.
	layers, _ := img.Layers()
	for _, l := range layers {
		d, _ := l.Digest()
		if len(keys(own.Bucket, "blobs/sha256/"+d.Hex[:2]+"/"+d.Hex+"/")) == 0 {
			t.Errorf("layer %s not in org-a's bucket", d)
		}
		if len(keys(platform.Bucket, "blobs/sha256/"+d.Hex[:2]+"/"+d.Hex+"/")) != 0 {
			t.Errorf("layer %s in the platform storage", d)
		}
	}
	if want, _ := img.Digest(); pull("org-a/app:v1", userA) != want {
		t.Fatal("pulled another image")
	}
	// Pushed before the switch: still pulled (from the platform storage).
	if want, _ := before.Digest(); pull("org-a/old:v1", userA) != want {
		t.Fatal("pulled another old image")
	}
	// Pushing an image whose blobs are only on the platform storage uploads them (a blob
	// HEAD does not fall back).
	if err := remote.Write(f.ref(t, "org-a/copy:v1"), before, basic(adminA)); err != nil {
		t.Fatalf("push of the old image into the bucket: %v", err)
	}
	if len(keys(own.Bucket, "repositories/org-a/copy/")) == 0 {
		t.Fatal("copy not in the bucket")
	}
	// Another organization: the platform storage.
	push(t, f, "org-b/app:v1", basic(adminB))
	if len(keys(platform.Bucket, "repositories/org-b/app/")) == 0 || len(keys(own.Bucket, "repositories/org-b/")) != 0 {
		t.Fatal("org-b's push is not (only) in the platform storage")
	}
	// The other organization cannot reach org-a's bucket through the registry.
	if _, err := remote.Image(f.ref(t, "org-a/app:v1"), basic(adminB)); status(err) != http.StatusNotFound {
		t.Fatalf("org-b pulling org-a's image: %v, want 404", err)
	}

	// org-b shares the bucket for one push: org-a's GC must not touch it.
	set("org-b", &own)
	shared := push(t, f, "org-b/shared:v1", basic(adminB))
	set("org-b", nil)
	gone := push(t, f, "org-a/gone:v1", basic(adminA))
	keep, _ := img.Digest()
	f.now = time.Now().Add(2 * DefaultGCGrace)
	res, err := f.reg.GC(context.Background(), GCOptions{OrgStorages: []string{"org-a"},
		Keep: func(org, _ string, d digest.Digest, _ []string) bool {
			return org == "org-a" && d.String() == keep.String()
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("gc: %+v", res)
	f.now = time.Now()
	pull("org-a/app:v1", userA)
	gd, _ := gone.Digest()
	if _, err := remote.Image(f.ref(t, "org-a/gone@"+gd.String()), basic(userA)); status(err) != http.StatusNotFound {
		t.Fatalf("collected image in org-a's bucket: %v, want 404", err)
	}
	set("org-b", &own)
	if want, _ := shared.Digest(); pull("org-b/shared:v1", adminB) != want {
		t.Fatal("org-b's image in the shared bucket changed")
	}
	set("org-b", nil)

	// The resolver failing: 503 for the organization, never the platform storage.
	mu.Lock()
	failing = errors.New("store down")
	mu.Unlock()
	f.reg.ForgetOrgStorage("org-a")
	if _, err := remote.Image(f.ref(t, "org-a/app:v1"), basic(userA)); status(err) != http.StatusServiceUnavailable {
		t.Fatalf("pull with the storage unknown: %v, want 503", err)
	}
}

// TestOrgGCSharedBucketLinks: in a bucket two organizations share, one's GC keeps a blob
// that only the other's repository links (uploaded, no manifest referencing it yet).
func TestOrgGCSharedBucketLinks(t *testing.T) {
	srv := s3test.Start(t)
	platform, own := srv.Bucket(t), srv.Bucket(t)
	f := newFixture(t, Config{S3: &platform, OrgStorage: func(_ context.Context, org string) (*s3.Config, error) {
		return &own, nil // org-a and org-b share a bucket
	}})
	push(t, f, "org-a/app:v1", basic(adminA))
	layer, err := random.Layer(1024, types.DockerLayer)
	if err != nil {
		t.Fatal(err)
	}
	repoB, err := name.NewRepository(f.host+"/org-b/wip", name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.WriteLayer(repoB, layer, basic(adminB)); err != nil {
		t.Fatal(err)
	}
	f.now = time.Now().Add(2 * DefaultGCGrace)
	if _, err := f.reg.GC(context.Background(), GCOptions{OrgStorages: []string{"org-a"}}); err != nil {
		t.Fatal(err)
	}
	f.now = time.Now()
	d, _ := layer.Digest()
	got, err := remote.Layer(repoB.Digest(d.String()), basic(adminB))
	if err != nil {
		t.Fatal(err)
	}
	rc, err := got.Compressed()
	if err == nil {
		_, err = io.Copy(io.Discard, rc)
		_ = rc.Close()
	}
	if err != nil {
		t.Fatalf("org-b's blob after org-a's GC of the shared bucket: %v", err)
	}
}
