package runner

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/sandboxd/sandboxd/internal/egress"
	"github.com/sandboxd/sandboxd/internal/reserved"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// Bounds of a sandbox's network rules: each rule becomes firewall entries or policy
// peers, so their number is bounded like every other list a sandbox declares.
const (
	MaxNetworkRules = 100 // per direction
	MaxRulePorts    = 100 // per rule
	MaxRuleExcepts  = 100 // per CIDR
)

// CIDRProblem says what is wrong with a rule's prefix ("" when nothing is): it must be
// an IPv4 or IPv6 prefix in canonical form (no host bits set), and not an IPv4-mapped
// IPv6 prefix, which no IPv4 packet would ever match.
func CIDRProblem(cidr string) string {
	p, err := netip.ParsePrefix(cidr)
	switch {
	case cidr == "":
		return "is required"
	case err != nil:
		return fmt.Sprintf("%q is not an IPv4 or IPv6 prefix such as 203.0.113.0/24 or 2001:db8::/32", cidr)
	case p.Addr().Is4In6():
		return fmt.Sprintf("%q is an IPv4-mapped IPv6 prefix; write the IPv4 prefix instead", cidr)
	case p != p.Masked():
		return fmt.Sprintf("%q has host bits set; did you mean %s?", cidr, p.Masked())
	}
	return ""
}

// ExceptProblem says what is wrong with an exception carved out of cidr (which must be
// valid): canonical, of the same family, and strictly inside it, as Kubernetes'
// ipBlock.except demands too.
func ExceptProblem(cidr, except string) string {
	if why := CIDRProblem(except); why != "" {
		return why
	}
	p, x := netip.MustParsePrefix(cidr), netip.MustParsePrefix(except)
	if p.Addr().Is4() != x.Addr().Is4() || x.Bits() <= p.Bits() || !p.Contains(x.Addr()) {
		return fmt.Sprintf("%s is not strictly inside %s", except, cidr)
	}
	return ""
}

// HostnameProblem says what is wrong with a DNS-name rule's name ("" when nothing is):
// a lowercase host name of at least two labels, written without a trailing dot (as the
// official client checks), or one leftmost wildcard label ("*.example.com", matching
// a.example.com but neither example.com nor a.b.example.com). The structure is the
// egress proxy's own rule (egress.ValidPattern), so whatever is accepted here can be
// enforced there. "*" alone is a policy ceiling, not a grant.
func HostnameProblem(name string) string {
	switch {
	case name == "":
		return "is required"
	case name == "*":
		return `"*" is a policy ceiling, not a sandbox grant; name a host or "*.domain"`
	case strings.HasSuffix(name, "."):
		return fmt.Sprintf("%q is not a host name as the API takes it: drop the trailing dot", name)
	case strings.ToLower(name) != name:
		return fmt.Sprintf("%q is not a host name as the API takes it: write it in lowercase", name)
	}
	if err := egress.ValidPattern(name); err != nil {
		return fmt.Sprintf("%q is not a host name: %v", name, err)
	}
	return ""
}

// PortProblems reports what is wrong with one port range at field (….ports[j]):
// protocol "", tcp, udp or sctp (as lowercase names; the API accepts any case), port
// 1-65535, end_port 0 (a single port) or port..65535.
func PortProblems(field, protocol string, port, end int, add func(field, format string, args ...any)) {
	switch protocol {
	case "", "tcp", "udp", "sctp":
	default:
		add(field+".protocol", "%q is not TCP, UDP or SCTP (unset means TCP)", protocol)
	}
	if port < 1 || port > 65535 {
		add(field+".port", "must be 1-65535, got %d", port)
	}
	if end != 0 && (end < port || end > 65535) {
		add(field+".end_port", "must be 0 (a single port) or between port %d and 65535, got %d", port, end)
	}
}

