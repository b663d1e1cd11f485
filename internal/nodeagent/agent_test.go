package nodeagent

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	nodeagentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/nodeagent/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/nodeagent/v1/nodeagentv1connect"
	"github.com/sandboxd/sandboxd/internal/nodeagent/cri"
	"github.com/sandboxd/sandboxd/internal/nodeagent/hibernate"
	"github.com/sandboxd/sandboxd/internal/nodeagent/store"
	"github.com/sandboxd/sandboxd/internal/pki"
)

const (
	runnerA = "runner-a"
	podUID  = "0b6f1a8e-1c2d-4e5f-8a9b-0c1d2e3f4a5b"
	criID   = "5f0c3a9d2b1e4f6a8c7d9e0f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b"
)

// fakeResolver: Pod sbx/sbx-abc of uid podUID is runner-a's sandbox abc.
type fakeResolver struct {
	ready  bool
	err    error
	runErr error // Running fails with it
}

func (f *fakeResolver) Sandbox(_ context.Context, q cri.Query) (cri.Sandbox, error) {
	if f.err != nil {
		return cri.Sandbox{}, f.err
	}
	if q.Pod == (cri.PodRef{Namespace: "sbx", Name: "sbx-def", UID: podUID2}) && q.RunnerID == runnerA && q.SandboxID == "def" {
		return cri.Sandbox{ID: criID2, MemoryBytes: 100}, nil
	}
	if q.Pod != (cri.PodRef{Namespace: "sbx", Name: "sbx-abc", UID: podUID}) {
		return cri.Sandbox{}, cri.ErrNotFound
	}
	if q.RunnerID != runnerA || q.SandboxID != "abc" {
		return cri.Sandbox{}, cri.ErrDenied
	}
	return cri.Sandbox{ID: criID, MemoryBytes: 100}, nil
}

func (f *fakeResolver) Running(context.Context, string) (bool, error) {
	if f.runErr != nil {
		return false, f.runErr
	}
	return f.ready, nil
}

type fakeCheckpointer struct {
	mu    sync.Mutex
	calls []string
	size  int
	err   error
}

func (f *fakeCheckpointer) Checkpoint(_ context.Context, sandboxID, dir string, leave bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, sandboxID)
	if f.err != nil {
		return f.err
	}
	return os.WriteFile(filepath.Join(dir, "checkpoint.img"), make([]byte, f.size), 0o600)
}

func (f *fakeCheckpointer) n() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.calls)
}

type fixture struct {
	srv  *Server
	res  *fakeResolver
	ckpt *fakeCheckpointer
	st   *store.Store
	root string
}

