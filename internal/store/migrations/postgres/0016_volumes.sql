-- Registered volumes (issue 23; VolumeService). Organization-scoped: the volume_id is the
-- caller's, unique within its organization only. Hard deleted (a deleted volume frees its
-- id). One volume per (organization, runner, claim): two registrations of one runner-managed
-- claim would share and then delete each other's data. request_digest identifies the
-- CreateVolume request (a repeated request_id with another request is a conflict).
-- Like the sandbox index it is the gateway's, so no foreign key to organizations.
-- Keep in step with ../sqlite/0016_volumes.sql.
CREATE TABLE volumes (
    org_id             text        NOT NULL,
    id                 text        NOT NULL,
    runner_id          text        NOT NULL,
    namespace          text        NOT NULL,
    claim_name         text        NOT NULL,
    sub_path           text        NOT NULL DEFAULT '',
    read_only          boolean     NOT NULL DEFAULT false,
    description        text        NOT NULL DEFAULT '',
    state              text        NOT NULL,
    state_reason       text        NOT NULL DEFAULT '',
    capacity_bytes     bigint      NOT NULL DEFAULT 0,
    create_time        timestamptz NOT NULL,
    update_time        timestamptz NOT NULL,
    last_validated     timestamptz,
    request_id         text,
    request_digest     text        NOT NULL DEFAULT '',
    CONSTRAINT volumes_pkey PRIMARY KEY (org_id, id)
);
CREATE UNIQUE INDEX volumes_request_id_key ON volumes (org_id, request_id) WHERE request_id IS NOT NULL;
CREATE UNIQUE INDEX volumes_claim_key ON volumes (org_id, runner_id, claim_name);
CREATE INDEX volumes_org_created ON volumes (org_id, create_time, id);

-- The registered volumes a sandbox mounts, one row each (ListSandboxes volume_ids filter,
-- attached_sandbox_count, delete-while-attached).
CREATE TABLE sandbox_volumes (
    sandbox_id text NOT NULL REFERENCES sandboxes (id) ON DELETE CASCADE,
    volume_id  text NOT NULL,
    CONSTRAINT sandbox_volumes_pkey PRIMARY KEY (sandbox_id, volume_id)
);
CREATE INDEX sandbox_volumes_volume ON sandbox_volumes (volume_id);
