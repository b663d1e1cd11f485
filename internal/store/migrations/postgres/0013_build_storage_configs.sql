-- Build storage settings (issue 22; SettingsService Get/UpdateBuildStorageConfig). A row is
-- what an organization's administrator set; no row means the defaults (builds enabled, the
-- platform's registry and bucket). revision counts the updates (1 after the first); the
-- gateway's etag is made from it. Like the sandbox index it is the gateway's, so no
-- foreign key to organizations.
-- IF NOT EXISTS: a test replays the migrations after 0008 (rollouts_test.go).
-- Keep in step with ../sqlite/0013_build_storage_configs.sql.
CREATE TABLE IF NOT EXISTS build_storage_configs (
    org_id             text        NOT NULL,
    enabled            boolean     NOT NULL,
    mode               integer     NOT NULL DEFAULT 0,
    bucket_name        text        NOT NULL DEFAULT '',
    location           text        NOT NULL DEFAULT '',
    registry_namespace text        NOT NULL DEFAULT '',
    billing_reference  text        NOT NULL DEFAULT '',
    revision           bigint      NOT NULL,
    update_time        timestamptz NOT NULL,
    CONSTRAINT build_storage_configs_pkey PRIMARY KEY (org_id)
);