func newFixture(t *testing.T, quota int64, edit ...func(*Config)) *fixture {
	t.Helper()
	d := t.TempDir()
	root := filepath.Join(d, "root")
	if err := os.Mkdir(root, 0o700); err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(store.Config{Root: root, StateDir: filepath.Join(d, "state"), Owner: runnerA, QuotaBytes: quota,
		Dirs: store.PlainDirs{}, Free: func(string) (int64, error) { return 1 << 40, nil }})
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{res: &fakeResolver{}, ckpt: &fakeCheckpointer{size: 500}, st: st, root: root}
	t.Cleanup(func() { _ = st.Close() })
	cfg := Config{Node: "node-1", RunnerID: runnerA, Resolver: f.res, Checkpointer: f.ckpt, Store: st}
	for _, e := range edit {
		e(&cfg)
	}
	f.srv, err = NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func as(owner string) context.Context {
	return context.WithValue(context.Background(), ownerKey{}, owner)
}

func goodRequest() *nodeagentv1.CheckpointRequest {
	return &nodeagentv1.CheckpointRequest{Pod: &nodeagentv1.PodRef{Namespace: "sbx", Name: "sbx-abc", Uid: podUID}, SandboxId: "abc"}
}

func TestServerCheckpointAndOwners(t *testing.T) {
	f := newFixture(t, 1<<20)
	resp, err := f.srv.Checkpoint(as(runnerA), connect.NewRequest(goodRequest()))
	if err != nil {
		t.Fatal(err)
	}
	id := resp.Msg.CheckpointId
	if store.ValidID(id) != nil || resp.Msg.Bytes != 500 || resp.Msg.Node != "node-1" || resp.Msg.SandboxRunning == nil || *resp.Msg.SandboxRunning {
		t.Fatalf("resp %+v", resp.Msg)
	}
	if f.ckpt.calls[0] != criID {
		t.Fatalf("checkpointed %v: want the CRI's ID", f.ckpt.calls)
	}
	if _, err := os.Stat(filepath.Join(f.root, id, "sandboxd-complete")); err != nil {
		t.Fatalf("not marked complete: %v", err)
	}
	list, err := f.srv.ListCheckpoints(as(runnerA), connect.NewRequest(&nodeagentv1.ListCheckpointsRequest{}))
	if err != nil || len(list.Msg.Checkpoints) != 1 || list.Msg.Checkpoints[0].CheckpointId != id || list.Msg.Checkpoints[0].Pod.Uid != podUID {
		t.Fatalf("list %v %v", list, err)
	}
	// Runner B (had it reached the handler) sees none of A's and deletes none.
	list, err = f.srv.ListCheckpoints(as("runner-b"), connect.NewRequest(&nodeagentv1.ListCheckpointsRequest{}))
	if err != nil || len(list.Msg.Checkpoints) != 0 {
		t.Fatalf("b lists %v %v", list, err)
	}
	if _, err := f.srv.DeleteCheckpoint(as("runner-b"), connect.NewRequest(&nodeagentv1.DeleteCheckpointRequest{CheckpointId: id})); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(f.root, id)); err != nil {
		t.Fatalf("b deleted a's image: %v", err)
	}
	// B cannot checkpoint A's Pod (the resolver checks the runner label against B).
	if _, err := f.srv.Checkpoint(as("runner-b"), connect.NewRequest(goodRequest())); connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Fatalf("b checkpoints a's pod: %v", err)
	}
	info, err := f.srv.Info(as(runnerA), connect.NewRequest(&nodeagentv1.InfoRequest{}))
	if err != nil || info.Msg.UsedBytes != 500 || info.Msg.QuotaBytes != 1<<20 || info.Msg.Node != "node-1" {
		t.Fatalf("info %v %v", info, err)
	}
	// A deletes it; twice is fine.
	for range 2 {
		if _, err := f.srv.DeleteCheckpoint(as(runnerA), connect.NewRequest(&nodeagentv1.DeleteCheckpointRequest{CheckpointId: id})); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Lstat(filepath.Join(f.root, id)); !os.IsNotExist(err) {
		t.Fatalf("image left: %v", err)
	}
	// No identity at all.
	if _, err := f.srv.ListCheckpoints(context.Background(), connect.NewRequest(&nodeagentv1.ListCheckpointsRequest{})); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("anonymous: %v", err)
	}
}

