package nodeagentdial

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	k8s "k8s.io/client-go/kubernetes"

	"github.com/sandboxd/sandboxd/internal/nodeagent"
	"github.com/sandboxd/sandboxd/internal/pki"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes"
)

// How a runner reaches the node agent of a sandbox Pod's node (the runner's
// --node-agent-* flags, docs/nodeagent.md "The runner's side").

// MaxStaticAgents bounds DialConfig.Addrs.
const MaxStaticAgents = 4096

// DialConfig is how a runner reaches its node agents: by node — the node's InternalIP
// and Port (NodeDialer) — or by a static map node → host:port (StaticDialer), with mTLS
// from TLSDir (ClientTLSFromDir). Validate is pure (RunnerID is not its: the runner
// may learn it later, at enrolment); Dialer reads the TLS files.
type DialConfig struct {
	// Port: the agents listen on their node's InternalIP at this port (1..65535).
	Port int
	// Addrs: node name → host:port of its agent (tests, fixed deployments). Exactly one
	// of Port and Addrs.
	Addrs map[string]string
	// TLSDir holds the runner's client certificate for its agents (tls.crt, tls.key: it
	// must name RunnerID, pki.NodeAgentClientURI) and ca.crt, the CA the agents' server
	// certificates (ServerName) chain to — the layout of a kubernetes.io/tls Secret with
	// ca.crt. That CA must issue only this runner's agents' certificates: a shared issuer
	// lets whoever else it serves mint the agents' name (docs/nodeagent.md).
	TLSDir string
	// Issue, instead of TLSDir: the runner issues the certificates itself and keeps them
	// in these Secrets (Issuer; needs a Kubernetes client).
	Issue    *IssueConfig
	RunnerID string
	// NodeGoneAfter (with Port): how long a node must stay missing from the API server
	// before it is taken as gone with its checkpoints (NodeDialer.GoneAfter; 0: the
	// default, 5 min).
	NodeGoneAfter time.Duration
	// ClientOptions bound the clients' connections (zero: nodeagent's defaults; no flag).
	ClientOptions nodeagent.ClientOptions
	// Log takes the warnings of a renewed client certificate refused and the agents' own
	// errors (what the API caller is not told: AgentError) (nil: slog.Default).
	Log *slog.Logger
}

// Enabled: some agent is configured (Port or Addrs).
func (c DialConfig) Enabled() bool { return c.Port != 0 || len(c.Addrs) > 0 }

// Validate checks c without touching a file or the network.
func (c DialConfig) Validate() error {
	switch {
	case c.Port != 0 && len(c.Addrs) > 0:
		return errors.New("--node-agent-port and --node-agent-addrs: give one (the agents by node address, or a static map)")
	case !c.Enabled():
		if c.TLSDir != "" {
			return errors.New("--node-agent-tls-dir needs --node-agent-port or --node-agent-addrs")
		}
		if c.Issue != nil {
			return errors.New("--node-agent-issue-secrets needs --node-agent-port or --node-agent-addrs")
		}
		if c.NodeGoneAfter != 0 {
			return errors.New("--node-agent-node-gone-after needs --node-agent-port: it says when a node's agent is taken as gone, and no node agent is configured")
		}
		return nil
	case c.Port < 0 || c.Port > 65535:
		return fmt.Errorf("--node-agent-port %d: want 1..65535", c.Port)
	case c.TLSDir != "" && c.Issue != nil:
		return errors.New("--node-agent-tls-dir and --node-agent-issue-secrets: give one (certificates you made, or the runner issues them)")
	case c.TLSDir == "" && c.Issue == nil:
		return errors.New("--node-agent-port/--node-agent-addrs need --node-agent-tls-dir (the runner's client certificate for its node agents and their CA) or --node-agent-issue-secrets (the runner issues them)")
	case c.NodeGoneAfter < 0:
		return fmt.Errorf("--node-agent-node-gone-after %v: want a duration ≥ 0", c.NodeGoneAfter)
	case c.NodeGoneAfter != 0 && c.Port == 0:
		return errors.New("--node-agent-node-gone-after needs --node-agent-port (a static map never takes a node for gone)")
	case len(c.Addrs) > MaxStaticAgents:
		return fmt.Errorf("--node-agent-addrs: %d agents, at most %d", len(c.Addrs), MaxStaticAgents)
	}
	if c.Issue != nil {
		if err := c.Issue.Validate(); err != nil {
			return fmt.Errorf("--node-agent-issue-secrets: %w", err)
		}
	}
	nodes := make([]string, 0, len(c.Addrs))
	for n := range c.Addrs {
		nodes = append(nodes, n)
	}
	sort.Strings(nodes)
	for _, n := range nodes {
		if errs := validation.IsDNS1123Subdomain(n); len(errs) > 0 {
			return fmt.Errorf("--node-agent-addrs: node %q: %s", n, strings.Join(errs, "; "))
		}
		if err := checkHostPort(c.Addrs[n]); err != nil {
			return fmt.Errorf("--node-agent-addrs: node %s: %w", n, err)
		}
	}
	return nil
}

