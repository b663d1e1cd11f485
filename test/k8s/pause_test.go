package k8s

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sclient "k8s.io/client-go/kubernetes"

	"github.com/sandboxd/sandboxd/internal/nodeagent"
	"github.com/sandboxd/sandboxd/internal/nodeagent/store"
	"github.com/sandboxd/sandboxd/internal/pki"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes/nodeagentdial"
	"github.com/sandboxd/sandboxd/internal/stack"
)

// pauseTickScript keeps a random value drawn once and a counter in the shell's memory and
// writes both to /tmp/tick every 100 ms: a sandbox that starts afresh draws another value
// and counts from 1, a restored one goes on with the same value and count.
const pauseTickScript = `s=$(head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \n'); n=0; while :; do n=$((n+1)); echo "$s $n" > /tmp/tick.new; mv /tmp/tick.new /tmp/tick; sleep 0.1; done`

// TestK8sPauseResume: a `gvisor` sandbox made by the backend (gate + agent) is paused
// through the runner (runner.Pause: the backend checkpoints its Pod sandbox through the
// node agent — the real one, internal/nodeagent, in the test process through CRI and the
// shim's hibernate socket, listening on the node's InternalIP, which the runner reaches
// over mTLS as its --node-agent-port and --node-agent-tls-dir configure it
// (stack.KubernetesConfig.NodeAgents: NodeDialer, BackendDialer) — marks its Secret,
// deletes the Pod) and
// resumed (a new Pod on the node restores the checkpoint): its agent answers exec, its
// memory state (a value and a counter held by its main command's shell) and a file in
// /tmp are intact. While paused: state PAUSED, no Pod, the Secret kept (marked). A
// second pause then Delete leaves neither Secret nor checkpoint image.
func TestK8sPauseResume(t *testing.T) {
	pe := newPauseEnv(t)
	c, node, dialer, ckptRoot := pe.c, pe.node, pe.ta.dialer, pe.ckptRoot
	s := pe.stack(t, t.TempDir())
	t.Cleanup(func() {
		s.Close()
		deleteRunnerObjects(s.Client, c.namespace, pe.runnerID)
	})
	r := s.Runner
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	// A runc sandbox cannot be paused: the refusal names gvisor.
	rcsb, err := r.Create(ctx, runner.CreateRequest{Spec: runtime.Spec{
		Container: runtime.Container{Image: busybox, Command: "sleep", Args: []string{"3600"}},
		Meta:      map[string]string{runtime.MetaOrg: "org-1"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, r, rcsb.ID, 2*time.Minute, running)
	if _, err := r.Pause(ctx, rcsb.ID, runner.PauseOptions{}); err == nil || !strings.Contains(err.Error(), "gvisor") {
		t.Errorf("pause of a runc sandbox: %v, want a refusal naming gvisor", err)
	}
	_, _ = r.Delete(rcsb.ID, time.Second)
	sb, err := r.Create(ctx, runner.CreateRequest{Spec: runtime.Spec{
		Container:    runtime.Container{Image: busybox, Command: "sh", Args: []string{"-c", pauseTickScript}},
		RuntimeClass: "gvisor",
		Meta:         map[string]string{runtime.MetaOrg: "org-1"},
		// A NetworkPolicy of its own, to follow across the pause.
		Network: &runtime.Network{Egress: []runtime.EgressRule{{CIDR: "203.0.113.0/24"}}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	sb = waitState(t, r, sb.ID, 2*time.Minute, running)
	if sb.State != runner.StateRunning {
		t.Fatalf("state %s (%s: %s), want RUNNING", sb.State, sb.Reason, sb.Message)
	}
	id := sb.ID
	ipBefore := sb.IP
	if res := exec(t, r, id, "sh", "-c", "echo kept > /tmp/f && cat /tmp/f"); res.ExitCode != 0 || string(res.Stdout) != "kept\n" {
		t.Fatalf("write /tmp/f: exit %d %q %q", res.ExitCode, res.Stdout, res.Stderr)
	}
	val, n0 := readTick(t, r, id)
	time.Sleep(300 * time.Millisecond)
	pods := s.Client.CoreV1().Pods(c.namespace)
	secrets := s.Client.CoreV1().Secrets(c.namespace)

	// Pause.
	t0 := time.Now()
	psb, err := r.Pause(ctx, id, runner.PauseOptions{})
	if err != nil {
		t.Fatalf("pause: %v", err)
	}
	tPause := time.Since(t0)
	if psb.State != runner.StatePaused || psb.Pause == nil || !psb.Pause.Released {
		t.Fatalf("after pause: state %s, pause %+v; want PAUSED released", psb.State, psb.Pause)
	}
	if _, err := pods.Get(ctx, "sbx-"+id, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("paused sandbox's Pod: %v, want NotFound", err)
	}
	sec, err := secrets.Get(ctx, "sbx-"+id, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("paused sandbox's Secret: %v", err)
	}
	cid := sec.Annotations["sandboxd.io/paused-checkpoint"]
	if sec.Labels["sandboxd.io/paused"] != "true" || cid == "" || len(sec.OwnerReferences) != 0 {
		t.Errorf("paused Secret: labels %v annotations %v owners %v", sec.Labels, sec.Annotations, sec.OwnerReferences)
	}
	if err := store.ValidID(cid); err != nil {
		t.Errorf("paused checkpoint ID %q is not the node agent's: %v", cid, err)
	}
	image := filepath.Join(ckptRoot, cid)
	if _, err := os.Stat(image); err != nil {
		t.Errorf("checkpoint image: %v", err)
	}
	t.Logf("pause: %s (checkpoint %s, %d KiB)", tPause.Round(time.Millisecond), cid, psb.Pause.CheckpointBytes>>10)
	// The Pod stays gone for a while (the backend does not take the checkpoint's end for the sandbox's).
	time.Sleep(time.Second)
	if got, _ := r.Get(id); got.State != runner.StatePaused {
		t.Fatalf("1 s after the pause: state %s (%s: %s), want PAUSED", got.State, got.Reason, got.Message)
	}

	// Resume.
	t0 = time.Now()
	rsb, err := r.Resume(ctx, id)
	if err != nil {
		t.Fatalf("resume: %v", err)
	}
	tResume := time.Since(t0)
	if rsb.State != runner.StateRunning {
		t.Fatalf("after resume: state %s, want RUNNING", rsb.State)
	}
	t.Logf("resume: %s (IP %s -> %s)", tResume.Round(time.Millisecond), ipBefore, rsb.IP)
	if res := exec(t, r, id, "cat", "/tmp/f"); res.ExitCode != 0 || string(res.Stdout) != "kept\n" {
		t.Errorf("/tmp/f after resume: exit %d %q %q", res.ExitCode, res.Stdout, res.Stderr)
	}
	val1, n1 := readTick(t, r, id)
	if val1 != val {
		t.Fatalf("after resume the main command holds value %s, not %s: it started afresh", val1, val)
	}
	if n1 < n0 {
		t.Errorf("after resume the counter is %d, before the pause it was %d", n1, n0)
	}
	time.Sleep(500 * time.Millisecond)
	if val2, n2 := readTick(t, r, id); val2 != val || n2 <= n1 {
		t.Errorf("the restored main command does not run on: %s %d then %s %d", val1, n1, val2, n2)
	}
	sec, err = secrets.Get(ctx, "sbx-"+id, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := sec.Labels["sandboxd.io/paused"]; ok {
		t.Errorf("resumed sandbox's Secret still marked paused: %v", sec.Labels)
	}
	// The new Pod (a new IP) owns the Secret and the NetworkPolicy again.
	newPod, err := pods.Get(ctx, "sbx-"+id, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if rsb.IP == "" || rsb.IP != newPod.Status.PodIP {
		t.Errorf("resumed sandbox's IP %q, its Pod's %q", rsb.IP, newPod.Status.PodIP)
	}
	ownedByNew := func(refs []metav1.OwnerReference) bool {
		return len(refs) == 1 && refs[0].Kind == "Pod" && refs[0].UID == newPod.UID
	}
	if !ownedByNew(sec.OwnerReferences) {
		t.Errorf("resumed sandbox's Secret owners %v, want its new Pod %s", sec.OwnerReferences, newPod.UID)
	}
	nps := s.Client.NetworkingV1().NetworkPolicies(c.namespace)
	if np, err := nps.Get(ctx, "sbx-"+id, metav1.GetOptions{}); err != nil || !ownedByNew(np.OwnerReferences) {
		t.Errorf("resumed sandbox's NetworkPolicy %v (%v), want owned by its new Pod", np, err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := os.Stat(image)
		if os.IsNotExist(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("the resumed checkpoint's image %s is still there", image)
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	fmt.Fprintf(os.Stderr, "gVisor pause/resume on Kubernetes: pause %s (image %d KiB), resume %s\n",
		tPause.Round(time.Millisecond), psb.Pause.CheckpointBytes>>10, tResume.Round(time.Millisecond))

	// Pause again, then delete: no Secret, no image.
	if _, err := r.Pause(ctx, id, runner.PauseOptions{}); err != nil {
		t.Fatalf("second pause: %v", err)
	}
	sec, err = secrets.Get(ctx, "sbx-"+id, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	image = filepath.Join(ckptRoot, sec.Annotations["sandboxd.io/paused-checkpoint"])
	if _, err := os.Stat(image); err != nil {
		t.Fatalf("second checkpoint image: %v", err)
	}
	if _, err := r.Delete(id, 2*time.Second); err != nil {
		t.Fatalf("delete the paused sandbox: %v", err)
	}
	if end := terminal(t, r, id); end.State != runner.StateTerminated || end.Reason != runner.ReasonDeleted {
		t.Errorf("deleted while paused: %s %s (%s), want TERMINATED Deleted", end.State, end.Reason, end.Message)
	}
	deadline = time.Now().Add(30 * time.Second)
	for {
		_, serr := secrets.Get(ctx, "sbx-"+id, metav1.GetOptions{})
		_, perr := secrets.Get(ctx, "sbx-"+id+"-pull", metav1.GetOptions{})
		_, nerr := nps.Get(ctx, "sbx-"+id, metav1.GetOptions{})
		_, ierr := os.Stat(image)
		if apierrors.IsNotFound(serr) && apierrors.IsNotFound(perr) && apierrors.IsNotFound(nerr) && os.IsNotExist(ierr) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after deleting the paused sandbox: secret %v, pull secret %v, network policy %v, image %v (want all gone)", serr, perr, nerr, ierr)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// The agent's index holds none of this runner's checkpoints any more.
	ac, err := dialer.Agent(ctx, node)
	if err != nil {
		t.Fatal(err)
	}
	if list, err := ac.ListCheckpoints(ctx); err != nil || len(list) != 0 {
		t.Errorf("the node agent's checkpoints of the runner after the delete: %v (%v), want none", list, err)
	}
}

// pauseEnv is what pausing on the test cluster needs: root, the one node, the real node
// agent in the test process listening on the node's InternalIP, and the runner's client
// TLS for it (as its --node-agent-port and --node-agent-tls-dir configure it:
// stack.KubernetesConfig.NodeAgents, nodeagentdial.NodeDialer).
type pauseEnv struct {
	c        cluster
	node     string
	runnerID string
	ta       testAgent
	dial     nodeagentdial.DialConfig
	ckptRoot string
}

func newPauseEnv(t *testing.T) *pauseEnv {
	c := needCluster(t)
	if os.Geteuid() != 0 {
		msg := "needs root: the shim's hibernate socket and the checkpoint root are root's"
		if os.Getenv("SANDBOXD_K8S_REQUIRED") == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	rc, err := stack.RESTConfig(c.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	client, err := k8sclient.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	nodes, err := client.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
	if err != nil || len(nodes.Items) != 1 {
		t.Fatalf("the test cluster's nodes: %v (%d), want one", err, len(nodes.Items))
	}
	node := nodes.Items[0].Name
	nodeIP := ""
	for _, a := range nodes.Items[0].Status.Addresses {
		if a.Type == corev1.NodeInternalIP && nodeIP == "" {
			nodeIP = a.Address
		}
	}
	if nodeIP == "" {
		t.Fatalf("node %s has no InternalIP: %v", node, nodes.Items[0].Status.Addresses)
	}
	runnerID := randomID("test-")
	agentCtx, agentCancel := context.WithCancel(context.Background())
	t.Cleanup(agentCancel)
	// The agent listens on the node's InternalIP; the runner reaches it as its
	// --node-agent-port and --node-agent-tls-dir say (nodeagentdial.NodeDialer reads the node).
	ta := startNodeAgentAt(t, agentCtx, node, c.namespace, runnerID, net.JoinHostPort(nodeIP, "0"))
	_, portS, _ := net.SplitHostPort(ta.addr)
	port, _ := strconv.Atoi(portS)
	ccert, err := ta.ca.IssueClient("runner-"+runnerID, []*url.URL{pki.NodeAgentClientURI(runnerID)}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	runnerTLS := t.TempDir()
	if err := nodeagent.WriteTLSDir(runnerTLS, ccert, ta.ca.CertPEM()); err != nil {
		t.Fatal(err)
	}
	return &pauseEnv{c: c, node: node, runnerID: runnerID, ta: ta, ckptRoot: testCheckpointRoot(),
		dial: nodeagentdial.DialConfig{Port: port, TLSDir: runnerTLS}}
}

// stack starts a runner of the environment's runner ID on dataDir (a second one on the
// same dataDir, after the first is closed, is a restarted runner).
func (pe *pauseEnv) stack(t *testing.T, dataDir string) *stack.KubernetesStack {
	return newStackAgents(t, pe.c, pe.runnerID, dataDir, pe.dial, func(cfg *kubernetes.Config) {
		cfg.RuntimeClasses = map[string]string{"runc": "", "gvisor": "gvisor"}
		// The backend's resume steps (pod created, IP, agent answered) in the test's log.
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	})
}

// readTick reads /tmp/tick of the sandbox: the value and count its main command holds.
func readTick(t *testing.T, r *runner.Runner, id string) (string, int) {
	t.Helper()
	// Right after RUNNING the main command may not have written it yet.
	deadline := time.Now().Add(30 * time.Second)
	var f []string
	for {
		res := exec(t, r, id, "cat", "/tmp/tick")
		f = strings.Fields(string(res.Stdout))
		if res.ExitCode == 0 && len(f) == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/tmp/tick: exit %d %q %q", res.ExitCode, res.Stdout, res.Stderr)
		}
		time.Sleep(100 * time.Millisecond)
	}
	n, err := strconv.Atoi(f[1])
	if err != nil {
		t.Fatal(err)
	}
	return f[0], n
}
