-- Clusters (issue 18): the Kubernetes clusters the control plane installs runners into,
-- platform-wide (cluster_id is unique across organizations), each for one organization's
-- runners. credential is the sealed credential (AES-256-GCM under the control plane's
-- cluster key, base64): the store never sees it in the clear.
-- runner_installs: a runner the control plane installs (or installed) into a registered
-- cluster, and how far it got; it goes with its runner. hints is a JSON array of strings.
-- Keep in step with ../postgres/0004_clusters.sql.

CREATE TABLE clusters (
    cluster_id      TEXT    NOT NULL PRIMARY KEY,
    org_id          TEXT    NOT NULL REFERENCES organizations (id),
    server          TEXT    NOT NULL,
    credential_kind TEXT    NOT NULL CHECK (credential_kind IN ('KUBECONFIG', 'SERVICE_ACCOUNT_TOKEN')),
    credential      TEXT    NOT NULL,
    created_at      INTEGER NOT NULL
) STRICT;

CREATE TABLE runner_installs (
    org_id     TEXT    NOT NULL,
    runner_id  TEXT    NOT NULL,
    cluster_id TEXT    NOT NULL,
    state      TEXT    NOT NULL CHECK (state IN ('INSTALLING', 'INSTALLED', 'FAILED')),
    namespace  TEXT    NOT NULL,
    reason     TEXT    NOT NULL DEFAULT '',
    message    TEXT    NOT NULL DEFAULT '',
    hints      TEXT    NOT NULL DEFAULT '[]',
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (org_id, runner_id),
    FOREIGN KEY (org_id, runner_id) REFERENCES runners (org_id, runner_id) ON DELETE CASCADE
) STRICT;

CREATE INDEX runner_installs_state ON runner_installs (state);
