-- File-system snapshot bucket settings (issue 20; SettingsService
-- Get/UpdateFileSystemSnapshotBucketConfig). A row is an organization's own (bring your
-- own) bucket for new snapshots; no row means the platform's bucket. Like the sandbox
-- index it is the gateway's, so no foreign key to organizations. A bucket is one
-- organization's: no organization writes its archives into another's bucket.
-- IF NOT EXISTS: a test replays the migrations after 0008 (rollouts_test.go).
-- Keep in step with ../postgres/0009_fss_bucket_configs.sql.
CREATE TABLE IF NOT EXISTS fss_bucket_configs (
    org_id      TEXT    NOT NULL PRIMARY KEY,
    bucket_name TEXT    NOT NULL UNIQUE,
    region      TEXT    NOT NULL DEFAULT '',
    updated_at  INTEGER NOT NULL
) STRICT;
