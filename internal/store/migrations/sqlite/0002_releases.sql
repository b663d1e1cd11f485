-- Releases: one record per runner version, and the channels that offer it. RAPID gets a
-- version when it is published (rapid_at), STABLE when it is promoted (stable_at); a
-- channel's current version is the highest one it offers. binary_checksums is a JSON
-- object, architecture -> hex SHA-256. Keep in step with ../postgres/0002_releases.sql.

CREATE TABLE releases (
    version             TEXT    NOT NULL PRIMARY KEY,
    runner_image_digest TEXT    NOT NULL,
    agent_image_digest  TEXT    NOT NULL,
    binary_checksums    TEXT    NOT NULL DEFAULT '{}',
    created_at          INTEGER NOT NULL,
    rapid_at            INTEGER,
    stable_at           INTEGER,
    CHECK (stable_at IS NULL OR rapid_at IS NOT NULL)
) STRICT;
