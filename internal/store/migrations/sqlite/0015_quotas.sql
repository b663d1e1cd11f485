-- Per-organization quotas (issue 23 point 4). Keep in step with ../postgres/0015_quotas.sql.
CREATE TABLE org_quotas (
    org_id           TEXT    NOT NULL PRIMARY KEY,
    max_sandboxes    INTEGER,
    max_cpu_millis   INTEGER,
    max_memory_bytes INTEGER,
    updated_at       INTEGER NOT NULL,
    updated_by       TEXT    NOT NULL DEFAULT ''
) STRICT;
CREATE TABLE quota_reservations (
    id           TEXT    NOT NULL PRIMARY KEY,
    org_id       TEXT    NOT NULL,
    sandboxes    INTEGER NOT NULL,
    cpu_millis   INTEGER NOT NULL,
    memory_bytes INTEGER NOT NULL,
    created_at   INTEGER NOT NULL,
    expires_at   INTEGER NOT NULL
) STRICT;
CREATE INDEX quota_reservations_org ON quota_reservations (org_id, expires_at);
CREATE TABLE quota_locks (
    org_id TEXT    NOT NULL PRIMARY KEY,
    n      INTEGER NOT NULL DEFAULT 0
) STRICT;
ALTER TABLE sandboxes ADD COLUMN cpu_millis INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sandboxes ADD COLUMN memory_bytes INTEGER NOT NULL DEFAULT 0;
CREATE INDEX sandboxes_org_live ON sandboxes (org_id) WHERE ended_at IS NULL;
