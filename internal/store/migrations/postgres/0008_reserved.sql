-- Placeholder: migration 0008 is allocated to another branch (issue 18 review fixes). The
-- migrations must be numbered without gaps, so this branch carries an empty 0008 until the
-- merge; the lead drops this file when the other branch's 0008 lands.
SELECT 1;
