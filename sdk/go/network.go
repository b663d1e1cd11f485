package sandbox

import (
	"fmt"
	"strings"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
)

// Tenant scopes of an egress rule.
const (
	TenantSameOrg  = "same_org"  // the sandboxes of the caller's organization
	TenantSameUser = "same_user" // the sandboxes created with the same API key
)

// EgressRule allows traffic to one destination: exactly one of CIDR, DNSName, Tenant
// and Any. Rules only allow; what no rule allows is denied (the platform DNS always
// answers).
type EgressRule struct {
	// CIDR is an IPv4 or IPv6 prefix in canonical form ("203.0.113.0/24"); Except
	// carves prefixes out of it.
	CIDR   string
	Except []string
	// DNSName allows HTTPS (TCP 443) to a host ("pypi.org") or to the hosts one label
	// below a domain ("*.pypi.org"). Runners that cannot enforce it refuse it.
	DNSName string
	// Tenant is TenantSameOrg or TenantSameUser.
	Tenant string
	// Any is the internet (not the cluster's or the host's own addresses).
	Any bool
	// Ports limits the rule; empty means every port.
	Ports []PortRange
}

// PortRange is one port (EndPort 0) or an inclusive range.
type PortRange struct {
	Protocol string // "tcp" (default), "udp" or "sctp"
	Port     int
	EndPort  int
}

// String is the rule as `sbx run --egress` takes it: any, cidr=…, dns=…, tenant=….
func (r EgressRule) String() string {
	var s string
	switch {
	case r.CIDR != "":
		s = "cidr=" + r.CIDR
		for _, x := range r.Except {
			s += " except " + x
		}
	case r.DNSName != "":
		s = "dns=" + r.DNSName
	case r.Tenant != "":
		s = "tenant=" + r.Tenant
	case r.Any:
		s = "any"
	}
	for i, p := range r.Ports {
		sep := ","
		if i == 0 {
			sep = " ports "
		}
		proto := p.Protocol
		if proto == "" {
			proto = "tcp"
		}
		s += fmt.Sprintf("%s%s/%d", sep, proto, p.Port)
		if p.EndPort != 0 {
			s += fmt.Sprintf("-%d", p.EndPort)
		}
	}
	return s
}

// ParseEgress parses the short form of a rule: "any", "cidr=PREFIX", "dns=NAME" or
// "tenant=same_org|same_user" (the server checks the values).
func ParseEgress(s string) (EgressRule, error) {
	k, v, _ := strings.Cut(strings.TrimSpace(s), "=")
	switch strings.ToLower(k) {
	case "any":
		if v == "" {
			return EgressRule{Any: true}, nil
		}
	case "cidr":
		if v != "" {
			return EgressRule{CIDR: v}, nil
		}
	case "dns":
		if v != "" {
			return EgressRule{DNSName: v}, nil
		}
	case "tenant":
		switch t := strings.ToLower(v); t {
		case TenantSameOrg, TenantSameUser:
			return EgressRule{Tenant: t}, nil
		}
		return EgressRule{}, fmt.Errorf("egress %q: tenant is same_org or same_user", s)
	}
	return EgressRule{}, fmt.Errorf("egress %q: want any, cidr=PREFIX, dns=NAME or tenant=same_org|same_user", s)
}

func egressToProto(rs []EgressRule) []*sandboxv1.EgressRule {
	var out []*sandboxv1.EgressRule
	for _, r := range rs {
		w := &sandboxv1.EgressRule{}
		for _, p := range r.Ports {
			w.Ports = append(w.Ports, &sandboxv1.PortRange{Protocol: strings.ToUpper(p.Protocol), Port: int32(p.Port), EndPort: int32(p.EndPort)})
		}
		switch {
		case r.CIDR != "":
			w.Destination = &sandboxv1.EgressRule_Cidr{Cidr: &sandboxv1.CidrBlock{Cidr: r.CIDR, Except: r.Except}}
		case r.DNSName != "":
			w.Destination = &sandboxv1.EgressRule_HttpsHostname{HttpsHostname: r.DNSName}
		case r.Tenant != "":
			t := sandboxv1.TenantScope_TENANT_SCOPE_SAME_ORG
			if r.Tenant == TenantSameUser {
				t = sandboxv1.TenantScope_TENANT_SCOPE_SAME_USER
			}
			w.Destination = &sandboxv1.EgressRule_Tenant{Tenant: t}
		case r.Any:
			w.Destination = &sandboxv1.EgressRule_Any{Any: true}
		}
		out = append(out, w)
	}
	return out
}

func egressFromProto(rs []*sandboxv1.EgressRule) []EgressRule {
	var out []EgressRule
	for _, w := range rs {
		r := EgressRule{}
		for _, p := range w.GetPorts() {
			r.Ports = append(r.Ports, PortRange{Protocol: strings.ToLower(p.GetProtocol()), Port: int(p.GetPort()), EndPort: int(p.GetEndPort())})
		}
		switch d := w.GetDestination().(type) {
		case *sandboxv1.EgressRule_Cidr:
			r.CIDR, r.Except = d.Cidr.GetCidr(), d.Cidr.GetExcept()
		case *sandboxv1.EgressRule_HttpsHostname:
			r.DNSName = d.HttpsHostname
		case *sandboxv1.EgressRule_Tenant:
			r.Tenant = strings.ToLower(strings.TrimPrefix(d.Tenant.String(), "TENANT_SCOPE_"))
		case *sandboxv1.EgressRule_Any:
			r.Any = d.Any
		default:
			continue // a destination this SDK does not know (e.g. a selector)
		}
		out = append(out, r)
	}
	return out
}
