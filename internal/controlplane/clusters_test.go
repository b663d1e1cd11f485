package controlplane_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	controlplanev1 "github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/controlplane"
	"github.com/sandboxd/sandboxd/internal/install"
	"github.com/sandboxd/sandboxd/internal/pki"
	"github.com/sandboxd/sandboxd/internal/store"
)

const secretToken = "eyJhbGciOiJSUzI1NiJ9.very-secret-token"

func testCA(t testing.TB) *pki.CA {
	t.Helper()
	ca, err := pki.LoadOrCreateCA(t.TempDir(), "test CA")
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// kubeconfig is a kubeconfig whose current context reaches server with token; edit
// changes it before it is written.
func kubeconfig(t testing.TB, server string, caPEM []byte, edit func(*clientcmdapi.Config)) string {
	t.Helper()
	c := clientcmdapi.NewConfig()
	c.Clusters["k"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: caPEM}
	c.AuthInfos["u"] = &clientcmdapi.AuthInfo{Token: secretToken}
	c.Contexts["ctx"] = &clientcmdapi.Context{Cluster: "k", AuthInfo: "u"}
	c.CurrentContext = "ctx"
	if edit != nil {
		edit(c)
	}
	b, err := clientcmd.Write(*c)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestValidateCluster(t *testing.T) {
	caPEM := string(testCA(t).CertPEM())
	kc := func(edit func(*clientcmdapi.Config)) string {
		return kubeconfig(t, "https://k8s.example:6443", []byte(caPEM), edit)
	}
	tokenCluster := func() *controlplanev1.Cluster {
		return &controlplanev1.Cluster{ClusterId: "prod-1", Server: "https://10.0.0.1:6443", Token: secretToken, CaPem: caPEM}
	}
	for _, tc := range []struct {
		name   string
		c      *controlplanev1.Cluster
		fields []string // nil: valid
	}{
		{"token", tokenCluster(), nil},
		{"kubeconfig", &controlplanev1.Cluster{ClusterId: "c", Kubeconfig: kc(nil)}, nil},
		{"kubeconfig with its server", &controlplanev1.Cluster{ClusterId: "c", Server: "https://k8s.example:6443", Kubeconfig: kc(nil)}, nil},
		{"kubeconfig, other server", &controlplanev1.Cluster{ClusterId: "c", Server: "https://evil:6443", Kubeconfig: kc(nil)}, []string{"cluster.server"}},
		{"no credential", &controlplanev1.Cluster{ClusterId: "c"}, []string{"cluster.kubeconfig"}},
		{"both", &controlplanev1.Cluster{ClusterId: "c", Kubeconfig: kc(nil), Token: "t"}, []string{"cluster.token"}},
		{"bad id", func() *controlplanev1.Cluster { c := tokenCluster(); c.ClusterId = "../x"; return c }(), []string{"cluster.cluster_id"}},
		{"http server", func() *controlplanev1.Cluster { c := tokenCluster(); c.Server = "http://10.0.0.1"; return c }(), []string{"cluster.server"}},
		{"server with user", func() *controlplanev1.Cluster { c := tokenCluster(); c.Server = "https://a:b@h"; return c }(), []string{"cluster.server"}},
		{"token without CA", func() *controlplanev1.Cluster { c := tokenCluster(); c.CaPem = ""; return c }(), []string{"cluster.ca_pem"}},
		{"token with a key for CA", func() *controlplanev1.Cluster {
			c := tokenCluster()
			c.CaPem = "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"
			return c
		}(), []string{"cluster.ca_pem"}},
		{"token with a space", func() *controlplanev1.Cluster { c := tokenCluster(); c.Token = "a b"; return c }(), []string{"cluster.token"}},
		{"token too long", func() *controlplanev1.Cluster {
			c := tokenCluster()
			c.Token = strings.Repeat("a", controlplane.MaxToken+1)
			return c
		}(), []string{"cluster.token"}},
		{"kubeconfig too long", &controlplanev1.Cluster{ClusterId: "c", Kubeconfig: kc(nil) + "#" + strings.Repeat("x", controlplane.MaxKubeconfig)}, []string{"cluster.kubeconfig"}},
		{"kubeconfig not YAML", &controlplanev1.Cluster{ClusterId: "c", Kubeconfig: "{{{"}, []string{"cluster.kubeconfig"}},
		{"exec plugin", &controlplanev1.Cluster{ClusterId: "c", Kubeconfig: kc(func(c *clientcmdapi.Config) {
			c.AuthInfos["u"] = &clientcmdapi.AuthInfo{Exec: &clientcmdapi.ExecConfig{Command: "/bin/sh", APIVersion: "client.authentication.k8s.io/v1"}}
		})}, []string{"cluster.kubeconfig"}},
		{"token file", &controlplanev1.Cluster{ClusterId: "c", Kubeconfig: kc(func(c *clientcmdapi.Config) {
			c.AuthInfos["u"] = &clientcmdapi.AuthInfo{TokenFile: "/etc/shadow"}
		})}, []string{"cluster.kubeconfig"}},
		{"CA file", &controlplanev1.Cluster{ClusterId: "c", Kubeconfig: kc(func(c *clientcmdapi.Config) {
			c.Clusters["k"].CertificateAuthorityData, c.Clusters["k"].CertificateAuthority = nil, "/etc/ssl/ca.pem"
		})}, []string{"cluster.kubeconfig"}},
		{"insecure", &controlplanev1.Cluster{ClusterId: "c", Kubeconfig: kc(func(c *clientcmdapi.Config) {
			c.Clusters["k"].CertificateAuthorityData, c.Clusters["k"].InsecureSkipTLSVerify = nil, true
		})}, []string{"cluster.kubeconfig"}},
		{"kubeconfig http", &controlplanev1.Cluster{ClusterId: "c", Kubeconfig: kc(func(c *clientcmdapi.Config) { c.Clusters["k"].Server = "http://x" })}, []string{"cluster.kubeconfig"}},
		{"no current context", &controlplanev1.Cluster{ClusterId: "c", Kubeconfig: kc(func(c *clientcmdapi.Config) { c.CurrentContext = "" })}, []string{"cluster.kubeconfig"}},
		{"kubeconfig and CA", &controlplanev1.Cluster{ClusterId: "c", Kubeconfig: kc(nil), CaPem: caPEM}, []string{"cluster.ca_pem"}},
		{"kind is output only", func() *controlplanev1.Cluster {
			c := tokenCluster()
			c.CredentialKind = controlplanev1.ClusterCredentialKind_CLUSTER_CREDENTIAL_KIND_KUBECONFIG
			return c
		}(), []string{"cluster.credential_kind"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cred, err := controlplane.ValidateCluster(tc.c)
			if tc.fields == nil {
				if err != nil || !strings.HasPrefix(cred.Server, "https://") || (cred.Token == "") == (cred.Kubeconfig == "") {
					t.Fatalf("valid: %+v %v", cred, err)
				}
				return
			}
			if connect.CodeOf(err) != connect.CodeInvalidArgument || apierr.Reason(err) != apierr.InvalidRequest {
				t.Fatalf("err = %v, want INVALID_ARGUMENT", err)
			}
			if got := fields(err); !slices.Equal(got, tc.fields) {
				t.Fatalf("violations on %v, want %v (%v)", got, tc.fields, err)
			}
			if strings.Contains(err.Error(), secretToken) {
				t.Fatalf("the error quotes the credential: %v", err)
			}
		})
	}
}

// FuzzValidateCluster: whatever a caller sends, validation does not panic, and what it
// accepts is a usable credential of one kind for an https server.
func FuzzValidateCluster(f *testing.F) {
	caPEM := string(testCA(f).CertPEM())
	f.Add("c", "", kubeconfig(f, "https://k8s.example:6443", []byte(caPEM), nil), "", "")
	f.Add("c", "https://10.0.0.1:6443", "", secretToken, caPEM)
	f.Add("c", "https://[::1]:6443/path", "", "t", caPEM+"junk")
	f.Add("c", "", "apiVersion: v1\nkind: Config\ncurrent-context: x\ncontexts: [{name: x, context: {cluster: k, user: u}}]\nclusters: [{name: k, cluster: {server: 'https://h'}}]\nusers: [{name: u, user: {exec: {command: sh}}}]\n", "", "")
	f.Add("c", "", "clusters: [{name: k, cluster: {server: 'https://h', certificate-authority: /etc/passwd}}]", "", "")
	f.Fuzz(func(t *testing.T, id, server, kc, token, ca string) {
		cred, err := controlplane.ValidateCluster(&controlplanev1.Cluster{ClusterId: id, Server: server, Kubeconfig: kc, Token: token, CaPem: ca})
		if err != nil {
			if connect.CodeOf(err) != connect.CodeInvalidArgument {
				t.Fatalf("err %v: want INVALID_ARGUMENT", err)
			}
			return
		}
		if !strings.HasPrefix(cred.Server, "https://") || (cred.Token == "") == (cred.Kubeconfig == "") ||
			len(cred.Kubeconfig) > controlplane.MaxKubeconfig || len(cred.Token) > controlplane.MaxToken {
			t.Fatalf("accepted %+v", cred)
		}
		rc, err := cred.RESTConfig()
		if err != nil || rc.Host == "" || rc.ExecProvider != nil || rc.AuthProvider != nil || rc.BearerTokenFile != "" ||
			rc.CAFile != "" || rc.CertFile != "" || rc.KeyFile != "" || rc.Insecure {
			t.Fatalf("accepted credential gives %+v %v", rc, err)
		}
	})
}

func TestSealer(t *testing.T) {
	key, err := pki.LoadOrCreateSecret(filepath.Join(t.TempDir(), controlplane.ClusterKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	s, err := controlplane.NewSealer(key)
	if err != nil {
		t.Fatal(err)
	}
	c := controlplane.ClusterCredential{Server: "https://h", Token: secretToken, CAPEM: "pem"}
	sealed, err := s.Seal("c1", c)
	if err != nil || bytes.Contains(sealed, []byte(secretToken)) {
		t.Fatalf("sealed %q %v", sealed, err)
	}
	again, _ := s.Seal("c1", c)
	if bytes.Equal(sealed, again) {
		t.Fatal("two seals are equal: nonce reused")
	}
	if got, err := s.Open("c1", sealed); err != nil || got != c {
		t.Fatalf("open: %+v %v", got, err)
	}
	if _, err := s.Open("c2", sealed); err == nil {
		t.Fatal("a credential sealed for c1 opens as c2's")
	}
	sealed[len(sealed)-1] ^= 1
	if _, err := s.Open("c1", sealed); err == nil {
		t.Fatal("a tampered credential opens")
	}
	other, _ := controlplane.NewSealer(bytes.Repeat([]byte{7}, 32))
	if _, err := other.Open("c1", again); err == nil {
		t.Fatal("opens under another key")
	}
	if _, err := controlplane.NewSealer([]byte("short")); err == nil {
		t.Fatal("short key accepted")
	}
}

// fakeTarget records applies and fails on demand (failure injection only: the real
// apply is tested on a cluster, test/k8s). It keeps the namespaces' labels, so tests can
// put a namespace someone else made in the way.
type fakeTarget struct {
	mu          sync.Mutex
	applied     []string // Kind/name
	failKind    string
	failErr     error
	deleted     []string
	deleteErr   error
	namespaces  map[string]map[string]string // name -> labels
	objects     map[string]map[string]string // cluster-scoped Kind/name -> labels
	objDeleted  []string                     // cluster-scoped Kind/name
	nsDeleted   []string                     // namespaced Kind/namespace/name (DeleteNamespaced)
	runnerArgs  []string                     // the last applied Deployment's runner args
	runnerImage string                       // and its image
	deployments int                          // Deployments applied
}

func (f *fakeTarget) Apply(_ context.Context, obj runtime.Object) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	m, _ := meta.Accessor(obj)
	kind := obj.GetObjectKind().GroupVersionKind().Kind
	if kind == f.failKind {
		return &install.ApplyError{Kind: kind, Name: m.GetName(), Namespace: m.GetNamespace(), Err: f.failErr}
	}
	if kind == "Namespace" {
		f.setNamespace(m.GetName(), m.GetLabels())
	}
	if kind == "ClusterRole" || kind == "ClusterRoleBinding" {
		f.setObject(kind+"/"+m.GetName(), m.GetLabels())
	}
	if d, ok := obj.(*appsv1.Deployment); ok {
		f.runnerArgs = slices.Clone(d.Spec.Template.Spec.Containers[0].Args)
		f.runnerImage = d.Spec.Template.Spec.Containers[0].Image
		f.deployments++
	}
	f.applied = append(f.applied, kind+"/"+m.GetName())
	return nil
}

func (f *fakeTarget) setNamespace(name string, labels map[string]string) {
	if f.namespaces == nil {
		f.namespaces = map[string]map[string]string{}
	}
	f.namespaces[name] = maps.Clone(labels)
}

func (f *fakeTarget) setObject(key string, labels map[string]string) {
	if f.objects == nil {
		f.objects = map[string]map[string]string{}
	}
	f.objects[key] = maps.Clone(labels)
}

func (f *fakeTarget) GetObject(_ context.Context, kind, name string) (*install.NamespaceInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	l, ok := f.objects[kind+"/"+name]
	if !ok {
		return nil, nil
	}
	return &install.NamespaceInfo{Labels: maps.Clone(l), UID: types.UID("uid-" + kind + "/" + name)}, nil
}

func (f *fakeTarget) CreateObject(_ context.Context, obj runtime.Object) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	m, _ := meta.Accessor(obj)
	key := obj.GetObjectKind().GroupVersionKind().Kind + "/" + m.GetName()
	if _, ok := f.objects[key]; ok {
		return apierrors.NewAlreadyExists(schema.GroupResource{Resource: "clusterroles"}, m.GetName())
	}
	f.setObject(key, m.GetLabels())
	return nil
}

func (f *fakeTarget) DeleteObject(_ context.Context, kind, name string, _ types.UID) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.deleteErr != nil {
		return &install.ApplyError{Kind: kind, Name: name, Err: f.deleteErr, Delete: true}
	}
	f.objDeleted = append(f.objDeleted, kind+"/"+name)
	delete(f.objects, kind+"/"+name)
	return nil
}

func (f *fakeTarget) DeleteNamespaced(_ context.Context, kind, namespace, name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.deleteErr != nil {
		return &install.ApplyError{Kind: kind, Name: name, Namespace: namespace, Err: f.deleteErr, Delete: true}
	}
	f.nsDeleted = append(f.nsDeleted, kind+"/"+namespace+"/"+name)
	return nil
}

func (f *fakeTarget) CreateNamespace(_ context.Context, ns *corev1.Namespace) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failKind == "Namespace" {
		return &install.ApplyError{Kind: "Namespace", Name: ns.Name, Err: f.failErr}
	}
	if _, ok := f.namespaces[ns.Name]; ok {
		return &install.ApplyError{Kind: "Namespace", Name: ns.Name, Err: apierrors.NewAlreadyExists(schema.GroupResource{Resource: "namespaces"}, ns.Name)}
	}
	f.setNamespace(ns.Name, ns.Labels)
	return nil
}