// checkHostPort: a host (name or IP) and a port 1..65535.
func checkHostPort(a string) error {
	host, port, err := net.SplitHostPort(a)
	if err != nil {
		return fmt.Errorf("%q: want host:port ([IPv6]:port): %w", a, err)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("%q: want a port 1..65535", a)
	}
	if _, err := netip.ParseAddr(host); err != nil {
		if errs := validation.IsDNS1123Subdomain(host); len(errs) > 0 {
			return fmt.Errorf("%q: the host is neither an IP address nor a DNS name", a)
		}
	}
	return nil
}

// ParseAddrs reads --node-agent-addrs: comma-separated node=host:port pairs, each node
// once ("": nil).
func ParseAddrs(s string) (map[string]string, error) {
	var m map[string]string
	for kv := range strings.SplitSeq(s, ",") {
		if kv = strings.TrimSpace(kv); kv == "" {
			continue
		}
		node, addr, ok := strings.Cut(kv, "=")
		node, addr = strings.TrimSpace(node), strings.TrimSpace(addr)
		if !ok || node == "" || addr == "" {
			return nil, fmt.Errorf("--node-agent-addrs: %q: want node=host:port", kv)
		}
		if m == nil {
			m = map[string]string{}
		}
		if _, dup := m[node]; dup {
			return nil, fmt.Errorf("--node-agent-addrs: node %q twice", node)
		}
		m[node] = addr
	}
	return m, nil
}

// Dialer is the backend's dialer of c's agents (nil, nil when none is configured):
// client is what NodeDialer reads Nodes with and Issue's Secrets are kept with. With
// Issue, the certificates are created or loaded here (Issuer.Ensure) and checked every
// RenewCheckInterval until ctx ends (Held.Maintain; the stack ends it at its Close).
func (c DialConfig) Dialer(ctx context.Context, client k8s.Interface) (kubernetes.NodeAgentDialer, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if !c.Enabled() {
		return nil, nil
	}
	if c.RunnerID == "" {
		return nil, errors.New("nodeagentdial: node agents need the runner's ID (its client certificate must name it)")
	}
	var (
		tc  *tls.Config
		err error
	)
	if c.Issue != nil {
		if client == nil {
			return nil, errors.New("nodeagentdial: a Kubernetes client to keep the node agents' certificates in Secrets")
		}
		is := &Issuer{Client: client, Config: *c.Issue, RunnerID: c.RunnerID, Log: c.Log}
		ca, err := is.Ensure(ctx)
		if err != nil {
			return nil, err
		}
		held, err := is.Hold(ca)
		if err != nil {
			return nil, err
		}
		tc = held.ClientTLS()
		go held.Maintain(ctx, RenewCheckInterval)
	} else if tc, err = ClientTLSFromDirLog(c.TLSDir, c.RunnerID, c.Log); err != nil {
		return nil, err
	}
	if len(c.Addrs) > 0 {
		return BackendDialer(&nodeagent.StaticDialer{Addrs: c.Addrs, TLS: tc, Options: c.ClientOptions}, Options{RunnerID: c.RunnerID, Log: c.Log}), nil
	}
	if client == nil {
		return nil, errors.New("nodeagentdial: a Kubernetes client to read the nodes' addresses")
	}
	return BackendDialer(&NodeDialer{Client: client, Port: c.Port, TLS: tc, GoneAfter: c.NodeGoneAfter, Options: c.ClientOptions}, Options{RunnerID: c.RunnerID, Log: c.Log}), nil
}

// ClientTLSFromDir is a runner's TLS configuration for its agents from dir (CertFile,
// KeyFile, CAFile): the client certificate must carry runnerID's NodeAgentClientURI and
// be valid now (checked here, so a wrong Secret fails the runner's start, not its first
// pause); it is re-read when its files change (a renewed certificate) and checked again:
// a renewed one that fails the check (another runner's, not valid now) or files that
// cannot be read leave the last good certificate in use, with a warning (once per
// change). The CA is read once (a new CA needs a restart).
func ClientTLSFromDir(dir, runnerID string) (*tls.Config, error) {
	return ClientTLSFromDirLog(dir, runnerID, nil)
}

