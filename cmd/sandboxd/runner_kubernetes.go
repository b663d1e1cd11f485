package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandboxd/sandboxd/internal/install"
	"github.com/sandboxd/sandboxd/internal/nodeagent"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes/nodeagentdial"
	"github.com/sandboxd/sandboxd/internal/stack"
)

// kubernetesFlags configure `sandboxd runner --backend kubernetes`.
type kubernetesFlags struct {
	kubeconfig, namespace, agentImage, pullPolicy string
	peerCIDRs, peerPods, dnsCIDRs                 string
	leaderElect                                   bool
	leaseName, leaseNamespace, identity           string
	leaseDuration                                 time.Duration
	selfDeployment, selfContainer                 string
	diskBytes                                     int64 // from --disk
	helloListen, helloAddr                        string
	openReserved                                  []netip.Prefix // from --egress-allow-reserved
	blobs                                         blobStore      // from --blob-*
	platformRegistry                              string
	insecure                                      []string // from --insecure-registry
	prepullImages, prepullInFlight                int
	warmPods                                      int
	runtimeClasses                                string
	// Host-name egress rules through this runner (--egress-*): see egress().
	egressProxyListen, egressDNSListen string
	egressProxyAddrs, egressDNSAddr    string
	egressForbid                       string
	// egressUpstreamCA and egressRoots: --egress-upstream-ca and --egress-roots (egress
	// secrets' trust; set from the hardening flags).
	egressUpstreamCA, egressRoots string
	// The node agents (--node-agent-*): see nodeAgents().
	nodeAgentPort                   int
	nodeAgentAddrs, nodeAgentTLSDir string
	nodeAgentIssueSecrets           string
	nodeAgentNodeGoneAfter          time.Duration
}

