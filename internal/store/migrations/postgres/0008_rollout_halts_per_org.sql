-- Halts per organization (review S2 of issue 18). Keep in step with
-- ../sqlite/0009_rollout_halts_per_org.sql.
--
-- A failed step of one organization's runner used to halt the channel's rollout for every
-- organization: any tenant's runner could stop every tenant's updates and publish its
-- text to them. A halt now stops only the rollout to the runner's own organization's
-- runners, so it is keyed by (org_id, channel). An existing halt becomes the halt of the
-- organization whose runner caused it.
ALTER TABLE rollout_halts DROP CONSTRAINT rollout_halts_pkey;
ALTER TABLE rollout_halts ADD PRIMARY KEY (org_id, channel);
