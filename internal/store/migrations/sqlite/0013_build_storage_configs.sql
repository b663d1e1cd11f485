-- Build storage settings (issue 22; SettingsService Get/UpdateBuildStorageConfig). A row is
-- what an organization's administrator set; no row means the defaults (builds enabled, the
-- platform's registry and bucket). revision counts the updates (1 after the first); the
-- gateway's etag is made from it. Like the sandbox index it is the gateway's, so no
-- foreign key to organizations.
-- IF NOT EXISTS: a test replays the migrations after 0008 (rollouts_test.go).
-- Keep in step with ../postgres/0013_build_storage_configs.sql.
CREATE TABLE IF NOT EXISTS build_storage_configs (
    org_id             TEXT    NOT NULL PRIMARY KEY,
    enabled            INTEGER NOT NULL,
    mode               INTEGER NOT NULL DEFAULT 0,
    bucket_name        TEXT    NOT NULL DEFAULT '',
    location           TEXT    NOT NULL DEFAULT '',
    registry_namespace TEXT    NOT NULL DEFAULT '',
    billing_reference  TEXT    NOT NULL DEFAULT '',
    revision           INTEGER NOT NULL,
    update_time        INTEGER NOT NULL
) STRICT;
