package nodeagentdial_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/nodeagent"
	"github.com/sandboxd/sandboxd/internal/pki"
	sbxruntime "github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes/nodeagentdial"
	"github.com/sandboxd/sandboxd/internal/testenv/logbuf"
)

func TestDialConfigValidate(t *testing.T) {
	ok := []nodeagentdial.DialConfig{
		{},
		{Port: 7445, TLSDir: "/t", RunnerID: "r"},
		{Addrs: map[string]string{"node-1": "10.0.0.1:7445", "n2.example": "agent.example:1", "n3": "[fd00::1]:7445"}, TLSDir: "/t", RunnerID: "r"},
	}
	for _, c := range ok {
		if err := c.Validate(); err != nil {
			t.Errorf("%+v: %v", c, err)
		}
	}
	for name, tc := range map[string]struct {
		c    nodeagentdial.DialConfig
		want string
	}{
		"both":                {nodeagentdial.DialConfig{Port: 1, Addrs: map[string]string{"n": "h:1"}, TLSDir: "/t", RunnerID: "r"}, "give one"},
		"tls alone":           {nodeagentdial.DialConfig{TLSDir: "/t", RunnerID: "r"}, "needs --node-agent-port or --node-agent-addrs"},
		"no tls":              {nodeagentdial.DialConfig{Port: 7445, RunnerID: "r"}, "need --node-agent-tls-dir"},
		"port high":           {nodeagentdial.DialConfig{Port: 70000, TLSDir: "/t", RunnerID: "r"}, "--node-agent-port 70000: want 1..65535"},
		"port negative":       {nodeagentdial.DialConfig{Port: -1, TLSDir: "/t", RunnerID: "r"}, "want 1..65535"},
		"gone after negative": {nodeagentdial.DialConfig{Port: 1, TLSDir: "/t", NodeGoneAfter: -time.Second}, "--node-agent-node-gone-after -1s: want a duration ≥ 0"},
		"gone after, static":  {nodeagentdial.DialConfig{Addrs: map[string]string{"n": "h:1"}, TLSDir: "/t", NodeGoneAfter: time.Second}, "needs --node-agent-port"},
		// Without any agent configured the flag would do nothing: refused at start.
		"gone after alone": {nodeagentdial.DialConfig{NodeGoneAfter: time.Minute}, "--node-agent-node-gone-after needs --node-agent-port"},
		"bad node":         {nodeagentdial.DialConfig{Addrs: map[string]string{"Node_1": "h:1"}, TLSDir: "/t", RunnerID: "r"}, `node "Node_1"`},
		"no port":          {nodeagentdial.DialConfig{Addrs: map[string]string{"n": "10.0.0.1"}, TLSDir: "/t", RunnerID: "r"}, "want host:port"},
		"port zero":        {nodeagentdial.DialConfig{Addrs: map[string]string{"n": "10.0.0.1:0"}, TLSDir: "/t", RunnerID: "r"}, "port 1..65535"},
		"bad host":         {nodeagentdial.DialConfig{Addrs: map[string]string{"n": "a/b:1"}, TLSDir: "/t", RunnerID: "r"}, "neither an IP"},
	} {
		err := tc.c.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", name, err, tc.want)
		}
	}
}

func TestParseAddrs(t *testing.T) {
	m, err := nodeagentdial.ParseAddrs(" node-1=10.0.0.1:7445, node-2 = [fd00::2]:7445 ,")
	if err != nil || len(m) != 2 || m["node-1"] != "10.0.0.1:7445" || m["node-2"] != "[fd00::2]:7445" {
		t.Fatalf("%v %v", m, err)
	}
	if m, err := nodeagentdial.ParseAddrs(""); err != nil || m != nil {
		t.Fatalf("empty: %v %v", m, err)
	}
	for in, want := range map[string]string{
		"node-1":                 "want node=host:port",
		"=10.0.0.1:1":            "want node=host:port",
		"n=":                     "want node=host:port",
		"n=10.0.0.1:1,n=h:2":     `node "n" twice`,
		"a=10.0.0.1:1,,b":        "want node=host:port",
		"n=10.0.0.1:1,m=h:1,n=x": "twice",
	} {
		if _, err := nodeagentdial.ParseAddrs(in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", in, err, want)
		}
	}
}

