-- PLACEHOLDER on branch splitstore only: migration 0026 belongs to another helper's branch.
-- Drop this file when merging after that branch (its 0026 takes this number).
SELECT 1;
