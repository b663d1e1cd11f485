-- Runner IDs name certificates platform-wide (runner certificates: DNS name <runner_id>;
-- edge certificates: *.<runner_id>.<domain>), and certificates outlive a deleted runner.
-- When an organization deletes its runner, the ID stays its own until held_until (the
-- longest certificate lifetime): no other organization may create a runner of that ID
-- before then (store.Runners.Create), so nobody else is named by certificates the old
-- holder may still have.
-- Keep in step with ../sqlite/0025_runner_id_holds.sql.
CREATE TABLE IF NOT EXISTS runner_id_holds (
    runner_id  text        NOT NULL PRIMARY KEY,
    org_id     text        NOT NULL,
    held_until timestamptz NOT NULL
);
