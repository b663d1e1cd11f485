package registry

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	storagedriver "github.com/distribution/distribution/v3/registry/storage/driver"
	"github.com/distribution/distribution/v3/registry/storage/driver/inmemory"
	"github.com/minio/minio-go/v7"

	"github.com/sandboxd/sandboxd/internal/blob/s3"
	"github.com/sandboxd/sandboxd/internal/blob/s3/s3test"
)

// countingDriver counts the bytes its Readers return.
type countingDriver struct {
	storagedriver.StorageDriver
	n atomic.Int64
}

func (d *countingDriver) Reader(ctx context.Context, path string, offset int64) (io.ReadCloser, error) {
	r, err := d.StorageDriver.Reader(ctx, path, offset)
	if err != nil {
		return nil, err
	}
	return countingReader{r, &d.n}, nil
}

type countingReader struct {
	io.ReadCloser
	n *atomic.Int64
}

func (r countingReader) Read(p []byte) (int, error) {
	n, err := r.ReadCloser.Read(p)
	r.n.Add(int64(n))
	return n, err
}

// TestLimitedDriverGetContent: GetContent refuses an object over 4 MiB having read at
// most 4 MiB + 1 of it; a small one (a link) and one of exactly 4 MiB are read.
func TestLimitedDriverGetContent(t *testing.T) {
	ctx := context.Background()
	inner := &countingDriver{StorageDriver: inmemory.New()}
	d := limitedDriver{inner}
	link := []byte("sha256:" + strings.Repeat("a", 64))
	if err := inner.PutContent(ctx, "/small/link", link); err != nil {
		t.Fatal(err)
	}
	if err := inner.PutContent(ctx, "/max/link", make([]byte, maxGetContent)); err != nil {
		t.Fatal(err)
	}
	if err := inner.PutContent(ctx, "/big/link", make([]byte, 5<<20)); err != nil {
		t.Fatal(err)
	}
	if b, err := d.GetContent(ctx, "/small/link"); err != nil || !bytes.Equal(b, link) {
		t.Fatalf("small: %q %v", b, err)
	}
	if b, err := d.GetContent(ctx, "/max/link"); err != nil || len(b) != maxGetContent {
		t.Fatalf("4 MiB: %d bytes, %v", len(b), err)
	}
	inner.n.Store(0)
	b, err := d.GetContent(ctx, "/big/link")
	if err == nil || b != nil {
		t.Fatalf("5 MiB: %d bytes, %v; want refused", len(b), err)
	}
	if n := inner.n.Load(); n > maxGetContent+1 {
		t.Errorf("5 MiB: read %d bytes before refusing", n)
	}
	if _, err := d.GetContent(ctx, "/missing/link"); !isNotFound(err) {
		t.Errorf("missing: %v, want not found", err)
	}
}

// TestOrgStorageOversizedLink: a 5 MiB layer link written into an organization's own
// bucket (by whoever holds its credentials) makes the blob's HEAD and GET fail, without
// the registry reading it whole; the registry's S3 storages are opened as
// limitedS3Driver.
func TestOrgStorageOversizedLink(t *testing.T) {
	srv := s3test.Start(t)
	platform, own := srv.Bucket(t), srv.Bucket(t)
	f := newFixture(t, Config{S3: &platform, OrgStorage: func(_ context.Context, org string) (*s3.Config, error) {
		if org == "org-a" {
			return &own, nil
		}
		return nil, nil
	}})
	img := push(t, f, "org-a/app:v1", basic(adminA))
	layers, _ := img.Layers()
	d, _ := layers[0].Digest()
	key := "registry/docker/registry/v2/repositories/org-a/app/_layers/sha256/" + d.Hex + "/link"
	big := bytes.Repeat([]byte("x"), 5<<20)
	if _, err := srv.Client.PutObject(context.Background(), own.Bucket, key, bytes.NewReader(big), int64(len(big)), minio.PutObjectOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{http.MethodHead, http.MethodGet} {
		req, _ := http.NewRequest(m, f.srv.URL+"/v2/org-a/app/blobs/"+d.String(), nil)
		req.SetBasicAuth("x", adminA)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Errorf("%s of a blob with a 5 MiB link: 200", m)
		}
	}
	if typ, _, err := s3Params(&own); err != nil || typ != limitedS3Driver {
		t.Errorf("s3Params: %s %v, want %s", typ, err, limitedS3Driver)
	}
}