// DNSPortsProblem says what is wrong with the ports of a DNS-name rule, which grants
// HTTPS only: none, or exactly TCP 443.
func DNSPortsProblem(ports []runtime.PortRange) string {
	if len(ports) == 0 {
		return ""
	}
	p := ports[0]
	if len(ports) == 1 && p.Port == 443 && (p.EndPort == 0 || p.EndPort == 443) && (p.Protocol == "" || p.Protocol == "tcp") {
		return ""
	}
	return "a DNS-name rule grants HTTPS only: leave ports empty or give exactly TCP 443"
}

// ValidateNetwork reports every problem of a sandbox's network rules with fields under
// prefix (e.g. "spec.network."), so a backend is never handed a rule it might read
// differently from what the API accepted.
func ValidateNetwork(prefix string, n *runtime.Network, add func(field, format string, args ...any)) {
	if n == nil {
		return
	}
	ValidateNetworkLists(prefix, n, add)
	for i, r := range n.Egress {
		ValidateEgressRule(fmt.Sprintf("%segress[%d]", prefix, i), r, add)
	}
	for i, r := range n.Ingress {
		ValidateIngressRule(fmt.Sprintf("%singress[%d]", prefix, i), r, add)
	}
}

// ValidateNetworkLists checks the rule lists as a whole: deny flags exclusive with rules
// of their direction, and the number of rules.
func ValidateNetworkLists(prefix string, n *runtime.Network, add func(field, format string, args ...any)) {
	if n.DenyEgress && len(n.Egress) > 0 {
		add(prefix+"deny_egress", "cannot be combined with egress rules: deny_egress allows no egress at all")
	}
	if n.DenyIngress && len(n.Ingress) > 0 {
		add(prefix+"deny_ingress", "cannot be combined with ingress rules: deny_ingress allows no ingress at all")
	}
	if len(n.Egress) > MaxNetworkRules {
		add(prefix+"egress", "at most %d rules, got %d", MaxNetworkRules, len(n.Egress))
	}
	if len(n.Ingress) > MaxNetworkRules {
		add(prefix+"ingress", "at most %d rules, got %d", MaxNetworkRules, len(n.Ingress))
	}
}

// ValidateEgressRule checks one egress rule at field f (….egress[i]).
func ValidateEgressRule(f string, r runtime.EgressRule, add func(field, format string, args ...any)) {
	validateRule(f, r.CIDR, r.Except, r.Tenant, r.Any, r.Ports, add, r.DNSName != "")
	if r.DNSName != "" {
		if why := HostnameProblem(r.DNSName); why != "" {
			add(f+".https_hostname", "%s", why)
		}
		if why := DNSPortsProblem(r.Ports); why != "" {
			add(f+".ports", "%s", why)
		}
	}
	ValidateEgressSecret(f, r, add)
}

// ValidateIngressRule checks one ingress rule at field f (….ingress[i]).
func ValidateIngressRule(f string, r runtime.IngressRule, add func(field, format string, args ...any)) {
	validateRule(f, r.CIDR, r.Except, r.Tenant, r.Any, r.Ports, add, false)
	if r.Tenant == runtime.TenantSandboxNetwork {
		add(f+".tenant", "SANDBOX_NETWORK is not supported for ingress")
	}
}

