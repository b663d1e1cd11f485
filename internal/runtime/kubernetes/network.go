package kubernetes

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/sandboxd/sandboxd/internal/reserved"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes/gate"
)

// Ranges that "the internet" (EgressRule.Any) excludes: the platform's reserved ranges
// (reserved.V4 and V6: cluster-internal RFC 1918, CGNAT and unique-local, loopback,
// link-local where cloud metadata lives, multicast, …), whatever the operator opened.
// NetworkPolicy cannot name the node's own addresses; on most clusters they are inside
// the private ranges.
var (
	internetExceptV4 = prefixStrings(reserved.V4())
	internetExceptV6 = prefixStrings(reserved.V6())
)

// prefixStrings writes ps for NetworkPolicy ipBlocks. IPv4-mapped IPv6 prefixes
// (::ffff:0:0/96) are left out: Kubernetes parses them as IPv4, so the apiserver refuses
// them as exceptions of an IPv6 block ("must be a strict subset of cidr"), and on the wire
// such traffic is IPv4, which the IPv4 exceptions cover.
func prefixStrings(ps []netip.Prefix) []string {
	out := make([]string, 0, len(ps))
	for _, p := range ps {
		if p.Addr().Is4In6() {
			continue
		}
		out = append(out, p.String())
	}
	return out
}

// ReservedEgress is what no sandbox's egress reaches: the reserved ranges but those the
// operator opened (Config.OpenReserved). The runner refuses cidr rules wholly inside
// it; NetworkPolicy ipBlocks get the rest of it as exceptions.
func (b *Backend) ReservedEgress() reserved.Set { return reserved.Egress(b.cfg.OpenReserved) }

var _ runtime.EgressReserver = (*Backend)(nil)

// DefaultDNSPeers is where sandboxes may always send DNS queries: the kube-system
// namespace (the cluster DNS, also when reached through its Service IP, since policies
// apply after the Service's address translation).
func DefaultDNSPeers() []networkingv1.NetworkPolicyPeer {
	return []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{
		MatchLabels: map[string]string{corev1.LabelMetadataName: "kube-system"},
	}}}
}

func networkPolicyName(id string) string { return "sbx-" + id }

