-- Placeholder for issue 18's rollout migration (branch i18-rollout owns version 0005;
-- migrations must be contiguous). It changes nothing. When the branches merge, the
-- rollout branch's 0005 replaces this file.
SELECT 1;
