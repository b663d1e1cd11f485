package k8s

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
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
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8s "k8s.io/client-go/kubernetes"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1/sandboxv1connect"
	controlplanev1 "github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1"
	statev1 "github.com/sandboxd/sandboxd/gen/sandboxd/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/sandbox/v1/statev1connect"
	"github.com/sandboxd/sandboxd/internal/connecttest"
	"github.com/sandboxd/sandboxd/internal/gateway"
	"github.com/sandboxd/sandboxd/internal/nodeagent"
	"github.com/sandboxd/sandboxd/internal/pki"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runnerapi"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes/nodeagentdial"
	"github.com/sandboxd/sandboxd/internal/stack"
)

// gvisorNodeLabel is the node label the chart's node agent DaemonSet selects by default
// (nodeAgent.nodeSelector); up.sh's kubelet registers the test node with it
// (--node-labels): the node has runsc, its shim and the RuntimeClass gvisor.
const gvisorNodeLabel = "sandboxd.dev/gvisor"

// TestChartPauseResume (issue 21): the runner chart with nodeAgent.enabled on the real
// cluster. The test issues the agents' server certificate (node-agent.sandboxd.internal,
// from one CA) and the runner's client certificate (its node-agent client URI, from
// another CA: each Secret's ca.crt must be the other side's CA) and stores them as the two
// kubernetes.io/tls Secrets in the release namespace (labelled privileged, as
// deploy/README.md says to; the sandboxes get a namespace of their own enforcing
// baseline). The chart is installed with the runner image of TestChartRunner, gVisor
// sandboxes and the node agent pointed at the test cluster's shim root, checkpoint root
// and CRI socket. Its DaemonSet's Pod (hostNetwork, on the node up.sh labels) gets Ready
// and answers the runner's certificate on the node's InternalIP (the test dials it as the
// runner does: nodeagentdial.NodeDialer). Through a gateway on this host, a gvisor
// sandbox whose main command keeps a random value and a counter in its shell's memory
// (pauseTickScript) and a file written by exec in /tmp is paused (PAUSED, its Pod gone,
// one checkpoint listed by the agent), still PAUSED a second later, resumed (RUNNING, the
// same value, the counter going on from where it was, the file intact), deleted
// (TERMINATED; the agent lists no checkpoint), and the release uninstalled (no DaemonSet,
// no ClusterRole left). The chart's shim annotation policy is on (the node agent's
// default): the runner's resumed Pod with the restore annotation passes it, and the
// uninstall removes it. The agent's state directory on the test node
// ($DATA/node-agent/<runner-id>) is removed after the uninstall.
func TestChartPauseResume(t *testing.T) { chartPauseResume(t, false) }

// TestChartPauseResumeIssued: TestChartPauseResume with no certificate Secrets made by the
// test: the chart's default, the runner issues them (--node-agent-issue-secrets). The
// runner, through the chart's Role, makes its CA Secret and the agents' server Secret (of
// the runner's, kubernetes.io/tls, a certificate for node-agent.sandboxd.internal of that
// CA); the agent's Pod, waiting for its Secret, then starts; it answers a client
// certificate of that CA naming the runner (the test issues one from the CA Secret, as
// the runner does in memory), and the pause and resume go through the runner's own.
func TestChartPauseResumeIssued(t *testing.T) { chartPauseResume(t, true) }