// networkPolicyFor translates spec.Network into the sandbox's NetworkPolicy; nil when the
// spec has no Network (specs from before network rules: nothing is enforced). Tenants
// select Pods by label: same_org on the organization, same_user on the hash of the
// creating API key (LabelUser). Rules that NetworkPolicy cannot express are refused
// (ErrInvalidSpec) rather than widened or dropped: a host-name rule needs a proxy that
// reads the TLS server name (Config.Egress: the runner's, reached through one rule for
// its proxy and DNS; without it the runner reports Support.NoDNSEgress), and sandbox
// networks do not exist (the gateway refuses them first).
func (b *Backend) networkPolicyFor(spec *runtime.Spec, lbls map[string]string) (*networkingv1.NetworkPolicy, error) {
	n := spec.Network
	if n == nil {
		return nil, nil
	}
	// tenantPeer selects the Pods of a tenant scope; nil when the sandbox has no such
	// label (no organization, no caller): nobody is "the same" then.
	tenantPeer := func(label string) *networkingv1.NetworkPolicyPeer {
		v := lbls[label]
		if v == "" {
			return nil
		}
		return &networkingv1.NetworkPolicyPeer{PodSelector: &metav1.LabelSelector{
			MatchLabels: map[string]string{LabelManagedBy: ManagedBy, label: v},
		}}
	}
	sameOrg := func() *networkingv1.NetworkPolicyPeer { return tenantPeer(LabelOrg) }
	tenants := map[string]func() *networkingv1.NetworkPolicyPeer{
		runtime.TenantSameOrg:  sameOrg,
		runtime.TenantSameUser: func() *networkingv1.NetworkPolicyPeer { return tenantPeer(LabelUser) },
	}
	np := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: networkPolicyName(spec.ID), Namespace: b.cfg.Namespace, Labels: lbls},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{LabelManagedBy: ManagedBy, LabelSandbox: spec.ID}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
			// Both lists present and possibly empty: an empty list denies that direction.
			Ingress: []networkingv1.NetworkPolicyIngressRule{},
			Egress:  []networkingv1.NetworkPolicyEgressRule{},
		},
	}

	// Ingress. The runner reaches the agent (the gate) and the edge every port.
	if len(b.cfg.RunnerPeers) > 0 {
		np.Spec.Ingress = append(np.Spec.Ingress, networkingv1.NetworkPolicyIngressRule{From: slices.Clone(b.cfg.RunnerPeers)})
	} else {
		// Where the runner is unknown, the gate's port is open to all: the gate accepts
		// only the runner's pinned client certificate, so reaching it grants nothing.
		np.Spec.Ingress = append(np.Spec.Ingress, networkingv1.NetworkPolicyIngressRule{
			Ports: []networkingv1.NetworkPolicyPort{tcpPort(gate.Port)},
		})
	}
	var private, custom []runtime.PortRange
	for _, s := range spec.Services {
		switch strings.ToLower(s.Visibility) {
		case "private":
			private = append(private, runtime.PortRange{Protocol: "tcp", Port: s.Port})
		case "custom":
			custom = append(custom, runtime.PortRange{Protocol: "tcp", Port: s.Port})
		}
	}
	if peer := sameOrg(); peer != nil && len(private) > 0 {
		ports, err := policyPorts(private)
		if err != nil {
			return nil, err
		}
		np.Spec.Ingress = append(np.Spec.Ingress, networkingv1.NetworkPolicyIngressRule{From: []networkingv1.NetworkPolicyPeer{*peer}, Ports: ports})
	}
	if !n.DenyIngress && len(custom) > 0 {
		for i, r := range n.Ingress {
			field := fmt.Sprintf("network.ingress[%d]", i)
			peers, err := peersOf(field, r.CIDR, r.Except, "", r.Tenant, r.Any, tenants, nil)
			if err != nil {
				return nil, err
			}
			// Ingress rules open CUSTOM services only: the rule's ports narrow them.
			ports, err := policyPorts(narrow(custom, r.Ports))
			if err != nil {
				return nil, fmt.Errorf("%w: %s: %w", runtime.ErrInvalidSpec, field, err)
			}
			if len(ports) == 0 || (peers != nil && len(peers) == 0) {
				continue // nothing to open
			}
			np.Spec.Ingress = append(np.Spec.Ingress, networkingv1.NetworkPolicyIngressRule{From: peers, Ports: ports})
		}
	}

	// Egress: DNS always, then the rules.
	dns := b.cfg.DNSPeers
	if dns == nil {
		dns = DefaultDNSPeers()
	}
	udp, tcp := corev1.ProtocolUDP, corev1.ProtocolTCP
	port53 := intstr.FromInt32(53)
	np.Spec.Egress = append(np.Spec.Egress, networkingv1.NetworkPolicyEgressRule{
		To:    slices.Clone(dns),
		Ports: []networkingv1.NetworkPolicyPort{{Protocol: &udp, Port: &port53}, {Protocol: &tcp, Port: &port53}},
	})
	if !n.DenyEgress {
		cut := b.ReservedEgress()
		names := false
		for i, r := range n.Egress {
			field := fmt.Sprintf("network.egress[%d]", i)
			if r.DNSName != "" && b.cfg.Egress != nil {
				// Through the runner's proxy and DNS (egress.go): one rule for them all.
				names = true
				continue
			}
			peers, err := peersOf(field, r.CIDR, r.Except, r.DNSName, r.Tenant, r.Any, tenants, &cut)
			if err != nil {
				return nil, err
			}
			if peers != nil && len(peers) == 0 {
				continue
			}
			ports, err := policyPorts(r.Ports)
			if err != nil {
				return nil, fmt.Errorf("%w: %s: %w", runtime.ErrInvalidSpec, field, err)
			}
			np.Spec.Egress = append(np.Spec.Egress, networkingv1.NetworkPolicyEgressRule{To: peers, Ports: ports})
		}
		if names {
			np.Spec.Egress = append(np.Spec.Egress, b.egressPolicyRule())
		}
	}
	// Last: the gate's hello to the runner (hello.go), UDP to its hello port only, also
	// under deny-all egress (the gate sends it; the sandbox could too, and gains nothing).
	if rule, ok := b.helloEgress(); ok && !spec.Multi() {
		np.Spec.Egress = append(np.Spec.Egress, rule)
	}
	return np, nil
}

