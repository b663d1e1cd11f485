package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// Host-name egress rules (issue 23; docs/network.md "Kubernetes backend"). NetworkPolicy
// names addresses, never TLS server names, so a sandbox with host-name rules may reach,
// besides its cidr/any/tenant rules, only the runner's egress proxy and the runner's DNS
// (EgressConfig.Peers). Its Pod's only nameserver is the runner's DNS, which answers a
// name its rules grant with the proxy's address (internal/egress steer.go); the proxy
// reads the TLS server name, checks it against the grants of the connection's source
// address, resolves it itself and splices. Both look the source up in the registry
// below: the Pod IPs of this runner's own running sandbox Pods, from the informer. An
// address the registry does not hold is no sandbox: refused.

// EgressConfig turns host-name egress rules on (Config.Egress).
type EgressConfig struct {
	// ProxyAddrs are what the runner's DNS answers for a granted name: where the Pods
	// reach the egress proxy on port 443 (the egress Service's ClusterIPs, one per
	// family). At least one.
	ProxyAddrs []netip.Addr
	// DNSAddr is the Pods' only nameserver (port 53): the runner's DNS.
	DNSAddr netip.Addr
	// Peers select the runner's Pod in the sandboxes' NetworkPolicies (pod and namespace
	// selectors, or its address as an ipBlock); ProxyPort and DNSPort are the ports the
	// traffic arrives at after a Service's translation (what NetworkPolicy sees: the
	// runner's listen ports). At least one peer.
	Peers              []networkingv1.NetworkPolicyPeer
	ProxyPort, DNSPort int
}

func (c *EgressConfig) check() error {
	switch {
	case len(c.ProxyAddrs) == 0:
		return errors.New("no proxy address")
	case !c.DNSAddr.IsValid():
		return errors.New("no DNS address")
	case len(c.Peers) == 0:
		return errors.New("no NetworkPolicy peer for the runner")
	case c.ProxyPort < 1 || c.ProxyPort > 65535 || c.DNSPort < 1 || c.DNSPort > 65535:
		return fmt.Errorf("proxy port %d and DNS port %d: want 1-65535", c.ProxyPort, c.DNSPort)
	}
	for _, a := range c.ProxyAddrs {
		if !a.IsValid() {
			return errors.New("an invalid proxy address")
		}
	}
	return nil
}

// egressSource is one registered source address: the sandbox whose Pod holds it.
type egressSource struct {
	id     string
	uid    types.UID
	org    string // the sandbox's organization: the egress DNS and proxy bound each org's share
	grants []string
}

// hostNameGrants are the spec's dns_name patterns, lower-cased without a trailing dot;
// nil without any (or under deny-all egress, which grants nothing).
func hostNameGrants(spec *runtime.Spec) []string {
	n := spec.Network
	if n == nil || n.DenyEgress {
		return nil
	}
	var out []string
	for _, r := range n.Egress {
		if r.DNSName != "" {
			out = append(out, strings.ToLower(strings.TrimSuffix(r.DNSName, ".")))
		}
	}
	return out
}

// usesEgress: s's spec has host-name rules and the backend serves them.
func (b *Backend) usesEgress(spec *runtime.Spec) bool {
	return b.cfg.Egress != nil && len(hostNameGrants(spec)) > 0
}

// EgressSource returns the host-name patterns granted to the sandbox Pod at src and
// whether src is one (for egress.Steering.Source).
func (b *Backend) EgressSource(src netip.Addr) ([]string, bool) {
	b.egressMu.RLock()
	defer b.egressMu.RUnlock()
	e := b.egressBySrc[src.Unmap()]
	if e == nil {
		return nil, false
	}
	return e.grants, true
}

// EgressGroup returns the organization of the sandbox Pod at src ("" for none or an
// unregistered address), for egress.Steering.Group and egress.Proxy.Group: one
// organization's sandboxes together hold a bounded share of the DNS's and the proxy's
// slots.
func (b *Backend) EgressGroup(src netip.Addr) string {
	b.egressMu.RLock()
	defer b.egressMu.RUnlock()
	if e := b.egressBySrc[src.Unmap()]; e != nil {
		return e.org
	}
	return ""
}

