-- How the runner's image pre-pull stands, as its last heartbeat reported it (issue 22):
-- the JSON of a sandboxd.controlplane.v1.PrepullStatus (at most 64 images, bounded text);
-- NULL before a heartbeat that reported one.
-- Keep in step with ../sqlite/0024_runner_prepull.sql.
ALTER TABLE runners ADD COLUMN IF NOT EXISTS prepull json;