// peersOf translates one rule's destination (egress) or source (ingress). An empty,
// non-nil result means the rule selects nobody here (same_org without an organization,
// or an egress cidr wholly inside cut). cut (egress only) is excepted from a cidr's
// ipBlock: the reserved ranges no egress reaches.
func peersOf(field, cidr string, except []string, dnsName, tenant string, anyDest bool,
	tenants map[string]func() *networkingv1.NetworkPolicyPeer, cut *reserved.Set) ([]networkingv1.NetworkPolicyPeer, error) {
	switch {
	case dnsName != "":
		return nil, fmt.Errorf("%w: %s: the host-name rule %q cannot be enforced by the Kubernetes backend (NetworkPolicy has no host names)",
			runtime.ErrInvalidSpec, field, dnsName)
	case anyDest:
		return []networkingv1.NetworkPolicyPeer{
			{IPBlock: &networkingv1.IPBlock{CIDR: "0.0.0.0/0", Except: slices.Clone(internetExceptV4)}},
			{IPBlock: &networkingv1.IPBlock{CIDR: "::/0", Except: slices.Clone(internetExceptV6)}},
		}, nil
	case cidr != "":
		p, err := netip.ParsePrefix(cidr)
		if err != nil {
			return nil, fmt.Errorf("%w: %s: cidr %q: %w", runtime.ErrInvalidSpec, field, cidr, err)
		}
		blk := &networkingv1.IPBlock{CIDR: p.Masked().String()}
		for _, e := range except {
			ep, err := netip.ParsePrefix(e)
			if err != nil {
				return nil, fmt.Errorf("%w: %s: except %q: %w", runtime.ErrInvalidSpec, field, e, err)
			}
			// Kubernetes insists on a strict subset of the block.
			if ep.Addr().Is4() != p.Addr().Is4() || ep.Bits() <= p.Bits() || !p.Contains(ep.Addr()) {
				return nil, fmt.Errorf("%w: %s: except %s is not inside %s", runtime.ErrInvalidSpec, field, e, cidr)
			}
			blk.Except = append(blk.Except, ep.Masked().String())
		}
		if cut != nil {
			if cut.Covers(p) {
				return []networkingv1.NetworkPolicyPeer{}, nil
			}
			if parts := cut.Overlap(p); len(parts) > 0 {
				ex := reserved.NewSet(parts...)
				for _, e := range blk.Except {
					ex = ex.Add(netip.MustParsePrefix(e))
				}
				if ex.Covers(p) {
					return []networkingv1.NetworkPolicyPeer{}, nil
				}
				blk.Except = prefixStrings(ex.Overlap(p))
			}
		}
		return []networkingv1.NetworkPolicyPeer{{IPBlock: blk}}, nil
	case tenants[tenant] != nil:
		if p := tenants[tenant](); p != nil {
			return []networkingv1.NetworkPolicyPeer{*p}, nil
		}
		return []networkingv1.NetworkPolicyPeer{}, nil
	case tenant != "":
		return nil, fmt.Errorf("%w: %s: the tenant rule %q cannot be enforced by the Kubernetes backend (no label selects it)",
			runtime.ErrInvalidSpec, field, tenant)
	}
	return nil, fmt.Errorf("%w: %s: the rule names no destination", runtime.ErrInvalidSpec, field)
}

func tcpPort(p int) networkingv1.NetworkPolicyPort {
	tcp := corev1.ProtocolTCP
	port := intstr.FromInt(p)
	return networkingv1.NetworkPolicyPort{Protocol: &tcp, Port: &port}
}

