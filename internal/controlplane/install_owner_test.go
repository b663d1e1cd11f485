package controlplane_test

import (
	"maps"
	"slices"
	"strings"
	"testing"

	"connectrpc.com/connect"

	controlplanev1 "github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/install"
	"github.com/sandboxd/sandboxd/internal/store"
)

// Two organizations' clusters that are one physical cluster (the bed's single fake target
// serves every registered cluster): their runners of one id (a duplicate from before
// runner IDs were unique across organizations, forced into the store) get two
// namespaces, and deleting one organization's runner deletes only its own.
func TestInstallTwoOrgsSameRunnerID(t *testing.T) {
	b := newClusterBed(t, installCfg, false)
	b.add(t, "c1", "")
	b.add(t, "c2", "tenant")
	nsPlat, nsTenant := install.Namespace("plat", "r1"), install.Namespace("tenant", "r1")
	if nsPlat == nsTenant {
		t.Fatalf("one namespace %s for both organizations", nsPlat)
	}
	b.createRunner(t, b.platform, "r1", "c1")
	// The tenant's runner goes into the store (no install yet), is renamed to r1 and is
	// installed as CreateManagedRunner would.
	if _, err := b.st.Runners().Create(t.Context(), store.Runner{Org: "tenant", RunnerID: "r1-dup", ClusterID: "c2", Zone: "z1"}); err != nil {
		t.Fatal(err)
	}
	forceRunnerID(t, b.path, "tenant", "r1-dup", "r1")
	dup, err := b.st.Runners().Get(t.Context(), "tenant", "r1")
	if err != nil {
		t.Fatal(err)
	}
	if err := b.svc.BeginInstall(t.Context(), dup); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ org, ns string }{{"plat", nsPlat}, {"tenant", nsTenant}} {
		if err := b.st.Runners().RecordHeartbeat(t.Context(), c.org, "r1", store.RunnerStatus{Version: "v1"}); err != nil {
			t.Fatal(err)
		}
	}
	b.waitInstall(t, b.platform, "r1", controlplanev1.RunnerInstallStatus_RUNNER_INSTALL_STATUS_INSTALLED)
	st := b.waitInstall(t, b.tenant, "r1", controlplanev1.RunnerInstallStatus_RUNNER_INSTALL_STATUS_INSTALLED)
	if st.GetInstallNamespace() != nsTenant {
		t.Fatalf("tenant's namespace %s, want %s", st.GetInstallNamespace(), nsTenant)
	}
	b.svc.WaitInstalls()
	b.target.mu.Lock()
	lp, lt := b.target.namespaces[nsPlat], b.target.namespaces[nsTenant]
	b.target.mu.Unlock()
	if !install.Owned(lp, "plat", "r1") || !install.Owned(lt, "tenant", "r1") || install.Owned(lp, "tenant", "r1") {
		t.Fatalf("labels %v / %v", lp, lt)
	}
	if _, err := b.svc.DeleteManagedRunner(b.tenant, connect.NewRequest(&controlplanev1.DeleteManagedRunnerRequest{RunnerId: "r1"})); err != nil {
		t.Fatal(err)
	}
	b.target.mu.Lock()
	defer b.target.mu.Unlock()
	if _, ok := b.target.namespaces[nsPlat]; !ok || !slices.Equal(b.target.deleted, []string{nsTenant}) {
		t.Fatalf("deleting the tenant's r1 deleted %v", b.target.deleted)
	}
}

