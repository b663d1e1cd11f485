package blobconfig_test

import (
	"context"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/blob/blobconfig"
	"github.com/sandboxd/sandboxd/internal/blob/s3/s3test"
)

func TestBucketProberOfADirStoreIsNil(t *testing.T) {
	if p := (blobconfig.Config{Dir: t.TempDir()}).BucketProber(); p != nil {
		t.Fatal("a directory store probes buckets")
	}
}

// TestBucketProber runs against a real SeaweedFS server (skipped in -short).
func TestBucketProber(t *testing.T) {
	srv := s3test.Start(t)
	platform := srv.Bucket(t)
	other := srv.Bucket(t)
	probe := blobconfig.Config{S3: &platform}.BucketProber()
	ctx := context.Background()
	if err := probe(ctx, other.Bucket, ""); err != nil {
		t.Fatalf("an existing bucket: %v", err)
	}
	if err := probe(ctx, "no-such-bucket-here", ""); err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Fatalf("a missing bucket: %v", err)
	}
	if err := probe(ctx, "Bad_Name", ""); err == nil {
		t.Fatal("an invalid name probed fine")
	}
	// The platform's credentials are what is used: wrong ones reach nothing.
	wrong := platform
	wrong.SecretKey = "not-the-secret"
	if err := (blobconfig.Config{S3: &wrong}).BucketProber()(ctx, other.Bucket, ""); err == nil {
		t.Fatal("wrong credentials probed fine")
	}
}
