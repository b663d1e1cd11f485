-- Registered volumes (issue 23; VolumeService). Organization-scoped: the volume_id is the
-- caller's, unique within its organization only. Hard deleted (a deleted volume frees its
-- id). One volume per (organization, runner, claim): two registrations of one runner-managed
-- claim would share and then delete each other's data. request_digest identifies the
-- CreateVolume request (a repeated request_id with another request is a conflict).
-- Like the sandbox index it is the gateway's, so no foreign key to organizations.
-- Keep in step with ../postgres/0016_volumes.sql.
CREATE TABLE volumes (
    org_id             TEXT    NOT NULL,
    id                 TEXT    NOT NULL,
    runner_id          TEXT    NOT NULL,
    namespace          TEXT    NOT NULL,
    claim_name         TEXT    NOT NULL,
    sub_path           TEXT    NOT NULL DEFAULT '',
    read_only          INTEGER NOT NULL DEFAULT 0,
    description        TEXT    NOT NULL DEFAULT '',
    state              TEXT    NOT NULL,
    state_reason       TEXT    NOT NULL DEFAULT '',
    capacity_bytes     INTEGER NOT NULL DEFAULT 0,
    create_time        INTEGER NOT NULL,
    update_time        INTEGER NOT NULL,
    last_validated     INTEGER,
    request_id         TEXT,
    request_digest     TEXT    NOT NULL DEFAULT '',
    PRIMARY KEY (org_id, id)
) STRICT;
CREATE UNIQUE INDEX volumes_request_id_key ON volumes (org_id, request_id) WHERE request_id IS NOT NULL;
CREATE UNIQUE INDEX volumes_claim_key ON volumes (org_id, runner_id, claim_name);
CREATE INDEX volumes_org_created ON volumes (org_id, create_time, id);

-- The registered volumes a sandbox mounts, one row each (ListSandboxes volume_ids filter,
-- attached_sandbox_count, delete-while-attached).
CREATE TABLE sandbox_volumes (
    sandbox_id TEXT NOT NULL REFERENCES sandboxes (id) ON DELETE CASCADE,
    volume_id  TEXT NOT NULL,
    PRIMARY KEY (sandbox_id, volume_id)
) STRICT;
CREATE INDEX sandbox_volumes_volume ON sandbox_volumes (volume_id);