// validateRule checks what egress and ingress rules share: one destination (dns counts
// for egress), the prefix and its exceptions, the tenant and the ports.
func validateRule(f, cidr string, except []string, tenant string, anyDest bool, ports []runtime.PortRange, add func(string, string, ...any), dns bool) {
	n := 0
	for _, set := range []bool{cidr != "", dns, tenant != "", anyDest} {
		if set {
			n++
		}
	}
	if n != 1 {
		add(f, "set exactly one destination (cidr, https_hostname for egress, tenant or any), got %d", n)
	}
	if cidr != "" {
		if why := CIDRProblem(cidr); why != "" {
			add(f+".cidr", "%s", why)
		} else {
			if len(except) > MaxRuleExcepts {
				add(f+".cidr.except", "at most %d exceptions, got %d", MaxRuleExcepts, len(except))
			}
			for j, x := range except {
				if why := ExceptProblem(cidr, x); why != "" {
					add(fmt.Sprintf("%s.cidr.except[%d]", f, j), "%s", why)
				}
			}
		}
	} else if len(except) > 0 {
		add(f+".cidr.except", "is only allowed with a cidr")
	}
	switch tenant {
	case "", runtime.TenantSameOrg, runtime.TenantSameUser, runtime.TenantSandboxNetwork:
	default:
		add(f+".tenant", "%q is not a tenant scope: use SAME_USER or SAME_ORG", tenant)
	}
	if len(ports) > MaxRulePorts {
		add(f+".ports", "at most %d port ranges, got %d", MaxRulePorts, len(ports))
	}
	for j, p := range ports {
		PortProblems(fmt.Sprintf("%s.ports[%d]", f, j), p.Protocol, p.Port, p.EndPort, add)
	}
}

// supported refuses rules the backend cannot enforce: running the sandbox without them
// would give it other access than it asked for and than its status reports.
func supported(n *runtime.Network, can runtime.Support) error {
	var vs violations
	if n != nil && can.NoEgressSecrets && !can.NoDNSEgress {
		for i, r := range n.Egress {
			if r.Secret != nil {
				vs.add(fmt.Sprintf("spec.network.egress[%d].sandboxd_secret", i),
					"this runner cannot inject egress secrets: it enforces host-name rules but does not terminate the sandbox's TLS to their hosts; use a runner that can")
			}
		}
	}
	if n != nil && can.NoDNSEgress {
		for i, r := range n.Egress {
			if r.Secret != nil {
				vs.add(fmt.Sprintf("spec.network.egress[%d].sandboxd_secret", i),
					"this runner cannot inject egress secrets: its backend (Kubernetes) cannot terminate the sandbox's TLS to put a secret into its requests; use a local runner")
				continue
			}
			if r.DNSName != "" {
				vs.add(fmt.Sprintf("spec.network.egress[%d].https_hostname", i),
					"this runner cannot enforce host-name rules (its backend filters by address only); use a cidr rule or a runner that can")
			}
		}
	}
	return vs.err()
}

// unreserved refuses egress cidr rules that lie wholly inside rs, the ranges no sandbox
// of this runner reaches (link-local and cloud metadata, loopback, RFC 1918, CGNAT, the
// sandbox subnet, the host's addresses, …): such a rule would grant nothing, and asking
// for it is a mistake or a probe. A rule that merely overlaps them (0.0.0.0/0) is
// enforced with the reserved parts cut out.
//
// rs is asked only when n has a cidr rule, and once: the local backend's set holds the
// host's addresses, read from the kernel per call (and the host has a link per running
// sandbox), so creates without cidr rules — most — do not pay for it.
func unreserved(n *runtime.Network, rs func() reserved.Set) error {
	var vs violations
	if n == nil {
		return nil
	}
	var set *reserved.Set
	for i, r := range n.Egress {
		p, err := netip.ParsePrefix(r.CIDR)
		if r.CIDR == "" || err != nil {
			continue
		}
		if set == nil {
			s := rs()
			set = &s
		}
		if set.Covers(p) {
			vs.add(fmt.Sprintf("spec.network.egress[%d].cidr", i),
				"%s lies inside the platform's reserved ranges (link-local and cloud metadata, loopback, private and cluster-internal ranges, the sandbox network, this host), which no sandbox reaches; only the runner's operator can open a range (--egress-allow-reserved)", r.CIDR)
		}
	}
	return vs.err()
}

// checkUnreserved is unreserved with the backend's reserved set, when it has one.
func (r *Runner) checkUnreserved(n *runtime.Network) error {
	rb, ok := r.backend.(runtime.EgressReserver)
	if !ok {
		return nil
	}
	return unreserved(n, rb.ReservedEgress)
}
