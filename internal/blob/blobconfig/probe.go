package blobconfig

import (
	"context"
	"errors"
	"fmt"

	"github.com/sandboxd/sandboxd/internal/blob/s3"
)

// BucketProber returns a check that another bucket is usable with c's S3 endpoint and
// credentials (an organization's own snapshot bucket): the bucket exists and its fss/
// objects can be listed. region "" keeps c's. It returns nil when c is not S3: a
// directory store has no other buckets.
func (c Config) BucketProber() func(ctx context.Context, bucket, region string) error {
	if c.S3 == nil {
		return nil
	}
	return func(ctx context.Context, bucket, region string) error {
		cfg, err := c.WithBucket(bucket, region)
		if err != nil {
			return err
		}
		st, err := s3.New(ctx, *cfg.S3) // checks that the bucket exists
		if err != nil {
			return err
		}
		for _, err := range st.List(ctx, "fss/") {
			return err // the first object (or error) answers: listing works
		}
		return ctx.Err()
	}
}

// ErrNoOtherBucket: the store (a directory store, or none) has no bucket but its own.
var ErrNoOtherBucket = errors.New("blob store: a directory store has no other bucket")

// WithBucket is c for another bucket of the same S3 endpoint and credentials (an
// organization's own snapshot bucket; region "" keeps c's), validated. A directory store
// has no other bucket: an error.
func (c Config) WithBucket(bucket, region string) (Config, error) {
	if c.S3 == nil {
		return Config{}, ErrNoOtherBucket
	}
	if why := s3.BucketNameProblem(bucket); why != "" {
		return Config{}, fmt.Errorf("blob store: bucket %q: %s", bucket, why)
	}
	s := *c.S3
	s.Bucket = bucket
	if region != "" {
		s.Region = region
	}
	if err := s.Validate(); err != nil {
		return Config{}, err
	}
	return Config{S3: &s}, nil
}
