package security

import (
	"bytes"
	"context"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/structpb"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	restclient "k8s.io/client-go/rest"

	controlplanev1 "github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1/controlplanev1connect"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/connecttest"
	"github.com/sandboxd/sandboxd/internal/controlplane"
	"github.com/sandboxd/sandboxd/internal/install"
	"github.com/sandboxd/sandboxd/internal/pki"
	"github.com/sandboxd/sandboxd/internal/store"
)

// oneCluster is one physical Kubernetes cluster as the control plane's install reaches it,
// whatever URL a registration names it by (install.Target: the control plane's own apply
// and delete logic runs against it; only the API server is simulated). It keeps each
// namespace's labels and which runner's Secret sits in it.
type oneCluster struct {
	mu      sync.Mutex
	labels  map[string]map[string]string // namespace -> labels
	secrets map[string]string            // namespace -> the runner id of the Secret applied there
	deleted []string
	objects map[string]map[string]string // cluster-scoped Kind/name -> labels
	// nsDeletes counts per namespace the namespaced deletes (DeleteNamespaced: the egress
	// objects of an install with egress off).
	nsDeletes map[string]int
}

func (c *oneCluster) Apply(_ context.Context, obj runtime.Object) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	m, _ := meta.Accessor(obj)
	switch obj.(type) {
	case *corev1.Namespace:
		c.labels[m.GetName()] = maps.Clone(m.GetLabels())
	case *corev1.Secret:
		if _, ok := c.labels[m.GetNamespace()]; !ok {
			return apierrors.NewNotFound(schema.GroupResource{Resource: "namespaces"}, m.GetNamespace())
		}
		c.secrets[m.GetNamespace()] = m.GetLabels()[install.RunnerLabel] + "@" + m.GetAnnotations()[install.OrgAnnotation]
	}
	return nil
}

func (c *oneCluster) CreateNamespace(_ context.Context, ns *corev1.Namespace) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.labels[ns.Name]; ok {
		return apierrors.NewAlreadyExists(schema.GroupResource{Resource: "namespaces"}, ns.Name)
	}
	c.labels[ns.Name] = maps.Clone(ns.Labels)
	return nil
}

func (c *oneCluster) GetNamespace(_ context.Context, name string) (*install.NamespaceInfo, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	l, ok := c.labels[name]
	if !ok {
		return nil, nil
	}
	return &install.NamespaceInfo{Labels: maps.Clone(l), UID: types.UID("uid-" + name)}, nil
}

func (c *oneCluster) DeleteNamespace(_ context.Context, name string, uid types.UID) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.labels[name]; ok && uid != types.UID("uid-"+name) {
		return apierrors.NewConflict(schema.GroupResource{Resource: "namespaces"}, name, nil)
	}
	delete(c.labels, name)
	delete(c.secrets, name)
	c.deleted = append(c.deleted, name)
	return nil
}

// The image pre-pull ClusterRole and ClusterRoleBinding: kept apart from namespaces
// (install's own tests check their ownership rule); each name is made once.
func (c *oneCluster) GetObject(_ context.Context, kind, name string) (*install.NamespaceInfo, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	l, ok := c.objects[kind+"/"+name]
	if !ok {
		return nil, nil
	}
	return &install.NamespaceInfo{Labels: maps.Clone(l), UID: types.UID("uid-" + kind + "/" + name)}, nil
}

func (c *oneCluster) CreateObject(_ context.Context, obj runtime.Object) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	m, _ := meta.Accessor(obj)
	key := obj.GetObjectKind().GroupVersionKind().Kind + "/" + m.GetName()
	if _, ok := c.objects[key]; ok {
		return apierrors.NewAlreadyExists(schema.GroupResource{Resource: "clusterroles"}, m.GetName())
	}
	if c.objects == nil {
		c.objects = map[string]map[string]string{}
	}
	c.objects[key] = maps.Clone(m.GetLabels())
	return nil
}

func (c *oneCluster) DeleteObject(_ context.Context, kind, name string, _ types.UID) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.objects, kind+"/"+name)
	return nil
}

func (c *oneCluster) DeleteNamespaced(_ context.Context, _, namespace, _ string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.nsDeletes == nil {
		c.nsDeletes = map[string]int{}
	}
	c.nsDeletes[namespace]++
	return nil
}

