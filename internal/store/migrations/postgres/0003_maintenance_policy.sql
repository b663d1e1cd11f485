-- A runner's maintenance policy (issue 18): when it may be updated. A JSON object
-- {"windows":[{"cron","duration_seconds"}],"exclusions":[{"start_time","end_time","reason"}]}
-- as internal/maintenance.Policy encodes it, validated by the control plane; NULL means
-- none (any time). Keep in step with ../sqlite/0003_maintenance_policy.sql.

ALTER TABLE runners ADD COLUMN maintenance_policy json;