func (f *fakeTarget) GetNamespace(_ context.Context, name string) (*install.NamespaceInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	l, ok := f.namespaces[name]
	if !ok {
		return nil, nil
	}
	return &install.NamespaceInfo{Labels: maps.Clone(l), UID: types.UID("uid-" + name)}, nil
}

func (f *fakeTarget) DeleteNamespace(_ context.Context, name string, _ types.UID) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.deleteErr != nil {
		return &install.ApplyError{Kind: "Namespace", Name: name, Err: f.deleteErr, Delete: true}
	}
	f.deleted = append(f.deleted, name)
	delete(f.namespaces, name)
	return nil
}

type clusterBed struct {
	path     string // the SQLite database
	st       store.Store
	ca       *pki.CA
	mu       sync.Mutex // hosts
	svc      *controlplane.Service
	platform context.Context // platform admin
	tenant   context.Context // tenant admin
	target   *fakeTarget
	caPEM    string
	hosts    []string // API servers targets were made for
}

func newClusterBed(t *testing.T, cfg controlplane.InstallConfig, noCA bool) *clusterBed {
	t.Helper()
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "cp.db")
	st, err := store.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	for _, o := range []string{"plat", "tenant"} {
		if err := controlplane.EnsureOrg(ctx, st, o); err != nil {
			t.Fatal(err)
		}
	}
	b := &clusterBed{path: path, st: st, target: &fakeTarget{}}
	b.ca = testCA(t)
	b.caPEM = string(b.ca.CertPEM())
	if noCA {
		b.ca = nil
	}
	b.restart(t, cfg, nil)
	b.platform = auth.WithPrincipal(ctx, auth.Principal{KeyID: "k1", Org: "plat", Role: auth.RoleAdmin})
	b.tenant = auth.WithPrincipal(ctx, auth.Principal{KeyID: "k2", Org: "tenant", Role: auth.RoleAdmin})
	return b
}

