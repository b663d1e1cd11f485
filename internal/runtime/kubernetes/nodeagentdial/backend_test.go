package nodeagentdial_test

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	nodeagentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/nodeagent/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/nodeagent/v1/nodeagentv1connect"
	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/nodeagent"
	"github.com/sandboxd/sandboxd/internal/nodeagent/cri"
	"github.com/sandboxd/sandboxd/internal/nodeagent/hibernate"
	"github.com/sandboxd/sandboxd/internal/nodeagent/store"
	"github.com/sandboxd/sandboxd/internal/pki"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes/nodeagentdial"
)

const (
	joinRunner = "runner-j"
	joinUID    = "0b6f1a8e-1c2d-4e5f-8a9b-0c1d2e3f4a5b"
	joinCRIID  = "5f0c3a9d2b1e4f6a8c7d9e0f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b"
)

// joinResolver: Pod sbx/sbx-abc (joinUID) is joinRunner's sandbox abc. running is what
// Running answers (runErr: it cannot tell).
type joinResolver struct {
	mu      sync.Mutex
	running bool
	runErr  error
}

func (r *joinResolver) Sandbox(_ context.Context, q cri.Query) (cri.Sandbox, error) {
	if q.Pod != (cri.PodRef{Namespace: "sbx", Name: "sbx-abc", UID: joinUID}) {
		return cri.Sandbox{}, cri.ErrNotFound
	}
	if q.RunnerID != joinRunner || q.SandboxID != "abc" {
		return cri.Sandbox{}, cri.ErrDenied
	}
	return cri.Sandbox{ID: joinCRIID, MemoryBytes: 100}, nil
}

func (r *joinResolver) Running(context.Context, string) (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.running, r.runErr
}

func (r *joinResolver) set(running bool, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.running, r.runErr = running, err
}

type joinCheckpointer struct {
	mu  sync.Mutex
	err error
}

func (c *joinCheckpointer) Checkpoint(_ context.Context, _, dir string, _ bool) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return c.err
	}
	return os.WriteFile(filepath.Join(dir, "checkpoint.img"), make([]byte, 700), 0o600)
}

func (c *joinCheckpointer) fail(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.err = err
}

// joinAgent serves a node agent of joinRunner on node-1 (fakes behind the real server,
// real mTLS on loopback) and returns the backend's dialer of it through a StaticDialer,
// and the checkpoint root.
func joinAgent(t *testing.T) (kubernetes.NodeAgentDialer, *joinResolver, *joinCheckpointer, string) {
	t.Helper()
	j := serveJoinAgent(t)
	sd := &nodeagent.StaticDialer{Addrs: map[string]string{"node-1": j.addr}, TLS: runnerTLS(t, j.ca)}
	return nodeagentdial.BackendDialer(sd, nodeagentdial.Options{RunnerID: joinRunner}), j.res, j.ck, j.root
}

// joined is a node agent served for a test: its address, CA, fakes and checkpoint root.
type joined struct {
	addr string
	ca   *pki.CA
	res  *joinResolver
	ck   *joinCheckpointer
	root string
}

func serveJoinAgent(t *testing.T) joined {
	t.Helper()
	return serveJoinAgentTLS(t, "")
}

