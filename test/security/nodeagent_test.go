package security

import (
	"context"
	"crypto/tls"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/sandboxd/sandboxd/internal/nodeagent"
	"github.com/sandboxd/sandboxd/internal/nodeagent/cri"
	"github.com/sandboxd/sandboxd/internal/nodeagent/store"
	"github.com/sandboxd/sandboxd/internal/pki"
)

// The node agent checkpoints gVisor Pod sandboxes for one runner (internal/nodeagent). A
// checkpoint is a copy of a sandbox's memory, so a caller that could checkpoint another
// runner's (or another tenant's) Pod, or steer the agent's file operations with a path,
// would read or destroy what is not its own. These tests attack it from outside: a
// client of another runner, a valid client naming a Pod that is not its own, and
// path-like and symlinked checkpoint IDs.

// secFakeCRI: a CRI runtime whose node runs Pods of two runners.
type secFakeCRI struct {
	runtimeapi.UnimplementedRuntimeServiceServer
	sandboxes []*runtimeapi.PodSandbox
}

func (f *secFakeCRI) ListPodSandbox(_ context.Context, req *runtimeapi.ListPodSandboxRequest) (*runtimeapi.ListPodSandboxResponse, error) {
	var out []*runtimeapi.PodSandbox
	for _, s := range f.sandboxes {
		if uid := req.GetFilter().GetLabelSelector()["io.kubernetes.pod.uid"]; uid == "" || s.Labels["io.kubernetes.pod.uid"] == uid {
			out = append(out, s)
		}
	}
	return &runtimeapi.ListPodSandboxResponse{Items: out}, nil
}

func (f *secFakeCRI) PodSandboxStatus(_ context.Context, req *runtimeapi.PodSandboxStatusRequest) (*runtimeapi.PodSandboxStatusResponse, error) {
	return &runtimeapi.PodSandboxStatusResponse{Status: &runtimeapi.PodSandboxStatus{Id: req.PodSandboxId, State: runtimeapi.PodSandboxState_SANDBOX_READY}}, nil
}

func secPod(id, ns, name, uid, runner, sandbox, handler string) *runtimeapi.PodSandbox {
	return &runtimeapi.PodSandbox{
		Id: id, Metadata: &runtimeapi.PodSandboxMetadata{Namespace: ns, Name: name, Uid: uid},
		State: runtimeapi.PodSandboxState_SANDBOX_READY, RuntimeHandler: handler,
		Labels: map[string]string{"io.kubernetes.pod.uid": uid, cri.LabelRunner: runner, cri.LabelSandbox: sandbox},
	}
}

type secCheckpointer struct{ calls []string }

func (c *secCheckpointer) Checkpoint(_ context.Context, sandboxID, dir string, _ bool) error {
	c.calls = append(c.calls, sandboxID)
	return os.WriteFile(filepath.Join(dir, "checkpoint.img"), []byte("memory"), 0o600)
}

type secAgent struct {
	addr string
	ca   *pki.CA
	root string
	ckpt *secCheckpointer
	st   *store.Store
}

// startSecAgent runs runner-a's agent (real CRI resolver over a fake CRI socket, real
// store, real TLS) serving namespace sbx with handler runsc.
func startSecAgent(t *testing.T) *secAgent {
	t.Helper()
	d := t.TempDir()
	sock := filepath.Join(d, "cri.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(gs, &secFakeCRI{sandboxes: []*runtimeapi.PodSandbox{
		secPod("aaaa", "sbx", "sbx-mine", "00000000-0000-4000-8000-000000000001", "runner-a", "mine", "runsc"),
		secPod("bbbb", "sbx", "sbx-theirs", "00000000-0000-4000-8000-000000000002", "runner-b", "theirs", "runsc"),
		secPod("cccc", "sbx", "sbx-runc", "00000000-0000-4000-8000-000000000003", "runner-a", "runc", "runc"),
		secPod("dddd", "kube-system", "sbx-sys", "00000000-0000-4000-8000-000000000004", "runner-a", "sys", "runsc"),
	}})
	go func() { _ = gs.Serve(l) }()
	t.Cleanup(gs.Stop)
	res, err := cri.New(cri.Config{Endpoint: "unix://" + sock, Namespaces: []string{"sbx"}, RuntimeHandler: "runsc"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { res.Close() })
	root := filepath.Join(d, "checkpoints")
	if err := os.Mkdir(root, 0o700); err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(store.Config{Root: root, StateDir: filepath.Join(d, "state"), Owner: "runner-a", QuotaBytes: 1 << 40,
		Dirs: store.PlainDirs{}, Free: func(string) (int64, error) { return 1 << 50, nil }})
	if err != nil {
		t.Fatal(err)
	}
	ckpt := &secCheckpointer{}
	srv, err := nodeagent.NewServer(nodeagent.Config{Node: "node-1", RunnerID: "runner-a", Resolver: res, Checkpointer: ckpt, Store: st})
	if err != nil {
		t.Fatal(err)
	}
	ca, err := pki.LoadOrCreateCA(t.TempDir(), "node-agent CA of runner-a")
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
	tc, err := nodeagent.ServerTLSConfig(tlsDir, "runner-a")
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := srv.HTTPServer(tc)
	go func() { _ = hs.ServeTLS(ln, "", "") }()
	t.Cleanup(func() { hs.Close() })
	t.Cleanup(func() { _ = st.Close() })
	return &secAgent{addr: ln.Addr().String(), ca: ca, root: root, ckpt: ckpt, st: st}
}

