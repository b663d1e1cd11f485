-- The organization of the caller of an audited call when it is not the organization the
-- call acted on (a platform admin acting on another organization's quota, rollout or
-- cluster): the event is that organization's (org_id), its admins see it, and the
-- platform organization's listing finds it by actor_org (issue 24 point 3). '' otherwise.
-- Keep in step with ../sqlite/0023_audit_actor_org.sql.
ALTER TABLE audit_events ADD COLUMN actor_org text NOT NULL DEFAULT '';
CREATE INDEX audit_events_actor_org_at ON audit_events (actor_org, at, id);