// clientTLSDir writes a runner's TLS dir: a client certificate with uris, ttl, and ca.crt.
func clientTLSDir(t *testing.T, ca *pki.CA, uris []*url.URL, ttl time.Duration) string {
	t.Helper()
	cert, err := ca.IssueClient("runner", uris, ttl)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := nodeagent.WriteTLSDir(dir, cert, ca.CertPEM()); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestClientTLSFromDir: the runner's TLS dir must hold a certificate naming this runner
// (else a clear error at start), and one that does reaches the agent.
func TestClientTLSFromDir(t *testing.T) {
	j := serveJoinAgent(t)
	for name, tc := range map[string]struct {
		uris []*url.URL
		ttl  time.Duration
		want string
	}{
		"other runner": {[]*url.URL{pki.NodeAgentClientURI("runner-x")}, time.Hour, `names runner "runner-x", this runner is "runner-j"`},
		"runner URI":   {[]*url.URL{pki.RunnerURI("org", joinRunner)}, time.Hour, "carries no node-agent client URI"},
		"expired":      {[]*url.URL{pki.NodeAgentClientURI(joinRunner)}, time.Millisecond, "not now"},
	} {
		dir := clientTLSDir(t, j.ca, tc.uris, tc.ttl)
		time.Sleep(5 * time.Millisecond) // the expired one's lifetime is over
		if _, err := nodeagentdial.ClientTLSFromDir(dir, joinRunner); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", name, err, tc.want)
		}
	}
	if _, err := nodeagentdial.ClientTLSFromDir(t.TempDir(), joinRunner); err == nil || !strings.Contains(err.Error(), "--node-agent-tls-dir") {
		t.Errorf("empty dir: %v", err)
	}
	dir := clientTLSDir(t, j.ca, []*url.URL{pki.NodeAgentClientURI(joinRunner)}, time.Hour)
	c := nodeagentdial.DialConfig{Addrs: map[string]string{"node-1": j.addr}, TLSDir: dir, RunnerID: joinRunner}
	d, err := c.Dialer(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	a, err := d.Agent(t.Context(), "node-1")
	if err != nil {
		t.Fatal(err)
	}
	cp, err := a.Checkpoint(t.Context(), joinReq(false))
	if err != nil || cp.Node != "node-1" {
		t.Fatalf("checkpoint through --node-agent-addrs: %+v %v", cp, err)
	}
	// The runner verifies the agent: its certificate must chain to ca.crt and name
	// nodeagent.ServerName with serverAuth. The runner's client certificate is the one
	// the agent trusts in every case, so only the runner's verification can refuse.
	ccert := runnerCert(t, j.ca)
	other, err := pki.LoadOrCreateCA(t.TempDir(), "other CA")
	if err != nil {
		t.Fatal(err)
	}
	checkpointVia := func(addr string, caPEM []byte) error {
		t.Helper()
		dir := t.TempDir()
		if err := nodeagent.WriteTLSDir(dir, ccert, caPEM); err != nil {
			t.Fatal(err)
		}
		d, err := nodeagentdial.DialConfig{Addrs: map[string]string{"node-1": addr}, TLSDir: dir, RunnerID: joinRunner}.Dialer(t.Context(), nil)
		if err != nil {
			t.Fatal(err)
		}
		a, err := d.Agent(t.Context(), "node-1")
		if err != nil {
			t.Fatal(err)
		}
		_, err = a.Checkpoint(t.Context(), joinReq(false))
		// The handshake's error is the runner's to log: the backend gets a fixed
		// sentence (AgentError), its cause only through Cause.
		if err != nil && !errors.Is(err, sbxruntime.ErrNodeAgentUnavailable) {
			t.Errorf("refused handshake: %v, want ErrNodeAgentUnavailable", err)
		}
		return nodeagentdial.Cause(err)
	}
	// The real agent, but the runner's ca.crt is another CA: unknown authority.
	var unknown x509.UnknownAuthorityError
	if err := checkpointVia(j.addr, other.CertPEM()); !errors.As(err, &unknown) {
		t.Errorf("agent not of the runner's CA: %v, want x509.UnknownAuthorityError", err)
	}
	// A server certificate of the same CA for another name.
	otherName, err := j.ca.IssueServer("impostor", []string{"other.sandboxd.internal"}, nil, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	var hostname x509.HostnameError
	if err := checkpointVia(impostor(t, otherName), j.ca.CertPEM()); !errors.As(err, &hostname) {
		t.Errorf("server certificate for another name: %v, want x509.HostnameError", err)
	}
	// A client-only certificate of the same CA (a runner's) presented as the server's.
	clientOnly, err := j.ca.IssueClient("runner-x", []*url.URL{pki.NodeAgentClientURI("runner-x")}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := checkpointVia(impostor(t, clientOnly), j.ca.CertPEM()); !errors.As(err, &hostname) {
		t.Errorf("client certificate as the server's: %v, want x509.HostnameError", err)
	}
	// The same with the agents' name in it (clientAuth only): the usage refuses it.
	var invalid x509.CertificateInvalidError
	if err := checkpointVia(impostor(t, clientCertNamed(t, j.ca, nodeagent.ServerName)), j.ca.CertPEM()); !errors.As(err, &invalid) || invalid.Reason != x509.IncompatibleUsage {
		t.Errorf("clientAuth certificate naming the agents as the server's: %v, want x509 IncompatibleUsage", err)
	}
	if _, err := (nodeagentdial.DialConfig{Addrs: c.Addrs, TLSDir: dir}).Dialer(t.Context(), nil); err == nil || !strings.Contains(err.Error(), "runner's ID") {
		t.Errorf("no runner ID: %v", err)
	}
	if d, err := (nodeagentdial.DialConfig{}).Dialer(t.Context(), nil); d != nil || err != nil {
		t.Errorf("no agents: %v %v, want nil, nil", d, err)
	}
}

// TestNodeDialer: --node-agent-port dials the node's InternalIP at the port; a node that
// is gone is the API's NotFound (the backend takes it for the loss of its checkpoints), a
// node without an InternalIP is ErrNoAgent.
func TestNodeDialer(t *testing.T) {
	j := serveJoinAgent(t)
	_, port, _ := net.SplitHostPort(j.addr)
	client := fake.NewClientset(
		testNode("node-1", corev1.NodeAddress{Type: corev1.NodeHostName, Address: "node-1"},
			corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: "fd00::9"},
			corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: "192.0.2.10"}),
		testNode("node-bare", corev1.NodeAddress{Type: corev1.NodeExternalIP, Address: "192.0.2.1"}),
	)
	dir := clientTLSDir(t, j.ca, []*url.URL{pki.NodeAgentClientURI(joinRunner)}, time.Hour)
	p, err := strconv.Atoi(port)
	if err != nil {
		t.Fatal(err)
	}
	r := newRedirect(map[string]string{net.JoinHostPort("192.0.2.10", port): j.addr})
	d, err := nodeagentdial.DialConfig{Port: p, TLSDir: dir, RunnerID: joinRunner, ClientOptions: nodeagent.ClientOptions{DialContext: r.dial}}.Dialer(t.Context(), client)
	if err != nil {
		t.Fatal(err)
	}
	a, err := d.Agent(t.Context(), "node-1")
	if err != nil {
		t.Fatal(err)
	}
	if cp, err := a.Checkpoint(t.Context(), joinReq(false)); err != nil || cp.Node != "node-1" {
		t.Fatalf("checkpoint through --node-agent-port: %+v %v", cp, err)
	}
	if got := r.dialed(); len(got) != 1 || got[0] != net.JoinHostPort("192.0.2.10", port) {
		t.Errorf("dialed %v, want the node's IPv4 InternalIP at the port", got)
	}
	// A node missing on its first look is not yet gone (TestNodeDialerGoneAfter).
	if _, err := d.Agent(t.Context(), "node-gone"); !errors.Is(err, nodeagentdial.ErrNodeMissing) || apierrors.IsNotFound(err) {
		t.Errorf("node missing: %v, want ErrNodeMissing, not NotFound", err)
	}
	if _, err := d.Agent(t.Context(), "node-bare"); !errors.Is(err, nodeagent.ErrNoAgent) {
		t.Errorf("node without InternalIP: %v, want ErrNoAgent", err)
	}
	if _, err := d.Agent(t.Context(), "../x"); err == nil || apierrors.IsNotFound(err) {
		t.Errorf("bad node name: %v", err)
	}
	if _, err := (nodeagentdial.DialConfig{Port: p, TLSDir: dir, RunnerID: joinRunner}).Dialer(t.Context(), nil); err == nil {
		t.Error("--node-agent-port without a Kubernetes client: no error")
	}
}

// TestNodeDialerRefusedAddresses: a Node whose InternalIPs are loopback, unspecified,
// link-local or multicast (the runner's own host or link, not the node) has no agent
// (ErrNoAgent naming them) and nothing is dialed; a usable address beside them is taken.
func TestNodeDialerRefusedAddresses(t *testing.T) {
	j := serveJoinAgent(t)
	_, port, _ := net.SplitHostPort(j.addr)
	p, _ := strconv.Atoi(port)
	var nodes []runtime.Object
	bad := []string{"127.0.0.1", "::1", "::ffff:127.0.0.2", "0.0.0.0", "::", "169.254.169.254", "fe80::1", "224.0.0.1", "ff02::1", "239.1.2.3"}
	for i, ip := range bad {
		nodes = append(nodes, testNode(fmt.Sprintf("node-%d", i), corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: ip}))
	}
	nodes = append(nodes, testNode("node-mixed",
		corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: "127.0.0.1"},
		corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: "169.254.0.1"},
		corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: "192.0.2.10"}))
	r := newRedirect(map[string]string{net.JoinHostPort("192.0.2.10", port): j.addr,
		net.JoinHostPort("127.0.0.1", port): j.addr, net.JoinHostPort("::1", port): j.addr})
	dir := clientTLSDir(t, j.ca, []*url.URL{pki.NodeAgentClientURI(joinRunner)}, time.Hour)
	d, err := nodeagentdial.DialConfig{Port: p, TLSDir: dir, RunnerID: joinRunner, ClientOptions: nodeagent.ClientOptions{DialContext: r.dial}}.Dialer(t.Context(), fake.NewClientset(nodes...))
	if err != nil {
		t.Fatal(err)
	}
	for i, ip := range bad {
		a, err := d.Agent(t.Context(), fmt.Sprintf("node-%d", i))
		if err == nil {
			_, err = a.Checkpoint(t.Context(), joinReq(true))
		}
		if !errors.Is(err, nodeagent.ErrNoAgent) || !strings.Contains(nodeagentdial.Cause(err).Error(), "no usable InternalIP") {
			t.Errorf("InternalIP %s: %v, want ErrNoAgent (no usable InternalIP)", ip, err)
		}
	}
	if got := r.dialed(); len(got) != 0 {
		t.Errorf("dialed %v for refused addresses", got)
	}
	a, err := d.Agent(t.Context(), "node-mixed")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Checkpoint(t.Context(), joinReq(true)); err != nil {
		t.Fatal(err)
	}
	if got := r.dialed(); len(got) != 1 || got[0] != net.JoinHostPort("192.0.2.10", port) {
		t.Errorf("dialed %v, want only the usable address", got)
	}
}