func TestServerBadInputs(t *testing.T) {
	f := newFixture(t, 1<<20)
	edit := func(e func(*nodeagentv1.CheckpointRequest)) *nodeagentv1.CheckpointRequest {
		r := goodRequest()
		e(r)
		return r
	}
	for name, c := range map[string]struct {
		req  *nodeagentv1.CheckpointRequest
		want connect.Code
	}{
		"no pod":          {edit(func(r *nodeagentv1.CheckpointRequest) { r.Pod = nil }), connect.CodeInvalidArgument},
		"path namespace":  {edit(func(r *nodeagentv1.CheckpointRequest) { r.Pod.Namespace = "../etc" }), connect.CodeInvalidArgument},
		"path name":       {edit(func(r *nodeagentv1.CheckpointRequest) { r.Pod.Name = "a/../b" }), connect.CodeInvalidArgument},
		"bad uid":         {edit(func(r *nodeagentv1.CheckpointRequest) { r.Pod.Uid = "x" }), connect.CodeInvalidArgument},
		"bad sandbox id":  {edit(func(r *nodeagentv1.CheckpointRequest) { r.SandboxId = "../abc" }), connect.CodeInvalidArgument},
		"other pod":       {edit(func(r *nodeagentv1.CheckpointRequest) { r.Pod.Name = "sbx-other" }), connect.CodeNotFound},
		"other sandbox":   {edit(func(r *nodeagentv1.CheckpointRequest) { r.SandboxId = "xyz" }), connect.CodePermissionDenied},
		"empty namespace": {edit(func(r *nodeagentv1.CheckpointRequest) { r.Pod.Namespace = "" }), connect.CodeInvalidArgument},
	} {
		_, err := f.srv.Checkpoint(as(runnerA), connect.NewRequest(c.req))
		if connect.CodeOf(err) != c.want {
			t.Errorf("%s: %v, want %v", name, err, c.want)
		}
	}
	for _, id := range []string{"", "..", "../../etc", "e2e-1", "c-x", strings.Repeat("a", 200)} {
		_, err := f.srv.DeleteCheckpoint(as(runnerA), connect.NewRequest(&nodeagentv1.DeleteCheckpointRequest{CheckpointId: id}))
		if connect.CodeOf(err) != connect.CodeInvalidArgument {
			t.Errorf("delete %q: %v", id, err)
		}
	}
	if f.ckpt.n() != 0 {
		t.Fatalf("checkpointed on bad input: %v", f.ckpt.calls)
	}
	// Not ready; CRI down.
	f.res.err = cri.ErrNotReady
	if _, err := f.srv.Checkpoint(as(runnerA), connect.NewRequest(goodRequest())); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Errorf("not ready: %v", err)
	}
	f.res.err = cri.ErrCRI
	if _, err := f.srv.Checkpoint(as(runnerA), connect.NewRequest(goodRequest())); connect.CodeOf(err) != connect.CodeUnavailable {
		t.Errorf("cri down: %v", err)
	}
}

func TestServerCheckpointFailures(t *testing.T) {
	// Quota before: the Pod's memory (100) does not fit 50.
	f := newFixture(t, 50)
	if _, err := f.srv.Checkpoint(as(runnerA), connect.NewRequest(goodRequest())); connect.CodeOf(err) != connect.CodeResourceExhausted {
		t.Fatalf("quota before: %v", err)
	}
	if f.ckpt.n() != 0 {
		t.Fatal("checkpointed over quota")
	}
	// Quota after, a fork: the image (500) is larger than the quota (200): deleted.
	f = newFixture(t, 200)
	f.res.ready = true
	fork := goodRequest()
	fork.LeaveRunning = true
	_, err := f.srv.Checkpoint(as(runnerA), connect.NewRequest(fork))
	if connect.CodeOf(err) != connect.CodeResourceExhausted {
		t.Fatalf("quota after: %v", err)
	}
	if des, _ := os.ReadDir(f.root); len(des) != 0 {
		t.Fatalf("image kept over quota: %v", des)
	}
	// Quota after, a pause: the sandbox is gone, the image is all that is left: kept.
	resp, err := f.srv.Checkpoint(as(runnerA), connect.NewRequest(goodRequest()))
	if err != nil {
		t.Fatalf("pause over quota: %v", err)
	}
	if des, _ := os.ReadDir(f.root); len(des) != 1 || des[0].Name() != resp.Msg.CheckpointId {
		t.Fatalf("pause image over quota: %v", des)
	}
	// A failed checkpoint: the image goes, the caller learns whether the sandbox runs.
	f = newFixture(t, 1<<20)
	f.ckpt.err = errors.New("runsc: boom")
	f.res.ready = true
	_, err = f.srv.Checkpoint(as(runnerA), connect.NewRequest(goodRequest()))
	var ce *connect.Error
	if !errors.As(err, &ce) || ce.Code() != connect.CodeFailedPrecondition || ce.Meta().Get(SandboxRunningMeta) != "true" {
		t.Fatalf("failed checkpoint: %v", err)
	}
	if des, _ := os.ReadDir(f.root); len(des) != 0 || len(f.st.List(runnerA)) != 0 {
		t.Fatalf("failed image kept: %v", des)
	}
	// The CRI cannot tell whether it runs: "unknown", never "false".
	f.res.runErr = errors.New("cri: unavailable")
	_, err = f.srv.Checkpoint(as(runnerA), connect.NewRequest(goodRequest()))
	if !errors.As(err, &ce) || ce.Meta().Get(SandboxRunningMeta) != "unknown" {
		t.Fatalf("failed checkpoint, running unknown: %v %v", err, ce.Meta())
	}
	// A fork that succeeded, the CRI cannot tell: absent in the response.
	f.ckpt.err = nil
	fork = goodRequest()
	fork.LeaveRunning = true
	resp, err = f.srv.Checkpoint(as(runnerA), connect.NewRequest(fork))
	if err != nil || resp.Msg.SandboxRunning != nil {
		t.Fatalf("fork, running unknown: %v %v", resp, err)
	}
	// A fork the CRI says runs.
	f.res.runErr = nil
	resp, err = f.srv.Checkpoint(as(runnerA), connect.NewRequest(fork))
	if err != nil || resp.Msg.SandboxRunning == nil || !*resp.Msg.SandboxRunning {
		t.Fatalf("fork, running: %v %v", resp, err)
	}
}

