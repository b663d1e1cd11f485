package k8s

import (
	"context"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"connectrpc.com/connect"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sclient "k8s.io/client-go/kubernetes"

	"github.com/sandboxd/sandboxd/internal/nodeagent"
	"github.com/sandboxd/sandboxd/internal/nodeagent/cri"
	"github.com/sandboxd/sandboxd/internal/nodeagent/hibernate"
	"github.com/sandboxd/sandboxd/internal/nodeagent/store"
	"github.com/sandboxd/sandboxd/internal/pki"
	"github.com/sandboxd/sandboxd/internal/stack"
)

// startNodeAgent runs the node agent of runnerID in the test process on the test node:
// the real CRI (containerd's socket), the real shim hibernate sockets and checkpoint
// root, TLS from a throw-away CA. It returns a client with runnerID's certificate.
func startNodeAgent(t *testing.T, ctx context.Context, node, namespace, runnerID string) *nodeagent.Client {
	t.Helper()
	c, err := startNodeAgentAt(t, ctx, node, namespace, runnerID, "127.0.0.1:0").dialer.Agent(ctx, node)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// testAgent is a node agent started by startNodeAgentAt: a StaticDialer of it (runnerID's
// client certificate, the agent's address for its node), the test CA its server
// certificate chains to, and where it listens.
type testAgent struct {
	dialer *nodeagent.StaticDialer
	ca     *pki.CA
	addr   string
}

// startNodeAgentAt is startNodeAgent listening on listen (host:port).
func startNodeAgentAt(t *testing.T, ctx context.Context, node, namespace, runnerID, listen string) testAgent {
	t.Helper()
	dataDir := env("SANDBOXD_K8S_DIR", "/var/lib/sandboxd-k8s")
	res, err := cri.New(cri.Config{
		Endpoint:       "unix://" + env("SANDBOXD_K8S_CONTAINERD", filepath.Join(dataDir, "run", "containerd.sock")),
		Namespaces:     []string{namespace},
		RuntimeHandler: "runsc",
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { res.Close() })
	if v, err := res.Version(ctx); err != nil {
		t.Fatalf("CRI: %v", err)
	} else {
		t.Logf("CRI runtime: %s", v)
	}
	state := filepath.Join(t.TempDir(), "state")
	st, err := store.Open(store.Config{
		Root: env("SANDBOXD_K8S_CHECKPOINT_ROOT", filepath.Join(dataDir, "checkpoints")), StateDir: state,
		Owner: runnerID, QuotaBytes: 8 << 30, MinFreeBytes: 256 << 20, RequireRoot: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := nodeagent.NewServer(nodeagent.Config{
		Node: node, RunnerID: runnerID, Resolver: res, Store: st,
		Checkpointer: nodeagent.ShimCheckpointer{ShimRoot: env("SANDBOXD_K8S_HIBERNATE_DIR", filepath.Join(dataDir, "hib"))},
	})
	if err != nil {
		t.Fatal(err)
	}
	ca, err := pki.LoadOrCreateCA(t.TempDir(), "test node-agent CA")
	if err != nil {
		t.Fatal(err)
	}
	cert, err := ca.IssueServer("sandboxd-node-agent", []string{nodeagent.ServerName}, nil, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	tlsDir := t.TempDir()
	if err := nodeagent.WriteTLSDir(tlsDir, cert, ca.CertPEM()); err != nil {
		t.Fatal(err)
	}
	tc, err := nodeagent.ServerTLSConfig(tlsDir, runnerID)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		t.Fatal(err)
	}
	hs := srv.HTTPServer(tc)
	go func() { _ = hs.ServeTLS(ln, "", "") }()
	t.Cleanup(func() { hs.Close() })
	ccert, err := ca.IssueClient("runner-"+runnerID, []*url.URL{pki.NodeAgentClientURI(runnerID)}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	d := &nodeagent.StaticDialer{Addrs: map[string]string{node: ln.Addr().String()}, TLS: nodeagent.ClientTLSConfig(&ccert, nil, ca.Pool())}
	c, err := d.Agent(ctx, node)
	if err != nil {
		t.Fatal(err)
	}
	// The test's images go whatever happens.
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		list, _ := c.ListCheckpoints(cctx)
		for _, cp := range list {
			_ = c.DeleteCheckpoint(cctx, cp.CheckpointId)
		}
	})
	return testAgent{dialer: d, ca: ca, addr: ln.Addr().String()}
}

// testCheckpointRoot is the checkpoint root of the test cluster's shim (where the agent
// makes its images).
func testCheckpointRoot() string {
	return env("SANDBOXD_K8S_CHECKPOINT_ROOT", filepath.Join(env("SANDBOXD_K8S_DIR", "/var/lib/sandboxd-k8s"), "checkpoints"))
}

// TestNodeAgentCheckpoint: the node agent, in-process against the node's containerd CRI
// and the gVisor shim, checkpoints a real gvisor Pod that carries the runner's and the
// sandbox's labels — a fork's checkpoint (the Pod runs on) and a pause's (it ends) — and a
// new Pod restores the agent's image with the first one's memory. Pods that are not the
// caller's (another runner's label, another sandbox ID, a runc Pod, a wrong UID) are
// refused through the real CRI. DeleteCheckpoint removes the images.
func TestNodeAgentCheckpoint(t *testing.T) {
	c := needCluster(t)
	if os.Geteuid() != 0 {
		msg := "needs root: the shim's hibernate socket, the CRI socket and the checkpoint root are root's"
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
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	tag := randomID("")
	runnerID := "na-" + tag
	pods := client.CoreV1().Pods(c.namespace)
	var made []string
	t.Cleanup(func() {
		for _, n := range made {
			_ = pods.Delete(context.Background(), n, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
		}
	})
	create := func(name, sandboxID, runner, restore, node string, runc bool) *corev1.Pod {
		t.Helper()
		p := tickPod(name, tag, restore, node)
		p.Labels[cri.LabelRunner] = runner
		p.Labels[cri.LabelSandbox] = sandboxID
		if runc {
			p.Spec.RuntimeClassName = nil
		}
		if _, err := pods.Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		made = append(made, name)
		return waitPod(t, ctx, pods, name, func(p *corev1.Pod) bool { return containerRunning(p) })
	}
	a := "na-a-" + tag
	podA := create(a, "sbx-"+tag, runnerID, "", "", false)
	foreign := create("na-x-"+tag, "sbx-x-"+tag, "other-"+tag, "", podA.Spec.NodeName, false)
	runcPod := create("na-r-"+tag, "sbx-r-"+tag, runnerID, "", podA.Spec.NodeName, true)
	before := waitTicks(t, ctx, pods, a, "", 5)
	secret := before[len(before)-1].secret
	agent := startNodeAgent(t, ctx, podA.Spec.NodeName, c.namespace, runnerID)

	ref := func(p *corev1.Pod, sandboxID string) nodeagent.CheckpointRequest {
		return nodeagent.CheckpointRequest{Namespace: p.Namespace, Name: p.Name, UID: string(p.UID), SandboxID: sandboxID}
	}
	// Refused through the real CRI.
	for name, tc := range map[string]struct {
		req  nodeagent.CheckpointRequest
		want connect.Code
	}{
		"another runner's pod": {ref(foreign, "sbx-x-"+tag), connect.CodePermissionDenied},
		"runc pod":             {ref(runcPod, "sbx-r-"+tag), connect.CodePermissionDenied},
		"other sandbox id":     {ref(podA, "sbx-x-"+tag), connect.CodePermissionDenied},
		"uid of another pod":   {nodeagent.CheckpointRequest{Namespace: podA.Namespace, Name: podA.Name, UID: string(foreign.UID), SandboxID: "sbx-" + tag}, connect.CodeNotFound},
	} {
		if _, err := agent.Checkpoint(ctx, tc.req); connect.CodeOf(err) != tc.want {
			t.Errorf("%s: %v, want %v", name, err, tc.want)
		}
	}

	// A fork's checkpoint: the Pod runs on.
	fork := ref(podA, "sbx-"+tag)
	fork.LeaveRunning = true
	fres, err := agent.Checkpoint(ctx, fork)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("fork checkpoint %s on %s: %d KiB in %s, running %v", fres.ID, fres.Node, fres.Bytes>>10, fres.Took.Round(time.Millisecond), fres.SandboxRunning)
	if fres.SandboxRunning == nil || !*fres.SandboxRunning || fres.Node != podA.Spec.NodeName || fres.Bytes == 0 {
		t.Fatalf("fork result %+v", fres)
	}
	ckptRoot := env("SANDBOXD_K8S_CHECKPOINT_ROOT", filepath.Join(env("SANDBOXD_K8S_DIR", "/var/lib/sandboxd-k8s"), "checkpoints"))
	if _, err := hibernate.ImageDir(ckptRoot, fres.ID); err != nil {
		t.Fatalf("the fork's image is not one the shim restores: %v", err)
	}
	n := waitTicks(t, ctx, pods, a, secret, 1)
	waitTicks(t, ctx, pods, a, secret, n[len(n)-1].n+3)

	// A pause's checkpoint: the sandbox ends.
	pres, err := agent.Checkpoint(ctx, ref(podA, "sbx-"+tag))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("pause checkpoint %s: %d KiB in %s", pres.ID, pres.Bytes>>10, pres.Took.Round(time.Millisecond))
	// (A pause's result says false by construction; that the sandbox ended is the Pod's
	// phase below.)
	waitPod(t, ctx, pods, a, func(p *corev1.Pod) bool {
		return p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded
	})
	last := waitTicks(t, ctx, pods, a, "", 1)
	lastN := last[len(last)-1].n
	if err := pods.Delete(ctx, a, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	waitPodGone(t, ctx, pods, a)

	// A new Pod on the node restores the agent's image with the memory of the first.
	b := "na-b-" + tag
	t0 := time.Now()
	create(b, "sbx-"+tag, runnerID, pres.ID, podA.Spec.NodeName, false)
	after := waitTicks(t, ctx, pods, b, secret, lastN+1)
	t.Logf("restored pod %s: ticks from %d (checkpoint at %d), value %s, in %s", b, after[0].n, lastN, secret, time.Since(t0).Round(time.Millisecond))

	list, err := agent.ListCheckpoints(ctx)
	if err != nil || len(list) != 2 {
		t.Fatalf("list %v %v", list, err)
	}
	for _, id := range []string{fres.ID, pres.ID} {
		if err := agent.DeleteCheckpoint(ctx, id); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Lstat(filepath.Join(ckptRoot, id)); !os.IsNotExist(err) {
			t.Fatalf("image %s left: %v", id, err)
		}
	}
	if list, err := agent.ListCheckpoints(ctx); err != nil || len(list) != 0 {
		t.Fatalf("list after delete %v %v", list, err)
	}
}
