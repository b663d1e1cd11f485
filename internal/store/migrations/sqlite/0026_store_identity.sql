-- The store's identity: one random ID, written once by the first opener that asks for it
-- (store.Store.Identity) and never changed. A gateway given --control-plane checks that
-- its control plane uses the same store (docs/admin.md "Split deployment"): the control
-- plane proves it knows this ID without revealing it.
-- Keep in step with ../postgres/0026_store_identity.sql.
CREATE TABLE store_identity (
    singleton INTEGER NOT NULL PRIMARY KEY CHECK (singleton = 1),
    id        TEXT    NOT NULL
) STRICT;