// tlsFixture serves the server with TLS from a fresh CA; it returns the address, the CA and
// a client config maker.
func serveTLS(t *testing.T, f *fixture) (string, *pki.CA) {
	t.Helper()
	ca, err := pki.LoadOrCreateCA(t.TempDir(), "test node-agent CA")
	if err != nil {
		t.Fatal(err)
	}
	srvCert, err := ca.IssueServer("sandboxd-node-agent", []string{ServerName}, nil, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	writeTLSDir(t, dir, srvCert, ca)
	cfg, err := ServerTLSConfig(dir, runnerA)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := f.srv.HTTPServer(cfg)
	go func() { _ = hs.ServeTLS(ln, "", "") }()
	t.Cleanup(func() { hs.Close() })
	return ln.Addr().String(), ca
}

func writeTLSDir(t *testing.T, dir string, cert tls.Certificate, ca *pki.CA) {
	t.Helper()
	if err := WriteTLSDir(dir, cert, ca.CertPEM()); err != nil {
		t.Fatal(err)
	}
}

func clientFor(t *testing.T, addr string, ca *pki.CA, cert *tls.Certificate) *Client {
	t.Helper()
	c, err := NewClient(addr, ClientTLSConfig(cert, nil, ca.Pool()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func TestTLS(t *testing.T) {
	f := newFixture(t, 1<<20)
	addr, ca := serveTLS(t, f)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	good, err := ca.IssueClient("runner-a", []*url.URL{pki.NodeAgentClientURI(runnerA)}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	c := clientFor(t, addr, ca, &good)
	res, err := c.Checkpoint(ctx, CheckpointRequest{Namespace: "sbx", Name: "sbx-abc", UID: podUID, SandboxID: "abc"})
	if err != nil || res.Node != "node-1" || res.Bytes != 500 || store.ValidID(res.ID) != nil {
		t.Fatalf("checkpoint %+v %v", res, err)
	}
	list, err := c.ListCheckpoints(ctx)
	if err != nil || len(list) != 1 || list[0].CheckpointId != res.ID {
		t.Fatalf("list %v %v", list, err)
	}
	if info, err := c.Info(ctx); err != nil || info.UsedBytes != 500 {
		t.Fatalf("info %v %v", info, err)
	}
	d := &StaticDialer{Addrs: map[string]string{"node-1": addr}, TLS: ClientTLSConfig(&good, nil, ca.Pool())}
	ac, err := d.Agent(ctx, "node-1")
	if err != nil {
		t.Fatal(err)
	}
	if err := ac.DeleteCheckpoint(ctx, res.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Agent(ctx, "node-2"); !errors.Is(err, ErrNoAgent) {
		t.Fatalf("unknown node: %v", err)
	}
	calls := f.ckpt.n()

	// Refused: another CA, another runner's URI, a runner's platform URI, no client cert.
	other, err := pki.LoadOrCreateCA(t.TempDir(), "another CA")
	if err != nil {
		t.Fatal(err)
	}
	foreignCA, _ := other.IssueClient("runner-a", []*url.URL{pki.NodeAgentClientURI(runnerA)}, time.Hour)
	runnerB, _ := ca.IssueClient("runner-b", []*url.URL{pki.NodeAgentClientURI("runner-b")}, time.Hour)
	wrongKind, _ := ca.IssueClient("runner-a", []*url.URL{pki.RunnerURI("org", runnerA)}, time.Hour)
	for name, cert := range map[string]*tls.Certificate{"another CA": &foreignCA, "runner-b": &runnerB, "runner URI": &wrongKind, "no cert": nil} {
		c := clientFor(t, addr, ca, cert)
		_, err := c.Checkpoint(ctx, CheckpointRequest{Namespace: "sbx", Name: "sbx-abc", UID: podUID, SandboxID: "abc"})
		if err == nil {
			t.Errorf("%s: checkpoint accepted", name)
		}
		if _, err := c.ListCheckpoints(ctx); err == nil {
			t.Errorf("%s: list accepted", name)
		}
	}
	if f.ckpt.n() != calls {
		t.Fatal("a refused client checkpointed")
	}
	// A client that does not verify the agent against the CA fails too (wrong roots).
	bad := clientFor(t, addr, other, &good)
	if _, err := bad.Info(ctx); err == nil {
		t.Error("server verified against another CA")
	}
}

// TestAuthenticateWithoutTLS: the handler itself refuses a request without a verified
// client certificate (a plain-HTTP mistake in the serving code).
func TestAuthenticateWithoutTLS(t *testing.T) {
	f := newFixture(t, 1<<20)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: f.srv.Handler(), Protocols: new(http.Protocols)}
	hs.Protocols.SetUnencryptedHTTP2(true)
	go func() { _ = hs.Serve(ln) }()
	t.Cleanup(func() { hs.Close() })
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	c := newClient(ln.Addr().String(), &http.Client{Transport: &http.Transport{Protocols: &p}})
	c.api = nodeagentv1connect.NewNodeAgentServiceClient(c.hc, "http://"+ln.Addr().String(), connect.WithGRPC())
	_, err = c.ListCheckpoints(context.Background())
	if connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("plain request: %v", err)
	}
}

func FuzzValidateCheckpointRequest(f *testing.F) {
	f.Add("sbx", "sbx-abc", podUID, "abc")
	f.Add("..", "a/b", "x", "-")
	f.Add("sbx", strings.Repeat("a", 300), podUID, strings.Repeat("b", 60))
	f.Fuzz(func(t *testing.T, ns, name, uid, sid string) {
		err := ValidateCheckpointRequest(&nodeagentv1.CheckpointRequest{Pod: &nodeagentv1.PodRef{Namespace: ns, Name: name, Uid: uid}, SandboxId: sid})
		if err != nil {
			if !errors.Is(err, cri.ErrInvalid) {
				t.Fatalf("error not ErrInvalid: %v", err)
			}
			return
		}
		for _, s := range []string{ns, name, uid, sid} {
			if s == "" || strings.ContainsAny(s, "/\\\x00 \n") || strings.Contains(s, "..") || len(s) > 253 {
				t.Fatalf("accepted %q", s)
			}
		}
		if len(ns) > 63 || len(sid) > cri.MaxSandboxIDLen {
			t.Fatalf("accepted long %q %q", ns, sid)
		}
	})
}

const (
	podUID2 = "00000000-0000-4000-8000-0000000000d2"
	criID2  = "d2d2d2d2d2d2d2d2d2d2d2d2d2d2d2d2d2d2d2d2d2d2d2d2d2d2d2d2d2d2d2d2"
)

func otherRequest() *nodeagentv1.CheckpointRequest {
	return &nodeagentv1.CheckpointRequest{Pod: &nodeagentv1.PodRef{Namespace: "sbx", Name: "sbx-def", Uid: podUID2}, SandboxId: "def"}
}

// blockCheckpointer blocks each checkpoint until release is closed or its context ends.
// When the context ends first, it returns the context's error at once but keeps writing
// the image once late is closed (a shim outliving the agent's timeout), then reports the
// write on lateDone.
type blockCheckpointer struct {
	started  chan string
	release  chan struct{}
	late     chan struct{}
	lateDone chan error
	ctxErr   chan error // the context's error when the checkpoint was released
}

func newBlockCheckpointer() *blockCheckpointer {
	return &blockCheckpointer{started: make(chan string, 8), release: make(chan struct{}), late: make(chan struct{}),
		lateDone: make(chan error, 8), ctxErr: make(chan error, 8)}
}

func (b *blockCheckpointer) Checkpoint(ctx context.Context, sandboxID, dir string, _ bool) error {
	b.started <- sandboxID
	select {
	case <-b.release:
		b.ctxErr <- ctx.Err()
		return os.WriteFile(filepath.Join(dir, "checkpoint.img"), make([]byte, 10), 0o600)
	case <-ctx.Done():
		go func() {
			<-b.late
			b.lateDone <- os.WriteFile(filepath.Join(dir, "checkpoint.img"), make([]byte, 10), 0o600)
		}()
		return ctx.Err()
	}
}

// TestCheckpointTimeout: a checkpoint that outlives CheckpointTimeout leaves its image
// directory alone (the shim may still write it), unlisted and left to aged GC, and holds
// the sandbox's claim.
func TestCheckpointTimeout(t *testing.T) {
	b := newBlockCheckpointer()
	f := newFixture(t, 1<<20, func(c *Config) { c.Checkpointer = b; c.CheckpointTimeout = 50 * time.Millisecond })
	_, err := f.srv.Checkpoint(as(runnerA), connect.NewRequest(goodRequest()))
	if connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("timed out: %v", err)
	}
	des, _ := os.ReadDir(f.root)
	if len(des) != 1 {
		t.Fatalf("the timed-out image's directory was removed under the shim: %v", des)
	}
	// The shim finishes writing later: its directory is still there.
	close(b.late)
	if err := <-b.lateDone; err != nil {
		t.Fatalf("late write: %v", err)
	}
	if l := f.st.List(runnerA); len(l) != 0 {
		t.Fatalf("a timed-out image listed: %+v", l)
	}
	// The sandbox stays claimed: no second checkpoint over the running one.
	if _, err := f.srv.Checkpoint(as(runnerA), connect.NewRequest(goodRequest())); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("second checkpoint while the first may still run: %v", err)
	}
	if n := len(b.started); n != 1 {
		t.Fatalf("checkpointed %d times", n)
	}
	// GC leaves it for GCAge (10 min) after the timeout, then removes it.
	if removed, _ := f.st.GC(time.Now().Add(5 * time.Minute)); len(removed) != 0 {
		t.Fatalf("collected early: %v", removed)
	}
	if removed, _ := f.st.GC(time.Now().Add(11 * time.Minute)); len(removed) != 1 || removed[0] != des[0].Name() {
		t.Fatalf("collected %v", removed)
	}
}

// TestBusyAndConcurrency: one checkpoint per sandbox; at most MaxConcurrent at once (the
// next waits, and gives up with its caller); a checkpoint runs on after its caller went.
func TestBusyAndConcurrency(t *testing.T) {
	b := newBlockCheckpointer()
	f := newFixture(t, 1<<20, func(c *Config) { c.Checkpointer = b; c.MaxConcurrent = 1 })
	ctx, cancel := context.WithCancel(as(runnerA))
	type result struct {
		resp *connect.Response[nodeagentv1.CheckpointResponse]
		err  error
	}
	done := make(chan result, 1)
	go func() {
		r, err := f.srv.Checkpoint(ctx, connect.NewRequest(goodRequest()))
		done <- result{r, err}
	}()
	if id := <-b.started; id != criID {
		t.Fatalf("started %s", id)
	}
	// The same sandbox: refused at once.
	if _, err := f.srv.Checkpoint(as(runnerA), connect.NewRequest(goodRequest())); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("same sandbox: %v", err)
	}
	// Another sandbox: waits for the slot; its caller gives up.
	wctx, wcancel := context.WithTimeout(as(runnerA), 100*time.Millisecond)
	defer wcancel()
	if _, err := f.srv.Checkpoint(wctx, connect.NewRequest(otherRequest())); connect.CodeOf(err) != connect.CodeCanceled {
		t.Fatalf("over MaxConcurrent: %v", err)
	}
	if n := len(b.started); n != 0 {
		t.Fatalf("%d more checkpoints started over MaxConcurrent", n)
	}
	// The first caller goes away; its checkpoint runs to its end.
	cancel()
	time.Sleep(20 * time.Millisecond)
	close(b.release)
	select {
	case err := <-b.ctxErr:
		if err != nil {
			t.Fatalf("the checkpoint's context ended with its caller: %v", err)
		}
	case r := <-done:
		t.Fatalf("the checkpoint ended with its caller: %v", r.err)
	}
	r := <-done
	if r.err != nil {
		t.Fatalf("checkpoint after the caller went: %v", r.err)
	}
	if l := f.st.List(runnerA); len(l) != 1 || l[0].ID != r.resp.Msg.CheckpointId {
		t.Fatalf("list %+v", l)
	}
	// The claim and the slot are free again.
	if _, err := f.srv.Checkpoint(as(runnerA), connect.NewRequest(otherRequest())); err != nil {
		t.Fatalf("after: %v", err)
	}
}

// TestInternalErrorsGeneric: the node's own failures reach the caller without host paths.
func TestInternalErrorsGeneric(t *testing.T) {
	d := t.TempDir()
	root := filepath.Join(d, "root")
	if err := os.Mkdir(root, 0o700); err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(store.Config{Root: root, StateDir: filepath.Join(d, "state"), Owner: runnerA, QuotaBytes: 1 << 20,
		Dirs: store.PlainDirs{}, Free: func(r string) (int64, error) { return 0, errors.New("statfs " + r + ": broken") }})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	srv, err := NewServer(Config{Node: "node-1", RunnerID: runnerA, Resolver: &fakeResolver{}, Checkpointer: &fakeCheckpointer{}, Store: st})
	if err != nil {
		t.Fatal(err)
	}
	_, err = srv.Info(as(runnerA), connect.NewRequest(&nodeagentv1.InfoRequest{}))
	if connect.CodeOf(err) != connect.CodeInternal || strings.Contains(err.Error(), d) {
		t.Fatalf("info: %v", err)
	}
	_, err = srv.Checkpoint(as(runnerA), connect.NewRequest(goodRequest()))
	if connect.CodeOf(err) != connect.CodeInternal || strings.Contains(err.Error(), d) || strings.Contains(err.Error(), "statfs") {
		t.Fatalf("checkpoint: %v", err)
	}
}

// TestTLSReload: the agent picks up a rotated CA and server certificate from its TLS
// directory without a restart; clients of the old CA are refused afterwards.
func TestTLSReload(t *testing.T) {
	f := newFixture(t, 1<<20)
	issue := func(name string) (*pki.CA, tls.Certificate, tls.Certificate) {
		ca, err := pki.LoadOrCreateCA(t.TempDir(), name)
		if err != nil {
			t.Fatal(err)
		}
		srv, err := ca.IssueServer("sandboxd-node-agent", []string{ServerName}, nil, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		cl, err := ca.IssueClient("runner-a", []*url.URL{pki.NodeAgentClientURI(runnerA)}, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		return ca, srv, cl
	}
	ca1, srv1, cl1 := issue("CA one")
	dir := t.TempDir()
	writeTLSDir(t, dir, srv1, ca1)
	cfg, err := ServerTLSConfig(dir, runnerA)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := f.srv.HTTPServer(cfg)
	go func() { _ = hs.ServeTLS(ln, "", "") }()
	t.Cleanup(func() { hs.Close() })
	addr := ln.Addr().String()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := clientFor(t, addr, ca1, &cl1).Info(ctx); err != nil {
		t.Fatalf("before: %v", err)
	}
	// Rotated: new CA, new server certificate.
	ca2, srv2, cl2 := issue("CA two")
	writeTLSDir(t, dir, srv2, ca2)
	time.Sleep(1100 * time.Millisecond) // the reloader looks at most once a second
	if _, err := clientFor(t, addr, ca2, &cl2).Info(ctx); err != nil {
		t.Fatalf("after rotation, new CA: %v", err)
	}
	if _, err := clientFor(t, addr, ca1, &cl1).Info(ctx); err == nil {
		t.Fatal("after rotation, the old CA's client is still accepted")
	}
}

// TestCheckpointFailureText: a failed checkpoint answers one fixed sentence per kind of
// failure; the shim's and runsc's text (host paths, shim internals) stays in the log.
func TestCheckpointFailureText(t *testing.T) {
	secret := "/run/containerd/runsc/k8s.io/" + criID + "/log.json: runsc: " + strings.Repeat("stack frame ", 100)
	for name, tc := range map[string]struct {
		err  error
		want string
	}{
		"runsc failed":     {&hibernate.CallError{Method: "Checkpoint", Code: 2, Message: secret}, "the gVisor runtime could not checkpoint"},
		"no hibernate rpc": {&hibernate.CallError{Method: "Checkpoint", Code: 12 /* gRPC UNIMPLEMENTED */, Message: secret}, "not sandboxd's patched shim"},
		"no shim":          {fmt.Errorf("%w: %s", hibernate.ErrDial, secret), "does not answer"},
		"socket path":      {fmt.Errorf("%w socket path %s", hibernate.ErrInvalid, secret), "node configuration problem"},
		"other":            {errors.New(secret), "the checkpoint failed on the node"},
	} {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t, 1<<20)
			f.ckpt.err = tc.err
			f.res.ready = true
			_, err := f.srv.Checkpoint(as(runnerA), connect.NewRequest(goodRequest()))
			var ce *connect.Error
			if !errors.As(err, &ce) || ce.Code() != connect.CodeFailedPrecondition || ce.Meta().Get(SandboxRunningMeta) != "true" {
				t.Fatalf("failed checkpoint: %v", err)
			}
			msg := ce.Message()
			if !strings.Contains(msg, tc.want) || !strings.Contains(msg, "sandbox abc") {
				t.Errorf("message %q: want %q and the sandbox", msg, tc.want)
			}
			if strings.Contains(msg, "/run/") || strings.Contains(msg, "runsc:") || strings.Contains(msg, criID) || strings.Contains(msg, "stack") || len(msg) > maxErrorText {
				t.Errorf("message carries the node's text: %q", msg)
			}
		})
	}
}

// TestErrorTextBounded: the text of an error about the caller's request is bounded.
func TestErrorTextBounded(t *testing.T) {
	f := newFixture(t, 1<<20)
	f.res.err = fmt.Errorf("%w: %s", cri.ErrDenied, strings.Repeat("x", 10000))
	_, err := f.srv.Checkpoint(as(runnerA), connect.NewRequest(goodRequest()))
	if connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Fatalf("denied: %v", err)
	}
	var ce *connect.Error
	if errors.As(err, &ce); len(ce.Message()) > maxErrorText || !strings.HasPrefix(ce.Message(), "permission denied") {
		t.Fatalf("message of %d bytes: %.80q", len(ce.Message()), ce.Message())
	}
}