// A namespace of the runner's name that the control plane did not create for it (no
// labels, or another runner's or organization's) is neither applied into nor deleted.
func TestInstallRefusesForeignNamespace(t *testing.T) {
	for name, labels := range map[string]map[string]string{
		"unlabelled":         nil,
		"another runner":     {install.ManagedByLabel: install.ManagedBy, install.RunnerLabel: "r9", install.OrgLabel: install.OrgHash("plat")},
		"another org":        {install.ManagedByLabel: install.ManagedBy, install.RunnerLabel: "r1", install.OrgLabel: install.OrgHash("tenant")},
		"another manager":    {install.ManagedByLabel: "Helm", install.RunnerLabel: "r1", install.OrgLabel: install.OrgHash("plat")},
		"org label missing":  {install.ManagedByLabel: install.ManagedBy, install.RunnerLabel: "r1"},
		"runner label empty": {install.ManagedByLabel: install.ManagedBy, install.RunnerLabel: "", install.OrgLabel: install.OrgHash("plat")},
	} {
		t.Run(name, func(t *testing.T) {
			b := newClusterBed(t, installCfg, false)
			b.add(t, "c1", "")
			ns := install.Namespace("plat", "r1")
			b.target.setNamespace(ns, labels)
			b.createRunner(t, b.platform, "r1", "c1")
			st := b.waitInstall(t, b.platform, "r1", controlplanev1.RunnerInstallStatus_RUNNER_INSTALL_STATUS_FAILED)
			e := st.GetInstallError()
			if e.GetReason() != apierr.InstallConflict || !strings.Contains(strings.Join(e.GetHints(), " "), "namespace "+ns+" exists and was not created by this control plane") {
				t.Fatalf("install error %v", e)
			}
			b.svc.WaitInstalls()
			b.target.mu.Lock()
			applied, got := slices.Clone(b.target.applied), maps.Clone(b.target.namespaces[ns])
			b.target.mu.Unlock()
			if len(applied) != 0 || !maps.Equal(got, labels) {
				t.Fatalf("applied %v into a foreign namespace (labels now %v)", applied, got)
			}
			// The install created nothing: the delete succeeds and leaves the namespace.
			if _, err := b.svc.DeleteManagedRunner(b.platform, connect.NewRequest(&controlplanev1.DeleteManagedRunnerRequest{RunnerId: "r1"})); err != nil {
				t.Fatal(err)
			}
			b.target.mu.Lock()
			defer b.target.mu.Unlock()
			if _, ok := b.target.namespaces[ns]; !ok || len(b.target.deleted) != 0 {
				t.Fatalf("foreign namespace deleted: %v", b.target.deleted)
			}
		})
	}
}

// A ClusterRole (or ClusterRoleBinding) of the runner's image pre-pull name that is not
// the runner's: the install is refused before creating anything and the object left as it
// was; the runner's delete then succeeds and still leaves it. An installed runner's
// uninstall deletes its own ClusterRole and ClusterRoleBinding with the namespace.
func TestInstallRefusesForeignClusterRole(t *testing.T) {
	for _, kind := range []string{"ClusterRole", "ClusterRoleBinding"} {
		t.Run(kind, func(t *testing.T) {
			b := newClusterBed(t, installCfg, false)
			b.add(t, "c1", "")
			ns := install.Namespace("plat", "r1")
			name := install.NodesRoleName(ns)
			foreign := map[string]string{install.ManagedByLabel: install.ManagedBy, install.RunnerLabel: "r1", install.OrgLabel: install.OrgHash("tenant")}
			b.target.mu.Lock()
			b.target.setObject(kind+"/"+name, foreign)
			b.target.mu.Unlock()
			b.createRunner(t, b.platform, "r1", "c1")
			st := b.waitInstall(t, b.platform, "r1", controlplanev1.RunnerInstallStatus_RUNNER_INSTALL_STATUS_FAILED)
			e := st.GetInstallError()
			if e.GetReason() != apierr.InstallConflict || !strings.Contains(strings.Join(e.GetHints(), " "), kind+" "+name+" exists and was not created by this control plane") {
				t.Fatalf("install error %v", e)
			}
			b.svc.WaitInstalls()
			b.target.mu.Lock()
			applied, nss := slices.Clone(b.target.applied), len(b.target.namespaces)
			b.target.mu.Unlock()
			if len(applied) != 0 || nss != 0 {
				t.Fatalf("applied %v, namespaces %d", applied, nss)
			}
			if _, err := b.svc.DeleteManagedRunner(b.platform, connect.NewRequest(&controlplanev1.DeleteManagedRunnerRequest{RunnerId: "r1"})); err != nil {
				t.Fatal(err)
			}
			b.target.mu.Lock()
			defer b.target.mu.Unlock()
			if !maps.Equal(b.target.objects[kind+"/"+name], foreign) || len(b.target.objDeleted) != 0 {
				t.Fatalf("foreign %s changed or deleted: %v %v", kind, b.target.objects, b.target.objDeleted)
			}
		})
	}
	t.Run("uninstall", func(t *testing.T) {
		b := newClusterBed(t, installCfg, false)
		b.add(t, "c1", "")
		name := install.NodesRoleName(install.Namespace("plat", "r1"))
		b.createRunner(t, b.platform, "r1", "c1")
		if err := b.st.Runners().RecordHeartbeat(t.Context(), "plat", "r1", store.RunnerStatus{Version: "v1"}); err != nil {
			t.Fatal(err)
		}
		b.waitInstall(t, b.platform, "r1", controlplanev1.RunnerInstallStatus_RUNNER_INSTALL_STATUS_INSTALLED)
		b.svc.WaitInstalls()
		if _, err := b.svc.DeleteManagedRunner(b.platform, connect.NewRequest(&controlplanev1.DeleteManagedRunnerRequest{RunnerId: "r1"})); err != nil {
			t.Fatal(err)
		}
		b.target.mu.Lock()
		defer b.target.mu.Unlock()
		if !slices.Equal(b.target.objDeleted, []string{"ClusterRoleBinding/" + name, "ClusterRole/" + name}) || len(b.target.objects) != 0 {
			t.Fatalf("deleted %v, left %v", b.target.objDeleted, b.target.objects)
		}
	})
}

