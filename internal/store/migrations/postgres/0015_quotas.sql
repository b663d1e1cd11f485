-- Per-organization quotas (issue 23 point 4). Keep in step with ../sqlite/0015_quotas.sql.
--
-- org_quotas: the limits an admin set for an organization; a NULL limit takes the
-- gateway's default (--default-max-*), -1 is unlimited.
CREATE TABLE org_quotas (
    org_id           text        NOT NULL,
    max_sandboxes    bigint,
    max_cpu_millis   bigint,
    max_memory_bytes bigint,
    updated_at       timestamptz NOT NULL,
    updated_by       text        NOT NULL DEFAULT '',
    CONSTRAINT org_quotas_pkey PRIMARY KEY (org_id)
);
-- quota_reservations: creates in flight, each holding sandboxes, CPU and memory of its
-- organization's quota until its sandboxes are recorded (each record takes its share
-- in the same transaction) or it is released; an expired one counts no more.
CREATE TABLE quota_reservations (
    id           text        NOT NULL,
    org_id       text        NOT NULL,
    sandboxes    bigint      NOT NULL,
    cpu_millis   bigint      NOT NULL,
    memory_bytes bigint      NOT NULL,
    created_at   timestamptz NOT NULL,
    expires_at   timestamptz NOT NULL,
    CONSTRAINT quota_reservations_pkey PRIMARY KEY (id)
);
CREATE INDEX quota_reservations_org ON quota_reservations (org_id, expires_at);
-- quota_locks: one row per organization, upserted first by every reservation: its row
-- lock serializes the organization's admissions across gateway replicas.
CREATE TABLE quota_locks (
    org_id text   NOT NULL,
    n      bigint NOT NULL DEFAULT 0,
    CONSTRAINT quota_locks_pkey PRIMARY KEY (org_id)
);
-- What each sandbox holds against its organization's quota (placement's need of the
-- resolved spec: per container its request, else its limit, else the runner default).
ALTER TABLE sandboxes ADD COLUMN cpu_millis bigint NOT NULL DEFAULT 0;
ALTER TABLE sandboxes ADD COLUMN memory_bytes bigint NOT NULL DEFAULT 0;
CREATE INDEX sandboxes_org_live ON sandboxes (org_id) WHERE ended_at IS NULL;
