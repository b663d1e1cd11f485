-- Image builds (issue 22; sandboxd.build.v1.BuildService). Organization-scoped. record is
-- the gateway's sandboxd.build.v1.Build as binary protobuf (opaque here); state and
-- template are copied out of it for filtering. request_digest identifies the StartBuild
-- request (a repeated request_id with another request is a conflict). build_events are a
-- build's log events (sandboxd.build.v1.BuildLogEvent, binary protobuf), numbered from 1,
-- kept after the build and removed with it.
-- Like the sandbox index it is the gateway's, so no foreign key to organizations.
-- Keep in step with ../sqlite/0012_builds.sql.
CREATE TABLE builds (
    id             text        NOT NULL,
    org_id         text        NOT NULL,
    state          integer     NOT NULL,
    template       text        NOT NULL DEFAULT '',
    record         bytea       NOT NULL,
    create_time    timestamptz NOT NULL,
    update_time    timestamptz NOT NULL,
    request_id     text,
    request_digest text        NOT NULL DEFAULT '',
    CONSTRAINT builds_pkey PRIMARY KEY (id)
);
CREATE UNIQUE INDEX builds_request_id_key ON builds (org_id, request_id) WHERE request_id IS NOT NULL;
CREATE INDEX builds_org_created ON builds (org_id, create_time, id);

CREATE TABLE build_events (
    build_id text   NOT NULL REFERENCES builds (id) ON DELETE CASCADE,
    seq      bigint NOT NULL,
    event    bytea  NOT NULL,
    CONSTRAINT build_events_pkey PRIMARY KEY (build_id, seq)
);
