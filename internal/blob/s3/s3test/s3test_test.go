package s3test

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/minio/minio-go/v7"
)

// TestVersionMatchesScript: the binary Bin looks for is the one `make seaweedfs` builds.
func TestVersionMatchesScript(t *testing.T) {
	b, err := os.ReadFile("../../../../scripts/build-seaweedfs.sh")
	if err != nil {
		t.Fatal(err)
	}
	if want := `SANDBOXD_SEAWEEDFS_VERSION:-` + Version + `}`; !strings.Contains(string(b), want) {
		t.Errorf("scripts/build-seaweedfs.sh does not default to %s (want %q in it)", Version, want)
	}
}

// TestManyBuckets: a server holds more buckets than a test run makes, whatever the
// disk's free space (each bucket grows its own volumes; CI ran out at the third bucket
// when the count was sized by free space).
func TestManyBuckets(t *testing.T) {
	srv := Start(t)
	ctx := context.Background()
	for i := 0; i < 16; i++ {
		cfg := srv.Bucket(t)
		if _, err := srv.Client.PutObject(ctx, cfg.Bucket, "k", bytesReader("v"), 1, minio.PutObjectOptions{}); err != nil {
			t.Fatalf("bucket %d (%s): put: %v", i, cfg.Bucket, err)
		}
	}
}
