package store

import (
	"context"
	"fmt"
	"time"
)

// ---- file-system snapshot bucket settings ----

// FSSBucketConfigs are the organizations' file-system snapshot bucket settings
// (SettingsService.Get/UpdateFileSystemSnapshotBucketConfig): a config names the
// organization's own bucket for new snapshots; none means the platform's bucket.
type FSSBucketConfigs interface {
	// Get returns org's config, ErrNotFound when it has none (the platform's bucket).
	Get(ctx context.Context, org string) (FSSBucketConfig, error)
	// Put creates or replaces org's config and returns it with UpdatedAt set.
	// ErrInvalid for an empty org or bucket, or one too long; ErrAlreadyExists (key
	// "bucket_name") when another organization has the bucket.
	Put(ctx context.Context, c FSSBucketConfig) (FSSBucketConfig, error)
	// Delete removes org's config (back to the platform's bucket); none is not an error.
	Delete(ctx context.Context, org string) error
}

// FSSBucketConfig is an organization's own snapshot bucket.
type FSSBucketConfig struct {
	Org       string
	Bucket    string
	Region    string // "" when not given
	UpdatedAt time.Time
}

// Bounds of a stored FSSBucketConfig (S3's: a bucket name is at most 63 bytes; the
// gateway checks the syntax).
const (
	maxFSSBucketLen = 63
	maxFSSRegionLen = 64
)

type fssBuckets struct{ s *sqlStore }

func (s *sqlStore) FSSBucketConfigs() FSSBucketConfigs { return fssBuckets{s} }

func (b fssBuckets) Get(ctx context.Context, org string) (FSSBucketConfig, error) {
	var c FSSBucketConfig
	var at dbTime
	err := b.s.d.queryRow(ctx, `SELECT org_id, bucket_name, region, updated_at FROM fss_bucket_configs WHERE org_id = $1`, org).
		Scan(&c.Org, &c.Bucket, &c.Region, &at)
	if err != nil {
		return FSSBucketConfig{}, b.s.readErr("fss bucket config of "+org, err)
	}
	c.UpdatedAt = at.t
	return c, nil
}

func (b fssBuckets) Put(ctx context.Context, c FSSBucketConfig) (FSSBucketConfig, error) {
	if err := required("org", c.Org, "bucket", c.Bucket); err != nil {
		return FSSBucketConfig{}, err
	}
	if len(c.Bucket) > maxFSSBucketLen || len(c.Region) > maxFSSRegionLen {
		return FSSBucketConfig{}, invalid("bucket (at most %d bytes) or region (at most %d) too long", maxFSSBucketLen, maxFSSRegionLen)
	}
	c.UpdatedAt = now()
	if _, err := b.s.d.exec(ctx, `INSERT INTO fss_bucket_configs (org_id, bucket_name, region, updated_at) VALUES ($1, $2, $3, $4)
		ON CONFLICT (org_id) DO UPDATE SET bucket_name = excluded.bucket_name, region = excluded.region, updated_at = excluded.updated_at`,
		c.Org, c.Bucket, c.Region, c.UpdatedAt); err != nil {
		return FSSBucketConfig{}, b.s.writeErr("fss bucket config", "put", err)
	}
	return c, nil
}

func (b fssBuckets) Delete(ctx context.Context, org string) error {
	if _, err := b.s.d.exec(ctx, `DELETE FROM fss_bucket_configs WHERE org_id = $1`, org); err != nil {
		return fmt.Errorf("delete fss bucket config of %s: %w", org, err)
	}
	return nil
}
