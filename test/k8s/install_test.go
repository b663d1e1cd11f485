package k8s

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/structpb"
	appsv1 "k8s.io/api/apps/v1"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	k8s "k8s.io/client-go/kubernetes"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	controlplanev1 "github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1/controlplanev1connect"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/connecttest"
	"github.com/sandboxd/sandboxd/internal/controlplane"
	"github.com/sandboxd/sandboxd/internal/gateway"
	"github.com/sandboxd/sandboxd/internal/install"
	"github.com/sandboxd/sandboxd/internal/pki"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runnerapi"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes/gate"
	"github.com/sandboxd/sandboxd/internal/stack"
	"github.com/sandboxd/sandboxd/internal/store"
)

// installPlane is a control plane that installs runners (its --install-* flags set), with
// the platform organization's admin clients.
type installPlane struct {
	ca       *pki.CA
	runners  controlplanev1connect.RunnerManagementServiceClient
	clusters controlplanev1connect.ClusterServiceClient
	stop     func() // ends it (before its cleanup): a restart
	// waitInstalls waits for its running installs (and re-applies) to end by themselves.
	waitInstalls func()
	addr         string // where it listens (the installed runners' control plane address)
}

func startInstallPlane(t *testing.T, ctx context.Context, host string, cfg controlplane.InstallConfig) *installPlane {
	t.Helper()
	return startInstallPlaneIn(t, ctx, t.TempDir(), net.JoinHostPort(host, "0"), cfg, nil)
}