func chartPauseResume(t *testing.T, issued bool) {
	c := needCluster(t)
	helm := needHelm(t)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	const release = "sandboxd-runner"
	runnerImage := env("SANDBOXD_K8S_RUNNER_IMAGE", "localhost/sandboxd/runner:dev")
	rc, err := stack.RESTConfig(c.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	admin := k8s.NewForConfigOrDie(rc)
	nodes, err := admin.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: gvisorNodeLabel + "=true"})
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes.Items) != 1 {
		t.Fatalf("%d nodes labelled %s=true, want the test node (test/k8s/up.sh labels it when the node first registers: a cluster from before that needs down.sh, then up.sh)", len(nodes.Items), gvisorNodeLabel)
	}
	node := nodes.Items[0].Name
	host := nodeIP(t, ctx, admin)

	cp := startControlPlane(t, ctx, host, "dev")
	runnerID := randomID("chart-na-")
	if _, err := cp.api.CreateManagedRunner(ctx, connect.NewRequest(&controlplanev1.CreateManagedRunnerRequest{ManagedRunner: &controlplanev1.ManagedRunner{
		RunnerId: runnerID, ClusterId: "c-" + runnerID, Zone: "test", Policy: gvisorPolicy(t)}})); err != nil {
		t.Fatal(err)
	}
	tok, err := cp.api.CreateBootstrapToken(ctx, connect.NewRequest(&controlplanev1.CreateBootstrapTokenRequest{RunnerId: runnerID}))
	if err != nil {
		t.Fatal(err)
	}

	// The release namespace admits the agent's Pods (hostNetwork, hostPaths, root); the
	// sandboxes' enforces baseline.
	ns := randomID("sandboxd-chart-na-")
	sbxNS := ns + "-sbx"
	for name, level := range map[string]string{ns: "privileged", sbxNS: "baseline"} {
		if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
			Name: name, Labels: map[string]string{"pod-security.kubernetes.io/enforce": level}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	dataDir := env("SANDBOXD_K8S_DIR", "/var/lib/sandboxd-k8s")
	agentStarted := false
	t.Cleanup(func() {
		// After the uninstall (cleanups run last first): the agent's state directory of
		// this test's runner ID on the node (this host), which no agent uses again. Once
		// the agent ran it must be there (else this removes the wrong path).
		dir := filepath.Join(dataDir, "node-agent", runnerID)
		if _, err := os.Stat(dir); agentStarted && err != nil {
			t.Errorf("the agent's state directory %s: %v, want the one the agent made", dir, err)
		}
		if err := os.RemoveAll(dir); err != nil {
			t.Errorf("removing the agent's state directory %s: %v", dir, err)
		}
	})
	uninstall := func(ctx context.Context) ([]byte, error) {
		return osexec.CommandContext(ctx, helm, "uninstall", release, "--namespace", ns, "--kubeconfig", c.kubeconfig, "--wait", "--ignore-not-found").CombinedOutput()
	}
	t.Cleanup(func() {
		// The release first (its ClusterRole is not in a namespace), then the namespaces.
		bg, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if out, err := uninstall(bg); err != nil {
			t.Errorf("helm uninstall: %v\n%s", err, out)
		}
		for _, n := range []string{sbxNS, ns} {
			_ = admin.CoreV1().Namespaces().Delete(bg, n, metav1.DeleteOptions{})
		}
	})

	var secretArgs []string
	var clientDir string
	if !issued {
		// Two CAs: the agents' (their server certificate; the runner's ca.crt) and the
		// runner's (its client certificate; the agents' ca.crt).
		agentsCA, err := pki.LoadOrCreateCA(t.TempDir(), "test node agents' CA of "+runnerID)
		if err != nil {
			t.Fatal(err)
		}
		runnerCA, err := pki.LoadOrCreateCA(t.TempDir(), "test runner client CA of "+runnerID)
		if err != nil {
			t.Fatal(err)
		}
		serverCert, err := agentsCA.IssueServer("sandboxd-node-agent", []string{nodeagent.ServerName}, nil, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		clientCert, err := runnerCA.IssueClient("runner-"+runnerID, []*url.URL{pki.NodeAgentClientURI(runnerID)}, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		const serverSecret, clientSecret = "sandboxd-node-agent-server", "sandboxd-node-agent-client"
		createTLSSecret(t, ctx, admin, ns, serverSecret, serverCert, runnerCA.CertPEM())
		clientDir = createTLSSecret(t, ctx, admin, ns, clientSecret, clientCert, agentsCA.CertPEM())
		secretArgs = []string{"--set", "nodeAgent.serverSecret=" + serverSecret, "--set", "nodeAgent.clientSecret=" + clientSecret}
	}

	// The agent's port on the node (hostNetwork): one free on this host now, below the
	// ephemeral range (32768 up by default) so that no outgoing connection takes it
	// before the agent's Pod binds it.
	agentPort := 0
	for p := 20000 + int(time.Now().UnixNano()%2000); p < 32000 && agentPort == 0; p += 7 {
		if l, err := net.Listen("tcp", fmt.Sprintf(":%d", p)); err == nil {
			l.Close()
			agentPort = p
		}
	}
	if agentPort == 0 {
		t.Fatal("no free port for the node agent in 20000-32000")
	}

	repo, tag, _ := strings.Cut(runnerImage, ":")
	agentRepo, agentTag, _ := strings.Cut(c.agentImage, ":")
	install := osexec.CommandContext(ctx, helm, append([]string{"install", release, chartDir, "--namespace", ns,
		"--kubeconfig", c.kubeconfig,
		"--set", "image.repository=" + repo, "--set", "image.tag=" + tag, "--set", "image.pullPolicy=Never",
		"--set", "agentImage.repository=" + agentRepo, "--set", "agentImage.tag=" + agentTag, "--set", "sandboxImagePullPolicy=Never",
		"--set", "controlPlane.address=" + cp.addr, "--set", "controlPlane.bootstrapToken=" + tok.Msg.GetBootstrapToken(),
		"--set-file", "controlPlane.caPEM=" + cp.caFile,
		"--set", "persistence.enabled=false", "--set", "sandboxNamespace=" + sbxNS,
		"--set", "runtimeClasses.runc=", "--set", "runtimeClasses.gvisor=gvisor",
		"--set", "nodeAgent.enabled=true", "--set-string", "nodeAgent.runnerID=" + runnerID,
		"--set", "nodeAgent.port=" + strconv.Itoa(agentPort),
		// The test cluster's node paths (test/k8s/up.sh), not a stock containerd's.
		"--set", "nodeAgent.shimRoot=" + env("SANDBOXD_K8S_HIBERNATE_DIR", filepath.Join(dataDir, "hib")),
		"--set", "nodeAgent.checkpointRoot=" + testCheckpointRoot(),
		"--set", "nodeAgent.stateDir=" + filepath.Join(dataDir, "node-agent"),
		"--set", "nodeAgent.criSocket=" + env("SANDBOXD_K8S_CONTAINERD", filepath.Join(dataDir, "run", "containerd.sock"))}, secretArgs...)...)
	if out, err := install.CombinedOutput(); err != nil {
		t.Fatalf("helm install: %v\n%s", err, out)
	}
	start := time.Now()
	// The shim annotation policy is on with the node agent (TestSecurityRestoreAnnotation):
	// the resume below passes it as the runner's service account.
	shimPolicy := release + "-" + ns + "-shim-annotations"
	if _, err := admin.AdmissionregistrationV1().ValidatingAdmissionPolicies().Get(ctx, shimPolicy, metav1.GetOptions{}); err != nil {
		t.Errorf("the shim annotation policy: %v", err)
	}
	var tc *tls.Config
	if issued {
		// The runner makes the Secrets at its start; the agent's Pod waits for its own.
		runnerPod := waitReadyPod(t, ctx, admin, ns, "app.kubernetes.io/name=sandboxd-runner,app.kubernetes.io/instance="+release, "runner")
		if args := runnerPod.Spec.Containers[0].Args; !slices.Contains(args, "--node-agent-issue-secrets="+release+"-node-agent") {
			t.Errorf("runner args %q lack --node-agent-issue-secrets=%s-node-agent", args, release)
		}
		t.Logf("runner Pod %s Ready %s after helm install", runnerPod.Name, time.Since(start).Round(time.Millisecond))
		tc = issuedClientTLS(t, ctx, admin, ns, release+"-node-agent", runnerID)
	}

	// The agent's Pod: Ready on the labelled node.
	agentSel := "app.kubernetes.io/name=sandboxd-node-agent,app.kubernetes.io/instance=" + release
	agentPod := waitReadyPod(t, ctx, admin, ns, agentSel, "node-agent")
	if agentPod.Spec.NodeName != node || !agentPod.Spec.HostNetwork {
		t.Errorf("agent Pod %s on node %q, hostNetwork %v: want node %s, hostNetwork", agentPod.Name, agentPod.Spec.NodeName, agentPod.Spec.HostNetwork, node)
	}
	agentStarted = true
	t.Logf("node agent Pod %s Ready %s after helm install", agentPod.Name, time.Since(start).Round(time.Millisecond))
	// It answers the runner's certificate on the node's InternalIP, as the runner dials it.
	if !issued {
		if tc, err = nodeagentdial.ClientTLSFromDir(clientDir, runnerID); err != nil {
			t.Fatal(err)
		}
	}
	dialer := &nodeagentdial.NodeDialer{Client: admin, Port: agentPort, TLS: tc}
	t.Cleanup(func() {
		// Before the uninstall (cleanups run last first): a checkpoint the runner did not
		// delete (the test failed after the pause) belongs to this test's runner ID, which
		// no agent will ever clean up.
		bg, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		ac, err := dialer.Agent(bg, node)
		if err != nil {
			return
		}
		list, err := ac.ListCheckpoints(bg)
		if err != nil {
			return
		}
		for _, cp := range list {
			if err := ac.DeleteCheckpoint(bg, cp.GetCheckpointId()); err != nil {
				t.Logf("deleting the left checkpoint %s: %v", cp.GetCheckpointId(), err)
			}
		}
	})
	listCheckpoints := func() []string {
		t.Helper()
		for {
			ac, err := dialer.Agent(ctx, node)
			if err == nil {
				list, lerr := ac.ListCheckpoints(ctx)
				if lerr == nil {
					ids := []string{}
					for _, cp := range list {
						ids = append(ids, cp.GetCheckpointId())
					}
					return ids
				}
				err = lerr
			}
			if ctx.Err() != nil {
				t.Fatalf("the node agent at %s:%d: %v\n%s", host, agentPort, err, containerLog(admin, agentPod, "node-agent"))
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	if ids := listCheckpoints(); len(ids) != 0 {
		t.Errorf("a new node agent lists checkpoints %v", ids)
	}
	runnerPod := waitReadyPod(t, ctx, admin, ns, "app.kubernetes.io/name=sandboxd-runner,app.kubernetes.io/instance="+release, "runner")
	if args := runnerPod.Spec.Containers[0].Args; !slices.Contains(args, "--node-agent-port="+strconv.Itoa(agentPort)) {
		t.Errorf("runner args %q lack --node-agent-port=%d", args, agentPort)
	}
	t.Logf("runner Pod %s Ready %s after helm install", runnerPod.Name, time.Since(start).Round(time.Millisecond))

	// A gateway on this host, reaching the runner through the chart's Service.
	svc, err := admin.CoreV1().Services(ns).Get(ctx, release, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ccfg, err := runnerapi.ClientTLSConfig(cp.ca, "gw1", runnerID)
	if err != nil {
		t.Fatal(err)
	}
	rcl, err := runnerapi.NewClient(runnerapi.ClientConfig{ID: runnerID, Addr: net.JoinHostPort(svc.Spec.ClusterIP, "7443"), TLS: ccfg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rcl.Close)
	gwURL, api, key := serveGateway(t, gateway.Config{Runners: []runner.Handle{rcl}, Policies: policyMap{runnerID: gvisorPolicyDoc}})
	state := statev1connect.NewSandboxStateServiceClient(h2cClient(), gwURL, connect.WithGRPC(), connect.WithInterceptors(connecttest.Bearer(key)))

	id := createRunningSpec(t, ctx, api, &sandboxv1.SandboxSpec{
		RuntimeClass: "gvisor",
		Containers: []*sandboxv1.Container{{Name: "main", Image: busybox, Command: "sh", Args: []string{"-c", pauseTickScript},
			Resources: &sandboxv1.Resources{Cpu: "100m", Memory: "64Mi"}}},
	})
	t.Cleanup(func() {
		// Bounded: the release's uninstall (cleaned up after this) must run even when the
		// gateway or the runner hangs.
		bg, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = api.DeleteSandbox(bg, connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: id}))
	})
	pods := admin.CoreV1().Pods(sbxNS)
	if p, err := pods.Get(ctx, "sbx-"+id, metav1.GetOptions{}); err != nil || p.Spec.RuntimeClassName == nil || *p.Spec.RuntimeClassName != "gvisor" {
		t.Fatalf("the sandbox's Pod in %s: %v, want RuntimeClass gvisor", sbxNS, err)
	}
	if out := execOK(t, ctx, api, id, "sh", "-c", "echo kept > /tmp/f && cat /tmp/f"); out != "kept\n" {
		t.Fatalf("write /tmp/f: %q", out)
	}
	val, n0 := readPublicTick(t, ctx, api, id)
	time.Sleep(300 * time.Millisecond)

	// Pause (auto-resume off: nothing but the resume below wakes it).
	t0 := time.Now()
	pres, err := state.PauseSandbox(ctx, connect.NewRequest(&statev1.PauseSandboxRequest{SandboxId: id, AutoResume: ptrTo(false)}))
	if err != nil {
		t.Fatalf("pause: %v\nagent: %s\n%s", err, containerLog(admin, agentPod, "node-agent"), podLog(admin, runnerPod))
	}
	tPause := time.Since(t0)
	ps := pres.Msg.GetStatus()
	t.Logf("pause: %s (checkpoint %d KiB, resources released %v)", tPause.Round(time.Millisecond), ps.GetCheckpointBytes()>>10, ps.GetResourcesReleased())
	if !ps.GetResourcesReleased() || ps.GetCheckpointBytes() == 0 {
		t.Errorf("pause status %v: want resources released and a checkpoint", ps)
	}
	if _, err := pods.Get(ctx, "sbx-"+id, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the paused sandbox's Pod: %v, want NotFound", err)
	}
	if ids := listCheckpoints(); len(ids) != 1 {
		t.Errorf("the node agent lists checkpoints %v while the sandbox is paused, want one", ids)
	}
	time.Sleep(time.Second)
	if st := publicState(t, ctx, api, id); st.GetState() != sandboxv1.State_STATE_PAUSED {
		t.Fatalf("1 s after the pause: %v, want PAUSED", st)
	}

	// Resume.
	t0 = time.Now()
	if _, err := state.ResumeSandbox(ctx, connect.NewRequest(&statev1.ResumeSandboxRequest{SandboxId: id})); err != nil {
		t.Fatalf("resume: %v\nagent: %s\n%s", err, containerLog(admin, agentPod, "node-agent"), podLog(admin, runnerPod))
	}
	tResume := time.Since(t0)
	t.Logf("resume: %s", tResume.Round(time.Millisecond))
	if p, err := pods.Get(ctx, "sbx-"+id, metav1.GetOptions{}); err != nil || p.Annotations[runtime.RestoreCheckpointAnnotation] == "" {
		t.Errorf("the resumed sandbox's Pod: %v, want it made with %s (the runner, through the policy)", err, runtime.RestoreCheckpointAnnotation)
	}
	waitPublicState(t, ctx, api, id, sandboxv1.State_STATE_RUNNING)
	if out := execOK(t, ctx, api, id, "cat", "/tmp/f"); out != "kept\n" {
		t.Errorf("/tmp/f after the resume: %q", out)
	}
	val1, n1 := readPublicTick(t, ctx, api, id)
	if val1 != val {
		t.Fatalf("after the resume the main command holds value %s, not %s: it started afresh", val1, val)
	}
	if n1 < n0 {
		t.Errorf("after the resume the counter is %d, before the pause it was %d", n1, n0)
	}
	time.Sleep(500 * time.Millisecond)
	if val2, n2 := readPublicTick(t, ctx, api, id); val2 != val || n2 <= n1 {
		t.Errorf("the restored main command does not run on: %s %d then %s %d", val1, n1, val2, n2)
	}
	fmt.Fprintf(os.Stderr, "gVisor pause/resume through the chart's node agent: pause %s (image %d KiB), resume %s\n",
		tPause.Round(time.Millisecond), ps.GetCheckpointBytes()>>10, tResume.Round(time.Millisecond))

	if _, err := api.DeleteSandbox(ctx, connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: id, GracePeriodSeconds: 2})); err != nil {
		t.Fatal(err)
	}
	waitPublicState(t, ctx, api, id, sandboxv1.State_STATE_TERMINATED)
	// The resume deleted its image: the agent holds none of the runner's.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		ids := listCheckpoints()
		if len(ids) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("the node agent still lists checkpoints %v after the resume and delete", ids)
			break
		}
	}

	if out, err := uninstall(ctx); err != nil {
		t.Fatalf("helm uninstall: %v\n%s", err, out)
	}
	if _, err := admin.AppsV1().DaemonSets(ns).Get(ctx, release+"-node-agent", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the node agent DaemonSet after helm uninstall: %v, want NotFound", err)
	}
	if _, err := admin.RbacV1().ClusterRoles().Get(ctx, release+"-"+ns+"-nodes", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the runner's ClusterRole after helm uninstall: %v, want NotFound", err)
	}
	if _, err := admin.AdmissionregistrationV1().ValidatingAdmissionPolicies().Get(ctx, shimPolicy, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the shim annotation policy after helm uninstall: %v, want NotFound", err)
	}
}

// issuedClientTLS reads the Secrets the runner issued (prefix-ca, prefix-server in ns),
// checks them — both labelled as runnerID's, the server Secret a kubernetes.io/tls one
// whose certificate is the CA's for node-agent.sandboxd.internal and whose ca.crt is that
// CA — and returns a client configuration with a certificate of that CA naming runnerID,
// as the runner makes its own.
func issuedClientTLS(t *testing.T, ctx context.Context, admin k8s.Interface, ns, prefix, runnerID string) *tls.Config {
	t.Helper()
	caName, serverName := nodeagentdial.IssueSecretNames(prefix)
	var caS, srvS *corev1.Secret
	for {
		var err1, err2 error
		caS, err1 = admin.CoreV1().Secrets(ns).Get(ctx, caName, metav1.GetOptions{})
		srvS, err2 = admin.CoreV1().Secrets(ns).Get(ctx, serverName, metav1.GetOptions{})
		if err1 == nil && err2 == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the runner's issued Secrets %s, %s: %v, %v", caName, serverName, err1, err2)
		}
		time.Sleep(200 * time.Millisecond)
	}
	for _, s := range []*corev1.Secret{caS, srvS} {
		if s.Labels[nodeagentdial.LabelRunnerID] != runnerID || s.Labels[nodeagentdial.LabelManagedBy] != "sandboxd-runner" {
			t.Errorf("Secret %s labels %v: want the runner's", s.Name, s.Labels)
		}
	}
	ca, err := pki.ParseCA(caS.Data[nodeagent.CAFile], caS.Data[nodeagentdial.CAKeyFile])
	if err != nil {
		t.Fatal(err)
	}
	if srvS.Type != corev1.SecretTypeTLS || !bytes.Equal(srvS.Data[nodeagent.CAFile], ca.CertPEM()) {
		t.Errorf("server Secret %s: type %s, ca.crt the runner's CA %v", serverName, srvS.Type, bytes.Equal(srvS.Data[nodeagent.CAFile], ca.CertPEM()))
	}
	kp, err := tls.X509KeyPair(srvS.Data[nodeagent.CertFile], srvS.Data[nodeagent.KeyFile])
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(kp.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{DNSName: nodeagent.ServerName, Roots: ca.Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		t.Errorf("the issued server certificate: %v", err)
	}
	client, err := ca.IssueClient("test-"+runnerID, []*url.URL{pki.NodeAgentClientURI(runnerID)}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return nodeagent.ClientTLSConfig(&client, nil, ca.Pool())
}

// createTLSSecret stores cert and caPEM as the kubernetes.io/tls Secret name in ns (the
// layout nodeagent.WriteTLSDir writes, which the agent and the runner read) and returns
// the directory it wrote them to.
func createTLSSecret(t *testing.T, ctx context.Context, admin k8s.Interface, ns, name string, cert tls.Certificate, caPEM []byte) string {
	t.Helper()
	dir := t.TempDir()
	if err := nodeagent.WriteTLSDir(dir, cert, caPEM); err != nil {
		t.Fatal(err)
	}
	data := map[string][]byte{}
	for _, f := range []string{nodeagent.CertFile, nodeagent.KeyFile, nodeagent.CAFile} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		data[f] = b
	}
	if _, err := admin.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name}, Type: corev1.SecretTypeTLS, Data: data}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return dir
}