// ClientTLSFromDirLog is ClientTLSFromDir with its warnings to log (nil: slog.Default).
func ClientTLSFromDirLog(dir, runnerID string, log *slog.Logger) (*tls.Config, error) {
	if log == nil {
		log = slog.Default()
	}
	d, err := nodeagent.OpenTLSDir(dir)
	if err != nil {
		return nil, fmt.Errorf("--node-agent-tls-dir: %w", err)
	}
	cert, pool, err := d.Load()
	if err != nil {
		return nil, fmt.Errorf("--node-agent-tls-dir: %w", err)
	}
	if err := checkClientCert(cert, runnerID, time.Now()); err != nil {
		return nil, fmt.Errorf("--node-agent-tls-dir %s: %w", dir, err)
	}
	var (
		mu      sync.Mutex
		good    = cert // the last certificate that passed checkClientCert
		refused *tls.Certificate
		loadErr string
	)
	return nodeagent.ClientTLSConfig(nil, func() (*tls.Certificate, error) {
		cur, _, err := d.Load()
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			if err.Error() != loadErr {
				loadErr = err.Error()
				log.Warn("node agent client certificate: cannot re-read it; the last good one stays in use", "dir", dir, "err", err)
			}
			return good, nil
		}
		loadErr = ""
		if cur == good {
			return good, nil
		}
		if err := checkClientCert(cur, runnerID, time.Now()); err != nil {
			if cur != refused {
				refused = cur
				log.Warn("node agent client certificate: the renewed one is refused; the last good one stays in use", "dir", dir, "err", err)
			}
			return good, nil
		}
		good = cur
		return good, nil
	}, pool), nil
}

// checkClientCert: cert's leaf names runnerID as a node-agent client and is valid at now.
func checkClientCert(cert *tls.Certificate, runnerID string, now time.Time) error {
	if len(cert.Certificate) == 0 {
		return errors.New("no client certificate")
	}
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		return fmt.Errorf("client certificate: %w", err)
	}
	id, ok := pki.NodeAgentRunner(leaf)
	switch {
	case !ok:
		return fmt.Errorf("the client certificate (%s) carries no node-agent client URI: want exactly one %s", nodeagent.CertFile, pki.NodeAgentClientURI(runnerID))
	case id != runnerID:
		return fmt.Errorf("the client certificate (%s) names runner %q, this runner is %q", nodeagent.CertFile, id, runnerID)
	case now.Before(leaf.NotBefore) || now.After(leaf.NotAfter):
		return fmt.Errorf("the client certificate (%s) is valid %s to %s, not now", nodeagent.CertFile, leaf.NotBefore.UTC().Format(time.RFC3339), leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	return nil
}

// NodeDialer reaches the agent of a node at the node's InternalIP and Port (the agents
// listen on their node's address: a hostNetwork DaemonSet or a hostPort). The node is
// read from the API server on each Agent call (one GET; nodes change addresses rarely,
// but a node that is gone must be known as gone). A node the API server does not know is
// taken as gone — its NotFound is passed on, and the backend takes it for the loss of
// the checkpoints on it (a resume ends the sandbox CheckpointLost) — only once it has
// been missing on two looks at least GoneAfter apart (tracked per node since the first
// look that missed it); before, the error is ErrNodeMissing, which is not NotFound: the
// sandbox stays paused and a later resume tries again (a node deleted and re-registered
// in maintenance, an API server answering from a stale cache). Clients are cached per
// node (one per node: when its address changes, the old client is closed and replaced).
// Use it by pointer.
type NodeDialer struct {
	Client k8s.Interface
	Port   int
	TLS    *tls.Config
	// GoneAfter: how long a node must stay missing before it is taken as gone (default
	// DefaultNodeGoneAfter).
	GoneAfter time.Duration
	// Options bound the clients' connections (zero: the defaults).
	Options nodeagent.ClientOptions

	mu      sync.Mutex
	clients map[string]nodeClient // by node name
	missing map[string]time.Time  // node name → when a look first missed it
}

// DefaultNodeGoneAfter is NodeDialer.GoneAfter's default.
const DefaultNodeGoneAfter = 5 * time.Minute

// ErrNodeMissing: the API server does not know the node, but it has not been missing
// long enough to be taken as gone (NodeDialer): retry later.
var ErrNodeMissing = errors.New("nodeagentdial: the node is missing (not yet taken as gone: retry later)")

// Agent returns the client of node's agent.
func (d *NodeDialer) Agent(ctx context.Context, node string) (*nodeagent.Client, error) {
	if errs := validation.IsDNS1123Subdomain(node); len(errs) > 0 {
		return nil, fmt.Errorf("nodeagentdial: node %q: %s", node, strings.Join(errs, "; "))
	}
	n, err := d.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		if apierrors.IsNotFound(err) {
			return nil, d.nodeMissing(node, err)
		}
		return nil, fmt.Errorf("nodeagentdial: node %s: %w", node, err)
	}
	d.mu.Lock()
	delete(d.missing, node)
	d.mu.Unlock()
	ip, refused := nodeInternalIP(n)
	if !ip.IsValid() {
		if len(refused) > 0 {
			return nil, fmt.Errorf("%w %q: the node has no usable InternalIP address (refused: %s)", nodeagent.ErrNoAgent, node, strings.Join(refused, ", "))
		}
		return nil, fmt.Errorf("%w %q: the node has no InternalIP address", nodeagent.ErrNoAgent, node)
	}
	addr := net.JoinHostPort(ip.String(), strconv.Itoa(d.Port))
	d.mu.Lock()
	defer d.mu.Unlock()
	if e, ok := d.clients[node]; ok {
		if e.addr == addr {
			return e.c, nil
		}
		// The node's address changed: its old client goes (its idle connections closed).
		e.c.Close()
		delete(d.clients, node)
	}
	c, err := nodeagent.NewClientWith(addr, d.TLS, d.Options)
	if err != nil {
		return nil, err
	}
	if d.clients == nil {
		d.clients = map[string]nodeClient{}
	}
	d.clients[node] = nodeClient{addr: addr, c: c}
	return c, nil
}