// startInstallPlaneIn starts the control plane listening on addr (HOST:PORT; port 0: any)
// on the store, CA and keys in dir (made by the first start; a later one, on the first
// one's addr, is the same control plane restarted with other flags), offering the channel
// targets targets. Its stop ends it (also at cleanup).
func startInstallPlaneIn(t *testing.T, ctx context.Context, dir, addr string, cfg controlplane.InstallConfig, targets map[string]string) *installPlane {
	t.Helper()
	st, err := store.Open(ctx, filepath.Join(dir, "sandboxd.db"))
	if err != nil {
		t.Fatal(err)
	}
	var stops []func()
	stopAll := func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
		stops = nil
	}
	t.Cleanup(stopAll)
	stops = append(stops, func() { _ = st.Close() })
	ca, err := pki.LoadOrCreateCA(filepath.Join(dir, "pki"), "k8s install test CA")
	if err != nil {
		t.Fatal(err)
	}
	key, err := pki.LoadOrCreateSecret(filepath.Join(dir, "pki", controlplane.ClusterKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := controlplane.EnsureOrg(ctx, st, "platform"); err != nil {
		t.Fatal(err)
	}
	adminKey, err := controlplane.EnsureAdminKey(ctx, st, "platform")
	if err != nil {
		t.Fatal(err)
	}
	keyFile := filepath.Join(dir, "admin.key") // the key is issued once: a restart reads it
	if adminKey != "" {
		if err := os.WriteFile(keyFile, []byte(adminKey), 0o600); err != nil {
			t.Fatal(err)
		}
	} else if b, err := os.ReadFile(keyFile); err != nil {
		t.Fatal(err)
	} else {
		adminKey = string(b)
	}
	authn := auth.NewStoreAuthenticator(st, nil)
	stops = append(stops, authn.Wait)
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ControlPlaneAddress = ln.Addr().String()
	svc, err := controlplane.New(controlplane.Config{Store: st, Auth: authn, PlatformOrg: "platform", CA: ca, HeartbeatInterval: 300 * time.Millisecond,
		ClusterKey: key, Install: cfg, TargetVersions: targets, Logger: slog.New(slog.NewTextHandler(testWriter{t}, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ictx, stop := context.WithCancel(context.Background())
	stops = append(stops, func() { stop(); svc.WaitInstalls() })
	if err := svc.ResumeInstalls(ictx); err != nil {
		t.Fatal(err)
	}
	tlsCfg, err := controlplane.TLSConfig(ca, []string{host})
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: svc.TLSHandler(), TLSConfig: tlsCfg}
	go func() { _ = srv.ServeTLS(ln, "", "") }()
	stops = append(stops, func() { _ = srv.Close() })
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: pki.ClientTLSConfig(nil, ca.Pool(), host), ForceAttemptHTTP2: true}}
	base, ic := "https://"+ln.Addr().String(), connect.WithInterceptors(connecttest.Bearer(adminKey))
	return &installPlane{ca: ca, runners: controlplanev1connect.NewRunnerManagementServiceClient(hc, base, ic),
		clusters: controlplanev1connect.NewClusterServiceClient(hc, base, ic), stop: stopAll, waitInstalls: svc.WaitInstalls,
		addr: ln.Addr().String()}
}

// testWriter logs the control plane's lines into the test's output.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// TestInstalledRunner is issue 18's scenario on the test cluster:
//   - The cluster registered (a token credential with the cluster's CA), a runner created for
//     it through the API: the control plane installs it (server-side apply), it heartbeats
//     (INSTALLED), and a sandbox runs on it through a gateway, as TestChartRunner's does.
//   - What it installed matches what the Helm chart renders for the same values (image,
//     args, env, security contexts, volumes, RBAC rules, Service ports), the runtime
//     classes among them (InstallConfig.RuntimeClasses runc + gvisor, the chart's
//     runtimeClasses): a runtime_class gvisor sandbox runs on it as a Pod of RuntimeClass
//     gvisor (issue 21).
//   - A second cluster registered with a service-account token that has no RBAC: its
//     runner's install is FAILED with CWSANDBOX_INSTALL_FORBIDDEN and a hint on namespaces.
//   - A namespace of a runner's name that the control plane did not create for it (no
//     labels): the install is FAILED with CWSANDBOX_INSTALL_CONFLICT, applies nothing into
//     it, and deleting the runner leaves the namespace alone. The same for a ClusterRole of a
//     runner's image pre-pull name (nothing created, the ClusterRole left as it was).
//   - The installed runner gets the chart's pre-pull ClusterRole and ClusterRoleBinding
//     (`list` on nodes), named after its namespace, and they go with the uninstall.
//   - With --install-egress (InstallConfig.Egress, issue 23) the runner gets the egress
//     Service and NetworkPolicy sandboxd-runner-egress and the --egress-* args, as the chart
//     with egress.enabled renders them (compareWithChart), and starts with them; an install
//     with it off (install.Apply, as the control plane's) deletes both and drops the args.
//   - Deleting the installed runner uninstalls it: its namespace, and everything labelled
//     for it, are gone from the cluster.
func TestInstalledRunner(t *testing.T) {
	c := needCluster(t)
	helm := needHelm(t)
	ctx, cancel := context.WithTimeout(t.Context(), 6*time.Minute)
	defer cancel()
	runnerImage := env("SANDBOXD_K8S_RUNNER_IMAGE", "localhost/sandboxd/runner:dev")
	rc, err := stack.RESTConfig(c.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	admin := k8s.NewForConfigOrDie(rc)
	host := nodeIP(t, ctx, admin)
	runnerID := randomID("inst-")
	ns := install.Namespace("platform", runnerID)
	class := "sandboxd-" + runnerID // the data volume's own storage class: nothing else binds it

	cp := startInstallPlane(t, ctx, host, controlplane.InstallConfig{
		RunnerImage: runnerImage, AgentImage: c.agentImage, PullPolicy: "Never", SandboxPullPolicy: "Never",
		StorageClass: class, ExtraArgs: []string{"--heartbeat-interval=300ms"},
		RuntimeClasses: map[string]string{"runc": "", "gvisor": "gvisor"}, // --install-runtime-classes runc=,gvisor=gvisor
		Egress:         true,                                              // --install-egress
		ApplyTimeout:   time.Minute, HeartbeatTimeout: 3 * time.Minute,
	})

	clusterID, server, caPEM := installTarget(t, ctx, c, cp, admin, rc.BearerToken, host, runnerID, ns, class)

	start := time.Now()
	created, err := cp.runners.CreateManagedRunner(ctx, connect.NewRequest(&controlplanev1.CreateManagedRunnerRequest{ManagedRunner: &controlplanev1.ManagedRunner{
		RunnerId: runnerID, ClusterId: clusterID, Zone: "test", Policy: gvisorPolicy(t)}}))
	if err != nil {
		t.Fatal(err)
	}
	if st := created.Msg.GetStatus(); st.GetInstallStatus() != controlplanev1.RunnerInstallStatus_RUNNER_INSTALL_STATUS_INSTALLING || st.GetInstallNamespace() != ns {
		t.Fatalf("created: %v", st)
	}
	st := waitInstallStatus(t, ctx, cp, runnerID, admin, ns, controlplanev1.RunnerInstallStatus_RUNNER_INSTALL_STATUS_INSTALLED)
	if st.GetLastHeartbeatTime() == nil || st.GetVersion() != "dev" {
		t.Fatalf("installed without a heartbeat: %v", st)
	}
	t.Logf("runner %s INSTALLED (first heartbeat) %s after create", runnerID, time.Since(start).Round(time.Millisecond))

	compareWithChart(t, ctx, admin, helm, ns, runnerImage, c.agentImage, class, true)

	// A sandbox through a gateway on this host, reaching the runner through its Service.
	svc, err := admin.CoreV1().Services(ns).Get(ctx, install.ReleaseName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ccfg, err := runnerapi.ClientTLSConfig(cp.ca, "gw1", runnerID)
	if err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort(svc.Spec.ClusterIP, "7443")
	for {
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			conn.Close()
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the runner's Service %s: %v", addr, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	rcl, err := runnerapi.NewClient(runnerapi.ClientConfig{ID: runnerID, Addr: addr, TLS: ccfg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rcl.Close)
	// The runner was registered to the platform organization: it serves org-a's keys.
	_, api, _ := serveGateway(t, gateway.Config{Runners: []runner.Handle{rcl}, PlatformOrg: "platform", Policies: policyMap{runnerID: gvisorPolicyDoc}})
	sb := createRunning(t, ctx, api)
	if _, err := admin.CoreV1().Pods(ns).Get(ctx, "sbx-"+sb, metav1.GetOptions{}); err != nil {
		t.Fatalf("the sandbox's Pod in %s: %v", ns, err)
	}
	if out := execOK(t, ctx, api, sb, "echo", "installed"); out != "installed\n" {
		t.Errorf("exec: %q", out)
	}
	if _, err := api.DeleteSandbox(ctx, connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: sb, GracePeriodSeconds: 1})); err != nil {
		t.Fatal(err)
	}
	// The installer's RuntimeClasses: the installed runner runs gvisor sandboxes.
	checkGVisorSandbox(t, ctx, api, admin, ns)

	// A credential without rights: a service account's token with no RBAC at all.
	sa := randomID("nobody-")
	if _, err := admin.CoreV1().ServiceAccounts(c.namespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = admin.CoreV1().ServiceAccounts(c.namespace).Delete(context.Background(), sa, metav1.DeleteOptions{})
	})
	tr, err := admin.CoreV1().ServiceAccounts(c.namespace).CreateToken(ctx, sa, &authnv1.TokenRequest{
		Spec: authnv1.TokenRequestSpec{ExpirationSeconds: new(int64(3600))}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	weak := "weak-" + runnerID
	if _, err := cp.clusters.AddCluster(ctx, connect.NewRequest(&controlplanev1.AddClusterRequest{Cluster: &controlplanev1.Cluster{
		ClusterId: weak, Server: server, Token: tr.Status.Token, CaPem: caPEM}})); err != nil {
		t.Fatal(err)
	}
	weakRunner := randomID("weak-")
	if _, err := cp.runners.CreateManagedRunner(ctx, connect.NewRequest(&controlplanev1.CreateManagedRunnerRequest{ManagedRunner: &controlplanev1.ManagedRunner{
		RunnerId: weakRunner, ClusterId: weak, Zone: "test", Policy: &structpb.Struct{}}})); err != nil {
		t.Fatal(err)
	}
	fst := waitInstallStatus(t, ctx, cp, weakRunner, nil, "", controlplanev1.RunnerInstallStatus_RUNNER_INSTALL_STATUS_FAILED)
	ie := fst.GetInstallError()
	if ie.GetReason() != apierr.InstallForbidden || !strings.Contains(ie.GetMessage(), "forbidden") ||
		!strings.Contains(strings.Join(ie.GetHints(), "\n"), "lacks RBAC to get namespaces") {
		t.Fatalf("install error %v: want %s, the API server's 403 and a hint on namespaces", ie, apierr.InstallForbidden)
	}
	t.Logf("no-RBAC credential: %s: %s; hint: %s", ie.GetReason(), ie.GetMessage(), ie.GetHints()[0])
	if _, err := admin.CoreV1().Namespaces().Get(ctx, install.Namespace("platform", weakRunner), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the failed install's namespace: %v, want none", err)
	}
	if _, err := cp.runners.DeleteManagedRunner(ctx, connect.NewRequest(&controlplanev1.DeleteManagedRunnerRequest{RunnerId: weakRunner})); err != nil {
		t.Fatalf("delete the failed install's runner: %v", err)
	}

	// A namespace someone else made, of a runner's namespace name: not adopted, not deleted.
	foreignRunner := randomID("foreign-")
	foreignNS := install.Namespace("platform", foreignRunner)
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: foreignNS,
		Labels: map[string]string{install.RunnerLabel: foreignRunner}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = admin.CoreV1().Namespaces().Delete(context.Background(), foreignNS, metav1.DeleteOptions{})
	})
	foreignCluster := "foreign-" + runnerID // one runner per cluster: the same cluster again, for this organization
	if _, err := cp.clusters.AddCluster(ctx, connect.NewRequest(&controlplanev1.AddClusterRequest{Cluster: &controlplanev1.Cluster{
		ClusterId: foreignCluster, Server: server, Token: rc.BearerToken, CaPem: caPEM}})); err != nil {
		t.Fatal(err)
	}
	if _, err := cp.runners.CreateManagedRunner(ctx, connect.NewRequest(&controlplanev1.CreateManagedRunnerRequest{ManagedRunner: &controlplanev1.ManagedRunner{
		RunnerId: foreignRunner, ClusterId: foreignCluster, Zone: "test", Policy: &structpb.Struct{}}})); err != nil {
		t.Fatal(err)
	}
	fst = waitInstallStatus(t, ctx, cp, foreignRunner, nil, "", controlplanev1.RunnerInstallStatus_RUNNER_INSTALL_STATUS_FAILED)
	if ie := fst.GetInstallError(); ie.GetReason() != apierr.InstallConflict ||
		!strings.Contains(strings.Join(ie.GetHints(), "\n"), "namespace "+foreignNS+" exists and was not created by this control plane") {
		t.Fatalf("install into a foreign namespace: %v", ie)
	}
	if l, err := admin.CoreV1().ServiceAccounts(foreignNS).List(ctx, metav1.ListOptions{}); err != nil || slices.ContainsFunc(l.Items, func(sa corev1.ServiceAccount) bool {
		return sa.Name == install.ReleaseName
	}) {
		t.Fatalf("applied into the foreign namespace: %v %v", l, err)
	}
	if _, err := cp.runners.DeleteManagedRunner(ctx, connect.NewRequest(&controlplanev1.DeleteManagedRunnerRequest{RunnerId: foreignRunner})); err != nil {
		t.Fatalf("delete the runner of the refused install: %v", err)
	}
	if got, err := admin.CoreV1().Namespaces().Get(ctx, foreignNS, metav1.GetOptions{}); err != nil || got.DeletionTimestamp != nil {
		t.Fatalf("the foreign namespace after the runner's delete: %v %v", got.GetDeletionTimestamp(), err)
	}
	if _, err := cp.clusters.DeleteCluster(ctx, connect.NewRequest(&controlplanev1.DeleteClusterRequest{ClusterId: foreignCluster})); err != nil {
		t.Fatal(err)
	}

	// A ClusterRole of a runner's pre-pull name that someone else made: the install is
	// refused before creating anything, the ClusterRole is left as it was, and deleting the
	// runner leaves it too.
	crRunner := randomID("foreigncr-")
	crName := install.NodesRoleName(install.Namespace("platform", crRunner))
	foreignRules := []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get"}}}
	if _, err := admin.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: crName},
		Rules: foreignRules}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.RbacV1().ClusterRoles().Delete(context.Background(), crName, metav1.DeleteOptions{}) })
	crCluster := "foreigncr-" + runnerID
	if _, err := cp.clusters.AddCluster(ctx, connect.NewRequest(&controlplanev1.AddClusterRequest{Cluster: &controlplanev1.Cluster{
		ClusterId: crCluster, Server: server, Token: rc.BearerToken, CaPem: caPEM}})); err != nil {
		t.Fatal(err)
	}
	if _, err := cp.runners.CreateManagedRunner(ctx, connect.NewRequest(&controlplanev1.CreateManagedRunnerRequest{ManagedRunner: &controlplanev1.ManagedRunner{
		RunnerId: crRunner, ClusterId: crCluster, Zone: "test", Policy: &structpb.Struct{}}})); err != nil {
		t.Fatal(err)
	}
	fst = waitInstallStatus(t, ctx, cp, crRunner, nil, "", controlplanev1.RunnerInstallStatus_RUNNER_INSTALL_STATUS_FAILED)
	if ie := fst.GetInstallError(); ie.GetReason() != apierr.InstallConflict ||
		!strings.Contains(strings.Join(ie.GetHints(), "\n"), "ClusterRole "+crName+" exists and was not created by this control plane") {
		t.Fatalf("install over a foreign ClusterRole: %v", ie)
	}
	if _, err := admin.CoreV1().Namespaces().Get(ctx, install.Namespace("platform", crRunner), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the refused install's namespace: %v, want none", err)
	}
	if _, err := cp.runners.DeleteManagedRunner(ctx, connect.NewRequest(&controlplanev1.DeleteManagedRunnerRequest{RunnerId: crRunner})); err != nil {
		t.Fatalf("delete the runner of the refused install: %v", err)
	}
	if got, err := admin.RbacV1().ClusterRoles().Get(ctx, crName, metav1.GetOptions{}); err != nil || len(got.Labels) != 0 ||
		!reflect.DeepEqual(got.Rules, foreignRules) {
		t.Fatalf("the foreign ClusterRole after the refused install and delete: %+v %v", got, err)
	}
	if _, err := cp.clusters.DeleteCluster(ctx, connect.NewRequest(&controlplanev1.DeleteClusterRequest{ClusterId: crCluster})); err != nil {
		t.Fatal(err)
	}

	// The cluster goes once no runner names it.
	if _, err := cp.clusters.DeleteCluster(ctx, connect.NewRequest(&controlplanev1.DeleteClusterRequest{ClusterId: weak})); err != nil {
		t.Fatal(err)
	}
	_, err = cp.clusters.DeleteCluster(ctx, connect.NewRequest(&controlplanev1.DeleteClusterRequest{ClusterId: clusterID}))
	if connect.CodeOf(err) != connect.CodeFailedPrecondition || apierr.Reason(err) != apierr.ClusterInUse {
		t.Fatalf("delete a cluster a runner names: %v", err)
	}

	// An install with egress off (the control plane's own apply, into the runner's
	// namespace): the egress Service and NetworkPolicy go, and the runner's args lose --egress-*.
	tgt, err := install.NewTarget(rc)
	if err != nil {
		t.Fatal(err)
	}
	sec, err := admin.CoreV1().Secrets(ns).Get(ctx, install.ReleaseName, metav1.GetOptions{}) // as installed: the runner keeps working
	if err != nil {
		t.Fatal(err)
	}
	offValues := install.Values{Org: "platform", RunnerID: runnerID, Namespace: ns, Image: runnerImage, AgentImage: c.agentImage,
		PullPolicy: "Never", SandboxImagePullPolicy: "Never", ControlPlane: string(sec.Data["address"]),
		BootstrapToken: string(sec.Data["bootstrap-token"]), CAPEM: string(sec.Data["ca.pem"]), StorageClass: class,
		ExtraArgs: []string{"--heartbeat-interval=300ms"}, RuntimeClasses: map[string]string{"runc": "", "gvisor": "gvisor"}}
	for range 2 { // the second finds nothing to delete
		if err := install.Apply(ctx, tgt, offValues); err != nil {
			t.Fatalf("install with egress off: %v", err)
		}
	}
	if _, err := admin.CoreV1().Services(ns).Get(ctx, install.EgressName, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("egress Service after an install with egress off: %v, want none", err)
	}
	if _, err := admin.NetworkingV1().NetworkPolicies(ns).Get(ctx, install.EgressName, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("egress NetworkPolicy after an install with egress off: %v, want none", err)
	}
	if d, err := admin.AppsV1().Deployments(ns).Get(ctx, install.ReleaseName, metav1.GetOptions{}); err != nil ||
		slices.ContainsFunc(d.Spec.Template.Spec.Containers[0].Args, func(a string) bool { return strings.HasPrefix(a, "--egress") }) {
		t.Errorf("runner args after an install with egress off: %v", err)
	}

	// Uninstall: the namespace and everything in it go.
	if _, err := cp.runners.DeleteManagedRunner(ctx, connect.NewRequest(&controlplanev1.DeleteManagedRunnerRequest{RunnerId: runnerID})); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	for {
		_, err := admin.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("namespace %s still there after the delete: %v", ns, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Logf("uninstalled: namespace %s gone %s after the delete", ns, time.Since(start).Round(time.Millisecond))
	sel := metav1.ListOptions{LabelSelector: install.RunnerLabel + "=" + runnerID}
	if l, err := admin.CoreV1().Namespaces().List(ctx, sel); err != nil || len(l.Items) != 0 {
		t.Errorf("namespaces left: %v %v", l, err)
	}
	if l, err := admin.RbacV1().ClusterRoles().List(ctx, sel); err != nil || len(l.Items) != 0 {
		t.Errorf("cluster roles left: %v %v", l, err)
	}
	if l, err := admin.RbacV1().ClusterRoleBindings().List(ctx, sel); err != nil || len(l.Items) != 0 {
		t.Errorf("cluster role bindings left: %v %v", l, err)
	}
	if l, err := admin.CoreV1().Pods("").List(ctx, sel); err != nil || len(l.Items) != 0 {
		t.Errorf("pods left: %v %v", l, err)
	}
	if _, err := cp.runners.GetManagedRunner(ctx, connect.NewRequest(&controlplanev1.GetManagedRunnerRequest{RunnerId: runnerID})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("runner after delete: %v", err)
	}
	if _, err := cp.clusters.DeleteCluster(ctx, connect.NewRequest(&controlplanev1.DeleteClusterRequest{ClusterId: clusterID})); err != nil {
		t.Fatal(err)
	}
}

// waitInstallStatus waits for the runner's install_status to be want (FAILED early is fatal
// when want is not FAILED, with the runner Pod's log).
func waitInstallStatus(t *testing.T, ctx context.Context, cp *installPlane, runnerID string, admin k8s.Interface, ns string,
	want controlplanev1.RunnerInstallStatus) *controlplanev1.ManagedRunnerStatus {
	t.Helper()
	for {
		r, err := cp.runners.GetManagedRunner(ctx, connect.NewRequest(&controlplanev1.GetManagedRunnerRequest{RunnerId: runnerID}))
		if err != nil {
			t.Fatal(err)
		}
		st := r.Msg.GetStatus()
		if st.GetInstallStatus() == want {
			return st
		}
		if st.GetInstallStatus() == controlplanev1.RunnerInstallStatus_RUNNER_INSTALL_STATUS_FAILED || ctx.Err() != nil {
			var logs []string
			if admin != nil {
				pods, _ := admin.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{})
				for i := range pods.Items {
					logs = append(logs, pods.Items[i].Name+" "+string(pods.Items[i].Status.Phase), podLog(admin, &pods.Items[i]))
				}
			}
			t.Fatalf("runner %s: install %v (%v), want %v\n%s", runnerID, st.GetInstallStatus(), st.GetInstallError(), want, strings.Join(logs, "\n"))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// compareWithChart renders the chart for the values the install used (the bootstrap token,
// address and CA read back from the installed Secret) and compares what matters with the
// installed objects: the Deployment's image, args, env, security contexts, volumes and
// mounts; the Roles' rules and the RoleBindings' subjects; the Service's ports; the Secret's keys.
func compareWithChart(t *testing.T, ctx context.Context, admin k8s.Interface, helm, ns, runnerImage, agentImage, class string, egress bool) {
	t.Helper()
	sec, err := admin.CoreV1().Secrets(ns).Get(ctx, install.ReleaseName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, sec.Data["ca.pem"], 0o600); err != nil {
		t.Fatal(err)
	}
	repo, tag, _ := strings.Cut(runnerImage, ":")
	agentRepo, agentTag, _ := strings.Cut(agentImage, ":")
	rendered := helmTemplate(t, helm, ns,
		"--set", "namespace.create=true",
		"--set", "image.repository="+repo, "--set", "image.tag="+tag, "--set", "image.pullPolicy=Never",
		"--set", "agentImage.repository="+agentRepo, "--set", "agentImage.tag="+agentTag, "--set", "sandboxImagePullPolicy=Never",
		"--set", "controlPlane.address="+string(sec.Data["address"]), "--set", "controlPlane.bootstrapToken="+string(sec.Data["bootstrap-token"]),
		"--set-file", "controlPlane.caPEM="+caFile, "--set", "persistence.storageClass="+class,
		// prepull.* at the chart's defaults: the install pre-pulls (64 images, 4 in flight) with its ClusterRole.
		"--set", "extraArgs={--heartbeat-interval=300ms}",
		"--set", "runtimeClasses.runc=", "--set", "runtimeClasses.gvisor=gvisor",
		"--set", fmt.Sprintf("egress.enabled=%v", egress))
	chart := map[string]*unstructured.Unstructured{}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(rendered), 4096)
	for {
		var u unstructured.Unstructured
		if err := dec.Decode(&u.Object); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			t.Fatal(err)
		}
		if u.Object != nil {
			chart[u.GetKind()+"/"+u.GetName()] = &u
		}
	}
	typed := func(key string, into any) {
		t.Helper()
		u, ok := chart[key]
		if !ok {
			t.Fatalf("the chart renders no %s (it renders %v)", key, keys(chart))
		}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, into); err != nil {
			t.Fatal(err)
		}
	}
	same := func(what string, installed, charted any) {
		t.Helper()
		if !reflect.DeepEqual(installed, charted) {
			t.Errorf("%s: installed %+v\n  chart %+v", what, installed, charted)
		}
	}
	var want appsv1.Deployment
	typed("Deployment/"+install.ReleaseName, &want)
	got, err := admin.AppsV1().Deployments(ns).Get(ctx, install.ReleaseName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	gc, wc := got.Spec.Template.Spec.Containers[0], want.Spec.Template.Spec.Containers[0]
	same("image", gc.Image, wc.Image)
	same("imagePullPolicy", gc.ImagePullPolicy, wc.ImagePullPolicy)
	same("args", gc.Args, wc.Args)
	same("env", envShape(gc.Env), envShape(wc.Env))
	same("gate hello (args, POD_IP, UDP port)", helloShape(gc), helloShape(wc))
	same("container securityContext", gc.SecurityContext, wc.SecurityContext)
	same("pod securityContext", got.Spec.Template.Spec.SecurityContext, want.Spec.Template.Spec.SecurityContext)
	same("serviceAccountName", got.Spec.Template.Spec.ServiceAccountName, want.Spec.Template.Spec.ServiceAccountName)
	same("volumeMounts", gc.VolumeMounts, wc.VolumeMounts)
	same("resources", gc.Resources, wc.Resources)
	same("selector", got.Spec.Selector, want.Spec.Selector)
	same("strategy", got.Spec.Strategy.Type, want.Spec.Strategy.Type)
	same("volumes", volumeShape(got.Spec.Template.Spec.Volumes), volumeShape(want.Spec.Template.Spec.Volumes))
	for _, name := range []string{install.ReleaseName + "-sandboxes", install.ReleaseName + "-self"} {
		var wr rbacv1.Role
		typed("Role/"+name, &wr)
		gr, err := admin.RbacV1().Roles(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		same("Role "+name+" rules", unnameRootsGrant(gr.Rules), wr.Rules)
		var wb rbacv1.RoleBinding
		typed("RoleBinding/"+name, &wb)
		gb, err := admin.RbacV1().RoleBindings(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		same("RoleBinding "+name, []any{gb.RoleRef, gb.Subjects}, []any{wb.RoleRef, wb.Subjects})
	}
	nodes := install.NodesRoleName(ns)
	var wcr rbacv1.ClusterRole
	typed("ClusterRole/"+nodes, &wcr)
	gcr, err := admin.RbacV1().ClusterRoles().Get(ctx, nodes, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	same("ClusterRole "+nodes+" rules", gcr.Rules, wcr.Rules)
	var wcrb rbacv1.ClusterRoleBinding
	typed("ClusterRoleBinding/"+nodes, &wcrb)
	gcrb, err := admin.RbacV1().ClusterRoleBindings().Get(ctx, nodes, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	same("ClusterRoleBinding "+nodes, []any{gcrb.RoleRef, gcrb.Subjects}, []any{wcrb.RoleRef, wcrb.Subjects})
	if !install.Owned(gcr.Labels, "platform", gcrb.Labels[install.RunnerLabel]) || !install.Owned(gcrb.Labels, "platform", gcr.Labels[install.RunnerLabel]) {
		t.Errorf("cluster RBAC labels %v %v", gcr.Labels, gcrb.Labels)
	}
	var ws corev1.Service
	typed("Service/"+install.ReleaseName, &ws)
	gs, err := admin.CoreV1().Services(ns).Get(ctx, install.ReleaseName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	same("Service ports", len(gs.Spec.Ports), len(ws.Spec.Ports))
	for i := range min(len(gs.Spec.Ports), len(ws.Spec.Ports)) {
		g, w := gs.Spec.Ports[i], ws.Spec.Ports[i]
		same("Service port "+w.Name, []any{g.Name, g.Port, g.TargetPort}, []any{w.Name, w.Port, w.TargetPort})
	}
	same("Service selector", gs.Spec.Selector, ws.Spec.Selector)
	var wsec corev1.Secret
	typed("Secret/"+install.ReleaseName, &wsec)
	for k, v := range wsec.StringData {
		same("Secret "+k, string(sec.Data[k]), v)
	}
	same("Secret keys", len(sec.Data), len(wsec.StringData))
	var wpvc corev1.PersistentVolumeClaim
	typed("PersistentVolumeClaim/"+install.ReleaseName, &wpvc)
	gpvc, err := admin.CoreV1().PersistentVolumeClaims(ns).Get(ctx, install.ReleaseName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	same("PVC", []any{gpvc.Spec.AccessModes, gpvc.Spec.StorageClassName, gpvc.Spec.Resources.Requests.Storage().String()},
		[]any{wpvc.Spec.AccessModes, wpvc.Spec.StorageClassName, wpvc.Spec.Resources.Requests.Storage().String()})
	if _, ok := chart["Namespace/"+ns]; !ok {
		t.Errorf("the chart renders no Namespace %s", ns)
	}
	if _, ok := chart["ServiceAccount/"+install.ReleaseName]; !ok {
		t.Errorf("the chart renders no ServiceAccount")
	}
	// The egress Service and NetworkPolicy (issue 23), as the API server keeps them.
	if egress {
		typed("Service/"+install.EgressName, &ws)
		gs, err := admin.CoreV1().Services(ns).Get(ctx, install.EgressName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		same("egress Service", []any{gs.Spec.Type, gs.Spec.Selector, len(gs.Spec.Ports)}, []any{ws.Spec.Type, ws.Spec.Selector, len(ws.Spec.Ports)})
		for i := range min(len(gs.Spec.Ports), len(ws.Spec.Ports)) {
			g, w := gs.Spec.Ports[i], ws.Spec.Ports[i]
			same("egress Service port "+w.Name, []any{g.Name, g.Port, g.TargetPort, g.Protocol}, []any{w.Name, w.Port, w.TargetPort, w.Protocol})
		}
		var wnp networkingv1.NetworkPolicy
		typed("NetworkPolicy/"+install.EgressName, &wnp)
		gnp, err := admin.NetworkingV1().NetworkPolicies(ns).Get(ctx, install.EgressName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		same("egress NetworkPolicy", gnp.Spec, wnp.Spec)
		same("enableServiceLinks", got.Spec.Template.Spec.EnableServiceLinks, want.Spec.Template.Spec.EnableServiceLinks)
		egressPorts := func(c corev1.Container) []string {
			var out []string
			for _, p := range c.Ports {
				if strings.HasPrefix(p.Name, "egress") {
					out = append(out, fmt.Sprintf("%s %d %s", p.Name, p.ContainerPort, cmp.Or(p.Protocol, corev1.ProtocolTCP)))
				}
			}
			return out
		}
		same("egress container ports", egressPorts(gc), egressPorts(wc))
	}
	if want, got := len(chart), len(install.Objects(install.Values{Namespace: ns, CAPEM: "x", Egress: egress})); want != got {
		t.Errorf("the chart renders %d objects (%v), the install applies %d", want, keys(chart), got)
	}
}

// envShape is env as "NAME=source" (the apiserver defaults fieldRef.apiVersion).
func envShape(env []corev1.EnvVar) []string {
	var out []string
	for _, e := range env {
		s := e.Name + "=" + e.Value
		if f := e.ValueFrom; f != nil {
			if f.FieldRef != nil {
				s += "field:" + f.FieldRef.FieldPath
			}
			if f.SecretKeyRef != nil {
				s += "secret:" + f.SecretKeyRef.Name + "/" + f.SecretKeyRef.Key
			}
		}
		out = append(out, s)
	}
	return out
}

// volumeShape is volumes as "name=source" (the apiserver defaults modes).
func volumeShape(vs []corev1.Volume) []string {
	var out []string
	for _, v := range vs {
		s := v.Name + "="
		switch {
		case v.PersistentVolumeClaim != nil:
			s += "pvc:" + v.PersistentVolumeClaim.ClaimName
		case v.EmptyDir != nil:
			s += "emptyDir"
		case v.Secret != nil:
			s += "secret:" + v.Secret.SecretName
			for _, i := range v.Secret.Items {
				s += ":" + i.Key + ">" + i.Path
			}
		}
		out = append(out, s)
	}
	return out
}

func keys(m map[string]*unstructured.Unstructured) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// unnameRootsGrant returns rules with the installer's grant on the runner's egress roots
// ConfigMap by name made namespace-wide, as the chart writes it (the chart cannot name it:
// the runner's ID is issued at registration); every other rule as it is.
func unnameRootsGrant(rules []rbacv1.PolicyRule) []rbacv1.PolicyRule {
	out := make([]rbacv1.PolicyRule, len(rules))
	for i, r := range rules {
		if slices.Equal(r.Resources, []string{"configmaps"}) && len(r.ResourceNames) == 1 && strings.HasPrefix(r.ResourceNames[0], gate.EgressRootsConfigMapPrefix) {
			r.ResourceNames = nil
		}
		out[i] = r
	}
	return out
}

// installTarget registers the test cluster for runner runnerID, whose namespace is ns, as
// cluster test-RUNNER (a token credential with the apiserver's CA: the kubeconfig skips
// verification, which a registered cluster may not; Pods get it as kube-root-ca.crt), and
// makes its data volume: a hostPath PersistentVolume of storage class class for the claim
// the install makes (the test cluster has no provisioner), as TestChartRunner's. Cleanup
// deletes the namespace and the volume. It returns the cluster's ID, API server URL and CA.
func installTarget(t *testing.T, ctx context.Context, c cluster, cp *installPlane, admin k8s.Interface,
	token, host, runnerID, ns, class string) (clusterID, server, caPEM string) {
	t.Helper()
	root, err := admin.CoreV1().ConfigMaps(c.namespace).Get(ctx, "kube-root-ca.crt", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	caPEM = root.Data["ca.crt"]
	server = "https://" + net.JoinHostPort(host, "6443")
	clusterID = "test-" + runnerID
	if _, err := cp.clusters.AddCluster(ctx, connect.NewRequest(&controlplanev1.AddClusterRequest{Cluster: &controlplanev1.Cluster{
		ClusterId: clusterID, Server: server, Token: token, CaPem: caPEM}})); err != nil {
		t.Fatal(err)
	}
	dataDir := t.TempDir()
	if err := os.Chown(dataDir, 65532, 65532); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CoreV1().PersistentVolumes().Create(ctx, &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: class},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName:              class,
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			PersistentVolumeSource:        corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: dataDir}},
			ClaimRef:                      &corev1.ObjectReference{Namespace: ns, Name: install.ReleaseName},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		bg := context.Background()
		_ = admin.CoreV1().Namespaces().Delete(bg, ns, metav1.DeleteOptions{})
		_ = admin.CoreV1().PersistentVolumes().Delete(bg, class, metav1.DeleteOptions{})
	})
	return clusterID, server, caPEM
}
