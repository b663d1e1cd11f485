package blobconfig

import (
	"context"
	"errors"
	"testing"

	"github.com/sandboxd/sandboxd/internal/blob"
	"github.com/sandboxd/sandboxd/internal/blob/dir"
	"github.com/sandboxd/sandboxd/internal/blob/s3"
)

func TestBucketsCachesBoundedAndRefusesOnADirStore(t *testing.T) {
	ctx := context.Background()
	platform, err := dir.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	base := Config{S3: &s3.Config{Endpoint: "s3.example.com", Bucket: "platform", AccessKey: "a", SecretKey: "s"}}
	b := NewBuckets(base, platform, 2)
	opened := map[string]int{}
	b.open = func(_ context.Context, c Config) (blob.Store, error) {
		opened[c.S3.Bucket]++
		if c.S3.Bucket == "missing" {
			return nil, s3.ErrNoSuchBucket
		}
		st, err := dir.Open(t.TempDir())
		return st, err
	}
	for _, name := range []string{"", "platform"} {
		if st, err := b.Store(ctx, name); err != nil || st != blob.Store(platform) {
			t.Fatalf("Store(%q) = %v, %v: want the platform store", name, st, err)
		}
	}
	a1, err := b.Store(ctx, "acme-fss")
	if err != nil {
		t.Fatal(err)
	}
	if a2, _ := b.Store(ctx, "acme-fss"); a2 != a1 || opened["acme-fss"] != 1 {
		t.Fatalf("acme-fss opened %d times, same store %v", opened["acme-fss"], a2 == a1)
	}
	if _, err := b.Store(ctx, "missing"); !errors.Is(err, s3.ErrNoSuchBucket) {
		t.Fatalf("a missing bucket: %v", err)
	}
	if _, err := b.Store(ctx, "missing"); err == nil || opened["missing"] != 2 {
		t.Fatalf("a failed open was kept: %d opens, %v", opened["missing"], err)
	}
	if _, err := b.Store(ctx, "Bad_Name"); err == nil || opened["Bad_Name"] != 0 {
		t.Fatalf("an invalid bucket name was opened: %v", err)
	}
	if _, err := b.Store(ctx, "192.168.1.1"); err == nil {
		t.Fatal("an IP address as a bucket name was accepted")
	}
	_, _ = b.Store(ctx, "other-fss")
	_, _ = b.Store(ctx, "acme-fss") // used: other-fss is now the least recent
	_, _ = b.Store(ctx, "third-fss")
	if b.Len() != 2 {
		t.Fatalf("%d stores kept, want at most 2", b.Len())
	}
	if _, _ = b.Store(ctx, "acme-fss"); opened["acme-fss"] != 1 {
		t.Fatal("the recently used store was dropped")
	}
	if _, _ = b.Store(ctx, "other-fss"); opened["other-fss"] != 2 {
		t.Fatal("the least recently used store was kept past the bound")
	}

	d := NewBuckets(Config{Dir: "/x"}, platform, 0)
	if st, err := d.Store(ctx, "local"); err != nil || st != blob.Store(platform) || d.Platform() != "local" {
		t.Fatalf("a dir store's own bucket: %v, %v", st, err)
	}
	if _, err := d.Store(ctx, "acme-fss"); !errors.Is(err, ErrNoOtherBucket) {
		t.Fatalf("a dir store opened another bucket: %v", err)
	}
}
