package spec

import (
	"fmt"
	"strconv"
	"strings"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

const networkField = "sandbox.spec.network."

// ToNetwork turns the wire network options into the rules a backend enforces, always
// non-nil (no options: no rules, which the policy resolution has already filled with the
// defaults when the spec is a resolved one). It returns the shape problems as field
// violations, every one at once, and the features this sandboxd cannot enforce.
//
// The rules are kept as given except for case: host names and protocols are lowercased
// (both are case-insensitive). Prefixes must already be canonical: a prefix with host
// bits set is refused rather than masked, so that what the status echoes is what the
// caller wrote.
func ToNetwork(n *sandboxv1.NetworkOptions) (*runtime.Network, []apierr.Violation, []string) {
	var (
		vs          []apierr.Violation
		unsupported []string
	)
	add := func(field, format string, args ...any) {
		vs = append(vs, apierr.Violation{Field: field, Description: fmt.Sprintf(format, args...)})
	}
	out := &runtime.Network{DenyEgress: n.GetDenyEgress(), DenyIngress: n.GetDenyIngress()}
	// A rule whose one destination is present but empty would read as "no destination":
	// it gets its own message instead (empty), and selectors are refused as unsupported
	// rather than checked (skip).
	empty := map[int]string{} // field suffix
	const (
		emptyCIDR = ".cidr"
		emptyHost = ".https_hostname"
	)
	skip := map[int]bool{}
	for i, r := range n.GetEgress() {
		rule := runtime.EgressRule{Ports: toPortRanges(r.GetPorts())}
		switch d := r.GetDestination().(type) {
		case *sandboxv1.EgressRule_Cidr:
			rule.CIDR, rule.Except = d.Cidr.GetCidr(), d.Cidr.GetExcept()
			if rule.CIDR == "" {
				empty[i] = emptyCIDR
			}
		case *sandboxv1.EgressRule_HttpsHostname:
			rule.DNSName = strings.ToLower(d.HttpsHostname)
			if rule.DNSName == "" {
				empty[i] = emptyHost
			}
			// A DNS-name rule grants TCP 443; an explicit 443 says nothing more.
			if runner.DNSPortsProblem(rule.Ports) == "" {
				rule.Ports = nil
			}
		case *sandboxv1.EgressRule_Tenant:
			rule.Tenant = tenantOf(d.Tenant)
			if d.Tenant == sandboxv1.TenantScope_TENANT_SCOPE_SANDBOX_NETWORK {
				unsupported = append(unsupported, "egress to tenant SANDBOX_NETWORK (sandbox networks)")
			}
		case *sandboxv1.EgressRule_Any:
			rule.Any = d.Any
		case *sandboxv1.EgressRule_Selector:
			unsupported = append(unsupported, "egress selector rules")
			skip[i] = true
		}
		if sec := r.GetSandboxdSecret(); sec != nil {
			rule.Secret = &runtime.EgressSecret{Store: sec.GetStoreName(), Path: sec.GetPath(), Field: sec.GetField(), Header: sec.GetHeader(), EnvVar: sec.GetEnvVar()}
		}
		out.Egress = append(out.Egress, rule)
	}
	emptyIn := map[int]bool{}
	for i, r := range n.GetIngress() {
		rule := runtime.IngressRule{Ports: toPortRanges(r.GetPorts())}
		switch d := r.GetSource().(type) {
		case *sandboxv1.IngressRule_Cidr:
			rule.CIDR, rule.Except = d.Cidr.GetCidr(), d.Cidr.GetExcept()
			emptyIn[i] = rule.CIDR == ""
		case *sandboxv1.IngressRule_Tenant:
			rule.Tenant = tenantOf(d.Tenant)
		case *sandboxv1.IngressRule_Any:
			rule.Any = d.Any
		}
		out.Ingress = append(out.Ingress, rule)
	}
	runner.ValidateNetworkLists(networkField, out, add)
	for i, r := range out.Egress {
		f := fmt.Sprintf("%segress[%d]", networkField, i)
		switch {
		case empty[i] == emptyCIDR:
			add(f+emptyCIDR, "is required: a prefix such as 203.0.113.0/24")
		case empty[i] == emptyHost:
			add(f+emptyHost, "is required: a host such as example.com or *.example.com")
		case !skip[i]:
			runner.ValidateEgressRule(f, r, add)
		}
		if len(n.GetEgress()[i].GetHttpsHostnameExcept()) > 0 {
			add(f+".https_hostname_except", "host-name exceptions exist only in runner policies, not in a sandbox's rules")
		}
	}
	for i, r := range out.Ingress {
		f := fmt.Sprintf("%singress[%d]", networkField, i)
		if emptyIn[i] {
			add(f+".cidr", "is required: a prefix such as 203.0.113.0/24")
			continue
		}
		runner.ValidateIngressRule(f, r, add)
	}
	switch m := n.GetDnsEgress(); m {
	case sandboxv1.DNSEgressMode_DNS_EGRESS_MODE_UNSPECIFIED, sandboxv1.DNSEgressMode_DNS_EGRESS_MODE_ALLOW:
	case sandboxv1.DNSEgressMode_DNS_EGRESS_MODE_DENY:
		// The platform resolver is what host-name rules and deny_egress rely on.
		unsupported = append(unsupported, "dns_egress DENY (the platform DNS always answers)")
	default:
		add(networkField+"dns_egress", "unknown mode %d: use DNS_EGRESS_MODE_ALLOW or leave it unset", m)
	}
	return out, vs, unsupported
}

// tenantOf is the runtime name of a tenant scope; an unset or unknown scope keeps a
// name the validator reports ("unspecified", "7").
func tenantOf(t sandboxv1.TenantScope) string {
	switch t {
	case sandboxv1.TenantScope_TENANT_SCOPE_SAME_ORG:
		return runtime.TenantSameOrg
	case sandboxv1.TenantScope_TENANT_SCOPE_SAME_USER:
		return runtime.TenantSameUser
	case sandboxv1.TenantScope_TENANT_SCOPE_SANDBOX_NETWORK:
		return runtime.TenantSandboxNetwork
	case sandboxv1.TenantScope_TENANT_SCOPE_UNSPECIFIED:
		return "unspecified"
	}
	return strconv.Itoa(int(t))
}

func tenantToProto(t string) sandboxv1.TenantScope {
	switch t {
	case runtime.TenantSameOrg:
		return sandboxv1.TenantScope_TENANT_SCOPE_SAME_ORG
	case runtime.TenantSameUser:
		return sandboxv1.TenantScope_TENANT_SCOPE_SAME_USER
	case runtime.TenantSandboxNetwork:
		return sandboxv1.TenantScope_TENANT_SCOPE_SANDBOX_NETWORK
	}
	return sandboxv1.TenantScope_TENANT_SCOPE_UNSPECIFIED
}

func toPortRanges(ps []*sandboxv1.PortRange) []runtime.PortRange {
	var out []runtime.PortRange
	for _, p := range ps {
		out = append(out, runtime.PortRange{Protocol: strings.ToLower(p.GetProtocol()), Port: int(p.GetPort()), EndPort: int(p.GetEndPort())})
	}
	return out
}

func portsToProto(ps []runtime.PortRange) []*sandboxv1.PortRange {
	var out []*sandboxv1.PortRange
	for _, p := range ps {
		out = append(out, &sandboxv1.PortRange{Protocol: strings.ToUpper(p.Protocol), Port: int32(p.Port), EndPort: int32(p.EndPort)})
	}
	return out
}

func cidrToProto(cidr string, except []string) *sandboxv1.CidrBlock {
	return &sandboxv1.CidrBlock{Cidr: cidr, Except: append([]string(nil), except...)}
}

// EffectiveNetwork renders enforced rules for SandboxStatus.effective_egress and
// effective_ingress: exactly what the backend was given, none under a deny flag.
func EffectiveNetwork(n *runtime.Network) (egress []*sandboxv1.EgressRule, ingress []*sandboxv1.IngressRule) {
	if n == nil {
		return nil, nil
	}
	for _, r := range n.Egress {
		w := &sandboxv1.EgressRule{Ports: portsToProto(r.Ports)}
		switch {
		case r.CIDR != "":
			w.Destination = &sandboxv1.EgressRule_Cidr{Cidr: cidrToProto(r.CIDR, r.Except)}
		case r.DNSName != "":
			w.Destination = &sandboxv1.EgressRule_HttpsHostname{HttpsHostname: r.DNSName}
		case r.Tenant != "":
			w.Destination = &sandboxv1.EgressRule_Tenant{Tenant: tenantToProto(r.Tenant)}
		case r.Any:
			w.Destination = &sandboxv1.EgressRule_Any{Any: true}
		}
		if sec := r.Secret; sec != nil {
			w.SandboxdSecret = &sandboxv1.EgressSecretInjection{StoreName: sec.Store, Path: sec.Path, Field: sec.Field, Header: sec.Header, EnvVar: sec.EnvVar}
		}
		egress = append(egress, w)
	}
	for _, r := range n.Ingress {
		w := &sandboxv1.IngressRule{Ports: portsToProto(r.Ports)}
		switch {
		case r.CIDR != "":
			w.Source = &sandboxv1.IngressRule_Cidr{Cidr: cidrToProto(r.CIDR, r.Except)}
		case r.Tenant != "":
			w.Source = &sandboxv1.IngressRule_Tenant{Tenant: tenantToProto(r.Tenant)}
		case r.Any:
			w.Source = &sandboxv1.IngressRule_Any{Any: true}
		}
		ingress = append(ingress, w)
	}
	return egress, ingress
}
