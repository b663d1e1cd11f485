-- Signed release manifests (issue 18): a release's sandbox-agent binary checksums (a JSON
-- object, architecture -> hex SHA-256, like binary_checksums) and, when it was published
-- from a signed manifest, the manifest's bytes exactly as signed and its Ed25519
-- signature (both or neither), so anyone reading the release can verify it again.
-- Keep in step with ../sqlite/0006_release_manifests.sql.

ALTER TABLE releases ADD COLUMN agent_binary_checksums json NOT NULL DEFAULT '{}';
ALTER TABLE releases ADD COLUMN manifest bytea;
ALTER TABLE releases ADD COLUMN manifest_signature bytea;
ALTER TABLE releases ADD CONSTRAINT releases_manifest_signed
    CHECK ((manifest IS NULL) = (manifest_signature IS NULL));
