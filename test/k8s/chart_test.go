package k8s

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	osexec "os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/structpb"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8s "k8s.io/client-go/kubernetes"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1/sandboxv1connect"
	controlplanev1 "github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1/controlplanev1connect"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/connecttest"
	"github.com/sandboxd/sandboxd/internal/controlplane"
	"github.com/sandboxd/sandboxd/internal/edge"
	"github.com/sandboxd/sandboxd/internal/egress/egresstest"
	"github.com/sandboxd/sandboxd/internal/gateway"
	"github.com/sandboxd/sandboxd/internal/pki"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runnerapi"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes"
	"github.com/sandboxd/sandboxd/internal/stack"
	"github.com/sandboxd/sandboxd/internal/store"
)

// testControlPlane is a `sandboxd controlplane` in the test: TLS on host, its stable
// channel offering target, organization org-a with an admin key.
type testControlPlane struct {
	addr   string
	caFile string // PEM of the platform CA
	ca     *pki.CA
	api    controlplanev1connect.RunnerManagementServiceClient
}

func startControlPlane(t *testing.T, ctx context.Context, host, target string) *testControlPlane {
	t.Helper()
	dir := t.TempDir()
	st, err := store.Open(ctx, filepath.Join(dir, "sandboxd.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	ca, err := pki.LoadOrCreateCA(filepath.Join(dir, "pki"), "k8s test platform CA")
	if err != nil {
		t.Fatal(err)
	}
	if err := controlplane.EnsureOrg(ctx, st, "org-a"); err != nil {
		t.Fatal(err)
	}
	adminKey, err := controlplane.EnsureAdminKey(ctx, st, "org-a")
	if err != nil {
		t.Fatal(err)
	}
	authn := auth.NewStoreAuthenticator(st, nil)
	t.Cleanup(authn.Wait)
	svc, err := controlplane.New(controlplane.Config{Store: st, Auth: authn, PlatformOrg: "org-a", CA: ca, HeartbeatInterval: 300 * time.Millisecond,
		TargetVersions: map[string]string{store.ChannelStable: target}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	tlsCfg, err := controlplane.TLSConfig(ca, []string{host})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: svc.TLSHandler(), TLSConfig: tlsCfg}
	go func() { _ = srv.ServeTLS(ln, "", "") }()
	t.Cleanup(func() { _ = srv.Close() })
	caFile := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(caFile, ca.CertPEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: pki.ClientTLSConfig(nil, ca.Pool(), host), ForceAttemptHTTP2: true}}
	return &testControlPlane{addr: ln.Addr().String(), caFile: caFile, ca: ca,
		api: controlplanev1connect.NewRunnerManagementServiceClient(hc, "https://"+ln.Addr().String(), connect.WithInterceptors(connecttest.Bearer(adminKey)))}
}

// nodeIP is the node's InternalIP: what Pods reach this host at.
func nodeIP(t *testing.T, ctx context.Context, admin k8s.Interface) string {
	t.Helper()
	nodes, err := admin.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes.Items {
		for _, a := range n.Status.Addresses {
			if a.Type == corev1.NodeInternalIP {
				return a.Address
			}
		}
	}
	t.Fatal("no node with an InternalIP")
	return ""
}

// TestChartRunner: the runner as it really runs, a Pod of the Helm chart's Deployment
// (the runner image scripts/build-runner-image.sh builds, in-cluster API access through
// the `kubernetes` Service and kube-proxy, the chart's RBAC), registered with a bootstrap
// token at a control plane on this host.
//   - A gateway on this host reaches it through the chart's Service: a sandbox is created
//     through the public API, execs, is deleted. With the chart's runtimeClasses (runc +
//     gvisor), a gvisor sandbox runs as a Pod of RuntimeClass gvisor (issue 21).
//   - The runner's edge (the control plane issued its certificate): a sandbox's public
//     HTTPS endpoint answers through the Service's edge port (checkEdge).
//   - :applyAvailableUpdate: the runner rolls its own Deployment to the channel's version
//     (the runner image tagged and built as update-test); the new Pod reports that version
//     and re-adopts a live sandbox, which still execs.
//   - Host-name egress (issue 23): installed with egress.enabled, the runner serves its
//     egress proxy and DNS behind the chart's egress Service, resolving through an
//     egresstest internet's DNS (the chart's dnsPolicy/dnsConfig); a sandbox granted one
//     host reaches it by name, another host is refused (checkChartEgress).
//   - The runner Pod deleted (grace 0): the Deployment recreates it, the new Pod takes the
//     Lease and re-adopts the sandbox again. (The kubelet still stops the old container
//     with SIGTERM, on which the runner releases the Lease; a holder that dies without
//     releasing it is TestLeaderLease's case.)
func TestChartRunner(t *testing.T) {
	c := needCluster(t)
	helm := needHelm(t)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	const (
		release = "sandboxd-runner" // fullname = release (it contains the chart's name)
		target  = "update-test"     // up.sh builds the runner image as this version too
	)
	runnerImage := env("SANDBOXD_K8S_RUNNER_IMAGE", "localhost/sandboxd/runner:dev")
	rc, err := stack.RESTConfig(c.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	admin := k8s.NewForConfigOrDie(rc)
	host := nodeIP(t, ctx, admin)

	cp := startControlPlane(t, ctx, host, target)
	runnerID := randomID("chart-")
	if _, err := cp.api.CreateManagedRunner(ctx, connect.NewRequest(&controlplanev1.CreateManagedRunnerRequest{ManagedRunner: &controlplanev1.ManagedRunner{
		RunnerId: runnerID, ClusterId: "c-" + runnerID, Zone: "test", Policy: gvisorPolicy(t)}})); err != nil {
		t.Fatal(err)
	}
	tok, err := cp.api.CreateBootstrapToken(ctx, connect.NewRequest(&controlplanev1.CreateBootstrapTokenRequest{RunnerId: runnerID}))
	if err != nil {
		t.Fatal(err)
	}

	// The data volume: a hostPath PersistentVolume bound to the chart's claim (the test
	// cluster has no provisioner). It keeps the registered credentials across Pods: the
	// bootstrap token is spent on the first start.
	ns := randomID("sandboxd-chart-")
	dataDir := t.TempDir()
	if err := os.Chown(dataDir, 65532, 65532); err != nil { // the chart's runAsUser; fsGroup does not apply to hostPath
		t.Fatal(err)
	}
	class := ns // a storage class of this test's own: nothing else binds the volume
	if _, err := admin.CoreV1().PersistentVolumes().Create(ctx, &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: ns},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName:              class,
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			PersistentVolumeSource:        corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: dataDir}},
			ClaimRef:                      &corev1.ObjectReference{Namespace: ns, Name: release},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// The namespace first (its Pods end), then the volume.
		bg := context.Background()
		_ = admin.CoreV1().Namespaces().Delete(bg, ns, metav1.DeleteOptions{})
		_ = admin.CoreV1().PersistentVolumes().Delete(bg, ns, metav1.DeleteOptions{})
	})

	// The "internet" the runner's egress proxy reaches: a network namespace of this host
	// routed from it (198.18.0.0/15), with its DNS server and two HTTPS hosts.
	in := egresstest.New(t)
	eg := chartEgress{in: in, grantedIP: in.Addr(t), otherIP: in.Addr(t)}
	in.SetA("api.granted.test", eg.grantedIP)
	in.SetA("other.test", eg.otherIP)
	eg.granted = in.ServeHTTPS(t, eg.grantedIP, "api.granted.test")
	eg.other = in.ServeHTTPS(t, eg.otherIP, "other.test")

	repo, tag, _ := strings.Cut(runnerImage, ":")
	agentRepo, agentTag, _ := strings.Cut(c.agentImage, ":")
	install := osexec.CommandContext(ctx, helm, "install", release, chartDir, "--namespace", ns, "--create-namespace",
		"--kubeconfig", c.kubeconfig,
		"--set", "image.repository="+repo, "--set", "image.tag="+tag, "--set", "image.pullPolicy=Never",
		"--set", "agentImage.repository="+agentRepo, "--set", "agentImage.tag="+agentTag, "--set", "sandboxImagePullPolicy=Never",
		"--set", "controlPlane.address="+cp.addr, "--set", "controlPlane.bootstrapToken="+tok.Msg.GetBootstrapToken(),
		"--set-file", "controlPlane.caPEM="+cp.caFile,
		"--set", "persistence.storageClass="+class,
		// A short lease (should a Pod die without releasing it); frequent heartbeats: the
		// update reaches the runner soon.
		"--set", "leaderElection.leaseDuration=4s", "--set", "extraArgs={--heartbeat-interval=300ms}",
		// The platform registry's values: the real runner binary accepts the flags they
		// become (no sandbox here names an image of it: TestPlatformRegistryPull pulls).
		"--set", "platformRegistry.host=registry.invalid:5000", "--set", "platformRegistry.plainHTTP=true",
		// gVisor sandboxes (issue 21): the class gvisor as Pods of up.sh's RuntimeClass gvisor.
		"--set", "runtimeClasses.runc=", "--set", "runtimeClasses.gvisor=gvisor",
		// Host-name egress rules (issue 23): the chart's egress Service and args; the runner
		// resolves through the egresstest internet's DNS (the proxy dials what it answers).
		"--set", "egress.enabled=true", "--set", "dnsPolicy=None", "--set", "dnsConfig.nameservers={"+in.DNS.Addr().String()+"}")
	if out, err := install.CombinedOutput(); err != nil {
		t.Fatalf("helm install: %v\n%s", err, out)
	}
	start := time.Now()

	// runnerPod waits for the one live runner Pod, Ready (the chart's readiness probe: the
	// runner serves its API, i.e. it holds the Lease, is registered and has re-adopted),
	// running image, other than not.
	runnerPod := func(image, not string) *corev1.Pod {
		t.Helper()
		for {
			pods, err := admin.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=sandboxd-runner"})
			if err != nil {
				t.Fatal(err)
			}
			var live []corev1.Pod
			for _, p := range pods.Items {
				if p.DeletionTimestamp == nil {
					live = append(live, p)
				}
			}
			if len(live) == 1 && live[0].Name != not && live[0].Spec.Containers[0].Image == image && podReady(&live[0]) {
				return &live[0]
			}
			if ctx.Err() != nil {
				var states []string
				for _, p := range live {
					states = append(states, fmt.Sprintf("%s %s %s ready=%v", p.Name, p.Spec.Containers[0].Image, p.Status.Phase, podReady(&p)))
					states = append(states, podLog(admin, &p))
				}
				t.Fatalf("no Ready runner Pod with %s: %s", image, strings.Join(states, "\n"))
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	pod := runnerPod(runnerImage, "")
	t.Logf("runner Pod %s Ready %s after helm install", pod.Name, time.Since(start).Round(time.Millisecond))
	if args := pod.Spec.Containers[0].Args; !slices.Contains(args, "--platform-registry=registry.invalid:5000") || !slices.Contains(args, "--insecure-registry=registry.invalid:5000") {
		t.Errorf("runner args %q lack the platform registry's flags", args)
	}
	if args := pod.Spec.Containers[0].Args; !slices.Contains(args, "--runtime-classes=runc=,gvisor=gvisor") {
		t.Errorf("runner args %q lack the chart's runtimeClasses", args)
	}

	// Registered (the runner ID is the one the token was made for) and heartbeating.
	beats := map[string]bool{}
	for len(beats) < 2 {
		r, err := cp.api.GetManagedRunner(ctx, connect.NewRequest(&controlplanev1.GetManagedRunnerRequest{RunnerId: runnerID}))
		if err != nil {
			t.Fatal(err)
		}
		if st := r.Msg.GetStatus(); st.GetVersion() == "dev" && st.GetLastHeartbeatTime() != nil {
			beats[st.GetLastHeartbeatTime().AsTime().String()] = true
		}
		if ctx.Err() != nil {
			t.Fatalf("the runner does not heartbeat: %v\n%s", r.Msg.GetStatus(), podLog(admin, pod))
		}
		time.Sleep(100 * time.Millisecond)
	}

	// A gateway on this host, reaching the runner through the chart's Service (its
	// ClusterIP, through kube-proxy): the address survives the runner's Pod changing.
	svc, err := admin.CoreV1().Services(ns).Get(ctx, release, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ccfg, err := runnerapi.ClientTLSConfig(cp.ca, "gw1", runnerID)
	if err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort(svc.Spec.ClusterIP, "7443")
	// The Pod is Ready before kube-proxy has its endpoint (the EndpointSlice, then a sync):
	// until then the Service IP refuses connections.
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
	t.Logf("the runner's Service answers %s after helm install", time.Since(start).Round(time.Millisecond))
	rcl, err := runnerapi.NewClient(runnerapi.ClientConfig{ID: runnerID, Addr: addr, TLS: ccfg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rcl.Close)
	_, api, _ := serveGateway(t, gateway.Config{Runners: []runner.Handle{rcl}, Policies: policyMap{runnerID: gvisorPolicyDoc}})

	// A sandbox made, used and deleted by the in-cluster runner.
	first := createRunning(t, ctx, api)
	p, err := admin.CoreV1().Pods(ns).Get(ctx, "sbx-"+first, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the sandbox's Pod in %s: %v", ns, err)
	}
	if p.Labels[kubernetes.LabelRunner] != runnerID {
		t.Errorf("sandbox Pod labels %v: want runner %s", p.Labels, runnerID)
	}
	if out := execOK(t, ctx, api, first, "echo", "in a pod"); out != "in a pod\n" {
		t.Errorf("exec: %q", out)
	}
	// The chart turns the gate's hello on (hello.enabled): the sandbox's NetworkPolicy lets
	// it reach the runner Pod's UDP port, and the runner takes it (docs/hardening.md).
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if l := podLog(admin, pod); strings.Contains(l, kubernetes.HelloFirstLog) {
			break
		} else if time.Now().After(deadline) {
			t.Errorf("the runner took no gate hello: %q missing from\n%s", kubernetes.HelloFirstLog, l)
			break
		}
	}
	if _, err := api.DeleteSandbox(ctx, connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: first, GracePeriodSeconds: 2})); err != nil {
		t.Fatal(err)
	}
	waitPublicState(t, ctx, api, first, sandboxv1.State_STATE_TERMINATED)
	checkGVisorSandbox(t, ctx, api, admin, ns)
	checkChartEgress(t, ctx, api, admin, ns, pod, eg)
	edgeStart := time.Now()
	checkEdge(t, ctx, api, svc, runnerID, cp.ca.Pool())
	t.Logf("a public HTTPS endpoint answers through the Service's edge port %s after its create", time.Since(edgeStart).Round(time.Millisecond))

	// A live sandbox across the runner's update: state in its file system shows it is the
	// same sandbox, not a new one.
	live := createRunning(t, ctx, api)
	execOK(t, ctx, api, live, "sh", "-c", "echo kept > /tmp/mark")
	t.Cleanup(func() {
		_, _ = api.DeleteSandbox(context.Background(), connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: live}))
	})

	r, err := cp.api.GetManagedRunner(ctx, connect.NewRequest(&controlplanev1.GetManagedRunnerRequest{RunnerId: runnerID}))
	if err != nil {
		t.Fatal(err)
	}
	applied := time.Now()
	if _, err := cp.api.ApplyAvailableUpdate(ctx, connect.NewRequest(&controlplanev1.ApplyAvailableUpdateRequest{RunnerId: runnerID, Etag: r.Msg.GetEtag()})); err != nil {
		t.Fatalf("applyAvailableUpdate: %v", err)
	}
	rolled := runnerPod(stack.WithTag(runnerImage, target), pod.Name)
	t.Logf("rolled to %s: Pod %s Ready %s after :applyAvailableUpdate", target, rolled.Name, time.Since(applied).Round(time.Millisecond))
	// The new Pod runs the new version (up.sh builds the update-test image as that version):
	// its heartbeats say so, and the control plane has no update left to offer.
	for {
		r, err := cp.api.GetManagedRunner(ctx, connect.NewRequest(&controlplanev1.GetManagedRunnerRequest{RunnerId: runnerID}))
		if err != nil {
			t.Fatal(err)
		}
		if st := r.Msg.GetStatus(); st.GetVersion() == target && !st.GetUpdateAvailable() {
			break
		} else if ctx.Err() != nil {
			t.Fatalf("after the roll the runner reports %v, want version %s and no update available\n%s", st, target, podLog(admin, rolled))
		}
		time.Sleep(100 * time.Millisecond)
	}
	if out := execOK(t, ctx, api, live, "cat", "/tmp/mark"); out != "kept\n" {
		t.Errorf("after the update: /tmp/mark %q", out)
	}
	t.Logf("sandbox re-adopted: exec answers %s after :applyAvailableUpdate", time.Since(applied).Round(time.Millisecond))

	// The runner Pod deleted at once (grace 0).
	killed := time.Now()
	if err := admin.CoreV1().Pods(ns).Delete(ctx, rolled.Name, metav1.DeleteOptions{GracePeriodSeconds: ptrTo(int64(0))}); err != nil {
		t.Fatal(err)
	}
	again := runnerPod(stack.WithTag(runnerImage, target), rolled.Name)
	lease, err := admin.CoordinationV1().Leases(ns).Get(ctx, release, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if h := lease.Spec.HolderIdentity; h == nil || *h != again.Name {
		t.Errorf("lease held by %v, want the new Pod %s", lease.Spec.HolderIdentity, again.Name)
	}
	if out := execOK(t, ctx, api, live, "cat", "/tmp/mark"); out != "kept\n" {
		t.Errorf("after the Pod's deletion: /tmp/mark %q", out)
	}
	t.Logf("runner Pod deleted: %s Ready, holding the Lease, sandbox re-adopted %s after the deletion", again.Name, time.Since(killed).Round(time.Millisecond))
	if _, err := api.DeleteSandbox(ctx, connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: live, GracePeriodSeconds: 2})); err != nil {
		t.Fatal(err)
	}
	waitPublicState(t, ctx, api, live, sandboxv1.State_STATE_TERMINATED)
}

