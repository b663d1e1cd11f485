-- Placeholder for issue 18's clusters migration (branch i18-clusters owns version 0004;
-- migrations must be contiguous). It changes nothing. When the branches merge, the
-- clusters branch's 0004 replaces this file.
SELECT 1;
