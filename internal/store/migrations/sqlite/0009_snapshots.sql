-- The gateway's index of file-system snapshots (issue 20). Keep in step with
-- ../postgres/0009_snapshots.sql.
--
-- One row per snapshot of one scratch volume. state: CREATING → READY | FAILED, then
-- DELETING while its archive is removed, then the row goes. No foreign keys: a snapshot
-- outlives its sandbox and the runner that took it.
CREATE TABLE snapshots (
    id                 TEXT    NOT NULL PRIMARY KEY,
    org_id             TEXT    NOT NULL,
    state              TEXT    NOT NULL CHECK (state IN ('CREATING', 'READY', 'FAILED', 'DELETING')),
    state_reason       TEXT    NOT NULL DEFAULT '',
    reason             TEXT    NOT NULL DEFAULT '',
    size_bytes         INTEGER NOT NULL DEFAULT 0,
    content_bytes      INTEGER NOT NULL DEFAULT 0,
    digest             TEXT    NOT NULL DEFAULT '',
    source_sandbox_id  TEXT    NOT NULL,
    source_volume_name TEXT    NOT NULL,
    trigger_kind       TEXT    NOT NULL CHECK (trigger_kind IN ('MANUAL', 'ON_DELETE')),
    object_bucket      TEXT    NOT NULL DEFAULT '',
    object_key         TEXT    NOT NULL,
    runner_id          TEXT    NOT NULL,
    request_id         TEXT,
    pause_ns           INTEGER NOT NULL DEFAULT 0,
    create_time        INTEGER NOT NULL,
    complete_time      INTEGER,
    updated_at         INTEGER NOT NULL
) STRICT;
CREATE UNIQUE INDEX snapshots_request_id_key ON snapshots (org_id, request_id) WHERE request_id IS NOT NULL;
CREATE INDEX snapshots_org_created ON snapshots (org_id, create_time, id);
CREATE INDEX snapshots_org_source ON snapshots (org_id, source_sandbox_id);
CREATE INDEX snapshots_state ON snapshots (state, create_time);
CREATE INDEX snapshots_object_key ON snapshots (object_key);
