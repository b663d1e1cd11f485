package store

import (
	"context"
	"fmt"
	"time"
)

// ---- build storage settings ----

// BuildStorageConfigs are the organizations' build storage settings
// (SettingsService.Get/UpdateBuildStorageConfig). An organization without one has the
// defaults (the gateway's: builds enabled, the platform's registry and bucket).
type BuildStorageConfigs interface {
	// Get returns org's config, ErrNotFound when it has none (the defaults).
	Get(ctx context.Context, org string) (BuildStorageConfig, error)
	// Put writes c as org's config if its current revision is revision (0: org has none
	// yet), ErrConflict otherwise, and returns it with Revision = revision+1 and
	// UpdateTime set. ErrInvalid for an empty org or a field too long.
	Put(ctx context.Context, c BuildStorageConfig, revision int64) (BuildStorageConfig, error)
}

// BuildStorageConfig is an organization's build storage settings as set (the gateway
// gives the meaning and the defaults).
type BuildStorageConfig struct {
	Org               string
	Enabled           bool
	Mode              int32 // coreweave.sandbox.v1.BuildStorageMode
	Bucket            string
	Location          string
	RegistryNamespace string
	BillingReference  string
	Revision          int64
	UpdateTime        time.Time
}

// maxBuildStorageField bounds each text field of a stored BuildStorageConfig (the
// gateway checks the values).
const maxBuildStorageField = 256

type buildStorage struct{ s *sqlStore }

func (s *sqlStore) BuildStorageConfigs() BuildStorageConfigs { return buildStorage{s} }

const buildStorageCols = `org_id, enabled, mode, bucket_name, location, registry_namespace, billing_reference, revision, update_time`

func (b buildStorage) Get(ctx context.Context, org string) (BuildStorageConfig, error) {
	var c BuildStorageConfig
	var at dbTime
	err := b.s.d.queryRow(ctx, `SELECT `+buildStorageCols+` FROM build_storage_configs WHERE org_id = $1`, org).
		Scan(&c.Org, &c.Enabled, &c.Mode, &c.Bucket, &c.Location, &c.RegistryNamespace, &c.BillingReference, &c.Revision, &at)
	if err != nil {
		return BuildStorageConfig{}, b.s.readErr("build storage config of "+org, err)
	}
	c.UpdateTime = at.t
	return c, nil
}

func (b buildStorage) Put(ctx context.Context, c BuildStorageConfig, revision int64) (BuildStorageConfig, error) {
	if err := required("org", c.Org); err != nil {
		return BuildStorageConfig{}, err
	}
	for _, f := range []string{c.Bucket, c.Location, c.RegistryNamespace, c.BillingReference} {
		if len(f) > maxBuildStorageField {
			return BuildStorageConfig{}, invalid("build storage config: a field is longer than %d bytes", maxBuildStorageField)
		}
	}
	if revision < 0 {
		return BuildStorageConfig{}, invalid("build storage config: revision %d", revision)
	}
	c.Revision, c.UpdateTime = revision+1, now()
	var n int64
	var err error
	if revision == 0 {
		n, err = b.s.d.exec(ctx, `INSERT INTO build_storage_configs (`+buildStorageCols+`) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
			ON CONFLICT (org_id) DO NOTHING`,
			c.Org, c.Enabled, c.Mode, c.Bucket, c.Location, c.RegistryNamespace, c.BillingReference, c.Revision, c.UpdateTime)
	} else {
		n, err = b.s.d.exec(ctx, `UPDATE build_storage_configs SET enabled = $2, mode = $3, bucket_name = $4, location = $5,
			registry_namespace = $6, billing_reference = $7, revision = $8, update_time = $9 WHERE org_id = $1 AND revision = $10`,
			c.Org, c.Enabled, c.Mode, c.Bucket, c.Location, c.RegistryNamespace, c.BillingReference, c.Revision, c.UpdateTime, revision)
	}
	if err != nil {
		return BuildStorageConfig{}, b.s.writeErr("build storage config", "put", err)
	}
	if n == 0 {
		return BuildStorageConfig{}, fmt.Errorf("build storage config of %s is not at revision %d: %w", c.Org, revision, ErrConflict)
	}
	return c, nil
}
