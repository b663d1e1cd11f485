-- Releases: one record per runner version, and the channels that offer it. RAPID gets a
-- version when it is published (rapid_at), STABLE when it is promoted (stable_at); a
-- channel's current version is the highest one it offers. binary_checksums is a JSON
-- object, architecture -> hex SHA-256. Keep in step with ../sqlite/0002_releases.sql.

CREATE TABLE releases (
    version             text        NOT NULL,
    runner_image_digest text        NOT NULL,
    agent_image_digest  text        NOT NULL,
    binary_checksums    json        NOT NULL DEFAULT '{}',
    created_at          timestamptz NOT NULL,
    rapid_at            timestamptz,
    stable_at           timestamptz,
    CONSTRAINT releases_pkey PRIMARY KEY (version),
    CONSTRAINT releases_stable_after_rapid CHECK (stable_at IS NULL OR rapid_at IS NOT NULL)
);