// TestNodeDialerAddressChange: one client per node: the same while the node's address
// stays, and when it changes the old client is closed (its connection with it) and a new
// one dials the new address.
func TestNodeDialerAddressChange(t *testing.T) {
	j := serveJoinAgent(t)
	_, port, _ := net.SplitHostPort(j.addr)
	p, _ := strconv.Atoi(port)
	oldAddr, newAddr := net.JoinHostPort("192.0.2.10", port), net.JoinHostPort("192.0.2.11", port)
	r := newRedirect(map[string]string{oldAddr: j.addr, newAddr: j.addr})
	client := fake.NewClientset(testNode("node-1", corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: "192.0.2.10"}))
	d := &nodeagentdial.NodeDialer{Client: client, Port: p, TLS: runnerTLS(t, j.ca), Options: nodeagent.ClientOptions{DialContext: r.dial}}
	ctx := t.Context()
	c1, err := d.Agent(ctx, "node-1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c1.ListCheckpoints(ctx); err != nil {
		t.Fatal(err)
	}
	if again, err := d.Agent(ctx, "node-1"); err != nil || again != c1 {
		t.Fatalf("same address: %p %v, want the cached client %p", again, err, c1)
	}
	n, err := client.CoreV1().Nodes().Get(ctx, "node-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.0.2.11"}}
	if _, err := client.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	c2, err := d.Agent(ctx, "node-1")
	if err != nil || c2 == c1 {
		t.Fatalf("new address: %p %v, want a new client (old %p)", c2, err, c1)
	}
	if _, err := c2.ListCheckpoints(ctx); err != nil {
		t.Fatal(err)
	}
	if got := r.dialed(); !slices.Equal(got, []string{oldAddr, newAddr}) {
		t.Errorf("dialed %v, want %s then %s", got, oldAddr, newAddr)
	}
	for deadline := time.Now().Add(5 * time.Second); r.open(oldAddr) != 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the old address's client is not closed: %d connections open", r.open(oldAddr))
		}
	}
	if r.open(newAddr) != 1 {
		t.Errorf("%d connections to the new address, want 1", r.open(newAddr))
	}
}