// EgressKnown reports whether src is a registered sandbox Pod (for egress.Proxy.Known).
func (b *Backend) EgressKnown(src netip.Addr) bool {
	_, ok := b.EgressSource(src)
	return ok
}

// EgressGrants returns the host-name patterns granted to the sandbox Pod at src; nil for
// an address that is no registered sandbox (for egress.Proxy.Grants).
func (b *Backend) EgressGrants(src netip.Addr) []string {
	g, _ := b.EgressSource(src)
	return g
}

// egressObserveLocked brings the registry in line with s's Pod as last seen: its IPs are
// registered while the Pod is this runner's, is s's (its UID), and neither ends nor is
// being deleted; they are removed at the first sign of its end, and an IP that changed
// is replaced. Called with b.mu held, on every informer event (evaluateLocked).
func (b *Backend) egressObserveLocked(s *sandbox) {
	if b.cfg.Egress == nil {
		return
	}
	var want []netip.Addr
	grants := hostNameGrants(&s.spec)
	p := s.pod
	live := len(grants) > 0 && p != nil && s.uid != "" && p.UID == s.uid && !s.deleted && !s.egressOff &&
		p.DeletionTimestamp == nil && !podEnded(p) &&
		p.Labels[LabelManagedBy] == ManagedBy && p.Labels[LabelRunner] == b.cfg.RunnerID && p.Labels[LabelSandbox] == s.id
	if live {
		select {
		case <-s.done:
			live = false // the sandbox has ended (a writer's Pod outlives its workload)
		default:
		}
	}
	if live {
		ips := p.Status.PodIPs
		if len(ips) == 0 && p.Status.PodIP != "" {
			ips = []corev1.PodIP{{IP: p.Status.PodIP}}
		}
		for _, ip := range ips {
			if a, err := netip.ParseAddr(ip.IP); err == nil && !slices.Contains(want, a.Unmap()) {
				want = append(want, a.Unmap())
			}
		}
	}
	if slices.Equal(want, s.egressIPs) {
		return
	}
	b.egressMu.Lock()
	defer b.egressMu.Unlock()
	for _, a := range s.egressIPs {
		if e := b.egressBySrc[a]; e != nil && e.id == s.id && e.uid == s.uid && !slices.Contains(want, a) {
			delete(b.egressBySrc, a)
		}
	}
	for _, a := range want {
		b.egressBySrc[a] = &egressSource{id: s.id, uid: s.uid, org: s.spec.Meta[runtime.MetaOrg], grants: grants}
	}
	s.egressIPs = want
}

// egressForgetLocked removes s's addresses (before the backend deletes its Pod).
func (b *Backend) egressForgetLocked(s *sandbox) {
	if len(s.egressIPs) == 0 {
		return
	}
	b.egressMu.Lock()
	defer b.egressMu.Unlock()
	for _, a := range s.egressIPs {
		if e := b.egressBySrc[a]; e != nil && e.id == s.id && e.uid == s.uid {
			delete(b.egressBySrc, a)
		}
	}
	s.egressIPs = nil
}