// chartEgress is checkChartEgress's internet: two HTTPS hosts the runner's DNS resolves.
type chartEgress struct {
	in                 *egresstest.Internet
	grantedIP, otherIP netip.Addr
	granted, other     *egresstest.Server
}

// checkChartEgress (issue 23): the chart's egress values on the runner Pod. The runner took
// the egress Service's ClusterIP from the variable the kubelet gives its container (the
// chart's `$(…_SERVICE_HOST)` args; a literal would have stopped it), so a python sandbox
// created through the public API with the rule https_hostname api.granted.test gets that
// address as its only nameserver; the runner's DNS answers the granted name with it and
// relays another name to the runner's resolvers (its real address); the granted host is
// reached by name through the Service (443 → the runner Pod's proxy port), and the other
// host is refused by the proxy (TLS access_denied) even when asked for by name through it:
// the other server sees no connection.
func checkChartEgress(t *testing.T, ctx context.Context, api sandboxv1connect.SandboxServiceClient, admin k8s.Interface, ns string, runnerPod *corev1.Pod, eg chartEgress) {
	t.Helper()
	start := time.Now()
	svc, err := admin.CoreV1().Services(ns).Get(ctx, "sandboxd-runner-egress", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the chart's egress Service: %v", err)
	}
	ip := svc.Spec.ClusterIP
	if args := runnerPod.Spec.Containers[0].Args; !slices.Contains(args, "--egress-proxy-addr=$(SANDBOXD_RUNNER_EGRESS_SERVICE_HOST)") {
		t.Errorf("runner args %q: no egress proxy address from the Service's variable", args)
	}
	for _, st := range runnerPod.Status.ContainerStatuses {
		t.Logf("runner container %s: %d restarts", st.Name, st.RestartCount)
	}
	id := createRunningSpec(t, ctx, api, &sandboxv1.SandboxSpec{
		Containers: []*sandboxv1.Container{{Name: "main", Image: python, Command: "sleep", Args: []string{"3600"},
			Resources: &sandboxv1.Resources{Cpu: "200m", Memory: "128Mi"}}},
		Network: &sandboxv1.NetworkOptions{Egress: []*sandboxv1.EgressRule{
			{Destination: &sandboxv1.EgressRule_HttpsHostname{HttpsHostname: "api.granted.test"}}}},
	})
	// Deleted whatever happened above: with a context of its own (the test's may be spent),
	// reporting with t.Error (a deferred t.Fatal would hide the failure that ran it).
	defer func() {
		dctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := api.DeleteSandbox(dctx, connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: id, GracePeriodSeconds: 2})); err != nil {
			t.Errorf("delete the egress sandbox %s: %v", id, err)
			return
		}
		for {
			res, err := api.GetSandbox(dctx, connect.NewRequest(&sandboxv1.GetSandboxRequest{SandboxId: id}))
			if err == nil && res.Msg.GetStatus().GetState() == sandboxv1.State_STATE_TERMINATED {
				return
			}
			if dctx.Err() != nil {
				t.Errorf("the egress sandbox %s not terminated within a minute of its delete: %v", id, err)
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
	p, err := admin.CoreV1().Pods(ns).Get(ctx, "sbx-"+id, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Spec.DNSPolicy != corev1.DNSNone || p.Spec.DNSConfig == nil || !slices.Equal(p.Spec.DNSConfig.Nameservers, []string{ip}) {
		t.Errorf("the sandbox Pod's DNS %q %+v, want the egress Service %s only", p.Spec.DNSPolicy, p.Spec.DNSConfig, ip)
	}
	grantedConns, otherConns := eg.granted.Conns(), eg.other.Conns()
	out := execOK(t, ctx, api, id, "python3", "-c", egressProbe, ip)
	var got map[string]string
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("probe output %q: %v", out, err)
	}
	t.Logf("probe: %q", got)
	fp := func(s *egresstest.Server) string {
		sum := sha256.Sum256(s.Cert.Raw)
		return "ok:" + hex.EncodeToString(sum[:])[:16]
	}
	if rc := got["resolv.conf"]; !strings.Contains(rc, "nameserver "+ip) || strings.Count(rc, "nameserver") != 1 {
		t.Errorf("resolv.conf %q: want the egress Service %s only", rc, ip)
	}
	for check, want := range map[string]string{
		"resolve granted":              ip,                  // the proxy's Service, not the host's address
		"resolve other":                eg.otherIP.String(), // relayed to the runner's resolvers
		"granted name":                 fp(eg.granted),
		"other name through the proxy": "fail:",
	} {
		if g := got[check]; g != want && !(want == "fail:" && strings.HasPrefix(g, want)) {
			t.Errorf("%s: %q, want %q", check, g, want)
		}
	}
	if g := strings.ToLower(got["other name through the proxy"]); !strings.Contains(g, "access denied") && !strings.Contains(g, "access_denied") {
		t.Errorf("other name through the proxy: %q, want the proxy's access-denied alert", g)
	}
	if n := eg.granted.Conns() - grantedConns; n < 1 {
		t.Errorf("the granted server saw %d connections", n)
	}
	if n := eg.other.Conns() - otherConns; n != 0 {
		t.Errorf("the other server saw %d connections through the proxy", n)
	}
	t.Logf("egress through the chart's Service %s: create and probe %s", ip, time.Since(start).Round(time.Millisecond))
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// podLog is the runner container's log (for failure messages).
func podLog(admin k8s.Interface, p *corev1.Pod) string { return containerLog(admin, p, "runner") }

// checkEdge: a sandbox serving HTTP on port 8080, published as an OPEN HTTPS endpoint,
// answers an HTTPS client that trusts the platform CA (the runner's edge certificate
// comes from the control plane) and dials the chart Service's edge port, with the
// endpoint's host name as SNI. The sandbox is deleted again.
func checkEdge(t *testing.T, ctx context.Context, api sandboxv1connect.SandboxServiceClient, svc *corev1.Service, runnerID string, roots *x509.CertPool) {
	t.Helper()
	var edgeAddr, edgePort string
	for _, p := range svc.Spec.Ports {
		if p.Name == "edge" {
			edgePort = strconv.Itoa(int(p.Port))
			edgeAddr = net.JoinHostPort(svc.Spec.ClusterIP, edgePort)
		}
	}
	if edgeAddr == "" {
		t.Fatalf("the chart's Service has no edge port: %v", svc.Spec.Ports)
	}
	id := createRunningSpec(t, ctx, api, &sandboxv1.SandboxSpec{
		Containers: []*sandboxv1.Container{{Name: "main", Image: busybox, Command: "/bin/sh",
			Args:      []string{"-c", `mkdir -p /tmp/www && echo "hello from $(hostname)" > /tmp/www/index.html && exec httpd -f -p 8080 -h /tmp/www`},
			Resources: &sandboxv1.Resources{Cpu: "100m", Memory: "32Mi"}}},
		Services: []*sandboxv1.Service{{Port: 8080, Name: "web", Visibility: sandboxv1.Visibility_VISIBILITY_PUBLIC,
			Endpoint: &sandboxv1.EndpointSpec{Kind: sandboxv1.EndpointKind_ENDPOINT_KIND_HTTPS, Auth: sandboxv1.EndpointAuth_ENDPOINT_AUTH_OPEN}}},
	})
	defer func() {
		if _, err := api.DeleteSandbox(ctx, connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: id, GracePeriodSeconds: 2})); err != nil {
			t.Errorf("delete %s: %v", id, err)
		}
	}()
	host := edge.Host(8080, id, runnerID, controlplane.DefaultEndpointDomain)
	res, err := api.GetSandbox(ctx, connect.NewRequest(&sandboxv1.GetSandboxRequest{SandboxId: id}))
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(res.Msg.GetStatus().GetServices()[0].GetEndpoint().GetUrl())
	if err != nil {
		t.Fatalf("endpoint URL: %v", err)
	}
	// The Service's port (the chart's --edge-public-port), not the Pod's 8443; 443 is
	// left out of the URL.
	port := u.Port()
	if port == "" {
		port = "443"
	}
	if u.Scheme != "https" || u.Hostname() != host || port != edgePort {
		t.Fatalf("endpoint URL %v, want https://%s:%s", u, host, edgePort)
	}
	t.Logf("endpoint %s", u)
	// As `curl --resolve HOST:443:SERVICE-IP`: the name stays the SNI and the Host.
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig:   &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12},
		ForceAttemptHTTP2: true,
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, edgeAddr)
		},
	}}
	defer hc.CloseIdleConnections()
	want := "hello from " + id + "\n"
	for {
		res, err := hc.Get("https://" + host + "/")
		if err == nil {
			b, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if res.StatusCode == http.StatusOK && string(b) == want {
				if res.TLS == nil || res.TLS.ServerName != host || len(res.TLS.PeerCertificates) == 0 || res.TLS.PeerCertificates[0].VerifyHostname(host) != nil {
					t.Errorf("TLS state %+v: want the wildcard for %s", res.TLS, host)
				}
				return
			}
			// 502 while httpd is not listening yet.
			err = fmt.Errorf("%s %q", res.Status, b)
		}
		if ctx.Err() != nil {
			t.Fatalf("GET https://%s/ through %s: %v", host, edgeAddr, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// createRunning creates a busybox sandbox through the public API and waits until it runs.
func createRunning(t *testing.T, ctx context.Context, api sandboxv1connect.SandboxServiceClient) string {
	t.Helper()
	return createRunningSpec(t, ctx, api, &sandboxv1.SandboxSpec{
		Containers: []*sandboxv1.Container{{Name: "main", Image: busybox, Command: "/bin/sh", Args: []string{"-c", `trap "exit 0" TERM; sleep 3600 & wait`},
			Resources: &sandboxv1.Resources{Cpu: "100m", Memory: "32Mi"}}},
	})
}

// gvisorPolicyDoc is a runner policy that lets sandboxes pin the gvisor class
// (checkGVisorSandbox): a runner that offers a class does not allow it by that. The
// gateway checks it (its Policies) and the runner gets it from the control plane
// (gvisorPolicy, the managed runner's policy).
const gvisorPolicyDoc = `{"constraints": {"security": {"allowed_runtime_classes": ["runc", "gvisor"]}}}`

func gvisorPolicy(t *testing.T) *structpb.Struct {
	t.Helper()
	p := new(structpb.Struct)
	if err := p.UnmarshalJSON([]byte(gvisorPolicyDoc)); err != nil {
		t.Fatal(err)
	}
	return p
}

// checkGVisorSandbox: a sandbox of runtime_class gvisor, created through the public API on
// a runner offering it (--runtime-classes runc=,gvisor=gvisor from the chart's
// runtimeClasses or the installer's RuntimeClasses) and allowing it (gvisorPolicy), runs as a Pod of RuntimeClass gvisor in
// namespace ns under gVisor's kernel (dmesg), and is deleted again.
func checkGVisorSandbox(t *testing.T, ctx context.Context, api sandboxv1connect.SandboxServiceClient, admin k8s.Interface, ns string) {
	t.Helper()
	start := time.Now()
	id := createRunningSpec(t, ctx, api, &sandboxv1.SandboxSpec{
		RuntimeClass: "gvisor",
		Containers: []*sandboxv1.Container{{Name: "main", Image: busybox, Command: "/bin/sh", Args: []string{"-c", `trap "exit 0" TERM; sleep 3600 & wait`},
			Resources: &sandboxv1.Resources{Cpu: "100m", Memory: "32Mi"}}},
	})
	p, err := admin.CoreV1().Pods(ns).Get(ctx, "sbx-"+id, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the gvisor sandbox's Pod in %s: %v", ns, err)
	}
	if rc := p.Spec.RuntimeClassName; rc == nil || *rc != "gvisor" {
		t.Errorf("the gvisor sandbox's Pod runtimeClassName %v, want gvisor", rc)
	}
	if out := execOK(t, ctx, api, id, "dmesg"); !strings.Contains(out, "gVisor") {
		t.Errorf("dmesg in the gvisor sandbox %q, want gVisor's boot messages", out)
	}
	t.Logf("gvisor sandbox: create -> RUNNING and exec %s", time.Since(start).Round(time.Millisecond))
	if _, err := api.DeleteSandbox(ctx, connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: id, GracePeriodSeconds: 2})); err != nil {
		t.Fatal(err)
	}
	waitPublicState(t, ctx, api, id, sandboxv1.State_STATE_TERMINATED)
}

// createRunningSpec creates a sandbox through the public API and waits until it runs.
// UNAVAILABLE (the gateway has not seen the runner answer yet: it probes every second) is
// retried, as clients do.
func createRunningSpec(t *testing.T, ctx context.Context, api sandboxv1connect.SandboxServiceClient, spec *sandboxv1.SandboxSpec) string {
	t.Helper()
	var (
		res *connect.Response[sandboxv1.Sandbox]
		err error
	)
	for {
		res, err = api.CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: spec}}))
		if connect.CodeOf(err) != connect.CodeUnavailable || ctx.Err() != nil {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	id := res.Msg.GetSandboxId()
	waitPublicState(t, ctx, api, id, sandboxv1.State_STATE_RUNNING)
	return id
}

