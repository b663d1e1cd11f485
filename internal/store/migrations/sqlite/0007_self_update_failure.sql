-- A single-host runner's last failed self-update (issue 18): the version it refused or
-- rolled back from and why, as its heartbeats report it (status, like version; '' when it
-- reports none). The rollout controller ends a step to that version at once instead of
-- waiting for the step's deadline. Bounded here too (the store checks bytes first).
-- Keep in step with ../postgres/0007_self_update_failure.sql.
ALTER TABLE runners ADD COLUMN self_update_failed_version TEXT NOT NULL DEFAULT ''
    CHECK (length(self_update_failed_version) <= 128);
ALTER TABLE runners ADD COLUMN self_update_failure TEXT NOT NULL DEFAULT ''
    CHECK (length(self_update_failure) <= 1024);
