package stack

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	k8s "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/sandboxd/sandboxd/internal/blob"
	"github.com/sandboxd/sandboxd/internal/blob/blobconfig"
	"github.com/sandboxd/sandboxd/internal/egress"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes/nodeagentdial"
	"github.com/sandboxd/sandboxd/internal/runtime/local/network"
)

// KubernetesConfig configures a runner on the Kubernetes backend.
type KubernetesConfig struct {
	// Kubeconfig is a kubeconfig file; "" = in-cluster configuration.
	Kubeconfig string
	Namespace  string
	RunnerID   string
	AgentImage string
	// ImagePullPolicy; "" = IfNotPresent.
	ImagePullPolicy corev1.PullPolicy
	// RuntimeClasses: see kubernetes.Config.
	RuntimeClasses map[string]string
	// RunnerPeers and DNSPeers: see kubernetes.Config.
	RunnerPeers, DNSPeers []networkingv1.NetworkPolicyPeer
	// DiskBytes and OpenReserved: see kubernetes.Config.
	DiskBytes    int64
	OpenReserved []netip.Prefix
	DataDir      string // the runner's own files (archived logs)
	Retention    time.Duration
	ExpiryGrace  time.Duration
	Logger       *slog.Logger
	// Blobs, BlobConfig and the snapshot limits: see runner.Config (nil: no file-system
	// snapshots).
	Blobs                                   blob.Store
	BlobConfig                              blobconfig.Config
	SnapshotsPerSandbox, SnapshotsPerRunner int
	// PlatformRegistry and PlatformRegistryHTTP: see kubernetes.Config.
	PlatformRegistry     string
	PlatformRegistryHTTP bool
	// MaxPrepull and PrepullInFlight: see kubernetes.Config.
	MaxPrepull, PrepullInFlight int
	// HelloListen and HelloAddr: see kubernetes.Config.
	HelloListen, HelloAddr string
	// MaxWarm: see kubernetes.Config.
	MaxWarm int
	// Egress serves host-name egress rules from this runner (nil: off, and the runner
	// refuses such rules: Support.NoDNSEgress).
	Egress *KubernetesEgress
	// NodeAgents is how the runner reaches the node agents that checkpoint its gvisor
	// sandboxes (pause/resume; none configured: pause is refused with the reason). Its
	// RunnerID is the backend's when empty. A Backend with NodeAgents set keeps its own.
	NodeAgents nodeagentdial.DialConfig
	// Backend, when set, overrides the fields above that configure the backend; Client
	// and Namespace are filled in when empty.
	Backend *kubernetes.Config
}

// KubernetesEgress is the runner's egress proxy and DNS for its sandboxes' host-name
// rules (kubernetes.EgressConfig, docs/network.md "Kubernetes backend"). The
// NetworkPolicy peers are the runner's (KubernetesConfig.RunnerPeers, or the Backend's);
// the ports the policies open are the listen ports (what a Service translates to).
type KubernetesEgress struct {
	// ProxyListen (TCP) and DNSListen (UDP and TCP) are where this process serves, as
	// host:port.
	ProxyListen, DNSListen string
	// ProxyAddrs are what the DNS answers for a granted name (the sandboxes connect to
	// port 443 there); DNSAddr is the sandbox Pods' nameserver (port 53 there).
	ProxyAddrs []netip.Addr
	DNSAddr    netip.Addr
	// Upstreams are the resolvers names are relayed to ("ip:port"; nil: the nameservers
	// of /etc/resolv.conf); Resolver is the proxy's (nil: the system's). Forbidden: see
	// egress.Proxy (nil: the platform's reserved ranges and the host's addresses).
	Upstreams []string
	Resolver  *net.Resolver
	Forbidden func(netip.Addr) bool
	// Forbid are more ranges the proxy never dials (the cluster's Service and Pod ranges
	// when they are not private); with Forbidden nil, the proxy refuses them, the
	// platform's reserved ranges, the host's addresses, and ProxyAddrs and DNSAddr.
	Forbid []netip.Prefix
	// UpstreamCAFile: PEM roots the proxy verifies the hosts it injects egress secrets
	// for against ("": the system roots). RootsFile: the public bundle sandboxes with
	// egress secrets trust besides their own CA ("": the first of
	// egress.DefaultRootsFiles; at most kubernetes.MaxEgressRoots).
	UpstreamCAFile, RootsFile string
}

