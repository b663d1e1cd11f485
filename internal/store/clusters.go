package store

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"regexp"

	"github.com/sandboxd/sandboxd/internal/textclip"
)

// ---- clusters ----

type clusters struct{ s *sqlStore }

func (s *sqlStore) Clusters() Clusters { return clusters{s} }

const clusterCols = `cluster_id, org_id, server, credential_kind, credential, created_at`

// clusterIDPattern is ManagedRunner.cluster_id's syntax.
var clusterIDPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// MaxSealedCredential bounds a sealed credential (a kubeconfig is at most 64 KiB, a token
// with its CA less; sealing adds a few bytes).
const MaxSealedCredential = 160 << 10

func scanCluster(r row) (Cluster, error) {
	var c Cluster
	var cred string
	var created dbTime
	if err := r.Scan(&c.ClusterID, &c.Org, &c.Server, &c.CredentialKind, &cred, &created); err != nil {
		return Cluster{}, err
	}
	b, err := base64.StdEncoding.DecodeString(cred)
	if err != nil {
		return Cluster{}, fmt.Errorf("cluster %s credential: %w", c.ClusterID, err)
	}
	c.Credential, c.CreatedAt = b, created.t
	return c, nil
}

func (cl clusters) Create(ctx context.Context, c Cluster) (Cluster, error) {
	if err := required("cluster_id", c.ClusterID, "org", c.Org, "server", c.Server); err != nil {
		return Cluster{}, err
	}
	if !clusterIDPattern.MatchString(c.ClusterID) {
		return Cluster{}, invalid("cluster_id %q", c.ClusterID)
	}
	if c.CredentialKind != CredentialKubeconfig && c.CredentialKind != CredentialToken {
		return Cluster{}, invalid("credential kind %q", c.CredentialKind)
	}
	if len(c.Credential) == 0 || len(c.Credential) > MaxSealedCredential {
		return Cluster{}, invalid("credential must be 1 to %d bytes (got %d)", MaxSealedCredential, len(c.Credential))
	}
	out, err := scanCluster(cl.s.d.queryRow(ctx, `INSERT INTO clusters (cluster_id, org_id, server, credential_kind,
		credential, created_at) VALUES ($1, $2, $3, $4, $5, $6) RETURNING `+clusterCols,
		c.ClusterID, c.Org, c.Server, c.CredentialKind, base64.StdEncoding.EncodeToString(c.Credential), now()))
	if err != nil {
		return Cluster{}, cl.s.writeErr("cluster", "create", err)
	}
	return out, nil
}

func (cl clusters) Get(ctx context.Context, clusterID string) (Cluster, error) {
	c, err := scanCluster(cl.s.d.queryRow(ctx, `SELECT `+clusterCols+` FROM clusters WHERE cluster_id = $1`, clusterID))
	return c, cl.s.readErr("cluster "+clusterID, err)
}

func (cl clusters) List(ctx context.Context) ([]Cluster, error) {
	rs, err := cl.s.d.query(ctx, `SELECT `+clusterCols+` FROM clusters ORDER BY cluster_id`)
	if err != nil {
		return nil, fmt.Errorf("list clusters: %w", err)
	}
	defer rs.Close()
	var out []Cluster
	for rs.Next() {
		c, err := scanCluster(rs)
		if err != nil {
			return nil, fmt.Errorf("list clusters: %w", err)
		}
		out = append(out, c)
	}
	if err := rs.Err(); err != nil {
		return nil, fmt.Errorf("list clusters: %w", err)
	}
	return out, nil
}

// Delete checks for runners and deletes in one transaction, so a runner created
// concurrently either sees the cluster (and installs) or is counted here.
func (cl clusters) Delete(ctx context.Context, clusterID string) error {
	return cl.s.d.tx(ctx, func(q querier) error {
		rs, err := q.query(ctx, `SELECT r.runner_id FROM runners r JOIN clusters c
			ON r.org_id = c.org_id AND r.cluster_id = c.cluster_id WHERE c.cluster_id = $1 ORDER BY r.runner_id LIMIT 5`, clusterID)
		if err != nil {
			return fmt.Errorf("delete cluster: %w", err)
		}
		var ids []string
		for rs.Next() {
			var id string
			if err := rs.Scan(&id); err != nil {
				rs.Close()
				return fmt.Errorf("delete cluster: %w", err)
			}
			ids = append(ids, id)
		}
		err = rs.Err()
		rs.Close()
		if err != nil {
			return fmt.Errorf("delete cluster: %w", err)
		}
		if len(ids) > 0 {
			return &ClusterInUseError{ClusterID: clusterID, RunnerIDs: ids}
		}
		n, err := q.exec(ctx, `DELETE FROM clusters WHERE cluster_id = $1`, clusterID)
		if err != nil {
			return fmt.Errorf("delete cluster: %w", err)
		}
		if n == 0 {
			return fmt.Errorf("cluster %s: %w", clusterID, ErrNotFound)
		}
		return nil
	})
}