// policyPorts translates port ranges; none means every port.
func policyPorts(rs []runtime.PortRange) ([]networkingv1.NetworkPolicyPort, error) {
	var out []networkingv1.NetworkPolicyPort
	for _, r := range rs {
		var proto corev1.Protocol
		switch strings.ToLower(r.Protocol) {
		case "", "tcp":
			proto = corev1.ProtocolTCP
		case "udp":
			proto = corev1.ProtocolUDP
		case "sctp":
			proto = corev1.ProtocolSCTP
		default:
			return nil, fmt.Errorf("protocol %q: want tcp, udp or sctp", r.Protocol)
		}
		pp := networkingv1.NetworkPolicyPort{Protocol: &proto}
		switch {
		case r.Port < 0 || r.Port > 65535 || r.EndPort < 0 || r.EndPort > 65535 || (r.EndPort != 0 && r.EndPort < r.Port):
			return nil, fmt.Errorf("port range %d-%d is not within 1-65535", r.Port, r.EndPort)
		case r.Port == 0: // every port of the protocol
		default:
			port := intstr.FromInt(r.Port)
			pp.Port = &port
			if r.EndPort > r.Port {
				end := int32(r.EndPort)
				pp.EndPort = &end
			}
		}
		out = append(out, pp)
	}
	return out, nil
}

// narrow keeps the service ports that some rule range covers (all of them when the rule
// has no ranges).
func narrow(services, rule []runtime.PortRange) []runtime.PortRange {
	if len(rule) == 0 {
		return services
	}
	var out []runtime.PortRange
	for _, s := range services {
		for _, r := range rule {
			proto := strings.ToLower(r.Protocol)
			end := max(r.EndPort, r.Port)
			if (proto == "" || proto == "tcp") && (r.Port == 0 || (s.Port >= r.Port && s.Port <= end)) {
				out = append(out, s)
				break
			}
		}
	}
	return out
}

// createNetworkPolicy creates np (AlreadyExists: replaced, since a spec decides it).
func (b *Backend) createNetworkPolicy(ctx context.Context, np *networkingv1.NetworkPolicy) error {
	api := b.cfg.Client.NetworkingV1().NetworkPolicies(b.cfg.Namespace)
	_, err := api.Create(ctx, np, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		cur, gerr := api.Get(ctx, np.Name, metav1.GetOptions{})
		if gerr != nil {
			return gerr
		}
		np.ResourceVersion = cur.ResourceVersion
		_, err = api.Update(ctx, np, metav1.UpdateOptions{})
	}
	if apierrors.IsInvalid(err) {
		return fmt.Errorf("%w: network policy: %w", runtime.ErrInvalidSpec, err)
	}
	return err
}

// ensureNetworkPolicy restores a recovered sandbox's NetworkPolicy from its persisted
// spec: re-created, owned by the Pod, when missing (deleted behind the runner's back);
// put back when its rules were changed, so the sandbox runs with exactly the rules it
// was given (and that its status reports).
func (b *Backend) ensureNetworkPolicy(ctx context.Context, spec *runtime.Spec, pod *corev1.Pod) error {
	if spec.Network == nil {
		return nil
	}
	np, err := b.networkPolicyFor(spec, b.labels(spec))
	if err != nil {
		return err
	}
	np.OwnerReferences = []metav1.OwnerReference{podOwner(pod)}
	api := b.cfg.Client.NetworkingV1().NetworkPolicies(b.cfg.Namespace)
	cur, err := api.Get(ctx, np.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		b.log.Warn("the sandbox's network policy was missing: re-creating it", "sandbox", spec.ID)
		return b.createNetworkPolicy(ctx, np)
	case err != nil:
		return fmt.Errorf("network policy of %s: %w", spec.ID, err)
	case apiequality.Semantic.DeepEqual(cur.Spec, np.Spec):
		return nil
	}
	b.log.Warn("the sandbox's network policy was changed: restoring it", "sandbox", spec.ID)
	np.ResourceVersion = cur.ResourceVersion
	if _, err := api.Update(ctx, np, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("restore network policy of %s: %w", spec.ID, err)
	}
	return nil
}

func podOwner(pod *corev1.Pod) metav1.OwnerReference {
	return metav1.OwnerReference{APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID}
}