// restart replaces the bed's control plane by one on the same store, CA and cluster key
// with install settings cfg and channel targets targets (nil: none), as a control plane
// restarted with other flags; it resumes the INSTALLING installs.
func (b *clusterBed) restart(t *testing.T, cfg controlplane.InstallConfig, targets map[string]string) {
	t.Helper()
	cfg.NewTarget = func(rc *rest.Config) (install.Target, error) {
		b.mu.Lock()
		b.hosts = append(b.hosts, rc.Host+" "+rc.BearerToken)
		b.mu.Unlock()
		return b.target, nil
	}
	svc, err := controlplane.New(controlplane.Config{Store: b.st, Auth: auth.NewStoreAuthenticator(b.st, nil), PlatformOrg: "plat",
		Logger: slog.New(slog.DiscardHandler), CA: b.ca, ClusterKey: bytes.Repeat([]byte{1}, 32), Install: cfg, TargetVersions: targets})
	if err != nil {
		t.Fatal(err)
	}
	if b.svc != nil {
		b.svc.WaitInstalls()
	}
	b.svc = svc
	// Installs run under the test's context: it ends (stopping them) before WaitInstalls.
	if err := b.svc.ResumeInstalls(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.svc.WaitInstalls)
}

// resumeInstalling puts runner id of cluster (registered) into the store with its install
// record in state, as a control plane that stopped leaves them, resumes the installs and
// waits until the fake target satisfies done (checked under its lock).
func (b *clusterBed) resumeInstalling(t *testing.T, id, cluster, state string, done func(*fakeTarget) bool) {
	t.Helper()
	ctx := t.Context()
	if _, err := b.st.Runners().Create(ctx, store.Runner{Org: "plat", RunnerID: id, ClusterID: cluster, Zone: "z", ReleaseChannel: store.ChannelStable}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.st.Installs().Put(ctx, store.Install{Org: "plat", RunnerID: id, ClusterID: cluster, State: state, Namespace: install.Namespace("plat", id)}); err != nil {
		t.Fatal(err)
	}
	if err := b.svc.ResumeInstalls(ctx); err != nil {
		t.Fatal(err)
	}
	b.waitTarget(t, done)
}

// waitTarget waits until the fake target satisfies done (checked under its lock).
func (b *clusterBed) waitTarget(t *testing.T, done func(*fakeTarget) bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		b.target.mu.Lock()
		ok := done(b.target)
		applied := slices.Clone(b.target.applied)
		b.target.mu.Unlock()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("fake target: applied %v", applied)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (b *clusterBed) add(t *testing.T, id, org string) *controlplanev1.Cluster {
	t.Helper()
	out, err := b.svc.AddCluster(b.platform, connect.NewRequest(&controlplanev1.AddClusterRequest{Cluster: &controlplanev1.Cluster{
		ClusterId: id, Server: "https://" + id + ".example:6443", Token: secretToken, CaPem: b.caPEM, OrganizationId: org}}))
	if err != nil {
		t.Fatal(err)
	}
	return out.Msg
}

func (b *clusterBed) createRunner(t *testing.T, ctx context.Context, id, cluster string) *controlplanev1.ManagedRunner {
	t.Helper()
	out, err := b.svc.CreateManagedRunner(ctx, connect.NewRequest(&controlplanev1.CreateManagedRunnerRequest{ManagedRunner: &controlplanev1.ManagedRunner{
		RunnerId: id, ClusterId: cluster, Zone: "z1", Policy: &structpb.Struct{}}}))
	if err != nil {
		t.Fatal(err)
	}
	return out.Msg
}

func (b *clusterBed) get(t *testing.T, ctx context.Context, id string) *controlplanev1.ManagedRunnerStatus {
	t.Helper()
	out, err := b.svc.GetManagedRunner(ctx, connect.NewRequest(&controlplanev1.GetManagedRunnerRequest{RunnerId: id}))
	if err != nil {
		t.Fatal(err)
	}
	return out.Msg.GetStatus()
}

var installCfg = controlplane.InstallConfig{RunnerImage: "runner:v1", AgentImage: "agent:v1", ControlPlaneAddress: "cp.example:8443",
	HeartbeatTimeout: time.Minute}

func TestClusterServiceNeverReturnsCredentials(t *testing.T) {
	b := newClusterBed(t, installCfg, false)
	added := b.add(t, "c1", "")
	b.add(t, "c0", "tenant")
	list, err := b.svc.ListClusters(b.platform, connect.NewRequest(&controlplanev1.ListClustersRequest{}))
	if err != nil || len(list.Msg.GetClusters()) != 2 || list.Msg.GetClusters()[0].GetClusterId() != "c0" {
		t.Fatalf("list: %v %v", list, err)
	}
	got, err := b.svc.GetCluster(b.platform, connect.NewRequest(&controlplanev1.GetClusterRequest{ClusterId: "c1"}))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range append(list.Msg.GetClusters(), added, got.Msg) {
		j, _ := protojson.Marshal(c)
		if c.GetToken() != "" || c.GetKubeconfig() != "" || c.GetCaPem() != "" || strings.Contains(string(j), secretToken) {
			t.Fatalf("a response carries the credential: %s", j)
		}
		if c.GetCredentialKind() != controlplanev1.ClusterCredentialKind_CLUSTER_CREDENTIAL_KIND_SERVICE_ACCOUNT_TOKEN || !strings.HasPrefix(c.GetServer(), "https://") {
			t.Fatalf("response: %s", j)
		}
	}
	if got.Msg.GetOrganizationId() != "plat" {
		t.Fatalf("default organization: %v", got.Msg)
	}
	// The store holds it sealed.
	rec, err := b.st.Clusters().Get(t.Context(), "c1")
	if err != nil || bytes.Contains(rec.Credential, []byte(secretToken)) {
		t.Fatalf("stored in the clear: %v", err)
	}
	_, err = b.svc.AddCluster(b.platform, connect.NewRequest(&controlplanev1.AddClusterRequest{Cluster: &controlplanev1.Cluster{
		ClusterId: "c1", Server: "https://x:6443", Token: "t", CaPem: b.caPEM}}))
	wantReason(t, "add again", err, connect.CodeAlreadyExists, apierr.AlreadyExists)
	_, err = b.svc.AddCluster(b.platform, connect.NewRequest(&controlplanev1.AddClusterRequest{Cluster: &controlplanev1.Cluster{
		ClusterId: "c9", Server: "https://x:6443", Token: "t", CaPem: b.caPEM, OrganizationId: "nobody"}}))
	wantReason(t, "unknown organization", err, connect.CodeInvalidArgument, apierr.InvalidRequest)
	_, err = b.svc.GetCluster(b.platform, connect.NewRequest(&controlplanev1.GetClusterRequest{ClusterId: "c9"}))
	wantReason(t, "get missing", err, connect.CodeNotFound, apierr.ClusterNotFound)

	// A tenant's admin can do none of it.
	_, err = b.svc.ListClusters(b.tenant, connect.NewRequest(&controlplanev1.ListClustersRequest{}))
	wantReason(t, "tenant lists", err, connect.CodePermissionDenied, apierr.PermissionDenied)
	_, err = b.svc.GetCluster(b.tenant, connect.NewRequest(&controlplanev1.GetClusterRequest{ClusterId: "c0"}))
	wantReason(t, "tenant gets", err, connect.CodePermissionDenied, apierr.PermissionDenied)
	_, err = b.svc.AddCluster(b.tenant, connect.NewRequest(&controlplanev1.AddClusterRequest{Cluster: &controlplanev1.Cluster{
		ClusterId: "t1", Server: "https://x:6443", Token: "t", CaPem: b.caPEM}}))
	wantReason(t, "tenant adds", err, connect.CodePermissionDenied, apierr.PermissionDenied)
	_, err = b.svc.DeleteCluster(b.tenant, connect.NewRequest(&controlplanev1.DeleteClusterRequest{ClusterId: "c0"}))
	wantReason(t, "tenant deletes", err, connect.CodePermissionDenied, apierr.PermissionDenied)

	// Delete: refused while a runner names the cluster.
	b.createRunner(t, b.platform, "r1", "c1")
	_, err = b.svc.DeleteCluster(b.platform, connect.NewRequest(&controlplanev1.DeleteClusterRequest{ClusterId: "c1"}))
	wantReason(t, "delete in use", err, connect.CodeFailedPrecondition, apierr.ClusterInUse)
	if !strings.Contains(err.Error(), "r1") {
		t.Fatalf("in-use error does not name the runner: %v", err)
	}
	if _, err := b.svc.DeleteCluster(b.platform, connect.NewRequest(&controlplanev1.DeleteClusterRequest{ClusterId: "c0"})); err != nil {
		t.Fatal(err)
	}
}

func TestClustersDisabledWithoutKey(t *testing.T) {
	st, err := store.Open(t.Context(), filepath.Join(t.TempDir(), "cp.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	svc, err := controlplane.New(controlplane.Config{Store: st, Auth: auth.NewStoreAuthenticator(st, nil), PlatformOrg: "plat", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := auth.WithPrincipal(t.Context(), auth.Principal{KeyID: "k1", Org: "plat", Role: auth.RoleAdmin})
	_, err = svc.AddCluster(ctx, connect.NewRequest(&controlplanev1.AddClusterRequest{Cluster: &controlplanev1.Cluster{ClusterId: "c", Server: "https://h", Token: "t"}}))
	wantReason(t, "add without key", err, connect.CodeFailedPrecondition, apierr.ClustersDisabled)
}

// waitInstall waits for runner id's install status to be want.
func (b *clusterBed) waitInstall(t *testing.T, ctx context.Context, id string, want controlplanev1.RunnerInstallStatus) *controlplanev1.ManagedRunnerStatus {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st := b.get(t, ctx, id)
		if st.GetInstallStatus() == want {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("runner %s install %v, want %v (%v)", id, st.GetInstallStatus(), want, st.GetInstallError())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestInstallLifecycle(t *testing.T) {
	b := newClusterBed(t, installCfg, false)
	b.add(t, "c1", "")
	b.add(t, "tc", "tenant")
	ctx := t.Context()

	// Not a registered cluster: self-managed, as before. Another organization's cluster is
	// as good as none.
	if st := b.createRunner(t, b.platform, "hand", "elsewhere").GetStatus(); st.GetInstallStatus() != controlplanev1.RunnerInstallStatus_RUNNER_INSTALL_STATUS_SELF_MANAGED {
		t.Fatalf("unregistered cluster: %v", st)
	}
	if st := b.createRunner(t, b.platform, "notmine", "tc").GetStatus(); st.GetInstallStatus() != controlplanev1.RunnerInstallStatus_RUNNER_INSTALL_STATUS_SELF_MANAGED {
		t.Fatalf("another organization's cluster: %v", st)
	}

	ns1 := install.Namespace("plat", "r1")
	created := b.createRunner(t, b.platform, "r1", "c1")
	if st := created.GetStatus(); st.GetInstallStatus() != controlplanev1.RunnerInstallStatus_RUNNER_INSTALL_STATUS_INSTALLING ||
		st.GetInstallNamespace() != ns1 {
		t.Fatalf("created: %v", st)
	}
	// Applied in order, then it waits for the heartbeat.
	want := []string{"Namespace/" + ns1, "ClusterRole/" + install.NodesRoleName(ns1), "ClusterRoleBinding/" + install.NodesRoleName(ns1), "ServiceAccount/sandboxd-runner", "Secret/sandboxd-runner", "PersistentVolumeClaim/sandboxd-runner",
		"Role/sandboxd-runner-sandboxes", "RoleBinding/sandboxd-runner-sandboxes", "Role/sandboxd-runner-self", "RoleBinding/sandboxd-runner-self",
		"Service/sandboxd-runner", "Deployment/sandboxd-runner"}
	b.waitTarget(t, func(f *fakeTarget) bool { return slices.Equal(f.applied, want) })
	if st := b.get(t, b.platform, "r1"); st.GetInstallStatus() != controlplanev1.RunnerInstallStatus_RUNNER_INSTALL_STATUS_INSTALLING {
		t.Fatalf("before the heartbeat: %v", st)
	}
	if len(b.hosts) == 0 || b.hosts[0] != "https://c1.example:6443 "+secretToken {
		t.Fatalf("target made for %v", b.hosts)
	}
	// The bootstrap token is the runner's.
	if err := b.st.Runners().RecordHeartbeat(ctx, "plat", "r1", store.RunnerStatus{Version: "v1", Ready: true}); err != nil {
		t.Fatal(err)
	}
	b.waitInstall(t, b.platform, "r1", controlplanev1.RunnerInstallStatus_RUNNER_INSTALL_STATUS_INSTALLED)
	b.svc.WaitInstalls()
	if in, err := b.st.Installs().Get(ctx, "plat", "r1"); err != nil || in.State != store.InstallInstalled {
		t.Fatalf("recorded: %+v %v", in, err)
	}

	// Delete uninstalls: a failure keeps the runner (and says why), force goes on.
	b.target.deleteErr = apierrors.NewForbidden(schema.GroupResource{Resource: "namespaces"}, "sandboxd-r1", errors.New("no"))
	_, err := b.svc.DeleteManagedRunner(b.platform, connect.NewRequest(&controlplanev1.DeleteManagedRunnerRequest{RunnerId: "r1"}))
	wantReason(t, "uninstall forbidden", err, connect.CodeFailedPrecondition, apierr.UninstallFailed)
	if !strings.Contains(err.Error(), "CWSANDBOX_INSTALL_FORBIDDEN") {
		t.Fatalf("uninstall error: %v", err)
	}
	b.get(t, b.platform, "r1")
	b.target.deleteErr = nil
	if _, err := b.svc.DeleteManagedRunner(b.platform, connect.NewRequest(&controlplanev1.DeleteManagedRunnerRequest{RunnerId: "r1"})); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(b.target.deleted, []string{ns1}) {
		t.Fatalf("deleted %v", b.target.deleted)
	}
	// A self-managed runner's delete touches no cluster.
	if _, err := b.svc.DeleteManagedRunner(b.platform, connect.NewRequest(&controlplanev1.DeleteManagedRunnerRequest{RunnerId: "hand"})); err != nil ||
		len(b.target.deleted) != 1 {
		t.Fatalf("self-managed delete: %v %v", err, b.target.deleted)
	}
}

func TestInstallFailures(t *testing.T) {
	forbidden := apierrors.NewForbidden(schema.GroupResource{Resource: "namespaces"}, "sandboxd-r1",
		errors.New(`User "system:serviceaccount:default:nobody" cannot create resource "namespaces"`))
	for _, tc := range []struct {
		name     string
		cfg      controlplane.InstallConfig
		noCA     bool
		failKind string
		failErr  error
		reason   string
		hint     string
	}{
		{"no RBAC for namespaces", installCfg, false, "Namespace", forbidden, "CWSANDBOX_INSTALL_FORBIDDEN", "lacks RBAC to create namespaces"},
		{"unauthenticated", installCfg, false, "Namespace", apierrors.NewUnauthorized("bad token"), "CWSANDBOX_INSTALL_UNAUTHENTICATED", "does not accept the cluster credential"},
		{"rejected deployment", installCfg, false, "Deployment", apierrors.NewBadRequest("bad image"), "CWSANDBOX_INSTALL_REJECTED", "--install-runner-image"},
		{"not configured", controlplane.InstallConfig{}, false, "", nil, "CWSANDBOX_INSTALL_NOT_CONFIGURED", "--install-control-plane-url"},
		{"no CA", installCfg, true, "", nil, "CWSANDBOX_INSTALL_NOT_CONFIGURED", "--install-runner-image"},
		{"runtime classes without runc", func() controlplane.InstallConfig {
			c := installCfg
			c.RuntimeClasses = map[string]string{"gvisor": "gvisor"}
			return c
		}(), false, "", nil, "CWSANDBOX_INSTALL_NOT_CONFIGURED", "--install-runtime-classes"},
		{"egress with a runner arg that sets its flag", func() controlplane.InstallConfig {
			c := installCfg
			c.Egress, c.ExtraArgs = true, []string{"--egress-dns-addr=192.0.2.53"}
			return c
		}(), false, "", nil, "CWSANDBOX_INSTALL_NOT_CONFIGURED", "the egress flags --install-egress sets"},
		{"no heartbeat", func() controlplane.InstallConfig {
			c := installCfg
			c.HeartbeatTimeout = 200 * time.Millisecond
			return c
		}(), false, "", nil,
			"CWSANDBOX_INSTALL_NO_HEARTBEAT", "namespace " + install.Namespace("plat", "r1")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newClusterBed(t, tc.cfg, tc.noCA)
			b.target.failKind, b.target.failErr = tc.failKind, tc.failErr
			b.add(t, "c1", "")
			b.createRunner(t, b.platform, "r1", "c1")
			st := b.waitInstall(t, b.platform, "r1", controlplanev1.RunnerInstallStatus_RUNNER_INSTALL_STATUS_FAILED)
			e := st.GetInstallError()
			if e.GetReason() != tc.reason || !strings.Contains(strings.Join(e.GetHints(), "\n"), tc.hint) || e.GetMessage() == "" {
				t.Fatalf("install error %v, want %s with a hint on %q", e, tc.reason, tc.hint)
			}
			if tc.failErr != nil && !strings.Contains(e.GetMessage(), tc.failErr.Error()) {
				t.Fatalf("message %q does not quote the Kubernetes error", e.GetMessage())
			}
			if tc.reason == "CWSANDBOX_INSTALL_NOT_CONFIGURED" {
				b.target.mu.Lock()
				applied := slices.Clone(b.target.applied)
				b.target.mu.Unlock()
				if len(applied) > 0 {
					t.Fatalf("not configured, yet applied %v", applied)
				}
			}
			if tc.cfg.RuntimeClasses != nil && !strings.Contains(e.GetMessage(), "--install-runtime-classes: runtime classes: no entry for runc") {
				t.Fatalf("message %q does not say what is wrong with the runtime classes", e.GetMessage())
			}
			// Deleting it: a failure to create the namespace left nothing to remove.
			b.target.deleteErr = tc.failErr
			_, err := b.svc.DeleteManagedRunner(b.platform, connect.NewRequest(&controlplanev1.DeleteManagedRunnerRequest{RunnerId: "r1"}))
			if tc.failKind == "Namespace" && err != nil {
				t.Fatalf("delete after a namespace failure: %v", err)
			}
		})
	}
}

func TestResumeInstalls(t *testing.T) {
	b := newClusterBed(t, installCfg, false)
	b.add(t, "c1", "")
	ctx := t.Context()
	// As a control plane that stopped mid-install leaves it: a runner INSTALLING.
	b.resumeInstalling(t, "r1", "c1", store.InstallInstalling, func(f *fakeTarget) bool { return len(f.applied) == 12 })
	if err := b.st.Runners().RecordHeartbeat(ctx, "plat", "r1", store.RunnerStatus{Version: "v1"}); err != nil {
		t.Fatal(err)
	}
	b.waitInstall(t, b.platform, "r1", controlplanev1.RunnerInstallStatus_RUNNER_INSTALL_STATUS_INSTALLED)
}

// TestInstallRuntimeClasses: InstallConfig.RuntimeClasses (--install-runtime-classes)
// reaches the installed runner's Deployment as its --runtime-classes, runc first; without
// it, the runner gets none (runc only).
func TestInstallRuntimeClasses(t *testing.T) {
	for _, c := range []struct {
		classes map[string]string
		want    []string
	}{
		{nil, nil},
		{map[string]string{"gvisor": "gvisor", "runc": ""}, []string{"--runtime-classes=runc=,gvisor=gvisor"}},
	} {
		t.Run(fmt.Sprint(c.classes), func(t *testing.T) {
			cfg := installCfg
			cfg.RuntimeClasses = c.classes
			b := newClusterBed(t, cfg, false)
			b.add(t, "c1", "")
			b.createRunner(t, b.platform, "r1", "c1")
			var args []string
			b.waitTarget(t, func(f *fakeTarget) bool { args = f.runnerArgs; return args != nil })
			var got []string
			for _, a := range args {
				if strings.HasPrefix(a, "--runtime-classes") {
					got = append(got, a)
				}
			}
			if !slices.Equal(got, c.want) {
				t.Errorf("%v: the runner's %q, want %q", c.classes, got, c.want)
			}
		})
	}
}

// TestInstallEgress: InstallConfig.Egress (--install-egress) gives the installed runner the
// egress args and the egress Service and NetworkPolicy, and deletes nothing; off, the
// install applies none of them and deletes both from the runner's namespace, after the
// Deployment.
func TestInstallEgress(t *testing.T) {
	ns := install.Namespace("plat", "r1")
	for _, on := range []bool{true, false} {
		t.Run(fmt.Sprint(on), func(t *testing.T) {
			cfg := installCfg
			cfg.Egress = on
			b := newClusterBed(t, cfg, false)
			b.add(t, "c1", "")
			b.createRunner(t, b.platform, "r1", "c1")
			if err := b.st.Runners().RecordHeartbeat(t.Context(), "plat", "r1", store.RunnerStatus{Version: "v1"}); err != nil {
				t.Fatal(err)
			}
			// INSTALLED in the store: the install's apply has returned.
			deadline := time.Now().Add(10 * time.Second)
			for {
				in, err := b.st.Installs().Get(t.Context(), "plat", "r1")
				if err == nil && in.State == store.InstallInstalled {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("install %+v %v", in, err)
				}
				time.Sleep(10 * time.Millisecond)
			}
			b.target.mu.Lock()
			args, applied, deleted := slices.Clone(b.target.runnerArgs), slices.Clone(b.target.applied), slices.Clone(b.target.nsDeleted)
			b.target.mu.Unlock()
			var egressArgs []string
			for _, a := range args {
				if strings.HasPrefix(a, "--egress") {
					egressArgs = append(egressArgs, a)
				}
			}
			egressApplied := slices.Contains(applied, "Service/"+install.EgressName) && slices.Contains(applied, "NetworkPolicy/"+install.EgressName)
			if on {
				want := []string{"--egress-proxy-listen=:15443", "--egress-dns-listen=:5353",
					"--egress-proxy-addr=$(SANDBOXD_RUNNER_EGRESS_SERVICE_HOST)", "--egress-dns-addr=$(SANDBOXD_RUNNER_EGRESS_SERVICE_HOST)"}
				if !slices.Equal(egressArgs, want) || !egressApplied || deleted != nil {
					t.Fatalf("on: args %q applied %v deleted %v", egressArgs, applied, deleted)
				}
				return
			}
			want := []string{"NetworkPolicy/" + ns + "/" + install.EgressName, "Service/" + ns + "/" + install.EgressName}
			if egressArgs != nil || slices.ContainsFunc(applied, func(k string) bool { return strings.HasSuffix(k, "/"+install.EgressName) }) ||
				!slices.Equal(deleted, want) || applied[len(applied)-1] != "Deployment/"+install.ReleaseName {
				t.Fatalf("off: args %q applied %v deleted %v, want %v deleted after the Deployment", egressArgs, applied, deleted, want)
			}
		})
	}
}

// installedRunner puts runner id of cluster (registered) into the store as an install left
// it: INSTALLED, heartbeating version (able to update itself), on the stable channel.
func (b *clusterBed) installedRunner(t *testing.T, id, cluster, version string) {
	t.Helper()
	b.resumeInstalling(t, id, cluster, store.InstallInstalled, func(*fakeTarget) bool { return true })
	if err := b.st.Runners().RecordHeartbeat(t.Context(), "plat", id, store.RunnerStatus{Version: version, Ready: true, SelfUpdate: true}); err != nil {
		t.Fatal(err)
	}
}

// update applies runner id's available update (:applyAvailableUpdate), has its new Pod
// heartbeat on the update's version once the re-apply applied its Deployment (a refused
// re-apply applies none), and waits for the re-apply to end; it returns the install record.
func (b *clusterBed) update(t *testing.T, id string) store.Install {
	t.Helper()
	n := b.deploymentsApplied()
	out, err := b.svc.ApplyAvailableUpdate(b.platform, connect.NewRequest(&controlplanev1.ApplyAvailableUpdateRequest{RunnerId: id}))
	if err != nil {
		t.Fatal(err)
	}
	b.waitTarget(t, func(f *fakeTarget) bool { return f.deployments > n || b.installState(t, id) == store.InstallFailed })
	if b.deploymentsApplied() > n {
		b.heartbeat(t, id, out.Msg.GetStatus().GetDesiredVersion())
	}
	b.svc.WaitInstalls()
	in, err := b.st.Installs().Get(t.Context(), "plat", id)
	if err != nil {
		t.Fatal(err)
	}
	return in
}

func (b *clusterBed) deploymentsApplied() int {
	b.target.mu.Lock()
	defer b.target.mu.Unlock()
	return b.target.deployments
}

func (b *clusterBed) installState(t *testing.T, id string) string {
	in, err := b.st.Installs().Get(t.Context(), "plat", id)
	if err != nil {
		t.Error(err)
	}
	return in.State
}

// heartbeat records a heartbeat of runner id on version (now).
func (b *clusterBed) heartbeat(t *testing.T, id, version string) {
	t.Helper()
	if err := b.st.Runners().RecordHeartbeat(t.Context(), "plat", id, store.RunnerStatus{Version: version, Ready: true, SelfUpdate: true}); err != nil {
		t.Fatal(err)
	}
}

// desired is the desired version runner id's heartbeat reply carries.
func (b *clusterBed) desired(t *testing.T, id string) string {
	t.Helper()
	out, err := b.svc.Registration().Heartbeat(controlplane.WithRunnerCert(t.Context(), "plat", id),
		connect.NewRequest(&controlplanev1.HeartbeatRequest{RunnerId: id, Version: "v1", Ready: true, SelfUpdate: true}))
	if err != nil {
		t.Fatal(err)
	}
	return out.Msg.GetDesiredVersion()
}

func egressOf(args []string) []string {
	var out []string
	for _, a := range args {
		if strings.HasPrefix(a, "--egress") {
			out = append(out, a)
		}
	}
	return out
}

// TestUpdateReapplies: install flags (here --install-egress and --install-runner-arg)
// reach an INSTALLED runner at its next update, not before: a control plane restarted
// with them applies nothing by itself; :applyAvailableUpdate re-applies the whole object
// set with them and the runner image tagged with the update's version, and the runner's
// heartbeats carry the desired version only once that is done. Egress off again: the
// next update drops the args and deletes the egress Service and NetworkPolicy, after the
// Deployment, as an install does.
func TestUpdateReapplies(t *testing.T) {
	b := newClusterBed(t, installCfg, false)
	b.add(t, "c1", "")
	ns := install.Namespace("plat", "r1")
	b.installedRunner(t, "r1", "c1", "v1")

	on := installCfg
	on.Egress, on.ExtraArgs = true, []string{"--heartbeat-interval=2s"}
	b.restart(t, on, map[string]string{store.ChannelStable: "v2"})
	b.svc.WaitInstalls()
	if b.target.applied != nil {
		t.Fatalf("a restart with other flags applied %v, want nothing before an update", b.target.applied)
	}
	if in := b.update(t, "r1"); in.State != store.InstallInstalled {
		t.Fatalf("after the update's re-apply: %+v", in)
	}
	b.target.mu.Lock()
	applied, args, image, deleted := slices.Clone(b.target.applied), slices.Clone(b.target.runnerArgs), b.target.runnerImage, b.target.nsDeleted
	b.target.applied, b.target.nsDeleted = nil, nil
	b.target.mu.Unlock()
	wantEgress := []string{"--egress-proxy-listen=:15443", "--egress-dns-listen=:5353",
		"--egress-proxy-addr=" + install.EgressAddr, "--egress-dns-addr=" + install.EgressAddr}
	if !slices.Equal(egressOf(args), wantEgress) || args[len(args)-1] != "--heartbeat-interval=2s" || image != "runner:v2" ||
		!slices.Contains(applied, "Service/"+install.EgressName) || !slices.Contains(applied, "NetworkPolicy/"+install.EgressName) ||
		!slices.Contains(applied, "Namespace/"+ns) || applied[len(applied)-1] != "Deployment/"+install.ReleaseName || deleted != nil {
		t.Fatalf("egress on: applied %v args %q image %q deleted %v", applied, args, image, deleted)
	}
	if d := b.desired(t, "r1"); d != "v2" {
		t.Fatalf("heartbeat after the re-apply: desired %q, want v2", d)
	}

	// Egress off again, at the next update (v3).
	if err := b.st.Runners().RecordHeartbeat(t.Context(), "plat", "r1", store.RunnerStatus{Version: "v2", Ready: true, SelfUpdate: true}); err != nil {
		t.Fatal(err)
	}
	b.restart(t, installCfg, map[string]string{store.ChannelStable: "v3"})
	if in := b.update(t, "r1"); in.State != store.InstallInstalled {
		t.Fatalf("after the second update's re-apply: %+v", in)
	}
	b.target.mu.Lock()
	applied, args, image, deleted = slices.Clone(b.target.applied), slices.Clone(b.target.runnerArgs), b.target.runnerImage, b.target.nsDeleted
	b.target.mu.Unlock()
	want := []string{"NetworkPolicy/" + ns + "/" + install.EgressName, "Service/" + ns + "/" + install.EgressName}
	if egressOf(args) != nil || slices.Contains(args, "--heartbeat-interval=2s") || image != "runner:v3" || !slices.Equal(deleted, want) ||
		slices.ContainsFunc(applied, func(k string) bool { return strings.HasSuffix(k, "/"+install.EgressName) }) {
		t.Fatalf("egress off: applied %v args %q image %q deleted %v, want %v", applied, args, image, deleted, want)
	}
}

// TestUpdateReapplyFails: a re-apply the cluster refuses is FAILED with its reason and
// hints (as an install's failure), the Deployment is not touched (it comes last), and the
// runner is not told its desired version, so it does not move its image alone; the next
// update re-applies again.
func TestUpdateReapplyFails(t *testing.T) {
	b := newClusterBed(t, installCfg, false)
	b.add(t, "c1", "")
	b.installedRunner(t, "r1", "c1", "v1")
	on := installCfg
	on.Egress = true
	b.restart(t, on, map[string]string{store.ChannelStable: "v2"})
	b.target.mu.Lock()
	b.target.failKind = "NetworkPolicy"
	b.target.failErr = apierrors.NewForbidden(schema.GroupResource{Group: "networking.k8s.io", Resource: "networkpolicies"}, install.EgressName, errors.New("no RBAC"))
	b.target.mu.Unlock()
	in := b.update(t, "r1")
	if in.State != store.InstallFailed || in.Reason != apierr.InstallForbidden || !strings.Contains(in.Message, "no RBAC") ||
		!strings.Contains(strings.Join(in.Hints, "\n"), "networkpolicies") {
		t.Fatalf("failed re-apply recorded as %+v", in)
	}
	st := b.get(t, b.platform, "r1")
	if st.GetInstallStatus() != controlplanev1.RunnerInstallStatus_RUNNER_INSTALL_STATUS_FAILED || st.GetInstallError().GetReason() != apierr.InstallForbidden {
		t.Fatalf("API status after a failed re-apply: %v", st)
	}
	b.target.mu.Lock()
	applied := slices.Clone(b.target.applied)
	b.target.mu.Unlock()
	if slices.Contains(applied, "Deployment/"+install.ReleaseName) {
		t.Fatalf("a failed re-apply applied the Deployment: %v", applied)
	}
	if d := b.desired(t, "r1"); d != "" {
		t.Fatalf("heartbeat after a failed re-apply: desired %q, want none (the runner keeps its version)", d)
	}
	// Fixed (the credential gets its RBAC): the next update re-applies.
	b.target.mu.Lock()
	b.target.failKind = ""
	b.target.mu.Unlock()
	if in := b.update(t, "r1"); in.State != store.InstallInstalled || in.Reason != "" {
		t.Fatalf("re-apply after the fix: %+v", in)
	}
	if d := b.desired(t, "r1"); d != "v2" {
		t.Fatalf("heartbeat after the fixed re-apply: desired %q, want v2", d)
	}
}

// TestReapplyNeedsNewHeartbeat: an update's re-apply is INSTALLED only once the runner
// heartbeats on the update's version after the apply; its earlier heartbeats, and the old
// Pod's on its old version, do not count (a bad image or args would otherwise show
// INSTALLED): it ends FAILED with CWSANDBOX_INSTALL_NO_HEARTBEAT, and the runner is never
// told the version.
func TestReapplyNeedsNewHeartbeat(t *testing.T) {
	cfg := installCfg
	cfg.HeartbeatTimeout = 2 * time.Second // what the re-apply waits for, in vain
	b := newClusterBed(t, cfg, false)
	b.add(t, "c1", "")
	b.installedRunner(t, "r1", "c1", "v1")
	b.restart(t, cfg, map[string]string{store.ChannelStable: "v2"})
	n := b.deploymentsApplied()
	if _, err := b.svc.ApplyAvailableUpdate(b.platform, connect.NewRequest(&controlplanev1.ApplyAvailableUpdateRequest{RunnerId: "r1"})); err != nil {
		t.Fatal(err)
	}
	b.waitTarget(t, func(f *fakeTarget) bool { return f.deployments > n })
	b.heartbeat(t, "r1", "v1") // the old Pod, after the apply
	if st := b.get(t, b.platform, "r1"); st.GetInstallStatus() != controlplanev1.RunnerInstallStatus_RUNNER_INSTALL_STATUS_INSTALLING {
		t.Fatalf("API status while the re-apply waits for the new Pod: %v", st.GetInstallStatus())
	}
	b.svc.WaitInstalls()
	in, err := b.st.Installs().Get(t.Context(), "plat", "r1")
	if err != nil || in.State != store.InstallFailed || in.Reason != apierr.InstallNoHeartbeat || !strings.Contains(in.Message, "v2") {
		t.Fatalf("a re-apply whose runner never heartbeats on the new version: %+v %v", in, err)
	}
	if d := b.desired(t, "r1"); d != "" {
		t.Fatalf("heartbeat after the failed re-apply: desired %q, want none", d)
	}
}

// TestUpdateDuringReapply: an update started (a rollout step: UpdateStarting, the desired
// version written, UpdateStarted) while a re-apply waits for its heartbeat re-applies with
// the new version: the heartbeat of the Pod the first re-apply made does not make it
// INSTALLED (else the runner would be told the new version and move its image alone).
func TestUpdateDuringReapply(t *testing.T) {
	b := newClusterBed(t, installCfg, false)
	b.add(t, "c1", "")
	b.installedRunner(t, "r1", "c1", "v1")
	b.restart(t, installCfg, map[string]string{store.ChannelStable: "v2"})
	ctx := t.Context()
	n := b.deploymentsApplied()
	if _, err := b.svc.ApplyAvailableUpdate(b.platform, connect.NewRequest(&controlplanev1.ApplyAvailableUpdateRequest{RunnerId: "r1"})); err != nil {
		t.Fatal(err)
	}
	b.waitTarget(t, func(f *fakeTarget) bool { return f.deployments > n && f.runnerImage == "runner:v2" })
	n = b.deploymentsApplied()

	// v3 comes, as a rollout step starts it.
	r, err := b.st.Runners().Get(ctx, "plat", "r1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.svc.UpdateStarting(ctx, r); err != nil {
		t.Fatal(err)
	}
	v3 := "v3"
	att := store.UpdateAttempt{From: "v1", To: v3, State: store.UpdateInProgress, StartedAt: time.Now(), Deadline: time.Now().Add(time.Hour)}
	r, err = b.st.Runners().Update(ctx, "plat", "r1", r.Etag, store.RunnerUpdate{DesiredVersion: &v3, LastUpdate: &att})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.svc.UpdateStarted(ctx, r); err != nil {
		t.Fatal(err)
	}
	b.heartbeat(t, "r1", "v2") // the first re-apply's Pod
	b.waitTarget(t, func(f *fakeTarget) bool { return f.deployments > n })
	b.target.mu.Lock()
	img := b.target.runnerImage
	b.target.mu.Unlock()
	if img != "runner:v3" {
		t.Fatalf("re-applied with %q, want runner:v3", img)
	}
	if st := b.installState(t, "r1"); st != store.InstallInstalling {
		t.Fatalf("before the v3 Pod heartbeats: %s", st)
	}
	b.heartbeat(t, "r1", "v3")
	b.svc.WaitInstalls()
	if st := b.installState(t, "r1"); st != store.InstallInstalled {
		t.Fatalf("after the v3 Pod heartbeats: %s", st)
	}
	if d := b.desired(t, "r1"); d != "v3" {
		t.Fatalf("heartbeat after the re-apply: desired %q, want v3", d)
	}
}

// TestUpdateStartingUndo: UpdateStarting records the re-apply (INSTALLING) before the
// desired version is written, so no heartbeat hands the runner its version meanwhile; its
// undo (the version was then not written) puts the record back.
func TestUpdateStartingUndo(t *testing.T) {
	b := newClusterBed(t, installCfg, false)
	b.add(t, "c1", "")
	b.installedRunner(t, "r1", "c1", "v1")
	ctx := t.Context()
	r, err := b.st.Runners().Get(ctx, "plat", "r1")
	if err != nil {
		t.Fatal(err)
	}
	undo, err := b.svc.UpdateStarting(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	if st := b.installState(t, "r1"); st != store.InstallInstalling {
		t.Fatalf("after UpdateStarting: %s", st)
	}
	undo()
	if st := b.installState(t, "r1"); st != store.InstallInstalled {
		t.Fatalf("after its undo: %s", st)
	}
}