// egressUpstreams are the resolvers the egress DNS relays to: cfg.Upstreams, else the
// nameservers of resolvConf.
func egressUpstreams(cfg *KubernetesEgress, resolvConf string) []string {
	if cfg.Upstreams != nil {
		return cfg.Upstreams
	}
	var ups []string
	for _, ns := range network.HostNameservers(resolvConf) {
		ups = append(ups, net.JoinHostPort(ns, "53"))
	}
	return ups
}

// egressMaxConns caps a Kubernetes runner's egress proxy connections (all its sandboxes
// together; each has its own cap of 512); egressMaxConnsPerOrg caps one organization's
// sandboxes together, so that one tenant cannot take all.
const (
	egressMaxConns       = 16384
	egressMaxConnsPerOrg = egressMaxConns / 4
)

// EgressAuditFile is the egress secrets' audit log of a Kubernetes runner, in its data
// dir (egress.AuditLog: JSON lines, rotated to EgressAuditFile.1).
const EgressAuditFile = "egress-audit.jsonl"

// KubernetesStack is a runner driving Pods.
type KubernetesStack struct {
	Client  k8s.Interface
	Backend *kubernetes.Backend
	Runner  *runner.Runner
	// Egress serves the sandboxes' host-name rules (nil: off).
	Egress *EgressServers

	stopAgents context.CancelFunc // ends the node agents' background work
}

// EgressServers are a Kubernetes runner's egress proxy and DNS, serving.
type EgressServers struct {
	DNS   *egress.DNS
	Proxy *egress.Proxy
	// ProxyAddr and DNSAddr are where they listen (DNS: UDP and TCP).
	ProxyAddr, DNSAddr string
	closers            []func() error
	wg                 sync.WaitGroup
}

// Close stops the servers and waits for them.
func (e *EgressServers) Close() {
	if e == nil {
		return
	}
	for _, c := range e.closers {
		_ = c()
	}
	e.wg.Wait()
}

// listenEgress opens the egress sockets (before the backend: a taken port fails the start).
func listenEgress(cfg *KubernetesEgress) (e *EgressServers, proxy net.Listener, dnsUDP net.PacketConn, dnsTCP net.Listener, err error) {
	e = &EgressServers{}
	defer func() {
		if err != nil {
			e.Close()
		}
	}()
	if proxy, err = net.Listen("tcp", cfg.ProxyListen); err != nil {
		return nil, nil, nil, nil, fmt.Errorf("stack: egress proxy: %w", err)
	}
	e.closers = append(e.closers, proxy.Close)
	if dnsUDP, err = net.ListenPacket("udp", cfg.DNSListen); err != nil {
		return nil, nil, nil, nil, fmt.Errorf("stack: egress DNS: %w", err)
	}
	e.closers = append(e.closers, dnsUDP.Close)
	// TCP on the port UDP got (the same when the port was given; ":0" picks one).
	tcpAddr := cfg.DNSListen
	if host, port, _ := net.SplitHostPort(cfg.DNSListen); port == "0" {
		_, p, _ := net.SplitHostPort(dnsUDP.LocalAddr().String())
		tcpAddr = net.JoinHostPort(host, p)
	}
	if dnsTCP, err = net.Listen("tcp", tcpAddr); err != nil {
		return nil, nil, nil, nil, fmt.Errorf("stack: egress DNS: %w", err)
	}
	e.closers = append(e.closers, dnsTCP.Close)
	e.ProxyAddr, e.DNSAddr = proxy.Addr().String(), dnsUDP.LocalAddr().String()
	return e, proxy, dnsUDP, dnsTCP, nil
}