func waitPublicState(t *testing.T, ctx context.Context, api sandboxv1connect.SandboxServiceClient, id string, want sandboxv1.State) {
	t.Helper()
	for {
		res, err := api.GetSandbox(ctx, connect.NewRequest(&sandboxv1.GetSandboxRequest{SandboxId: id}))
		if err != nil {
			t.Fatalf("get %s: %v", id, err)
		}
		st := res.Msg.GetStatus()
		if st.GetState() == want {
			return
		}
		if st.GetState() == sandboxv1.State_STATE_FAILED || ctx.Err() != nil {
			t.Fatalf("sandbox %s: %v, want %s", id, st, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// execOK runs argv in sandbox id through the gateway until it answers (while a runner
// Pod is replaced, its Service has no endpoint for a moment) and returns its stdout; the
// command must exit 0.
func execOK(t *testing.T, ctx context.Context, api sandboxv1connect.SandboxServiceClient, id string, argv ...string) string {
	t.Helper()
	for {
		ex, err := api.Exec(ctx, connect.NewRequest(&sandboxv1.ExecRequest{SandboxId: id, Command: argv}))
		if err == nil {
			if ex.Msg.GetExitCode() != 0 {
				t.Errorf("exec %v in %s: exit %d, stderr %q", argv, id, ex.Msg.GetExitCode(), ex.Msg.GetStderr())
			}
			return string(ex.Msg.GetStdout())
		}
		if ctx.Err() != nil {
			t.Fatalf("exec %v in %s: %v", argv, id, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
