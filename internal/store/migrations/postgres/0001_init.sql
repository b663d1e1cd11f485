-- sandboxd store, PostgreSQL dialect. JSON documents are json (validated, kept exactly as
-- written). Constraint names are what postgres.go maps to AlreadyExistsError keys.
-- Keep in step with ../sqlite/0001_init.sql.

CREATE TABLE organizations (
    id         text        NOT NULL,
    name       text        NOT NULL DEFAULT '',
    created_at timestamptz NOT NULL,
    CONSTRAINT organizations_pkey PRIMARY KEY (id)
);

CREATE TABLE api_keys (
    id           text        NOT NULL,
    org_id       text        NOT NULL REFERENCES organizations (id),
    role         text        NOT NULL CHECK (role IN ('SANDBOX_ADMIN', 'SANDBOX_USER')),
    name         text        NOT NULL DEFAULT '',
    hash         text        NOT NULL,
    created_at   timestamptz NOT NULL,
    revoked_at   timestamptz,
    last_used_at timestamptz,
    CONSTRAINT api_keys_pkey PRIMARY KEY (id)
);
CREATE INDEX api_keys_org ON api_keys (org_id, created_at, id);

CREATE TABLE runners (
    org_id            text        NOT NULL REFERENCES organizations (id),
    runner_id         text        NOT NULL,
    cluster_id        text        NOT NULL,
    zone              text        NOT NULL DEFAULT '',
    runner_group_id   text        NOT NULL DEFAULT 'default',
    display_name      text        NOT NULL DEFAULT '',
    release_channel   text        NOT NULL DEFAULT 'STABLE' CHECK (release_channel IN ('STABLE', 'RAPID')),
    desired_version   text        NOT NULL DEFAULT '',
    policy            json,
    policy_revision   bigint      NOT NULL DEFAULT 0,
    revision          bigint      NOT NULL DEFAULT 1,
    created_at        timestamptz NOT NULL,
    updated_at        timestamptz NOT NULL,
    last_heartbeat_at timestamptz,
    version           text        NOT NULL DEFAULT '',
    ready             boolean     NOT NULL DEFAULT false,
    capacity          json,
    usage             json,
    CONSTRAINT runners_pkey PRIMARY KEY (org_id, runner_id),
    CONSTRAINT runners_cluster_id_key UNIQUE (org_id, cluster_id),
    CONSTRAINT runners_policy_set CHECK (policy IS NOT NULL OR policy_revision = 0)
);

CREATE TABLE bootstrap_tokens (
    hash        text        NOT NULL,
    org_id      text        NOT NULL,
    runner_id   text        NOT NULL,
    expires_at  timestamptz NOT NULL,
    created_at  timestamptz NOT NULL,
    consumed_at timestamptz,
    CONSTRAINT bootstrap_tokens_pkey PRIMARY KEY (hash),
    FOREIGN KEY (org_id, runner_id) REFERENCES runners (org_id, runner_id) ON DELETE CASCADE
);
CREATE INDEX bootstrap_tokens_runner ON bootstrap_tokens (org_id, runner_id);

-- The gateway's sandbox index. No foreign keys to runners: records outlive their runner.
CREATE TABLE sandboxes (
    id              text        NOT NULL,
    org_id          text        NOT NULL,
    runner_id       text        NOT NULL,
    request_id      text,
    spec            json        NOT NULL,
    tags            json        NOT NULL DEFAULT '[]',
    created_at      timestamptz NOT NULL,
    state           text        NOT NULL,
    policy_revision bigint      NOT NULL DEFAULT 0,
    status          json,
    updated_at      timestamptz NOT NULL,
    ended_at        timestamptz,
    CONSTRAINT sandboxes_pkey PRIMARY KEY (id)
);
CREATE UNIQUE INDEX sandboxes_request_id_key ON sandboxes (org_id, request_id) WHERE request_id IS NOT NULL;
CREATE INDEX sandboxes_org_created ON sandboxes (org_id, created_at, id);
CREATE INDEX sandboxes_org_runner ON sandboxes (org_id, runner_id);
CREATE INDEX sandboxes_ended ON sandboxes (ended_at) WHERE ended_at IS NOT NULL;

-- Tags again, one row each, for the AND filter of List.
CREATE TABLE sandbox_tags (
    sandbox_id text NOT NULL REFERENCES sandboxes (id) ON DELETE CASCADE,
    tag        text NOT NULL,
    CONSTRAINT sandbox_tags_pkey PRIMARY KEY (sandbox_id, tag)
);
CREATE INDEX sandbox_tags_tag ON sandbox_tags (tag);