// TestNodeDialerGoneAfter: a node the API server does not know is taken as gone (the
// API's NotFound, errdefs.ErrNotFound through the adapter: the backend ends its
// sandboxes' resumes as CheckpointLost) only when a look GoneAfter after the first that
// missed it misses it too; before, ErrNodeMissing, which is neither (the sandbox stays
// paused) but ErrNodeAgentUnavailable: retryable. A node
// that comes back is forgotten as missing: its next absence starts over.
func TestNodeDialerGoneAfter(t *testing.T) {
	j := serveJoinAgent(t)
	_, port, _ := net.SplitHostPort(j.addr)
	p, _ := strconv.Atoi(port)
	r := newRedirect(map[string]string{net.JoinHostPort("192.0.2.10", port): j.addr})
	client := fake.NewClientset()
	const grace = 400 * time.Millisecond
	nd := &nodeagentdial.NodeDialer{Client: client, Port: p, TLS: runnerTLS(t, j.ca), GoneAfter: grace, Options: nodeagent.ClientOptions{DialContext: r.dial}}
	d := nodeagentdial.BackendDialer(nd, nodeagentdial.Options{RunnerID: joinRunner})
	ctx := t.Context()
	notYet := func(what string) {
		t.Helper()
		_, err := d.Agent(ctx, "node-1")
		if !errors.Is(err, nodeagentdial.ErrNodeMissing) || !errors.Is(err, sbxruntime.ErrNodeAgentUnavailable) || apierrors.IsNotFound(nodeagentdial.Cause(err)) || errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("%s: %v, want ErrNodeMissing (not NotFound)", what, err)
		}
	}
	start := time.Now()
	notYet("first look")
	notYet("second look at once")
	time.Sleep(grace - time.Since(start) + 50*time.Millisecond)
	if _, err := d.Agent(ctx, "node-1"); !errors.Is(err, errdefs.ErrNotFound) || !apierrors.IsNotFound(nodeagentdial.Cause(err)) {
		t.Errorf("missing for longer than %v: %v, want errdefs.ErrNotFound (the API's NotFound its cause)", grace, err)
	}
	// It comes back: reachable, and forgotten as missing.
	n, err := client.CoreV1().Nodes().Create(ctx, testNode("node-1", corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: "192.0.2.10"}), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	a, err := d.Agent(ctx, "node-1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Checkpoint(ctx, joinReq(true)); err != nil {
		t.Fatal(err)
	}
	if err := client.CoreV1().Nodes().Delete(ctx, n.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	notYet("missing again")
	if nodeagentdial.DefaultNodeGoneAfter < time.Minute {
		t.Errorf("DefaultNodeGoneAfter %v", nodeagentdial.DefaultNodeGoneAfter)
	}
}

