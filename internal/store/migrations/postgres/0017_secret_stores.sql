-- Secret stores (issue 23 point 2; SettingsService *SecretStore, sandboxd.settings.v1
-- SecretService). A store is organization-scoped; provider_type is the wire's
-- SecretStoreProviderType (0 or 100: the built-in store). A secret's value is kept only
-- as ciphertext (AES-256-GCM, sealed by the gateway: internal/secretbox) with the ID of
-- the key that sealed it; the associated data binds it to its row. Deleting a store
-- deletes its secrets in the same transaction. Like the sandbox index it is the gateway's,
-- so no foreign key to organizations.
-- IF NOT EXISTS: a test replays the migrations after 0008 (rollouts_test.go).
-- Keep in step with ../sqlite/0017_secret_stores.sql.
CREATE TABLE IF NOT EXISTS secret_stores (
    org_id        text        NOT NULL,
    name          text        NOT NULL,
    provider_type integer     NOT NULL,
    request_id    text,
    create_time   timestamptz NOT NULL,
    update_time   timestamptz NOT NULL,
    CONSTRAINT secret_stores_pkey PRIMARY KEY (org_id, name)
);
CREATE UNIQUE INDEX IF NOT EXISTS secret_stores_request_id_key ON secret_stores (org_id, request_id) WHERE request_id IS NOT NULL;

CREATE TABLE IF NOT EXISTS secrets (
    org_id      text        NOT NULL,
    store_name  text        NOT NULL,
    path        text        NOT NULL,
    field       text        NOT NULL,
    key_id      text        NOT NULL,
    ciphertext  bytea       NOT NULL,
    create_time timestamptz NOT NULL,
    update_time timestamptz NOT NULL,
    CONSTRAINT secrets_pkey PRIMARY KEY (org_id, store_name, path, field)
);