func (k *kubernetesFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&k.platformRegistry, "platform-registry", "", "kubernetes backend: host[:port] of the platform's registry (the gateway's --registry-host): image configs are read from it although it may be on this runner's network (plain HTTP when --insecure-registry names it); the nodes pull its images with the sandbox's pull Secret, so they must reach it too")
	fs.IntVar(&k.prepullImages, "prepull-images", 64, "kubernetes backend: at most this many images of the templates the runner may place are pre-pulled onto every node their sandboxes may run on (0: no pre-pull; needs `list` on nodes)")
	fs.IntVar(&k.prepullInFlight, "prepull-in-flight", 4, "kubernetes backend: at most this many pre-pull Pods at once")
	fs.IntVar(&k.warmPods, "warm-pods", 8, "kubernetes backend: at most this many warm Pods for the templates' warm pools in total (each holds its resource requests on a node while it waits; 0: none)")
	fs.StringVar(&k.runtimeClasses, "runtime-classes", "", "kubernetes backend: the runtime classes the runner offers, comma-separated class=RuntimeClass pairs (an empty RuntimeClass: the cluster's default runtime), runc among them: 'runc=,gvisor=gvisor' runs gvisor sandboxes as Pods of RuntimeClass gvisor (gVisor's containerd shim on the nodes: deploy/README.md). Default: runc only")
	fs.StringVar(&k.kubeconfig, "kubeconfig", "", "kubernetes backend: kubeconfig file (default: the in-cluster configuration)")
	fs.StringVar(&k.namespace, "namespace", "sandboxd", "kubernetes backend: namespace of the sandbox Pods")
	fs.StringVar(&k.agentImage, "agent-image", "", "kubernetes backend: image holding /sandbox-agent and /sandbox-gate (scripts/build-runner-image.sh builds one)")
	fs.StringVar(&k.pullPolicy, "image-pull-policy", "IfNotPresent", "kubernetes backend: imagePullPolicy of the sandbox and agent images (Always, IfNotPresent, Never)")
	fs.StringVar(&k.peerCIDRs, "runner-peer-cidrs", "", "kubernetes backend: comma-separated CIDRs the runner reaches sandboxes from (their NetworkPolicies let them in)")
	fs.StringVar(&k.peerPods, "runner-peer-pods", "", "kubernetes backend: the runner's Pod labels, k=v,… (in $POD_NAMESPACE, else --namespace): sandboxes' NetworkPolicies let those Pods in")
	fs.StringVar(&k.dnsCIDRs, "dns-cidrs", "", "kubernetes backend: comma-separated CIDRs of the cluster DNS that sandboxes may always query (default: the kube-system namespace)")
	fs.StringVar(&k.helloListen, "hello-listen", "", "kubernetes backend: UDP host:port where the runner takes its sandboxes' gate hellos, so it dials a new sandbox's agent without waiting for the kubelet's status (~1 s); with --hello-addr (docs/hardening.md)")
	fs.StringVar(&k.helloAddr, "hello-addr", "", "kubernetes backend: IP:port the sandboxes' gates send hellos to (this runner as the Pods reach it; $POD_IP expands in the host part, an IPv6 one too: '$POD_IP:7444'); sandbox NetworkPolicies allow UDP to it")
	fs.BoolVar(&k.leaderElect, "leader-elect", false, "kubernetes backend: hold a coordination.k8s.io Lease before acting, so two replicas never act at once")
	fs.StringVar(&k.leaseName, "leader-elect-lease", "sandboxd-runner", "kubernetes backend: name of the Lease")
	fs.StringVar(&k.leaseNamespace, "leader-elect-namespace", "", "kubernetes backend: namespace of the Lease (default $POD_NAMESPACE, else --namespace)")
	fs.StringVar(&k.identity, "leader-elect-identity", "", "kubernetes backend: this replica's identity in the Lease (default $POD_NAME, else host name and PID)")
	fs.StringVar(&k.selfDeployment, "self-deployment", "", "kubernetes backend: the runner's own Deployment (in $POD_NAMESPACE, else --namespace); the control plane's :applyAvailableUpdate sets its image tag to the desired version")
	fs.StringVar(&k.selfContainer, "self-container", "runner", "kubernetes backend: the runner's container in --self-deployment")
	fs.StringVar(&k.egressProxyListen, "egress-proxy-listen", "", "kubernetes backend: TCP host:port where the runner's egress proxy serves its sandboxes' host-name egress rules (e.g. 0.0.0.0:15443); with --egress-dns-listen, --egress-proxy-addr and --egress-dns-addr, and --runner-peer-pods or --runner-peer-cidrs (docs/network.md)")
	fs.StringVar(&k.egressDNSListen, "egress-dns-listen", "", "kubernetes backend: UDP and TCP host:port where the runner's DNS serves the sandboxes with host-name rules (e.g. 0.0.0.0:5353)")
	fs.StringVar(&k.egressProxyAddrs, "egress-proxy-addr", "", "kubernetes backend: the IP(s), comma-separated (one per family), where sandbox Pods reach the egress proxy on port 443 (the egress Service's ClusterIPs); the runner's DNS answers granted names with them")
	fs.StringVar(&k.egressDNSAddr, "egress-dns-addr", "", "kubernetes backend: the IP where sandbox Pods reach the runner's DNS on port 53 (the egress Service's ClusterIP): their only nameserver")
	fs.StringVar(&k.egressForbid, "egress-forbid", "", "kubernetes backend: comma-separated CIDRs the egress proxy never dials for a sandbox besides the platform's reserved ranges (the cluster's Service and Pod ranges when they are not private)")
	fs.IntVar(&k.nodeAgentPort, "node-agent-port", 0, "kubernetes backend: the node agents (sandboxd node-agent, docs/nodeagent.md) listen on their node's InternalIP at this port: pause and resume of gvisor sandboxes checkpoint through the agent of the sandbox's node (needs get on nodes; with --node-agent-tls-dir; 0 and no --node-agent-addrs: pause is refused)")
	fs.StringVar(&k.nodeAgentAddrs, "node-agent-addrs", "", "kubernetes backend: instead of --node-agent-port, a static map of the node agents: comma-separated node=host:port pairs (fixed deployments, tests)")
	fs.DurationVar(&k.nodeAgentNodeGoneAfter, "node-agent-node-gone-after", 0, "kubernetes backend, with --node-agent-port: a paused sandbox's node that the API server does not know is taken as gone with its checkpoint (the resume ends the sandbox CheckpointLost) only when it is still missing this long after a look first missed it; before, the resume fails and may be retried (0: 5m)")
	fs.StringVar(&k.nodeAgentTLSDir, "node-agent-tls-dir", "", "kubernetes backend: the runner's mTLS to its node agents: tls.crt and tls.key (its client certificate, naming spiffe://sandboxd/node-agent-client/<runner-id>; re-read when renewed) and ca.crt (the CA of the agents' certificates for "+nodeagent.ServerName+")")
	fs.StringVar(&k.nodeAgentIssueSecrets, "node-agent-issue-secrets", "", "kubernetes backend: instead of --node-agent-tls-dir, the runner issues its node agents' certificates itself and keeps them in two Secrets of $POD_NAMESPACE (else --namespace): PREFIX-ca (its node-agent CA, only the runner reads it) and PREFIX-server (kubernetes.io/tls with ca.crt: what the agents mount as their --tls-dir), made or loaded and checked at start, re-issued when not this runner's or within 30 days of their end (checked hourly); its own client certificate is issued in memory (needs create on Secrets and get, update on the two)")
	fs.DurationVar(&k.leaseDuration, "leader-elect-lease-duration", 15*time.Second, "kubernetes backend: how long a Lease lasts without renewal (a new replica takes over after at most this)")
}