// waitReadyPod waits for the one live Pod of ns matching selector, Ready; its
// container's log in the failure.
func waitReadyPod(t *testing.T, ctx context.Context, admin k8s.Interface, ns, selector, container string) *corev1.Pod {
	t.Helper()
	for {
		pods, err := admin.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			t.Fatal(err)
		}
		var live []corev1.Pod
		for _, p := range pods.Items {
			if p.DeletionTimestamp == nil {
				live = append(live, p)
			}
		}
		if len(live) == 1 && podReady(&live[0]) {
			return &live[0]
		}
		if ctx.Err() != nil {
			var states []string
			for _, p := range live {
				states = append(states, fmt.Sprintf("%s %s ready=%v %+v", p.Name, p.Status.Phase, podReady(&p), p.Status.ContainerStatuses))
				states = append(states, containerLog(admin, &p, container))
			}
			evs, _ := admin.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{})
			if evs != nil {
				for _, e := range evs.Items {
					states = append(states, fmt.Sprintf("event %s/%s: %s %s", e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Reason, e.Message))
				}
			}
			t.Fatalf("no Ready Pod %s in %s: %d live\n%s", selector, ns, len(live), strings.Join(states, "\n"))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// containerLog is a container's log (for failure messages).
func containerLog(admin k8s.Interface, p *corev1.Pod, container string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b, err := admin.CoreV1().Pods(p.Namespace).GetLogs(p.Name, &corev1.PodLogOptions{Container: container}).DoRaw(ctx)
	if err != nil {
		return fmt.Sprintf("log of %s/%s: %v", p.Name, container, err)
	}
	return "log of " + p.Name + "/" + container + ":\n" + string(b)
}

// publicState is the sandbox's status through the public API.
func publicState(t *testing.T, ctx context.Context, api sandboxv1connect.SandboxServiceClient, id string) *sandboxv1.SandboxStatus {
	t.Helper()
	res, err := api.GetSandbox(ctx, connect.NewRequest(&sandboxv1.GetSandboxRequest{SandboxId: id}))
	if err != nil {
		t.Fatalf("get %s: %v", id, err)
	}
	return res.Msg.GetStatus()
}

// readPublicTick reads /tmp/tick of the sandbox through the public API: the value and
// count its main command (pauseTickScript) holds.
func readPublicTick(t *testing.T, ctx context.Context, api sandboxv1connect.SandboxServiceClient, id string) (string, int) {
	t.Helper()
	// Right after RUNNING the main command may not have written it yet.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		ex, err := api.Exec(ctx, connect.NewRequest(&sandboxv1.ExecRequest{SandboxId: id, Command: []string{"cat", "/tmp/tick"}}))
		if err == nil && ex.Msg.GetExitCode() == 0 {
			if f := strings.Fields(string(ex.Msg.GetStdout())); len(f) == 2 {
				n, err := strconv.Atoi(f[1])
				if err != nil {
					t.Fatalf("/tmp/tick %q: %v", ex.Msg.GetStdout(), err)
				}
				return f[0], n
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("/tmp/tick of %s: %v %v", id, ex, err)
		}
	}
}

// h2cClient speaks HTTP/2 without TLS (the test gateway's protocol).
func h2cClient() *http.Client {
	p := new(http.Protocols)
	p.SetUnencryptedHTTP2(true)
	return &http.Client{Transport: &http.Transport{Protocols: p}}
}
