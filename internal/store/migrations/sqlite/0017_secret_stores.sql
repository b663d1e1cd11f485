-- Secret stores (issue 23 point 2; SettingsService *SecretStore, sandboxd.settings.v1
-- SecretService). A store is organization-scoped; provider_type is the wire's
-- SecretStoreProviderType (0 or 100: the built-in store). A secret's value is kept only
-- as ciphertext (AES-256-GCM, sealed by the gateway: internal/secretbox) with the ID of
-- the key that sealed it; the associated data binds it to its row. Deleting a store
-- deletes its secrets in the same transaction. Like the sandbox index it is the gateway's,
-- so no foreign key to organizations.
-- IF NOT EXISTS: a test replays the migrations after 0008 (rollouts_test.go).
-- Keep in step with ../postgres/0017_secret_stores.sql.
CREATE TABLE IF NOT EXISTS secret_stores (
    org_id        TEXT    NOT NULL,
    name          TEXT    NOT NULL,
    provider_type INTEGER NOT NULL,
    request_id    TEXT,
    create_time   INTEGER NOT NULL,
    update_time   INTEGER NOT NULL,
    PRIMARY KEY (org_id, name)
) STRICT;
CREATE UNIQUE INDEX IF NOT EXISTS secret_stores_request_id_key ON secret_stores (org_id, request_id) WHERE request_id IS NOT NULL;

CREATE TABLE IF NOT EXISTS secrets (
    org_id      TEXT    NOT NULL,
    store_name  TEXT    NOT NULL,
    path        TEXT    NOT NULL,
    field       TEXT    NOT NULL,
    key_id      TEXT    NOT NULL,
    ciphertext  BLOB    NOT NULL,
    create_time INTEGER NOT NULL,
    update_time INTEGER NOT NULL,
    PRIMARY KEY (org_id, store_name, path, field)
) STRICT;
