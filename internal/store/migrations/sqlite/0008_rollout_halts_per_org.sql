-- Halts per organization (review S2 of issue 18). Keep in step with
-- ../postgres/0009_rollout_halts_per_org.sql.
--
-- A failed step of one organization's runner used to halt the channel's rollout for every
-- organization: any tenant's runner could stop every tenant's updates and publish its
-- text to them. A halt now stops only the rollout to the runner's own organization's
-- runners, so it is keyed by (org_id, channel). An existing halt becomes the halt of the
-- organization whose runner caused it.
CREATE TABLE rollout_halts_new (
    org_id    TEXT    NOT NULL,
    channel   TEXT    NOT NULL CHECK (channel IN ('STABLE', 'RAPID')),
    version   TEXT    NOT NULL,
    reason    TEXT    NOT NULL,
    runner_id TEXT    NOT NULL,
    halted_at INTEGER NOT NULL,
    PRIMARY KEY (org_id, channel)
) STRICT;
INSERT INTO rollout_halts_new (org_id, channel, version, reason, runner_id, halted_at)
    SELECT org_id, channel, version, reason, runner_id, halted_at FROM rollout_halts;
DROP TABLE rollout_halts;
ALTER TABLE rollout_halts_new RENAME TO rollout_halts;
