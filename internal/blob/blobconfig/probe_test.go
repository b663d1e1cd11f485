package blobconfig_test

import (
	"context"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/blob/blobconfig"
	"github.com/sandboxd/sandboxd/internal/blob/s3"
	"github.com/sandboxd/sandboxd/internal/blob/s3/s3test"
)

func TestBucketProberOfADirStoreIsNil(t *testing.T) {
	if p := (blobconfig.Config{Dir: t.TempDir()}).BucketProber(); p != nil {
		t.Fatal("a directory store probes buckets")
	}
}

func TestWithBucket(t *testing.T) {
	base := blobconfig.Config{S3: &s3.Config{Endpoint: "s3.example.com", Bucket: "platform", Region: "us-east-1", AccessKey: "a", SecretKey: "s"}}
	c, err := base.WithBucket("acme-fss", "")
	if err != nil || c.S3.Bucket != "acme-fss" || c.S3.Region != "us-east-1" || c.S3.Endpoint != "s3.example.com" || c.Bucket() != "acme-fss" {
		t.Fatalf("WithBucket = %+v, %v", c.S3, err)
	}
	if base.S3.Bucket != "platform" {
		t.Fatal("WithBucket changed its receiver")
	}
	if c, err := base.WithBucket("acme-fss", "eu-west-1"); err != nil || c.S3.Region != "eu-west-1" {
		t.Fatalf("with a region: %+v, %v", c.S3, err)
	}
	for _, bad := range [][2]string{{"Bad_Name", ""}, {"acme-fss", "EU"}} {
		if _, err := base.WithBucket(bad[0], bad[1]); err == nil {
			t.Errorf("WithBucket%v: no error", bad)
		}
	}
	if _, err := (blobconfig.Config{Dir: "/x"}).WithBucket("acme-fss", ""); err == nil {
		t.Error("a directory store gave another bucket")
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
