-- The audit log (issue 24 point 3): one row per audited call (admin writes, sandbox
-- lifecycle calls), written after the call completes. Keep in step with
-- ../sqlite/0021_audit.sql.
CREATE TABLE audit_events (
    id          text        NOT NULL,
    at          timestamptz NOT NULL,
    org_id      text        NOT NULL,
    key_id      text        NOT NULL DEFAULT '',
    source      text        NOT NULL DEFAULT '',
    request_id  text        NOT NULL DEFAULT '',
    method      text        NOT NULL,
    kind        text        NOT NULL DEFAULT '',
    target_type text        NOT NULL DEFAULT '',
    target_id   text        NOT NULL DEFAULT '',
    code        text        NOT NULL,
    reason      text        NOT NULL DEFAULT '',
    message     text        NOT NULL DEFAULT '',
    CONSTRAINT audit_events_pkey PRIMARY KEY (id)
);
-- Reads are per organization by time (newest first); retention prunes by time alone.
CREATE INDEX audit_events_org_at ON audit_events (org_id, at, id);
CREATE INDEX audit_events_at ON audit_events (at);