// acquireLease holds the runner's Lease (--leader-elect) or returns nil.
func (k *kubernetesFlags) acquireLease(ctx context.Context, log *slog.Logger) (*stack.Lease, error) {
	if !k.leaderElect {
		return nil, nil
	}
	ns := firstNonEmpty(k.leaseNamespace, os.Getenv("POD_NAMESPACE"), k.namespace)
	id := k.identity
	if id == "" {
		host, _ := os.Hostname()
		id = firstNonEmpty(os.Getenv("POD_NAME"), host+"-"+strconv.Itoa(os.Getpid()))
	}
	return stack.AcquireLease(ctx, stack.LeaseConfig{
		Kubeconfig: k.kubeconfig, Namespace: ns, Name: k.leaseName, Identity: id,
		LeaseDuration: k.leaseDuration, Logger: log,
	})
}

func firstNonEmpty(ss ...string) string {
	for _, s := range ss {
		if s != "" {
			return s
		}
	}
	return ""
}

// cidrPeers turns a comma-separated list of CIDRs into NetworkPolicy peers.
func cidrPeers(flagName, list string) ([]networkingv1.NetworkPolicyPeer, error) {
	var peers []networkingv1.NetworkPolicyPeer
	for c := range strings.SplitSeq(list, ",") {
		if c = strings.TrimSpace(c); c == "" {
			continue
		}
		p, err := netip.ParsePrefix(c)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", flagName, err)
		}
		peers = append(peers, networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: p.Masked().String()}})
	}
	return peers, nil
}

// runnerPeers turns --runner-peer-cidrs and --runner-peer-pods into NetworkPolicy peers.
func (k *kubernetesFlags) runnerPeers() ([]networkingv1.NetworkPolicyPeer, error) {
	peers, err := cidrPeers("--runner-peer-cidrs", k.peerCIDRs)
	if err != nil {
		return nil, err
	}
	if strings.TrimSpace(k.peerPods) != "" {
		sel, err := metav1.ParseToLabelSelector(k.peerPods)
		if err != nil {
			return nil, fmt.Errorf("--runner-peer-pods: %w", err)
		}
		ns := firstNonEmpty(os.Getenv("POD_NAMESPACE"), k.namespace)
		peers = append(peers, networkingv1.NetworkPolicyPeer{
			PodSelector:       sel,
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: ns}},
		})
	}
	return peers, nil
}

// validate checks the flags of the kubernetes backend.
func (k kubernetesFlags) validate() error {
	if k.agentImage == "" {
		return fmt.Errorf("--backend kubernetes needs --agent-image")
	}
	switch p := corev1.PullPolicy(k.pullPolicy); p {
	case corev1.PullAlways, corev1.PullIfNotPresent, corev1.PullNever:
	default:
		return fmt.Errorf("--image-pull-policy %q: want Always, IfNotPresent or Never", k.pullPolicy)
	}
	if r := k.platformRegistry; r != "" && (strings.ContainsAny(r, "/ @") || strings.Contains(r, "://")) {
		return fmt.Errorf("--platform-registry %q: want host[:port]", r)
	}
	if _, err := cidrPeers("--runner-peer-cidrs", k.peerCIDRs); err != nil {
		return err
	}
	if strings.TrimSpace(k.peerPods) != "" {
		if _, err := metav1.ParseToLabelSelector(k.peerPods); err != nil {
			return fmt.Errorf("--runner-peer-pods: %w", err)
		}
	}
	if k.prepullImages < 0 || k.prepullImages > 1024 {
		return fmt.Errorf("--prepull-images %d: want 0..1024", k.prepullImages)
	}
	if k.warmPods < 0 || k.warmPods > 256 {
		return fmt.Errorf("--warm-pods %d: want 0..256", k.warmPods)
	}
	if k.prepullInFlight < 0 || k.prepullInFlight > 64 {
		return fmt.Errorf("--prepull-in-flight %d: want 1..64 (0: the default, 4)", k.prepullInFlight)
	}
	if (k.helloListen == "") != (k.helloAddr == "") {
		return fmt.Errorf("--hello-listen and --hello-addr go together")
	}
	if _, err := k.runtimeClassMap(); err != nil {
		return err
	}
	if _, err := k.egress(); err != nil {
		return err
	}
	if _, err := k.nodeAgents(); err != nil {
		return err
	}
	_, err := cidrPeers("--dns-cidrs", k.dnsCIDRs)
	return err
}

