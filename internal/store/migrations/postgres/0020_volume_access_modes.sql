-- The access modes of a registered volume as its runner holds it (issue 23, point 1): a
-- Kubernetes claim's (ReadWriteOnce, ReadWriteOncePod, ReadWriteMany, ReadOnlyMany),
-- comma-separated, reported by the runner when it makes or checks the volume; '' until
-- known and on local runners (ReadWriteMany). Keep in step with
-- ../sqlite/0020_volume_access_modes.sql.
ALTER TABLE volumes ADD COLUMN access_modes text NOT NULL DEFAULT '';
