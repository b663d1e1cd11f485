-- The audit log (issue 24 point 3): one row per audited call (admin writes, sandbox
-- lifecycle calls), written after the call completes. Keep in step with
-- ../postgres/0021_audit.sql.
CREATE TABLE audit_events (
    id          TEXT    NOT NULL PRIMARY KEY,
    at          INTEGER NOT NULL,
    org_id      TEXT    NOT NULL,
    key_id      TEXT    NOT NULL DEFAULT '',
    source      TEXT    NOT NULL DEFAULT '',
    request_id  TEXT    NOT NULL DEFAULT '',
    method      TEXT    NOT NULL,
    kind        TEXT    NOT NULL DEFAULT '',
    target_type TEXT    NOT NULL DEFAULT '',
    target_id   TEXT    NOT NULL DEFAULT '',
    code        TEXT    NOT NULL,
    reason      TEXT    NOT NULL DEFAULT '',
    message     TEXT    NOT NULL DEFAULT ''
) STRICT;
CREATE INDEX audit_events_org_at ON audit_events (org_id, at, id);
CREATE INDEX audit_events_at ON audit_events (at);