// An installed runner whose namespace no longer carries its labels: the uninstall refuses
// to delete it (UninstallFailed, the runner stays); force forgets the runner and still
// leaves the namespace.
func TestUninstallRefusesForeignNamespace(t *testing.T) {
	b := newClusterBed(t, installCfg, false)
	b.add(t, "c1", "")
	ns := install.Namespace("plat", "r1")
	b.createRunner(t, b.platform, "r1", "c1")
	if err := b.st.Runners().RecordHeartbeat(t.Context(), "plat", "r1", store.RunnerStatus{Version: "v1"}); err != nil {
		t.Fatal(err)
	}
	b.waitInstall(t, b.platform, "r1", controlplanev1.RunnerInstallStatus_RUNNER_INSTALL_STATUS_INSTALLED)
	b.svc.WaitInstalls()
	b.target.mu.Lock()
	b.target.setNamespace(ns, map[string]string{"team": "payments"})
	b.target.mu.Unlock()
	_, err := b.svc.DeleteManagedRunner(b.platform, connect.NewRequest(&controlplanev1.DeleteManagedRunnerRequest{RunnerId: "r1"}))
	wantReason(t, "foreign namespace", err, connect.CodeFailedPrecondition, apierr.UninstallFailed)
	if !strings.Contains(err.Error(), "was not created by this control plane") || !strings.Contains(err.Error(), ns) {
		t.Fatalf("uninstall error: %v", err)
	}
	b.get(t, b.platform, "r1")
	if _, err := b.svc.DeleteManagedRunner(b.platform, connect.NewRequest(&controlplanev1.DeleteManagedRunnerRequest{RunnerId: "r1", Force: true})); err != nil {
		t.Fatal(err)
	}
	b.target.mu.Lock()
	defer b.target.mu.Unlock()
	if _, ok := b.target.namespaces[ns]; !ok || len(b.target.deleted) != 0 {
		t.Fatalf("foreign namespace deleted: %v", b.target.deleted)
	}
}

// A cluster's API server is registered to one organization: another organization's
// registration of it (spelt differently or not) is refused; the same organization's is not.
func TestAddClusterRefusesServerOfAnotherOrg(t *testing.T) {
	b := newClusterBed(t, installCfg, false)
	add := func(id, server, org string) error {
		_, err := b.svc.AddCluster(b.platform, connect.NewRequest(&controlplanev1.AddClusterRequest{Cluster: &controlplanev1.Cluster{
			ClusterId: id, Server: server, Token: secretToken, CaPem: b.caPEM, OrganizationId: org}}))
		return err
	}
	if err := add("a", "https://k8s.example:6443", "plat"); err != nil {
		t.Fatal(err)
	}
	for _, server := range []string{"https://k8s.example:6443", "https://K8S.example:6443/", "HTTPS://k8s.EXAMPLE:6443"} {
		err := add("b", server, "tenant")
		wantReason(t, server, err, connect.CodeFailedPrecondition, apierr.ClusterServerShared)
		if vs := apierr.Violations(err); len(vs) != 1 || vs[0].Field != "cluster.server" {
			t.Fatalf("%s: violations %v", server, vs)
		}
	}
	if err := add("a2", "https://k8s.example:6443", ""); err != nil { // the platform's again: its own
		t.Fatal(err)
	}
	if err := add("b", "https://k8s.example:6444", "tenant"); err != nil { // another server
		t.Fatal(err)
	}
}
