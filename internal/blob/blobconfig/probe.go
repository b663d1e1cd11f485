package blobconfig

import (
	"context"

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
	base := *c.S3
	return func(ctx context.Context, bucket, region string) error {
		cfg := base
		cfg.Bucket = bucket
		if region != "" {
			cfg.Region = region
		}
		st, err := s3.New(ctx, cfg) // validates the name, checks that the bucket exists
		if err != nil {
			return err
		}
		for _, err := range st.List(ctx, "fss/") {
			return err // the first object (or error) answers: listing works
		}
		return ctx.Err()
	}
}
