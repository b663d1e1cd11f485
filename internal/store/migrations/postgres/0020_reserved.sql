-- Placeholder on branch h24audit only: 0020 belongs to another branch (the lead renumbers
-- at merge; drop this file then). Keep in step with ../sqlite/0020_reserved.sql.
SELECT 1;
