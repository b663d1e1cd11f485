-- sandboxd store, SQLite dialect. Times are INTEGER microseconds since the Unix epoch (UTC);
-- JSON documents are TEXT, kept exactly as written. Keep in step with ../postgres/0001_init.sql.

CREATE TABLE organizations (
    id         TEXT    NOT NULL PRIMARY KEY,
    name       TEXT    NOT NULL DEFAULT '',
    created_at INTEGER NOT NULL
) STRICT;

CREATE TABLE api_keys (
    id           TEXT    NOT NULL PRIMARY KEY,
    org_id       TEXT    NOT NULL REFERENCES organizations (id),
    role         TEXT    NOT NULL CHECK (role IN ('SANDBOX_ADMIN', 'SANDBOX_USER')),
    name         TEXT    NOT NULL DEFAULT '',
    hash         TEXT    NOT NULL,
    created_at   INTEGER NOT NULL,
    revoked_at   INTEGER,
    last_used_at INTEGER
) STRICT;
CREATE INDEX api_keys_org ON api_keys (org_id, created_at, id);

CREATE TABLE runners (
    org_id            TEXT    NOT NULL REFERENCES organizations (id),
    runner_id         TEXT    NOT NULL,
    cluster_id        TEXT    NOT NULL,
    zone              TEXT    NOT NULL DEFAULT '',
    runner_group_id   TEXT    NOT NULL DEFAULT 'default',
    display_name      TEXT    NOT NULL DEFAULT '',
    release_channel   TEXT    NOT NULL DEFAULT 'STABLE' CHECK (release_channel IN ('STABLE', 'RAPID')),
    desired_version   TEXT    NOT NULL DEFAULT '',
    policy            TEXT,
    policy_revision   INTEGER NOT NULL DEFAULT 0,
    revision          INTEGER NOT NULL DEFAULT 1,
    created_at        INTEGER NOT NULL,
    updated_at        INTEGER NOT NULL,
    last_heartbeat_at INTEGER,
    version           TEXT    NOT NULL DEFAULT '',
    ready             INTEGER NOT NULL DEFAULT 0,
    capacity          TEXT,
    usage             TEXT,
    PRIMARY KEY (org_id, runner_id),
    UNIQUE (org_id, cluster_id),
    CHECK (policy IS NOT NULL OR policy_revision = 0)
) STRICT;

CREATE TABLE bootstrap_tokens (
    hash        TEXT    NOT NULL PRIMARY KEY,
    org_id      TEXT    NOT NULL,
    runner_id   TEXT    NOT NULL,
    expires_at  INTEGER NOT NULL,
    created_at  INTEGER NOT NULL,
    consumed_at INTEGER,
    FOREIGN KEY (org_id, runner_id) REFERENCES runners (org_id, runner_id) ON DELETE CASCADE
) STRICT;
CREATE INDEX bootstrap_tokens_runner ON bootstrap_tokens (org_id, runner_id);

-- The gateway's sandbox index. No foreign keys to runners: records outlive their runner.
CREATE TABLE sandboxes (
    id              TEXT    NOT NULL PRIMARY KEY,
    org_id          TEXT    NOT NULL,
    runner_id       TEXT    NOT NULL,
    request_id      TEXT,
    spec            TEXT    NOT NULL,
    tags            TEXT    NOT NULL DEFAULT '[]',
    created_at      INTEGER NOT NULL,
    state           TEXT    NOT NULL,
    policy_revision INTEGER NOT NULL DEFAULT 0,
    status          TEXT,
    updated_at      INTEGER NOT NULL,
    ended_at        INTEGER
) STRICT;
CREATE UNIQUE INDEX sandboxes_request_id_key ON sandboxes (org_id, request_id) WHERE request_id IS NOT NULL;
CREATE INDEX sandboxes_org_created ON sandboxes (org_id, created_at, id);
CREATE INDEX sandboxes_org_runner ON sandboxes (org_id, runner_id);
CREATE INDEX sandboxes_ended ON sandboxes (ended_at) WHERE ended_at IS NOT NULL;

-- Tags again, one row each, for the AND filter of List.
CREATE TABLE sandbox_tags (
    sandbox_id TEXT NOT NULL REFERENCES sandboxes (id) ON DELETE CASCADE,
    tag        TEXT NOT NULL,
    PRIMARY KEY (sandbox_id, tag)
) STRICT;
CREATE INDEX sandbox_tags_tag ON sandbox_tags (tag);
