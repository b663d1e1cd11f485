-- Placeholder so this branch's migrations are contiguous (i23-secrets uses 0017).
-- The lead drops it at merge, where another branch's 0015 takes its number.
SELECT 1;
