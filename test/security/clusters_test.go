package security

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	controlplanev1 "github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1/controlplanev1connect"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/connecttest"
	"github.com/sandboxd/sandboxd/internal/controlplane"
)

// clusters is the ClusterService of d as the holder of key sees it.
func (d *Dev) clusters(key string) controlplanev1connect.ClusterServiceClient {
	return controlplanev1connect.NewClusterServiceClient(&http.Client{}, d.API, connect.WithInterceptors(connecttest.Bearer(key)))
}

// TestClusterCredentialsNeverReturned: a registered cluster's credential (a token that can
// create namespaces and RBAC) is write-only. No call returns it — add, get, list, over
// Connect or REST — and the store and data directory hold it only sealed. A tenant
// organization's admin can neither register a cluster nor learn which exist.
func TestClusterCredentialsNeverReturned(t *testing.T) {
	d := needDev(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	secret := "sbx-security-cluster-token-" + time.Now().Format("150405.000000")
	kubeSecret := secret + "-kubeconfig"
	ca, err := os.ReadFile(filepath.Join(d.DataDir, "ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	id := "sec-" + strings.ReplaceAll(time.Now().Format("150405.000000"), ".", "-")
	platform := d.clusters(d.Admin)
	added, err := platform.AddCluster(ctx, connect.NewRequest(&controlplanev1.AddClusterRequest{Cluster: &controlplanev1.Cluster{
		ClusterId: id, Server: "https://192.0.2.1:6443", Token: secret, CaPem: string(ca)}}))
	if err != nil {
		t.Fatal(err)
	}
	kc := `apiVersion: v1
kind: Config
current-context: c
contexts: [{name: c, context: {cluster: k, user: u}}]
clusters: [{name: k, cluster: {server: "https://192.0.2.2:6443"}}]
users: [{name: u, user: {token: ` + kubeSecret + `}}]
`
	body, _ := json.Marshal(map[string]string{"clusterId": id + "-kc", "kubeconfig": kc})
	st, b := rest(t, d, "POST", "/v1/sandbox/clusters", "Bearer "+d.Admin, body)
	if st != http.StatusOK {
		t.Fatalf("REST add: %d %s", st, b)
	}
	seen := []string{string(b)}
	j, _ := json.Marshal(added.Msg)
	seen = append(seen, string(j))
	got, err := platform.GetCluster(ctx, connect.NewRequest(&controlplanev1.GetClusterRequest{ClusterId: id}))
	if err != nil {
		t.Fatal(err)
	}
	j, _ = json.Marshal(got.Msg)
	seen = append(seen, string(j))
	list, err := platform.ListClusters(ctx, connect.NewRequest(&controlplanev1.ListClustersRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	j, _ = json.Marshal(list.Msg)
	seen = append(seen, string(j))
	for _, p := range []string{"/v1/sandbox/clusters", "/v1/sandbox/clusters/" + id, "/v1/sandbox/clusters/" + id + "-kc"} {
		st, b := rest(t, d, "GET", p, "Bearer "+d.Admin, nil)
		if st != http.StatusOK {
			t.Fatalf("GET %s: %d %s", p, st, b)
		}
		seen = append(seen, string(b))
	}
	for i, s := range seen {
		if strings.Contains(s, secret) || strings.Contains(s, "BEGIN CERTIFICATE") || !strings.Contains(s, id) {
			t.Errorf("response %d carries the credential (or not the cluster): %s", i, s)
		}
	}
	// At rest: nothing under the data directory holds the token in the clear; the key is 0600.
	_ = filepath.WalkDir(d.DataDir, func(p string, e os.DirEntry, err error) error {
		if err != nil || e.IsDir() || strings.HasSuffix(p, ".sock") {
			return nil
		}
		if info, err := e.Info(); err != nil || info.Size() > 256<<20 || !info.Mode().IsRegular() {
			return nil
		}
		if b, err := os.ReadFile(p); err == nil && strings.Contains(string(b), secret) {
			t.Errorf("%s holds the cluster token in the clear", p)
		}
		return nil
	})
	if fi, err := os.Stat(filepath.Join(d.DataDir, controlplane.ClusterKeyFile)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("cluster key: %v %v, want mode 0600", fi, err)
	}

	// A tenant's admin may not add, list, get or delete clusters, over Connect or REST.
	tenant, err := d.NewKey("org-a", "admin")
	if err != nil {
		t.Fatal(err)
	}
	denied := func(what string, err error) {
		t.Helper()
		if connect.CodeOf(err) != connect.CodePermissionDenied || apierr.Reason(err) != apierr.PermissionDenied {
			t.Errorf("%s: %v, want PERMISSION_DENIED", what, err)
		}
	}
	tc := d.clusters(tenant)
	_, err = tc.AddCluster(ctx, connect.NewRequest(&controlplanev1.AddClusterRequest{Cluster: &controlplanev1.Cluster{
		ClusterId: id + "-t", Server: "https://192.0.2.1:6443", Token: "t", CaPem: string(ca), OrganizationId: "org-a"}}))
	denied("tenant adds", err)
	_, err = tc.ListClusters(ctx, connect.NewRequest(&controlplanev1.ListClustersRequest{}))
	denied("tenant lists", err)
	_, err = tc.GetCluster(ctx, connect.NewRequest(&controlplanev1.GetClusterRequest{ClusterId: id}))
	denied("tenant gets", err)
	_, err = tc.DeleteCluster(ctx, connect.NewRequest(&controlplanev1.DeleteClusterRequest{ClusterId: id}))
	denied("tenant deletes", err)
	for _, c := range []struct{ method, path string }{{"GET", "/v1/sandbox/clusters"}, {"GET", "/v1/sandbox/clusters/" + id},
		{"POST", "/v1/sandbox/clusters"}, {"DELETE", "/v1/sandbox/clusters/" + id}} {
		var body []byte
		if c.method == "POST" {
			body, _ = json.Marshal(map[string]string{"clusterId": id + "-t", "server": "https://192.0.2.1:6443", "token": "t", "caPem": string(ca)})
		}
		st, b := rest(t, d, c.method, c.path, "Bearer "+tenant, body)
		var e apiError
		_ = json.Unmarshal(b, &e)
		if st != http.StatusForbidden || e.reason() != apierr.PermissionDenied || strings.Contains(string(b), id) {
			t.Errorf("tenant %s %s: %d %s, want 403 %s", c.method, c.path, st, b, apierr.PermissionDenied)
		}
	}
	// Cleanup: the platform admin removes them (no runner names them).
	for _, c := range []string{id, id + "-kc"} {
		if _, err := platform.DeleteCluster(ctx, connect.NewRequest(&controlplanev1.DeleteClusterRequest{ClusterId: c})); err != nil {
			t.Errorf("delete %s: %v", c, err)
		}
	}
}