// serveJoinAgentTLS is serveJoinAgent with the agent's TLS directory tlsDir ("": one of a
// new CA, joined.ca).
func serveJoinAgentTLS(t *testing.T, tlsDir string) joined {
	t.Helper()
	d := t.TempDir()
	root := filepath.Join(d, "root")
	if err := os.Mkdir(root, 0o700); err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(store.Config{Root: root, StateDir: filepath.Join(d, "state"), Owner: joinRunner, QuotaBytes: 1 << 20,
		Dirs: store.PlainDirs{}, Free: func(string) (int64, error) { return 1 << 40, nil }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	res, ck := &joinResolver{}, &joinCheckpointer{}
	srv, err := nodeagent.NewServer(nodeagent.Config{Node: "node-1", RunnerID: joinRunner, Resolver: res, Checkpointer: ck, Store: st})
	if err != nil {
		t.Fatal(err)
	}
	if tlsDir != "" {
		addr := serveAgentTLSDir(t, srv.HTTPServer, tlsDir)
		return joined{addr: addr, res: res, ck: ck, root: root}
	}
	addr, ca := serveAgentTLS(t, srv.HTTPServer)
	return joined{addr: addr, ca: ca, res: res, ck: ck, root: root}
}

// serveAgentTLS serves, on loopback until the test ends, the server newServer makes for
// the node agent's mTLS of a new CA: a server certificate for nodeagent.ServerName, a
// client certificate naming joinRunner required. Its address and the CA.
func serveAgentTLS(t *testing.T, newServer func(*tls.Config) *http.Server) (string, *pki.CA) {
	t.Helper()
	ca, err := pki.LoadOrCreateCA(t.TempDir(), "test node-agent CA")
	if err != nil {
		t.Fatal(err)
	}
	cert, err := ca.IssueServer("sandboxd-node-agent", []string{nodeagent.ServerName}, nil, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := nodeagent.WriteTLSDir(dir, cert, ca.CertPEM()); err != nil {
		t.Fatal(err)
	}
	return serveAgentTLSDir(t, newServer, dir), ca
}

// serveAgentTLSDir is serveAgentTLS with the agent's TLS directory dir.
func serveAgentTLSDir(t *testing.T, newServer func(*tls.Config) *http.Server, dir string) string {
	t.Helper()
	tc, err := nodeagent.ServerTLSConfig(dir, joinRunner)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := newServer(tc)
	go func() { _ = hs.ServeTLS(ln, "", "") }()
	t.Cleanup(func() { _ = hs.Close() })
	return ln.Addr().String()
}

// runnerCert is joinRunner's client certificate of ca (the agents' CA).
func runnerCert(t *testing.T, ca *pki.CA) tls.Certificate {
	t.Helper()
	c, err := ca.IssueClient("runner-"+joinRunner, []*url.URL{pki.NodeAgentClientURI(joinRunner)}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// runnerTLS is joinRunner's client TLS configuration for the agents of ca: its
// runnerCert, and ca as the agents' root.
func runnerTLS(t *testing.T, ca *pki.CA) *tls.Config {
	t.Helper()
	c := runnerCert(t, ca)
	return nodeagent.ClientTLSConfig(&c, nil, ca.Pool())
}

func joinReq(leave bool) kubernetes.NodeCheckpointRequest {
	return kubernetes.NodeCheckpointRequest{Namespace: "sbx", Name: "sbx-abc", UID: joinUID, SandboxID: "abc", LeaveRunning: leave}
}

// TestBackendDialerCheckpoint: through the adapter, the Kubernetes backend's NodeAgent
// reaches the real agent server: a pause's checkpoint (the sandbox ends), a fork's (it
// runs on), the image on disk, complete, and deleted (idempotently).
func TestBackendDialerCheckpoint(t *testing.T) {
	d, res, _, root := joinAgent(t)
	ctx := t.Context()
	a, err := d.Agent(ctx, "node-1")
	if err != nil {
		t.Fatal(err)
	}
	cp, err := a.Checkpoint(ctx, joinReq(false))
	if err != nil {
		t.Fatal(err)
	}
	if hibernate.ValidCheckpointID(cp.ID) != nil || cp.Node != "node-1" || cp.Bytes != 700 || cp.Took <= 0 || cp.SandboxRunning == kubernetes.RunningYes {
		t.Fatalf("pause checkpoint %+v", cp)
	}
	if _, err := os.Stat(filepath.Join(root, cp.ID, "sandboxd-complete")); err != nil {
		t.Fatalf("image not complete: %v", err)
	}
	res.set(true, nil)
	fk, err := a.Checkpoint(ctx, joinReq(true))
	if err != nil {
		t.Fatal(err)
	}
	if fk.SandboxRunning != kubernetes.RunningYes || fk.ID == cp.ID {
		t.Fatalf("fork checkpoint %+v (pause's %s): want running, another ID", fk, cp.ID)
	}
	// The listing names each image's sandbox and Pod (what a restarted runner ties a
	// paused sandbox's recorded checkpoint to).
	list, err := a.ListCheckpoints(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := []kubernetes.NodeCheckpointEntry{
		{ID: cp.ID, SandboxID: "abc", Namespace: "sbx", Name: "sbx-abc", UID: joinUID},
		{ID: fk.ID, SandboxID: "abc", Namespace: "sbx", Name: "sbx-abc", UID: joinUID, LeaveRunning: true},
	}
	slices.SortFunc(list, func(x, y kubernetes.NodeCheckpointEntry) int { return strings.Compare(x.ID, y.ID) })
	slices.SortFunc(want, func(x, y kubernetes.NodeCheckpointEntry) int { return strings.Compare(x.ID, y.ID) })
	if !slices.Equal(list, want) {
		t.Errorf("listed %+v, want %+v", list, want)
	}
	for _, id := range []string{cp.ID, cp.ID, fk.ID} { // twice: idempotent
		if err := a.DeleteCheckpoint(ctx, id); err != nil {
			t.Fatalf("delete %s: %v", id, err)
		}
	}
	for _, id := range []string{cp.ID, fk.ID} {
		if _, err := os.Stat(filepath.Join(root, id)); !os.IsNotExist(err) {
			t.Errorf("image %s after delete: %v", id, err)
		}
	}
}

// TestBackendDialerFailedCheckpoint: a failed checkpoint's SandboxRunning follows the
// agent's answer: running, ended, and "unknown" (the agent could not tell) as
// RunningUnknown — distinct from ended — with the error saying so; a refusal before the
// checkpoint is unknown too (the agent never touched the sandbox). The shim's own text
// ("boom") stays on the node: the agent answers a fixed sentence per kind of failure.
func TestBackendDialerFailedCheckpoint(t *testing.T) {
	d, res, ck, _ := joinAgent(t)
	ctx := t.Context()
	a, err := d.Agent(ctx, "node-1")
	if err != nil {
		t.Fatal(err)
	}
	ck.fail(errors.New("runsc: boom"))
	for _, tc := range []struct {
		name        string
		running     bool
		runErr      error
		wantRunning kubernetes.Running
		wantUnknown bool
	}{
		{"it runs", true, nil, kubernetes.RunningYes, false},
		{"it ended", false, nil, kubernetes.RunningNo, false},
		{"unknown", true, errors.New("CRI down"), kubernetes.RunningUnknown, true},
	} {
		res.set(tc.running, tc.runErr)
		cp, err := a.Checkpoint(ctx, joinReq(false))
		if err == nil {
			t.Fatalf("%s: no error", tc.name)
		}
		if cp.SandboxRunning != tc.wantRunning || cp.ID != "" {
			t.Errorf("%s: %+v, want running %v and no ID", tc.name, cp, tc.wantRunning)
		}
		if got := strings.Contains(err.Error(), "could not tell"); got != tc.wantUnknown || strings.Contains(err.Error(), "boom") {
			t.Errorf("%s: error %q", tc.name, err)
		}
	}
	// Refused before anything was touched (another sandbox's ID): no running answer.
	res.set(true, nil)
	bad := joinReq(false)
	bad.SandboxID = "other"
	if cp, err := a.Checkpoint(ctx, bad); err == nil || cp.SandboxRunning != kubernetes.RunningUnknown || strings.Contains(err.Error(), "could not tell") {
		t.Errorf("refused checkpoint: %+v %v", cp, err)
	}
}

// TestBackendDialerUnknownNode: a node the static map does not name is an error that is
// not errdefs.ErrNotFound (the backend takes that for a node that is gone with its
// checkpoints: a resume would end the sandbox as CheckpointLost for a configuration gap).
func TestBackendDialerUnknownNode(t *testing.T) {
	d, _, _, _ := joinAgent(t)
	_, err := d.Agent(t.Context(), "node-2")
	if !errors.Is(err, nodeagent.ErrNoAgent) || errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("unknown node: %v", err)
	}
}

// fakeAgent is an agent that answers Checkpoint with id (what a compromised agent, or a
// server holding an agent's certificate, might say).
type fakeAgent struct {
	nodeagentv1connect.UnimplementedNodeAgentServiceHandler
	id string
}

func (f fakeAgent) Checkpoint(context.Context, *connect.Request[nodeagentv1.CheckpointRequest]) (*connect.Response[nodeagentv1.CheckpointResponse], error) {
	return connect.NewResponse(&nodeagentv1.CheckpointResponse{CheckpointId: f.id, Node: "node-1", Bytes: 1, Took: durationpb.New(time.Millisecond)}), nil
}

// serveHandler serves h over HTTP/2 with the agent's mTLS (serveAgentTLS) and returns
// its address and joinRunner's client TLS configuration that trusts it.
func serveHandler(t *testing.T, h http.Handler) (string, *tls.Config) {
	t.Helper()
	addr, ca := serveAgentTLS(t, func(tc *tls.Config) *http.Server {
		hs := &http.Server{Handler: h, TLSConfig: tc, ReadHeaderTimeout: 10 * time.Second, Protocols: new(http.Protocols)}
		hs.Protocols.SetHTTP2(true)
		return hs
	})
	return addr, runnerTLS(t, ca)
}

// TestBackendAgentForeignCheckpointID: the checkpoint ID an agent answers must be a valid
// ID of this runner's; another runner's, a malformed one or a path is an error with no ID
// (the backend records nothing, the sandbox stays as its Pod says).
func TestBackendAgentForeignCheckpointID(t *testing.T) {
	own := store.NewID(joinRunner)
	for name, tc := range map[string]struct {
		id   string
		want string
	}{
		"other runner's": {store.NewID("runner-x"), "not runner"},
		"malformed":      {"c-" + store.OwnerHash(joinRunner) + "-xyz", "invalid checkpoint ID"},
		"path":           {"../../etc", "invalid checkpoint ID"},
		"own":            {own, ""},
	} {
		_, h := nodeagentv1connect.NewNodeAgentServiceHandler(fakeAgent{id: tc.id})
		addr, tlsCfg := serveHandler(t, h)
		c, err := nodeagent.NewClient(addr, tlsCfg)
		if err != nil {
			t.Fatal(err)
		}
		cp, err := nodeagentdial.BackendAgent(c, "node-1", nodeagentdial.Options{RunnerID: joinRunner}).Checkpoint(t.Context(), joinReq(false))
		if tc.want == "" {
			if err != nil || cp.ID != own {
				t.Errorf("%s: %+v %v", name, cp, err)
			}
			continue
		}
		if err == nil || !strings.Contains(nodeagentdial.Cause(err).Error(), tc.want) || !errors.Is(err, runtime.ErrNodeAgentRefused) || cp.ID != "" || cp.SandboxRunning != kubernetes.RunningUnknown {
			t.Errorf("%s: %+v %v, want an error %q and no ID", name, cp, err, tc.want)
		}
	}
}