// nodeAgents reads the --node-agent-* flags (validated; the runner ID is the stack's).
func (k *kubernetesFlags) nodeAgents() (nodeagentdial.DialConfig, error) {
	addrs, err := nodeagentdial.ParseAddrs(k.nodeAgentAddrs)
	if err != nil {
		return nodeagentdial.DialConfig{}, err
	}
	c := nodeagentdial.DialConfig{Port: k.nodeAgentPort, Addrs: addrs, TLSDir: k.nodeAgentTLSDir, NodeGoneAfter: k.nodeAgentNodeGoneAfter}
	if k.nodeAgentIssueSecrets != "" {
		ca, server := nodeagentdial.IssueSecretNames(k.nodeAgentIssueSecrets)
		c.Issue = &nodeagentdial.IssueConfig{Namespace: firstNonEmpty(os.Getenv("POD_NAMESPACE"), k.namespace), CASecret: ca, ServerSecret: server}
	}
	if err := c.Validate(); err != nil {
		return nodeagentdial.DialConfig{}, err
	}
	return c, nil
}

// start starts the kubernetes backend (validated).
func (k *kubernetesFlags) start(ctx context.Context, runnerID, dataDir string, log *slog.Logger) (*stack.KubernetesStack, error) {
	peers, err := k.runnerPeers()
	if err != nil {
		return nil, err
	}
	dns, err := cidrPeers("--dns-cidrs", k.dnsCIDRs)
	if err != nil {
		return nil, err
	}
	helloAddr := ""
	if k.helloAddr != "" {
		if helloAddr, err = expandHelloAddr(k.helloAddr, os.Getenv); err != nil {
			return nil, err
		}
	}
	classes, err := k.runtimeClassMap()
	if err != nil {
		return nil, err
	}
	eg, err := k.egress()
	if err != nil {
		return nil, err
	}
	agents, err := k.nodeAgents()
	if err != nil {
		return nil, err
	}
	return stack.NewKubernetes(ctx, stack.KubernetesConfig{
		Kubeconfig: k.kubeconfig, Namespace: k.namespace, RunnerID: runnerID, AgentImage: k.agentImage,
		ImagePullPolicy: corev1.PullPolicy(k.pullPolicy), DataDir: dataDir, Logger: log,
		RunnerPeers: peers, DNSPeers: dns, DiskBytes: k.diskBytes, OpenReserved: k.openReserved,
		Blobs: k.blobs.store, BlobConfig: k.blobs.cfg, SnapshotsPerSandbox: k.blobs.perSandbox, SnapshotsPerRunner: k.blobs.perRunner,
		PlatformRegistry: k.platformRegistry, PlatformRegistryHTTP: k.platformRegistry != "" && slices.Contains(k.insecure, k.platformRegistry),
		MaxPrepull: prepullBound(k.prepullImages), PrepullInFlight: k.prepullInFlight, MaxWarm: prepullBound(k.warmPods),
		HelloListen: k.helloListen, HelloAddr: helloAddr, RuntimeClasses: classes,
		Egress: eg, NodeAgents: agents,
	})
}

// runtimeClassMap reads --runtime-classes ("" = nil: runc only) as the chart and the
// installer check it (install.ParseRuntimeClasses: class=RuntimeClass pairs, each class
// once, runc among them, at most install.MaxRuntimeClasses; names as Kubernetes takes them).
func (k *kubernetesFlags) runtimeClassMap() (map[string]string, error) {
	m, err := install.ParseRuntimeClasses(k.runtimeClasses)
	if err != nil {
		return nil, fmt.Errorf("--runtime-classes: %w", err)
	}
	return m, nil
}

