-- Image builds (issue 22; sandboxd.build.v1.BuildService). Organization-scoped. record is
-- the gateway's sandboxd.build.v1.Build as binary protobuf (opaque here); state and
-- template are copied out of it for filtering. request_digest identifies the StartBuild
-- request (a repeated request_id with another request is a conflict). build_events are a
-- build's log events (sandboxd.build.v1.BuildLogEvent, binary protobuf), numbered from 1,
-- kept after the build and removed with it.
-- Like the sandbox index it is the gateway's, so no foreign key to organizations.
-- Keep in step with ../postgres/0012_builds.sql.
CREATE TABLE builds (
    id             TEXT    NOT NULL PRIMARY KEY,
    org_id         TEXT    NOT NULL,
    state          INTEGER NOT NULL,
    template       TEXT    NOT NULL DEFAULT '',
    record         BLOB    NOT NULL,
    create_time    INTEGER NOT NULL,
    update_time    INTEGER NOT NULL,
    request_id     TEXT,
    request_digest TEXT    NOT NULL DEFAULT ''
) STRICT;
CREATE UNIQUE INDEX builds_request_id_key ON builds (org_id, request_id) WHERE request_id IS NOT NULL;
CREATE INDEX builds_org_created ON builds (org_id, create_time, id);

CREATE TABLE build_events (
    build_id TEXT    NOT NULL REFERENCES builds (id) ON DELETE CASCADE,
    seq      INTEGER NOT NULL,
    event    BLOB    NOT NULL,
    PRIMARY KEY (build_id, seq)
) STRICT;
