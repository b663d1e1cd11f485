-- sandboxd:no-transaction
-- The organization of the caller of an audited call when it is not the organization the
-- call acted on (a platform admin acting on another organization's quota, rollout or
-- cluster): the event is that organization's (org_id), its admins see it, and the
-- platform organization's listing finds it by actor_org (issue 24 point 3). '' otherwise.
-- Keep in step with ../sqlite/0023_audit_actor_org.sql.
--
-- Outside a transaction (migrate.go): audit_events is a big table, and a plain CREATE
-- INDEX would block its writes (every audited call) while it builds. Each statement is
-- idempotent, since a crash between them applies the migration again: the column is
-- added if missing (a constant default: no rewrite), and the index dropped first, as a
-- CREATE INDEX CONCURRENTLY that failed or was interrupted leaves an INVALID one behind
-- that IF NOT EXISTS alone would keep.
ALTER TABLE audit_events ADD COLUMN IF NOT EXISTS actor_org text NOT NULL DEFAULT '';
DROP INDEX CONCURRENTLY IF EXISTS audit_events_actor_org_at;
CREATE INDEX CONCURRENTLY IF NOT EXISTS audit_events_actor_org_at ON audit_events (actor_org, at, id);