// waitEgress waits until s's Pod has an address in the egress registry (at most the
// start timeout), so that its workload's first query is answered; at once for a
// sandbox without host-name rules.
func (b *Backend) waitEgress(ctx context.Context, s *sandbox) error {
	if !b.usesEgress(&s.spec) {
		return nil
	}
	timeout := time.NewTimer(b.cfg.StartTimeout)
	defer timeout.Stop()
	for {
		b.mu.Lock()
		ok, changed := len(s.egressIPs) > 0, s.changed
		b.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-changed:
		case <-s.done:
			return errors.New("the Pod ended before its address was known for its host-name egress rules")
		case <-timeout.C:
			return errors.New("the Pod's address was not reported in time for its host-name egress rules")
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// egressPolicyRule is the NetworkPolicy egress rule of a sandbox with host-name rules:
// the runner's proxy (TCP) and DNS (UDP and TCP), nothing else.
func (b *Backend) egressPolicyRule() networkingv1.NetworkPolicyEgressRule {
	e := b.cfg.Egress
	udp, tcp := corev1.ProtocolUDP, corev1.ProtocolTCP
	proxy, dns := intstr.FromInt(e.ProxyPort), intstr.FromInt(e.DNSPort)
	return networkingv1.NetworkPolicyEgressRule{
		To: slices.Clone(e.Peers),
		Ports: []networkingv1.NetworkPolicyPort{
			{Protocol: &tcp, Port: &proxy}, {Protocol: &udp, Port: &dns}, {Protocol: &tcp, Port: &dns},
		},
	}
}

// checkEgress refuses what host-name rules cannot do here yet: egress secrets (the proxy
// does not inject on this backend), and a container that adds NET_RAW (raw sockets
// could forge another Pod's source address, which is what the grants are keyed by).
func (b *Backend) checkEgress(spec *runtime.Spec) error {
	if spec.Network == nil {
		return b.checkNetRaw(spec)
	}
	for i, r := range spec.Network.Egress {
		if r.Secret != nil {
			return fmt.Errorf("%w: network.egress[%d].sandboxd_secret: Kubernetes runners do not inject egress secrets yet; use a local runner", runtime.ErrInvalidSpec, i)
		}
	}
	return b.checkNetRaw(spec)
}

// checkNetRaw refuses CAP_NET_RAW in any container of any spec on a runner that serves
// host-name rules (Config.Egress), whether or not this spec has such rules: the grants
// are keyed by source address, and raw sockets in any of this runner's Pods could forge
// a registered Pod's address on a CNI without anti-spoofing.
func (b *Backend) checkNetRaw(spec *runtime.Spec) error {
	if b.cfg.Egress == nil {
		return nil
	}
	for _, c := range spec.AllContainers() {
		if c.Security != nil && (slices.Contains(c.Security.CapAdd, "CAP_NET_RAW") || slices.Contains(c.Security.CapAdd, "ALL") || slices.Contains(c.Security.CapAdd, "CAP_ALL")) {
			return fmt.Errorf("%w: container %q: security.cap_add: CAP_NET_RAW is not allowed on Kubernetes runners that serve host-name egress rules (raw sockets could forge another sandbox's address)", runtime.ErrInvalidSpec, c.ContainerName())
		}
	}
	return nil
}

// applyEgressPod drops NET_RAW in every container of every sandbox Pod of a runner that
// serves host-name rules, and gives the Pod of a sandbox with such rules the runner's
// DNS as its only nameserver (no search domains, ndots 1: a name is looked up as it
// is). Pods without host-name rules keep the cluster's DNS.
func (b *Backend) applyEgressPod(pod *corev1.Pod, spec *runtime.Spec) {
	if b.cfg.Egress == nil {
		return
	}
	// Every sandbox Pod of a runner serving host-name rules, with such rules or not:
	// none may forge a registered Pod's address with a raw socket.
	for _, cs := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for i := range cs {
			dropNetRaw(&cs[i])
		}
	}
	if !b.usesEgress(spec) {
		return
	}
	pod.Spec.DNSPolicy = corev1.DNSNone
	pod.Spec.DNSConfig = &corev1.PodDNSConfig{
		Nameservers: []string{b.cfg.Egress.DNSAddr.String()},
		Options:     []corev1.PodDNSConfigOption{{Name: "ndots", Value: ptr("1")}},
	}
}

func dropNetRaw(c *corev1.Container) {
	if c.SecurityContext == nil {
		c.SecurityContext = &corev1.SecurityContext{}
	}
	if c.SecurityContext.Capabilities == nil {
		c.SecurityContext.Capabilities = &corev1.Capabilities{}
	}
	caps := c.SecurityContext.Capabilities
	caps.Add = slices.DeleteFunc(caps.Add, func(c corev1.Capability) bool { return c == "NET_RAW" || c == "ALL" })
	if !slices.Contains(caps.Drop, "ALL") && !slices.Contains(caps.Drop, "NET_RAW") {
		caps.Drop = append(caps.Drop, "NET_RAW")
	}
}
