-- File-system snapshot bucket settings (issue 20; SettingsService
-- Get/UpdateFileSystemSnapshotBucketConfig). A row is an organization's own (bring your
-- own) bucket for new snapshots; no row means the platform's bucket. Like the sandbox
-- index it is the gateway's, so no foreign key to organizations. A bucket is one
-- organization's: no organization writes its archives into another's bucket.
-- IF NOT EXISTS: a test replays the migrations after 0008 (rollouts_test.go).
-- Keep in step with ../sqlite/0009_fss_bucket_configs.sql.
CREATE TABLE IF NOT EXISTS fss_bucket_configs (
    org_id      text        NOT NULL,
    bucket_name text        NOT NULL,
    region      text        NOT NULL DEFAULT '',
    updated_at  timestamptz NOT NULL,
    CONSTRAINT fss_bucket_configs_pkey PRIMARY KEY (org_id),
    CONSTRAINT fss_bucket_configs_bucket_name_key UNIQUE (bucket_name)
);
