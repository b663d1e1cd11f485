-- The automatic rollout (issue 18 point 3). Keep in step with ../sqlite/0005_rollout.sql.
--
-- self_update: the runner's heartbeats say it can update itself (status, like version).
-- update_*: the runner's last update step (internal/rollout): from/to version, state
-- ('' none, IN_PROGRESS, SUCCEEDED, ROLLED_BACK), the reason of a failure, when it started,
-- when its health gate gives up and when it ended. Written with the runner's etag check.
ALTER TABLE runners ADD COLUMN self_update boolean NOT NULL DEFAULT false;
ALTER TABLE runners ADD COLUMN update_from_version text NOT NULL DEFAULT '';
ALTER TABLE runners ADD COLUMN update_to_version text NOT NULL DEFAULT '';
ALTER TABLE runners ADD COLUMN update_state text NOT NULL DEFAULT ''
    CONSTRAINT runners_update_state CHECK (update_state IN ('', 'IN_PROGRESS', 'SUCCEEDED', 'ROLLED_BACK'));
ALTER TABLE runners ADD COLUMN update_reason text NOT NULL DEFAULT '';
ALTER TABLE runners ADD COLUMN update_started_at timestamptz;
ALTER TABLE runners ADD COLUMN update_deadline timestamptz;
ALTER TABLE runners ADD COLUMN update_ended_at timestamptz;

-- A halted rollout: no runner of channel starts moving to version (while the channel
-- offers it) until an admin resumes it. One row per channel.
CREATE TABLE rollout_halts (
    channel   text        NOT NULL PRIMARY KEY CHECK (channel IN ('STABLE', 'RAPID')),
    version   text        NOT NULL,
    reason    text        NOT NULL,
    org_id    text        NOT NULL,
    runner_id text        NOT NULL,
    halted_at timestamptz NOT NULL
);

-- Leases: one control-plane replica at a time runs the rollout controller.
CREATE TABLE leases (
    name       text        NOT NULL PRIMARY KEY,
    holder     text        NOT NULL,
    expires_at timestamptz NOT NULL
);