// ---- runner installs ----

type installs struct{ s *sqlStore }

func (s *sqlStore) Installs() Installs { return installs{s} }

const installCols = `org_id, runner_id, cluster_id, state, namespace, reason, message, hints, updated_at`

// Bounds of an install's error, which quotes the Kubernetes API.
const (
	MaxInstallMessage = 2 << 10
	MaxInstallHints   = 8
	MaxInstallHint    = 512
)

func scanInstall(r row) (Install, error) {
	var in Install
	var hints dbJSON
	var updated dbTime
	if err := r.Scan(&in.Org, &in.RunnerID, &in.ClusterID, &in.State, &in.Namespace, &in.Reason, &in.Message,
		&hints, &updated); err != nil {
		return Install{}, err
	}
	if err := json.Unmarshal(hints, &in.Hints); err != nil {
		return Install{}, fmt.Errorf("install %s hints: %w", in.RunnerID, err)
	}
	if len(in.Hints) == 0 {
		in.Hints = nil
	}
	in.UpdatedAt = updated.t
	return in, nil
}

func (is installs) Put(ctx context.Context, in Install) (Install, error) {
	if err := required("org", in.Org, "runner_id", in.RunnerID, "cluster_id", in.ClusterID, "namespace", in.Namespace); err != nil {
		return Install{}, err
	}
	switch in.State {
	case InstallInstalling, InstallInstalled, InstallFailed:
	default:
		return Install{}, invalid("install state %q", in.State)
	}
	// The message quotes what a cluster answered: bounded here, whatever the caller did.
	in.Message = textclip.Clip(in.Message, MaxInstallMessage)
	in.Reason = textclip.Clip(in.Reason, 128)
	if len(in.Hints) > MaxInstallHints {
		in.Hints = in.Hints[:MaxInstallHints]
	}
	hints := make([]string, len(in.Hints))
	for i, h := range in.Hints {
		hints[i] = textclip.Clip(h, MaxInstallHint)
	}
	b, err := json.Marshal(hints)
	if err != nil {
		return Install{}, err
	}
	out, err := scanInstall(is.s.d.queryRow(ctx, `INSERT INTO runner_installs (org_id, runner_id, cluster_id, state,
		namespace, reason, message, hints, updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
		ON CONFLICT (org_id, runner_id) DO UPDATE SET cluster_id = excluded.cluster_id, state = excluded.state,
		namespace = excluded.namespace, reason = excluded.reason, message = excluded.message,
		hints = excluded.hints, updated_at = excluded.updated_at
		RETURNING `+installCols,
		in.Org, in.RunnerID, in.ClusterID, in.State, in.Namespace, in.Reason, in.Message, string(b), now()))
	if err != nil {
		return Install{}, is.s.writeErr("runner install", "put", err)
	}
	return out, nil
}

func (is installs) Get(ctx context.Context, org, runnerID string) (Install, error) {
	in, err := scanInstall(is.s.d.queryRow(ctx, `SELECT `+installCols+` FROM runner_installs
		WHERE org_id = $1 AND runner_id = $2`, org, runnerID))
	return in, is.s.readErr("runner install "+runnerID, err)
}

func (is installs) ListState(ctx context.Context, state string) ([]Install, error) {
	rs, err := is.s.d.query(ctx, `SELECT `+installCols+` FROM runner_installs WHERE state = $1
		ORDER BY org_id, runner_id`, state)
	if err != nil {
		return nil, fmt.Errorf("list installs: %w", err)
	}
	defer rs.Close()
	var out []Install
	for rs.Next() {
		in, err := scanInstall(rs)
		if err != nil {
			return nil, fmt.Errorf("list installs: %w", err)
		}
		out = append(out, in)
	}
	if err := rs.Err(); err != nil {
		return nil, fmt.Errorf("list installs: %w", err)
	}
	return out, nil
}
