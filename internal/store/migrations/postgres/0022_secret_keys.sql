-- The secret-store encryption keys the store knows of (sandboxd secret-key prune;
-- docs/secrets.md): a row per key ID that sealed a value or was retired. A write of a
-- value under a key takes its row (an upsert: the lock that orders it against a prune);
-- prune retires a key in the same way and checks in that transaction that no value uses
-- it; a write under a retired key is refused. Keep in step with ../sqlite/0022_secret_keys.sql.
CREATE TABLE IF NOT EXISTS secret_keys (
    key_id  text    NOT NULL,
    retired boolean NOT NULL DEFAULT false,
    n       bigint  NOT NULL DEFAULT 0,
    CONSTRAINT secret_keys_pkey PRIMARY KEY (key_id)
);
