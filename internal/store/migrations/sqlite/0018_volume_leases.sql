-- The write lease of a GLOBAL registered volume (issue 23; docs/volumes.md): at most one
-- sandbox at a time holds a read-write mount of it. holder is the sandbox (or, while its
-- create is in flight, the create's placeholder "create:<random>"); since is when it took
-- the lease. A holder that has ended no longer holds it (the gateway checks that when
-- another sandbox asks). Keep in step with ../postgres/0018_volume_leases.sql.
CREATE TABLE IF NOT EXISTS volume_leases (
    org_id    TEXT    NOT NULL,
    volume_id TEXT    NOT NULL,
    holder    TEXT    NOT NULL,
    since     INTEGER NOT NULL,
    PRIMARY KEY (org_id, volume_id)
) STRICT;
