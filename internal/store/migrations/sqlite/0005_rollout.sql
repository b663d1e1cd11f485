-- The automatic rollout (issue 18 point 3). Keep in step with ../postgres/0005_rollout.sql.
--
-- self_update: the runner's heartbeats say it can update itself (status, like version).
-- update_*: the runner's last update step (internal/rollout): from/to version, state
-- ('' none, IN_PROGRESS, SUCCEEDED, ROLLED_BACK), the reason of a failure, when it started,
-- when its health gate gives up and when it ended. Written with the runner's etag check.
ALTER TABLE runners ADD COLUMN self_update INTEGER NOT NULL DEFAULT 0;
ALTER TABLE runners ADD COLUMN update_from_version TEXT NOT NULL DEFAULT '';
ALTER TABLE runners ADD COLUMN update_to_version TEXT NOT NULL DEFAULT '';
ALTER TABLE runners ADD COLUMN update_state TEXT NOT NULL DEFAULT ''
    CHECK (update_state IN ('', 'IN_PROGRESS', 'SUCCEEDED', 'ROLLED_BACK'));
ALTER TABLE runners ADD COLUMN update_reason TEXT NOT NULL DEFAULT '';
ALTER TABLE runners ADD COLUMN update_started_at INTEGER;
ALTER TABLE runners ADD COLUMN update_deadline INTEGER;
ALTER TABLE runners ADD COLUMN update_ended_at INTEGER;

-- A halted rollout: no runner of channel starts moving to version (while the channel
-- offers it) until an admin resumes it. One row per channel.
CREATE TABLE rollout_halts (
    channel   TEXT    NOT NULL PRIMARY KEY CHECK (channel IN ('STABLE', 'RAPID')),
    version   TEXT    NOT NULL,
    reason    TEXT    NOT NULL,
    org_id    TEXT    NOT NULL,
    runner_id TEXT    NOT NULL,
    halted_at INTEGER NOT NULL
) STRICT;

-- Leases: one control-plane replica at a time runs the rollout controller.
CREATE TABLE leases (
    name       TEXT    NOT NULL PRIMARY KEY,
    holder     TEXT    NOT NULL,
    expires_at INTEGER NOT NULL
) STRICT;
