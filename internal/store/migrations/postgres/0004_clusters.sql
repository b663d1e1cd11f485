-- Clusters (issue 18): the Kubernetes clusters the control plane installs runners into,
-- platform-wide (cluster_id is unique across organizations), each for one organization's
-- runners. credential is the sealed credential (AES-256-GCM under the control plane's
-- cluster key, base64): the store never sees it in the clear.
-- runner_installs: a runner the control plane installs (or installed) into a registered
-- cluster, and how far it got; it goes with its runner. hints is a JSON array of strings.
-- Keep in step with ../sqlite/0004_clusters.sql.

CREATE TABLE clusters (
    cluster_id      text        NOT NULL,
    org_id          text        NOT NULL REFERENCES organizations (id),
    server          text        NOT NULL,
    credential_kind text        NOT NULL,
    credential      text        NOT NULL,
    created_at      timestamptz NOT NULL,
    CONSTRAINT clusters_pkey PRIMARY KEY (cluster_id),
    CONSTRAINT clusters_credential_kind CHECK (credential_kind IN ('KUBECONFIG', 'SERVICE_ACCOUNT_TOKEN'))
);

CREATE TABLE runner_installs (
    org_id     text        NOT NULL,
    runner_id  text        NOT NULL,
    cluster_id text        NOT NULL,
    state      text        NOT NULL,
    namespace  text        NOT NULL,
    reason     text        NOT NULL DEFAULT '',
    message    text        NOT NULL DEFAULT '',
    hints      json        NOT NULL DEFAULT '[]',
    updated_at timestamptz NOT NULL,
    CONSTRAINT runner_installs_pkey PRIMARY KEY (org_id, runner_id),
    CONSTRAINT runner_installs_state CHECK (state IN ('INSTALLING', 'INSTALLED', 'FAILED')),
    CONSTRAINT runner_installs_runner_fkey FOREIGN KEY (org_id, runner_id) REFERENCES runners (org_id, runner_id) ON DELETE CASCADE
);

CREATE INDEX runner_installs_state_idx ON runner_installs (state);
