-- The gateway's build retention sweep (--build-retention) finds ended builds by state and
-- last update. IF NOT EXISTS: a test replays the migrations after 0008 (rollouts_test.go).
-- Keep in step with ../sqlite/0014_builds_retention.sql.
CREATE INDEX IF NOT EXISTS builds_state_updated ON builds (state, update_time);