func (a *secAgent) client(t *testing.T, ca *pki.CA, runnerID string) *nodeagent.Client {
	t.Helper()
	cert, err := ca.IssueClient("runner-"+runnerID, []*url.URL{pki.NodeAgentClientURI(runnerID)}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	c, err := nodeagent.NewClient(a.addr, nodeagent.ClientTLSConfig(&cert, nil, a.ca.Pool()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// TestSecurityNodeAgentForeignRunner: another runner's client certificate (from the same
// CA, or a CA of its own) is refused before any request is read; a certificate naming a
// runner only through a platform runner URI is refused too.
func TestSecurityNodeAgentForeignRunner(t *testing.T) {
	a := startSecAgent(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	otherCA, err := pki.LoadOrCreateCA(t.TempDir(), "runner-b's own CA")
	if err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]*nodeagent.Client{
		"runner-b, same CA":  a.client(t, a.ca, "runner-b"),
		"runner-a, other CA": a.client(t, otherCA, "runner-a"),
		"runner-b, other CA": a.client(t, otherCA, "runner-b"),
	} {
		if _, err := c.Checkpoint(ctx, nodeagent.CheckpointRequest{Namespace: "sbx", Name: "sbx-theirs", UID: "00000000-0000-4000-8000-000000000002", SandboxID: "theirs"}); err == nil {
			t.Errorf("%s: checkpoint accepted", name)
		}
		if l, err := c.ListCheckpoints(ctx); err == nil {
			t.Errorf("%s: list accepted: %v", name, l)
		}
	}
	// A client with a certificate of the right CA but a runner URI (not the node-agent
	// client URI).
	wrong, err := a.ca.IssueClient("runner-a", []*url.URL{pki.RunnerURI("org", "runner-a")}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := nodeagent.NewClient(a.addr, nodeagent.ClientTLSConfig(&wrong, nil, a.ca.Pool()))
	if _, err := c.ListCheckpoints(ctx); err == nil {
		t.Error("runner URI accepted")
	}
	// No client certificate.
	anon, _ := nodeagent.NewClient(a.addr, &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: a.ca.Pool(), ServerName: nodeagent.ServerName, NextProtos: []string{"h2"}})
	if _, err := anon.ListCheckpoints(ctx); err == nil {
		t.Error("anonymous client accepted")
	}
	if len(a.ckpt.calls) != 0 {
		t.Fatalf("checkpointed for a refused client: %v", a.ckpt.calls)
	}
}

// TestSecurityNodeAgentForeignPod: runner-a's valid client names Pods that are not its
// own: another runner's Pod (even with the right UID and sandbox label), a runc Pod, a Pod
// in a namespace the agent does not serve, its own Pod under another sandbox ID. Each is
// refused and nothing is checkpointed or written.
func TestSecurityNodeAgentForeignPod(t *testing.T) {
	a := startSecAgent(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	c := a.client(t, a.ca, "runner-a")
	for name, tc := range map[string]struct {
		req  nodeagent.CheckpointRequest
		want connect.Code
	}{
		"other runner's pod": {nodeagent.CheckpointRequest{Namespace: "sbx", Name: "sbx-theirs", UID: "00000000-0000-4000-8000-000000000002", SandboxID: "theirs"}, connect.CodePermissionDenied},
		"runc pod":           {nodeagent.CheckpointRequest{Namespace: "sbx", Name: "sbx-runc", UID: "00000000-0000-4000-8000-000000000003", SandboxID: "runc"}, connect.CodePermissionDenied},
		"kube-system pod":    {nodeagent.CheckpointRequest{Namespace: "kube-system", Name: "sbx-sys", UID: "00000000-0000-4000-8000-000000000004", SandboxID: "sys"}, connect.CodePermissionDenied},
		"pod under other id": {nodeagent.CheckpointRequest{Namespace: "sbx", Name: "sbx-mine", UID: "00000000-0000-4000-8000-000000000001", SandboxID: "theirs"}, connect.CodePermissionDenied},
		"uid of another pod": {nodeagent.CheckpointRequest{Namespace: "sbx", Name: "sbx-mine", UID: "00000000-0000-4000-8000-000000000002", SandboxID: "mine"}, connect.CodeNotFound},
		"path as name":       {nodeagent.CheckpointRequest{Namespace: "sbx", Name: "../../etc", UID: "00000000-0000-4000-8000-000000000001", SandboxID: "mine"}, connect.CodeInvalidArgument},
		"path as sandbox id": {nodeagent.CheckpointRequest{Namespace: "sbx", Name: "sbx-mine", UID: "00000000-0000-4000-8000-000000000001", SandboxID: "../mine"}, connect.CodeInvalidArgument},
	} {
		_, err := c.Checkpoint(ctx, tc.req)
		if connect.CodeOf(err) != tc.want {
			t.Errorf("%s: %v, want %v", name, err, tc.want)
		}
	}
	if len(a.ckpt.calls) != 0 {
		t.Fatalf("checkpointed a foreign Pod: %v", a.ckpt.calls)
	}
	if des, _ := os.ReadDir(a.root); len(des) != 0 {
		t.Fatalf("images written: %v", des)
	}
	// Its own Pod works (the fixture is not refusing everything).
	if _, err := c.Checkpoint(ctx, nodeagent.CheckpointRequest{Namespace: "sbx", Name: "sbx-mine", UID: "00000000-0000-4000-8000-000000000001", SandboxID: "mine"}); err != nil {
		t.Fatal(err)
	}
	if len(a.ckpt.calls) != 1 || a.ckpt.calls[0] != "aaaa" {
		t.Fatalf("calls %v", a.ckpt.calls)
	}
}

// TestSecurityNodeAgentPathIDs: DeleteCheckpoint with path-like IDs is INVALID_ARGUMENT and
// touches nothing; an ID-shaped symlink planted in the checkpoint root is never followed.
func TestSecurityNodeAgentPathIDs(t *testing.T) {
	a := startSecAgent(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	c := a.client(t, a.ca, "runner-a")
	victim := filepath.Join(t.TempDir(), "victim")
	if err := os.MkdirAll(victim, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(victim, "keep"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	rel, _ := filepath.Rel(a.root, victim)
	for _, id := range []string{"..", "../..", rel, victim, "c-00000000-00000000000000000000/..", "e2e-1", ".", "c-x"} {
		if err := c.DeleteCheckpoint(ctx, id); connect.CodeOf(err) != connect.CodeInvalidArgument {
			t.Errorf("delete %q: %v, want INVALID_ARGUMENT", id, err)
		}
	}
	// A symlink with a valid ID of runner-a's: not indexed, so delete is a no-op; GC
	// refuses to follow it either way (store tests).
	link := store.NewID("runner-a")
	if err := os.Symlink(victim, filepath.Join(a.root, link)); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteCheckpoint(ctx, link); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(victim, "keep")); err != nil {
		t.Fatalf("victim touched: %v", err)
	}
	// An indexed checkpoint whose directory is then swapped for a symlink to the victim:
	// Delete and GC refuse it (Lstat), the victim keeps its files.
	res, err := c.Checkpoint(ctx, nodeagent.CheckpointRequest{Namespace: "sbx", Name: "sbx-mine", UID: "00000000-0000-4000-8000-000000000001", SandboxID: "mine"})
	if err != nil {
		t.Fatal(err)
	}
	img := filepath.Join(a.root, res.ID)
	if err := os.RemoveAll(img); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, img); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteCheckpoint(ctx, res.ID); err == nil {
		t.Error("delete of a symlinked image succeeded")
	}
	if removed, _ := a.st.GC(time.Now().Add(time.Hour)); len(removed) != 0 {
		t.Errorf("GC removed %v through a symlink", removed)
	}
	if _, err := os.Stat(filepath.Join(victim, "keep")); err != nil {
		t.Fatalf("victim touched through an indexed symlink: %v", err)
	}
}