// nodeMissing: node was not found (notFound, the API's error). The first look that
// misses it is remembered; it is gone (notFound wrapped) once a look GoneAfter after that
// one misses it too, and its client is dropped; before, ErrNodeMissing.
func (d *NodeDialer) nodeMissing(node string, notFound error) error {
	goneAfter := d.GoneAfter
	if goneAfter <= 0 {
		goneAfter = DefaultNodeGoneAfter
	}
	now := time.Now()
	d.mu.Lock()
	defer d.mu.Unlock()
	first, seen := d.missing[node]
	if !seen {
		if d.missing == nil {
			d.missing = map[string]time.Time{}
		}
		// Nodes missing long ago and not asked for since are forgotten (a look then
		// starts over): the map holds no more than the nodes asked for in a day.
		for n, t := range d.missing {
			if now.Sub(t) > 24*time.Hour+goneAfter {
				delete(d.missing, n)
			}
		}
		d.missing[node] = now
		first = now
	}
	if missed := now.Sub(first); seen && missed >= goneAfter {
		if e, ok := d.clients[node]; ok {
			e.c.Close()
			delete(d.clients, node)
		}
		return fmt.Errorf("nodeagentdial: node %s: missing for %s (taken as gone after %s): %w", node, missed.Round(time.Second), goneAfter, notFound)
	}
	// notFound's text only: wrapped, the backend would take it for the node gone.
	return fmt.Errorf("%w: node %s: not found for %s, taken as gone only after %s: %s", ErrNodeMissing, node, now.Sub(first).Round(time.Second), goneAfter, notFound.Error())
}

// nodeClient is the cached client of a node's agent and the address it dials.
type nodeClient struct {
	addr string
	c    *nodeagent.Client
}

// nodeInternalIP is the node's first usable InternalIP address (IPv4 before IPv6). A
// Node object's addresses are written by its kubelet (or whoever may update Node status):
// loopback, unspecified, link-local and multicast addresses are refused — dialed, they
// would reach the runner's own host or its link, not the node. refused names those seen.
func nodeInternalIP(n *corev1.Node) (ip netip.Addr, refused []string) {
	var v6 netip.Addr
	for _, a := range n.Status.Addresses {
		if a.Type != corev1.NodeInternalIP {
			continue
		}
		ip, err := netip.ParseAddr(a.Address)
		if err != nil {
			continue
		}
		ip = ip.Unmap()
		if why := unusableAddr(ip); why != "" {
			refused = append(refused, ip.String()+" ("+why+")")
			continue
		}
		if ip.Is4() {
			return ip, refused
		}
		if !v6.IsValid() {
			v6 = ip
		}
	}
	return v6, refused
}

// unusableAddr: why ip is no node's address to dial ("": it is one).
func unusableAddr(ip netip.Addr) string {
	switch {
	case ip.Zone() != "":
		return "zoned"
	case ip.IsLoopback():
		return "loopback"
	case ip.IsUnspecified():
		return "unspecified"
	case ip.IsLinkLocalUnicast():
		return "link-local"
	case ip.IsMulticast():
		return "multicast"
	}
	return ""
}

var _ ClientDialer = (*NodeDialer)(nil)
