-- Per-volume sizes and storage quotas (issue 23 points 1 and 4). Keep in step with
-- ../postgres/0021_volume_sizes.sql.
-- size_bytes: the size a registered volume was created (or last grown) with, what the
-- organization's max_volume_bytes counts; volumes made before took the runner's default
-- (10 GiB on a local runner).
ALTER TABLE volumes ADD COLUMN size_bytes INTEGER NOT NULL DEFAULT 0;
UPDATE volumes SET size_bytes = CASE WHEN capacity_bytes > 0 THEN capacity_bytes ELSE 10737418240 END;
-- Per-organization limits on volume bytes and file-system snapshots (NULL: the default).
ALTER TABLE org_quotas ADD COLUMN max_volume_bytes INTEGER;
ALTER TABLE org_quotas ADD COLUMN max_snapshots INTEGER;
ALTER TABLE org_quotas ADD COLUMN max_snapshot_bytes INTEGER;
