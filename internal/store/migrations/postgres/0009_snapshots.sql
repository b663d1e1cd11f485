-- The gateway's index of file-system snapshots (issue 20). Keep in step with
-- ../sqlite/0009_snapshots.sql.
--
-- One row per snapshot of one scratch volume. state: CREATING → READY | FAILED, then
-- DELETING while its archive is removed, then the row goes. No foreign keys: a snapshot
-- outlives its sandbox and the runner that took it.
CREATE TABLE snapshots (
    id                 text        NOT NULL,
    org_id             text        NOT NULL,
    state              text        NOT NULL CHECK (state IN ('CREATING', 'READY', 'FAILED', 'DELETING')),
    state_reason       text        NOT NULL DEFAULT '',
    reason             text        NOT NULL DEFAULT '',
    size_bytes         bigint      NOT NULL DEFAULT 0,
    content_bytes      bigint      NOT NULL DEFAULT 0,
    digest             text        NOT NULL DEFAULT '',
    source_sandbox_id  text        NOT NULL,
    source_volume_name text        NOT NULL,
    trigger_kind       text        NOT NULL CHECK (trigger_kind IN ('MANUAL', 'ON_DELETE')),
    object_bucket      text        NOT NULL DEFAULT '',
    object_key         text        NOT NULL,
    runner_id          text        NOT NULL,
    request_id         text,
    pause_ns           bigint      NOT NULL DEFAULT 0,
    create_time        timestamptz NOT NULL,
    complete_time      timestamptz,
    updated_at         timestamptz NOT NULL,
    CONSTRAINT snapshots_pkey PRIMARY KEY (id)
);
CREATE UNIQUE INDEX snapshots_request_id_key ON snapshots (org_id, request_id) WHERE request_id IS NOT NULL;
CREATE INDEX snapshots_org_created ON snapshots (org_id, create_time, id);
CREATE INDEX snapshots_org_source ON snapshots (org_id, source_sandbox_id);
CREATE INDEX snapshots_state ON snapshots (state, create_time);
CREATE INDEX snapshots_object_key ON snapshots (object_key);