func (c *oneCluster) namespacedDeletes(ns string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nsDeletes[ns]
}

func (c *oneCluster) secret(ns string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.secrets[ns]
}

// TestInstallCannotTakeOverAnotherOrgsNamespace (review S1): one physical cluster is
// registered for organization A and, under another URL (an IP address instead of its DNS
// name: the control plane cannot tell they are one), for organization B. Each creates a
// runner r1. B's install must not apply over A's (before the fix both went to
// namespace sandboxd-r1, and B's Secret replaced A's), and deleting B's runner must not
// delete A's namespace. The same server URL for B is refused outright. Within one
// organization, a runner's install neither adopts nor deletes a namespace of its name
// that the control plane did not create for it. The control plane runs in this process
// with its real install path; only the cluster is simulated (oneCluster), so no root or
// Kubernetes is needed (test/k8s TestInstalledRunner checks the foreign namespace on a
// real cluster).
func TestInstallCannotTakeOverAnotherOrgsNamespace(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dir := t.TempDir()
	st, err := store.Open(ctx, filepath.Join(dir, "cp.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	keys := map[string]string{}
	for _, org := range []string{"platform", "org-a", "org-b"} {
		if err := controlplane.EnsureOrg(ctx, st, org); err != nil {
			t.Fatal(err)
		}
		if keys[org], err = controlplane.EnsureAdminKey(ctx, st, org); err != nil {
			t.Fatal(err)
		}
	}
	ca, err := pki.LoadOrCreateCA(filepath.Join(dir, "pki"), "security CA")
	if err != nil {
		t.Fatal(err)
	}
	cluster := &oneCluster{labels: map[string]map[string]string{}, secrets: map[string]string{}}
	authn := auth.NewStoreAuthenticator(st, nil)
	defer authn.Wait()
	svc, err := controlplane.New(controlplane.Config{Store: st, Auth: authn, PlatformOrg: "platform", CA: ca,
		Logger: slog.New(slog.DiscardHandler), ClusterKey: bytes.Repeat([]byte{3}, 32),
		Install: controlplane.InstallConfig{RunnerImage: "runner:v1", AgentImage: "agent:v1", ControlPlaneAddress: "cp.example:8443",
			HeartbeatTimeout: time.Minute,
			NewTarget:        func(*restclient.Config) (install.Target, error) { return cluster, nil }}})
	if err != nil {
		t.Fatal(err)
	}
	ictx, stop := context.WithCancel(ctx)
	defer svc.WaitInstalls()
	defer stop()
	if err := svc.ResumeInstalls(ictx); err != nil {
		t.Fatal(err)
	}
	tlsCfg, err := controlplane.TLSConfig(ca, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(svc.TLSHandler())
	srv.TLS = tlsCfg
	srv.StartTLS()
	defer srv.Close()
	base := strings.Replace(srv.URL, "127.0.0.1", "localhost", 1)
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: pki.ClientTLSConfig(nil, ca.Pool(), "localhost"), ForceAttemptHTTP2: true}}
	runners := func(org string) controlplanev1connect.RunnerManagementServiceClient {
		return controlplanev1connect.NewRunnerManagementServiceClient(hc, base, connect.WithInterceptors(connecttest.Bearer(keys[org])))
	}
	clusters := controlplanev1connect.NewClusterServiceClient(hc, base, connect.WithInterceptors(connecttest.Bearer(keys["platform"])))
	caPEM := string(ca.CertPEM())
	addCluster := func(id, server, org string) error {
		_, err := clusters.AddCluster(ctx, connect.NewRequest(&controlplanev1.AddClusterRequest{Cluster: &controlplanev1.Cluster{
			ClusterId: id, Server: server, Token: "tok", CaPem: caPEM, OrganizationId: org}}))
		return err
	}
	if err := addCluster("a", "https://k8s.example:6443", "org-a"); err != nil {
		t.Fatal(err)
	}
	err = addCluster("b-same", "https://K8S.example:6443/", "org-b")
	if connect.CodeOf(err) != connect.CodeFailedPrecondition || apierr.Reason(err) != apierr.ClusterServerShared {
		t.Fatalf("org B registers org A's cluster server: %v, want %s", err, apierr.ClusterServerShared)
	}
	if err := addCluster("b", "https://192.0.2.10:6443", "org-b"); err != nil {
		t.Fatal(err)
	}
	create := func(org, id, clusterID string) string {
		t.Helper()
		out, err := runners(org).CreateManagedRunner(ctx, connect.NewRequest(&controlplanev1.CreateManagedRunnerRequest{ManagedRunner: &controlplanev1.ManagedRunner{
			RunnerId: id, ClusterId: clusterID, Zone: "z", Policy: &structpb.Struct{}}}))
		if err != nil {
			t.Fatal(err)
		}
		return out.Msg.GetStatus().GetInstallNamespace()
	}
	// applied waits for the install to have applied the runner's Secret into ns (the
	// status shows INSTALLED as soon as the runner heartbeats, which may be before).
	applied := func(ns string) {
		t.Helper()
		for cluster.secret(ns) == "" {
			if ctx.Err() != nil {
				t.Fatalf("no Secret applied into %s", ns)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	wait := func(org, id string, want controlplanev1.RunnerInstallStatus) *controlplanev1.ManagedRunnerStatus {
		t.Helper()
		for {
			out, err := runners(org).GetManagedRunner(ctx, connect.NewRequest(&controlplanev1.GetManagedRunnerRequest{RunnerId: id}))
			if err != nil {
				t.Fatal(err)
			}
			if s := out.Msg.GetStatus(); s.GetInstallStatus() == want {
				return s
			}
			if ctx.Err() != nil {
				t.Fatalf("%s/%s: install %v, want %v", org, id, out.Msg.GetStatus().GetInstallStatus(), want)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	// A installs r1, and it runs.
	applied(create("org-a", "r1", "a"))
	if err := st.Runners().RecordHeartbeat(ctx, "org-a", "r1", store.RunnerStatus{Version: "v1"}); err != nil {
		t.Fatal(err)
	}
	nsA := wait("org-a", "r1", controlplanev1.RunnerInstallStatus_RUNNER_INSTALL_STATUS_INSTALLED).GetInstallNamespace()
	if cluster.secret(nsA) != "r1@org-a" {
		t.Fatalf("A's runner Secret in %s: %q", nsA, cluster.secret(nsA))
	}
	deletesA := cluster.namespacedDeletes(nsA) // A's own install (egress off) deleted its egress objects there
	// B cannot create a runner r1 of its own: runner IDs are unique across organizations.
	_, err = runners("org-b").CreateManagedRunner(ctx, connect.NewRequest(&controlplanev1.CreateManagedRunnerRequest{ManagedRunner: &controlplanev1.ManagedRunner{
		RunnerId: "r1", ClusterId: "b", Zone: "z", Policy: &structpb.Struct{}}}))
	if connect.CodeOf(err) != connect.CodeAlreadyExists || apierr.Reason(err) != apierr.AlreadyExists {
		t.Fatalf("org-b's r1: %v, want %s", err, apierr.AlreadyExists)
	}
	// B's r1 from older data (a duplicate forced into the store, its install started as
	// the create would) installs into the same physical cluster: another namespace; A's
	// Secret (its runner's bootstrap credential) is untouched.
	if _, err := st.Runners().Create(ctx, store.Runner{Org: "org-b", RunnerID: "r1-dup", ClusterID: "b", Zone: "z", Policy: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	forceRunnerID(t, filepath.Join(dir, "cp.db"), "org-b", "r1-dup", "r1")
	if _, err := st.Installs().Put(ctx, store.Install{Org: "org-b", RunnerID: "r1", ClusterID: "b", State: store.InstallInstalling,
		Namespace: install.Namespace("org-b", "r1")}); err != nil {
		t.Fatal(err)
	}
	if err := svc.ResumeInstalls(ictx); err != nil {
		t.Fatal(err)
	}
	applied(install.Namespace("org-b", "r1"))
	if err := st.Runners().RecordHeartbeat(ctx, "org-b", "r1", store.RunnerStatus{Version: "v1"}); err != nil {
		t.Fatal(err)
	}
	nsB := wait("org-b", "r1", controlplanev1.RunnerInstallStatus_RUNNER_INSTALL_STATUS_INSTALLED).GetInstallNamespace()
	if nsB == nsA || cluster.secret(nsA) != "r1@org-a" || cluster.secret(nsB) != "r1@org-b" {
		t.Fatalf("B's r1 in %s over A's in %s: A's Secret is %q", nsB, nsA, cluster.secret(nsA))
	}
	// Deleting B's runner deletes B's namespace only.
	if _, err := runners("org-b").DeleteManagedRunner(ctx, connect.NewRequest(&controlplanev1.DeleteManagedRunnerRequest{RunnerId: "r1"})); err != nil {
		t.Fatal(err)
	}
	if cluster.secret(nsA) != "r1@org-a" || len(cluster.deleted) != 1 || cluster.deleted[0] != nsB {
		t.Fatalf("deleting B's r1 deleted %v (A's namespace %s)", cluster.deleted, nsA)
	}
	if n := cluster.namespacedDeletes(nsA); n != deletesA {
		t.Fatalf("B's install and delete deleted %d objects in A's namespace %s", n-deletesA, nsA)
	}

	// B's runner whose namespace name is taken by a namespace it did not get from the
	// control plane — here one labelled as A's r1, as if copied: refused, nothing applied.
	nsTaken := install.Namespace("org-b", "r2")
	cluster.mu.Lock()
	cluster.labels[nsTaken] = maps.Clone(cluster.labels[nsA])
	cluster.secrets[nsTaken] = "r1@org-a"
	cluster.mu.Unlock()
	create("org-b", "r2", "b")
	ie := wait("org-b", "r2", controlplanev1.RunnerInstallStatus_RUNNER_INSTALL_STATUS_FAILED).GetInstallError()
	if ie.GetReason() != apierr.InstallConflict || !strings.Contains(strings.Join(ie.GetHints(), " "), "was not created by this control plane") {
		t.Fatalf("install into a namespace that is not the runner's: %v", ie)
	}
	if cluster.secret(nsTaken) != "r1@org-a" {
		t.Fatalf("applied into %s: its Secret is now %q", nsTaken, cluster.secret(nsTaken))
	}
	if _, err := runners("org-b").DeleteManagedRunner(ctx, connect.NewRequest(&controlplanev1.DeleteManagedRunnerRequest{RunnerId: "r2"})); err != nil {
		t.Fatal(err)
	}
	if _, ok := cluster.labels[nsTaken]; !ok {
		t.Fatalf("deleting B's r2 deleted the namespace it was refused: %v", cluster.deleted)
	}

	// Same organization: A's r3, whose namespace exists unlabelled (someone's own).
	nsOwn := install.Namespace("org-a", "r3")
	cluster.mu.Lock()
	cluster.labels[nsOwn] = map[string]string{"team": "payments"}
	cluster.mu.Unlock()
	if err := addCluster("a2", "https://k8s.example:6443", "org-a"); err != nil { // one runner per cluster; A's own server again
		t.Fatal(err)
	}
	create("org-a", "r3", "a2")
	if ie := wait("org-a", "r3", controlplanev1.RunnerInstallStatus_RUNNER_INSTALL_STATUS_FAILED).GetInstallError(); ie.GetReason() != apierr.InstallConflict {
		t.Fatalf("install into a foreign namespace: %v", ie)
	}
	if cluster.secret(nsOwn) != "" {
		t.Fatalf("applied into the foreign namespace %s", nsOwn)
	}
	// A's r1's namespace relabelled (no longer the control plane's): its delete refuses
	// to remove it.
	cluster.mu.Lock()
	cluster.labels[nsA] = map[string]string{"team": "payments"}
	cluster.mu.Unlock()
	_, err = runners("org-a").DeleteManagedRunner(ctx, connect.NewRequest(&controlplanev1.DeleteManagedRunnerRequest{RunnerId: "r1"}))
	if apierr.Reason(err) != apierr.UninstallFailed {
		t.Fatalf("delete of a runner whose namespace is no longer labelled its: %v, want %s", err, apierr.UninstallFailed)
	}
	cluster.mu.Lock()
	defer cluster.mu.Unlock()
	if _, ok := cluster.labels[nsA]; !ok || len(cluster.deleted) != 1 {
		t.Fatalf("deleted %v", cluster.deleted)
	}
}
