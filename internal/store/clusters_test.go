package store_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/store"
)

func cluster(id, org string) store.Cluster {
	return store.Cluster{ClusterID: id, Org: org, Server: "https://k8s.example:6443",
		CredentialKind: store.CredentialToken, Credential: []byte{0, 1, 2, 0xff, 'x'}}
}

func TestClusters(t *testing.T) {
	eachStore(t, func(t *testing.T, s store.Store) {
		ctx := t.Context()
		mustOrg(t, s, "plat")
		mustOrg(t, s, "tenant")
		c, err := s.Clusters().Create(ctx, cluster("c-2", "plat"))
		if err != nil {
			t.Fatal(err)
		}
		wantUTC(t, c.CreatedAt)
		if !bytes.Equal(c.Credential, []byte{0, 1, 2, 0xff, 'x'}) || c.Org != "plat" || c.CredentialKind != store.CredentialToken {
			t.Fatalf("created %+v", c)
		}
		_, err = s.Clusters().Create(ctx, cluster("c-2", "tenant"))
		wantKey(t, err, store.KeyClusterID)
		_, err = s.Clusters().Create(ctx, cluster("c-3", "nobody"))
		wantErr(t, err, store.ErrNotFound)
		bad := cluster("c-4", "plat")
		bad.CredentialKind = "PASSWORD"
		_, err = s.Clusters().Create(ctx, bad)
		wantErr(t, err, store.ErrInvalid)
		bad = cluster("c-4", "plat")
		bad.Credential = make([]byte, store.MaxSealedCredential+1)
		_, err = s.Clusters().Create(ctx, bad)
		wantErr(t, err, store.ErrInvalid)
		_, err = s.Clusters().Create(ctx, cluster("../x", "plat"))
		wantErr(t, err, store.ErrInvalid)
		k := cluster("c-1", "tenant")
		k.CredentialKind = store.CredentialKubeconfig
		if _, err := s.Clusters().Create(ctx, k); err != nil {
			t.Fatal(err)
		}
		cs, err := s.Clusters().List(ctx)
		if err != nil || len(cs) != 2 || cs[0].ClusterID != "c-1" || cs[1].ClusterID != "c-2" || cs[0].CredentialKind != store.CredentialKubeconfig {
			t.Fatalf("list %+v %v", cs, err)
		}
		got, err := s.Clusters().Get(ctx, "c-2")
		if err != nil || !got.CreatedAt.Equal(c.CreatedAt) || !bytes.Equal(got.Credential, c.Credential) {
			t.Fatalf("get %+v %v", got, err)
		}
		_, err = s.Clusters().Get(ctx, "c-9")
		wantErr(t, err, store.ErrNotFound)

		// A runner of the cluster's organization naming it keeps it; another
		// organization's runner of the same cluster_id does not (it is not installed there).
		mustRunner(t, s, "tenant", "other", "c-2")
		mustRunner(t, s, "plat", "r1", "c-2")
		err = s.Clusters().Delete(ctx, "c-2")
		var in *store.ClusterInUseError
		if !errors.Is(err, store.ErrClusterInUse) || !errors.As(err, &in) || len(in.RunnerIDs) != 1 || in.RunnerIDs[0] != "r1" {
			t.Fatalf("delete in use: %v", err)
		}
		if err := s.Runners().Delete(ctx, "plat", "r1", ""); err != nil {
			t.Fatal(err)
		}
		if err := s.Clusters().Delete(ctx, "c-2"); err != nil {
			t.Fatal(err)
		}
		wantErr(t, s.Clusters().Delete(ctx, "c-2"), store.ErrNotFound)
	})
}

func TestInstalls(t *testing.T) {
	eachStore(t, func(t *testing.T, s store.Store) {
		ctx := t.Context()
		mustOrg(t, s, "o")
		mustRunner(t, s, "o", "r1", "c1")
		mustRunner(t, s, "o", "r2", "c2")
		in, err := s.Installs().Put(ctx, store.Install{Org: "o", RunnerID: "r1", ClusterID: "c1", State: store.InstallInstalling, Namespace: "ns1"})
		if err != nil || in.State != store.InstallInstalling || in.Hints != nil {
			t.Fatalf("put %+v %v", in, err)
		}
		wantUTC(t, in.UpdatedAt)
		long := strings.Repeat("é", store.MaxInstallMessage) // 2 bytes each: cut mid-rune
		in, err = s.Installs().Put(ctx, store.Install{Org: "o", RunnerID: "r1", ClusterID: "c1", State: store.InstallFailed,
			Namespace: "ns1", Reason: "CWSANDBOX_INSTALL_FORBIDDEN", Message: long + "x", Hints: []string{"grant it", "or not"}})
		if err != nil || in.State != store.InstallFailed || len(in.Message) > store.MaxInstallMessage ||
			!strings.HasPrefix(long, strings.TrimSuffix(in.Message, "…")) || !strings.HasSuffix(in.Message, "…") || len(in.Hints) != 2 || in.Hints[1] != "or not" {
			t.Fatalf("put failed %+v %v", in, err)
		}
		if _, err := s.Installs().Put(ctx, store.Install{Org: "o", RunnerID: "r2", ClusterID: "c2", State: store.InstallInstalling, Namespace: "ns2"}); err != nil {
			t.Fatal(err)
		}
		_, err = s.Installs().Put(ctx, store.Install{Org: "o", RunnerID: "r2", ClusterID: "c2", State: "DONE", Namespace: "ns2"})
		wantErr(t, err, store.ErrInvalid)
		_, err = s.Installs().Put(ctx, store.Install{Org: "o", RunnerID: "nope", ClusterID: "c2", State: store.InstallInstalling, Namespace: "ns2"})
		wantErr(t, err, store.ErrNotFound)
		ls, err := s.Installs().ListState(ctx, store.InstallInstalling)
		if err != nil || len(ls) != 1 || ls[0].RunnerID != "r2" {
			t.Fatalf("installing: %+v %v", ls, err)
		}
		got, err := s.Installs().Get(ctx, "o", "r1")
		if err != nil || got.Reason != "CWSANDBOX_INSTALL_FORBIDDEN" || got.Namespace != "ns1" {
			t.Fatalf("get %+v %v", got, err)
		}
		// The install goes with its runner.
		if err := s.Runners().Delete(ctx, "o", "r1", ""); err != nil {
			t.Fatal(err)
		}
		_, err = s.Installs().Get(ctx, "o", "r1")
		wantErr(t, err, store.ErrNotFound)
	})
}