func testNode(name string, addrs ...corev1.NodeAddress) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: corev1.NodeStatus{Addresses: addrs}}
}

// redirect is a client's DialContext that routes the addresses it knows to test
// listeners (the Nodes name documentation addresses) and records each dial; the conns it
// made, by address, to see which were closed.
type redirect struct {
	mu    sync.Mutex
	to    map[string]string
	dials []string
	conns map[string][]*trackedConn
}

func newRedirect(to map[string]string) *redirect {
	return &redirect{to: to, conns: map[string][]*trackedConn{}}
}

func (r *redirect) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	r.mu.Lock()
	r.dials = append(r.dials, addr)
	target, ok := r.to[addr]
	r.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("test: no route to %s", addr)
	}
	c, err := (&net.Dialer{}).DialContext(ctx, network, target)
	if err != nil {
		return nil, err
	}
	tc := &trackedConn{Conn: c}
	r.mu.Lock()
	r.conns[addr] = append(r.conns[addr], tc)
	r.mu.Unlock()
	return tc, nil
}

func (r *redirect) dialed() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.dials)
}

// open counts the conns to addr not closed.
func (r *redirect) open(addr string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, c := range r.conns[addr] {
		if !c.closed.Load() {
			n++
		}
	}
	return n
}

type trackedConn struct {
	net.Conn
	closed atomic.Bool
}