func portOf(addr string) int {
	_, p, _ := net.SplitHostPort(addr)
	n, _ := strconv.Atoi(p)
	return n
}

// RESTConfig loads a kubeconfig file, or the in-cluster configuration for "".
func RESTConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig == "" {
		return rest.InClusterConfig()
	}
	return clientcmd.BuildConfigFromFlags("", kubeconfig)
}

// NewKubernetes builds the backend and the runner, and re-adopts the runner's Pods.
func NewKubernetes(ctx context.Context, cfg KubernetesConfig) (*KubernetesStack, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	rc, err := RESTConfig(cfg.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("stack: kubernetes config: %w", err)
	}
	rc.QPS, rc.Burst = 50, 100
	client, err := k8s.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("stack: kubernetes client: %w", err)
	}
	bc := kubernetes.Config{
		Namespace: cfg.Namespace, RunnerID: cfg.RunnerID, AgentImage: cfg.AgentImage,
		ImagePullPolicy: cfg.ImagePullPolicy, RuntimeClasses: cfg.RuntimeClasses, Logger: cfg.Logger,
		RunnerPeers: cfg.RunnerPeers, DNSPeers: cfg.DNSPeers, DiskBytes: cfg.DiskBytes, OpenReserved: cfg.OpenReserved,
		PlatformRegistry: cfg.PlatformRegistry, PlatformRegistryHTTP: cfg.PlatformRegistryHTTP,
		MaxPrepull: cfg.MaxPrepull, PrepullInFlight: cfg.PrepullInFlight, MaxWarm: cfg.MaxWarm,
		HelloListen: cfg.HelloListen, HelloAddr: cfg.HelloAddr,
	}
	if cfg.Backend != nil {
		bc = *cfg.Backend
	}
	if bc.Client == nil {
		bc.Client = client
	}
	// The node agents' background work (the issued certificates' checks) ends with the
	// stack (Close) or with a start that fails after it began.
	agentsCtx, stopAgents := context.WithCancel(ctx)
	started := false
	defer func() {
		if !started {
			stopAgents()
		}
	}()
	if bc.NodeAgents == nil && cfg.NodeAgents.Enabled() {
		na := cfg.NodeAgents
		if na.RunnerID == "" {
			na.RunnerID = bc.RunnerID
		}
		if na.Log == nil {
			na.Log = cfg.Logger
		}
		if bc.NodeAgents, err = na.Dialer(agentsCtx, bc.Client); err != nil {
			return nil, fmt.Errorf("stack: node agents: %w", err)
		}
	}
	var (
		eg             *EgressServers
		proxyL, dnsTCP net.Listener
		dnsUDP         net.PacketConn
		ups            []string
		upstreamRoots  *x509.CertPool
	)
	if cfg.Egress != nil {
		ups = egressUpstreams(cfg.Egress, "/etc/resolv.conf")
		if len(ups) == 0 {
			// Every name but the granted ones would get SERVFAIL: refused at the start
			// rather than found out by the sandboxes.
			return nil, errors.New("stack: egress DNS: no upstream nameserver (none given, none in /etc/resolv.conf)")
		}
		if eg, proxyL, dnsUDP, dnsTCP, err = listenEgress(cfg.Egress); err != nil {
			return nil, err
		}
		if upstreamRoots, err = egress.ReadUpstreamRoots(cfg.Egress.UpstreamCAFile); err != nil {
			eg.Close()
			return nil, fmt.Errorf("stack: %w", err)
		}
		roots, err := egress.ReadRoots(cfg.Egress.RootsFile)
		if err != nil {
			eg.Close()
			return nil, fmt.Errorf("stack: egress roots: %w", err)
		}
		peers := bc.RunnerPeers
		bc.Egress = &kubernetes.EgressConfig{
			ProxyAddrs: cfg.Egress.ProxyAddrs, DNSAddr: cfg.Egress.DNSAddr, Peers: peers,
			ProxyPort: portOf(eg.ProxyAddr), DNSPort: portOf(eg.DNSAddr), Roots: roots, RootsFile: cfg.Egress.RootsFile,
		}
	}
	if bc.Namespace == "" {
		bc.Namespace = cfg.Namespace
	}
	if bc.LogDir == "" {
		// Next to the runner's archive: the runner renames a copy into it.
		bc.LogDir = filepath.Join(cfg.DataDir, "runner", "k8s-logs")
	}
	if bc.SnapshotCacheDir == "" {
		// The archives volumes are restored from (used only with a blob store).
		bc.SnapshotCacheDir = filepath.Join(cfg.DataDir, "runner", "k8s-snapshots")
	}
	backend, err := kubernetes.New(ctx, bc)
	if err != nil {
		eg.Close()
		return nil, fmt.Errorf("stack: %w", err)
	}
	if eg != nil {
		log := cfg.Logger.With("component", "egress")
		eg.DNS = &egress.DNS{Upstreams: ups, Log: log, Steer: &egress.Steering{
			Source: backend.EgressSource, Group: backend.EgressGroup, Proxy: cfg.Egress.ProxyAddrs,
		}}
		forbidden := cfg.Egress.Forbidden
		if forbidden == nil {
			extra := slices.Clone(cfg.Egress.Forbid)
			for _, a := range append(slices.Clone(cfg.Egress.ProxyAddrs), cfg.Egress.DNSAddr) {
				extra = append(extra, netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()))
			}
			forbidden = egress.ForbiddenWith(extra...)
		}
		eg.Proxy = &egress.Proxy{Grants: backend.EgressGrants, Known: backend.EgressKnown,
			Resolver: cfg.Egress.Resolver, Forbidden: forbidden, Log: log, MaxConns: egressMaxConns,
			Group: backend.EgressGroup, MaxConnsPerGroup: egressMaxConnsPerOrg,
			// Egress secrets: the proxy terminates a sandbox's TLS to its injection
			// hosts with the sandbox's CA (values and key in this process only), each
			// use audited in the data dir (the runner's volume), as on a local runner.
			Secrets: backend.EgressSecrets, UpstreamRoots: upstreamRoots,
			Audit: &egress.AuditLog{Path: filepath.Join(cfg.DataDir, EgressAuditFile)}}
		// The servers close their connections first, then the sockets go.
		eg.Proxy.Audit.Errorf = func(format string, args ...any) { log.Warn(fmt.Sprintf(format, args...)) }
		eg.closers = append([]func() error{eg.DNS.Close, eg.Proxy.Close}, eg.closers...)
		eg.closers = append(eg.closers, eg.Proxy.Audit.Close)
		eg.wg.Go(func() { _ = eg.DNS.ServeUDP(dnsUDP) })
		eg.wg.Go(func() { _ = eg.DNS.ServeTCP(dnsTCP) })
		eg.wg.Go(func() { _ = eg.Proxy.Serve(proxyL) })
	}
	r, err := runner.New(ctx, runner.Config{
		Backend:     backend,
		DataDir:     filepath.Join(cfg.DataDir, "runner"),
		Retention:   cfg.Retention,
		ExpiryGrace: cfg.ExpiryGrace,
		Logger:      cfg.Logger,
		Blobs:       cfg.Blobs,
		BlobConfig:  cfg.BlobConfig,

		SnapshotsPerSandbox: cfg.SnapshotsPerSandbox,
		SnapshotsPerRunner:  cfg.SnapshotsPerRunner,
	})
	if err != nil {
		eg.Close()
		backend.Close()
		return nil, fmt.Errorf("stack: runner: %w", err)
	}
	started = true
	return &KubernetesStack{Client: client, Backend: backend, Runner: r, Egress: eg, stopAgents: stopAgents}, nil
}

// Close stops following sandboxes; their Pods keep running for the next runner.
func (s *KubernetesStack) Close() {
	s.Runner.Close()
	s.Egress.Close()
	s.Backend.Close()
	if s.stopAgents != nil {
		s.stopAgents()
	}
}