// egress reads the --egress-* flags: all four or none (nil: host-name rules are refused).
func (k *kubernetesFlags) egress() (*stack.KubernetesEgress, error) {
	set := 0
	for _, v := range []string{k.egressProxyListen, k.egressDNSListen, k.egressProxyAddrs, k.egressDNSAddr} {
		if strings.TrimSpace(v) != "" {
			set++
		}
	}
	switch {
	case set == 0:
		return nil, nil
	case set != 4:
		return nil, fmt.Errorf("--egress-proxy-listen, --egress-dns-listen, --egress-proxy-addr and --egress-dns-addr go together")
	case strings.TrimSpace(k.peerPods) == "" && strings.TrimSpace(k.peerCIDRs) == "":
		return nil, fmt.Errorf("--egress-proxy-listen needs --runner-peer-pods or --runner-peer-cidrs: the sandboxes' NetworkPolicies must name the runner to let them reach its proxy and DNS")
	}
	for _, l := range []struct{ flag, v string }{{"--egress-proxy-listen", k.egressProxyListen}, {"--egress-dns-listen", k.egressDNSListen}} {
		_, port, err := net.SplitHostPort(l.v)
		if n, perr := strconv.Atoi(port); err != nil || perr != nil || n < 1 || n > 65535 {
			return nil, fmt.Errorf("%s %q: want host:port with a port 1..65535", l.flag, l.v)
		}
	}
	eg := &stack.KubernetesEgress{ProxyListen: k.egressProxyListen, DNSListen: k.egressDNSListen,
		UpstreamCAFile: k.egressUpstreamCA, RootsFile: k.egressRoots}
	var v4, v6 int
	for a := range strings.SplitSeq(k.egressProxyAddrs, ",") {
		ip, err := netip.ParseAddr(strings.TrimSpace(a))
		if err != nil {
			return nil, fmt.Errorf("--egress-proxy-addr %q: want IP addresses, one per family: %w", k.egressProxyAddrs, err)
		}
		if err := checkEgressAddr(ip); err != nil {
			return nil, fmt.Errorf("--egress-proxy-addr %q: %w", k.egressProxyAddrs, err)
		}
		if ip = ip.Unmap(); ip.Is4() {
			v4++
		} else {
			v6++
		}
		eg.ProxyAddrs = append(eg.ProxyAddrs, ip)
	}
	if v4 > 1 || v6 > 1 {
		return nil, fmt.Errorf("--egress-proxy-addr %q: at most one address per family", k.egressProxyAddrs)
	}
	ip, err := netip.ParseAddr(strings.TrimSpace(k.egressDNSAddr))
	if err != nil {
		return nil, fmt.Errorf("--egress-dns-addr %q: want an IP address: %w", k.egressDNSAddr, err)
	}
	if err := checkEgressAddr(ip); err != nil {
		return nil, fmt.Errorf("--egress-dns-addr %q: %w", k.egressDNSAddr, err)
	}
	eg.DNSAddr = ip.Unmap()
	for c := range strings.SplitSeq(k.egressForbid, ",") {
		if c = strings.TrimSpace(c); c == "" {
			continue
		}
		p, err := netip.ParsePrefix(c)
		if err != nil {
			return nil, fmt.Errorf("--egress-forbid: %w", err)
		}
		if p.Addr().Is4In6() {
			// The proxy compares unmapped addresses: an IPv4-mapped prefix is its IPv4 one.
			if p.Bits() < 96 {
				return nil, fmt.Errorf("--egress-forbid %q: an IPv4-mapped prefix shorter than /96 mixes families; give the IPv4 and IPv6 ranges apart", c)
			}
			p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
		}
		eg.Forbid = append(eg.Forbid, p.Masked())
	}
	return eg, nil
}

// checkEgressAddr refuses an address the sandbox Pods cannot reach the runner at: the
// unspecified address, loopback (their own), multicast and link-local.
func checkEgressAddr(ip netip.Addr) error {
	ip = ip.Unmap()
	switch {
	case ip.IsUnspecified():
		return errors.New("the unspecified address is no address the sandbox Pods can reach")
	case ip.IsLoopback():
		return errors.New("a loopback address is the sandbox Pod's own, not the runner's")
	case ip.IsMulticast():
		return errors.New("a multicast address")
	case ip.IsLinkLocalUnicast() || ip.IsLinkLocalMulticast():
		return errors.New("a link-local address")
	}
	return nil
}

// expandHelloAddr expands environment variables in --hello-addr's host part only, then
// joins it with the port: "$POD_IP:7444" (or "[$POD_IP]:7444") with an IPv6 POD_IP
// gives "[fd00::5]:7444", not the unparseable "fd00::5:7444". What it gives is checked
// as the backend checks it (kubernetes.ParseHelloAddr: the host an IP, the port 1..65535).
func expandHelloAddr(raw string, getenv func(string) string) (string, error) {
	host, port, err := net.SplitHostPort(raw)
	if err != nil {
		return "", fmt.Errorf("--hello-addr %q: want IP:port ([IPv6]:port for a literal IPv6 address): %w", raw, err)
	}
	to, err := kubernetes.ParseHelloAddr(net.JoinHostPort(os.Expand(host, getenv), port))
	if err != nil {
		return "", fmt.Errorf("--hello-addr %q: %w", raw, err)
	}
	return to.String(), nil
}

// prepullBound turns --prepull-images into kubernetes.Config.MaxPrepull (0 there is the
// default, negative none).
func prepullBound(n int) int {
	if n == 0 {
		return -1
	}
	return n
}