func (c *trackedConn) Close() error {
	c.closed.Store(true)
	return c.Conn.Close()
}

// impostor serves TLS (h2) with cert and answers nothing; its address.
func impostor(t *testing.T, cert tls.Certificate) string {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_ = c.(*tls.Conn).Handshake()
			}()
		}
	}()
	return ln.Addr().String()
}

// clientCertNamed is a clientAuth-only certificate of ca that carries the DNS name name.
func clientCertNamed(t *testing.T, ca *pki.CA, name string) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	if err != nil {
		t.Fatal(err)
	}
	csr, err := x509.ParseCertificateRequest(der)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.SignCSR(csr, func(c *x509.Certificate) {
		c.DNSNames = []string{name}
		c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{leaf.Raw}, PrivateKey: key, Leaf: leaf}
}

// TestClientTLSRenewalChecked: a renewed client certificate is checked like the first:
// one naming another runner is refused with a warning (once) and the last good one stays
// in use; a good renewal is taken.
func TestClientTLSRenewalChecked(t *testing.T) {
	ca, err := pki.LoadOrCreateCA(t.TempDir(), "test node-agent CA")
	if err != nil {
		t.Fatal(err)
	}
	dir := clientTLSDir(t, ca, []*url.URL{pki.NodeAgentClientURI(joinRunner)}, time.Hour)
	var logs logbuf.Buffer
	tc, err := nodeagentdial.ClientTLSFromDirLog(dir, joinRunner, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	runnerOf := func() (string, []byte) {
		t.Helper()
		c, err := tc.GetClientCertificate(&tls.CertificateRequestInfo{})
		if err != nil {
			t.Fatal(err)
		}
		leaf, err := x509.ParseCertificate(c.Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		id, _ := pki.NodeAgentRunner(leaf)
		return id, leaf.Raw
	}
	first, firstRaw := runnerOf()
	if first != joinRunner {
		t.Fatalf("first certificate names %q", first)
	}
	renew := func(runner string) {
		t.Helper()
		time.Sleep(1100 * time.Millisecond) // the directory is looked at at most once a second
		c, err := ca.IssueClient("runner", []*url.URL{pki.NodeAgentClientURI(runner)}, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if err := nodeagent.WriteTLSDir(dir, c, ca.CertPEM()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(1100 * time.Millisecond)
	}
	renew("runner-x")
	for range 3 {
		if id, raw := runnerOf(); id != joinRunner || !bytes.Equal(raw, firstRaw) {
			t.Fatalf("after a renewal naming runner-x: presents %q, want the last good certificate", id)
		}
	}
	if n := strings.Count(logs.String(), "the renewed one is refused"); n != 1 || !strings.Contains(logs.String(), `names runner \"runner-x\"`) {
		t.Errorf("warnings %d, want 1 naming runner-x:\n%s", n, logs.String())
	}
	renew(joinRunner)
	if id, raw := runnerOf(); id != joinRunner || bytes.Equal(raw, firstRaw) {
		t.Errorf("after a good renewal: %q, same certificate %v, want the renewed one", id, bytes.Equal(raw, firstRaw))
	}
}
