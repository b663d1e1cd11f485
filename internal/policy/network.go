package policy

import (
	"fmt"
	"net/netip"
	"strings"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
)

// ruleUse says where a policy Rule appears; it decides which forms are allowed.
type ruleUse int

const (
	defaultEgress ruleUse = iota
	defaultIngress
	envelopeEgress
	envelopeIngress
)

func (u ruleUse) egress() bool   { return u == defaultEgress || u == envelopeEgress }
func (u ruleUse) envelope() bool { return u == envelopeEgress || u == envelopeIngress }

var tenants = map[string]sandboxv1.TenantScope{
	"SAME_USER":       sandboxv1.TenantScope_TENANT_SCOPE_SAME_USER,
	"SAME_ORG":        sandboxv1.TenantScope_TENANT_SCOPE_SAME_ORG,
	"SANDBOX_NETWORK": sandboxv1.TenantScope_TENANT_SCOPE_SANDBOX_NETWORK,
}

func tenantOf(s string) (sandboxv1.TenantScope, bool) {
	t, ok := tenants[strings.TrimPrefix(strings.ToUpper(strings.TrimSpace(s)), "TENANT_SCOPE_")]
	return t, ok
}

func tenantName(t sandboxv1.TenantScope) string {
	return strings.TrimPrefix(t.String(), "TENANT_SCOPE_")
}

// validateRule reports the problems of one policy rule at field.
func validateRule(field string, r Rule, use ruleUse, add func(field, format string, args ...any)) {
	n := 0
	for _, set := range []bool{r.CIDR != "", r.HTTPSHostname != "", r.Tenant != "", r.Any} {
		if set {
			n++
		}
	}
	if n != 1 {
		add(field, "set exactly one of cidr, https_hostname, tenant or any")
	}
	if r.CIDR != "" {
		p, err := netip.ParsePrefix(r.CIDR)
		switch {
		case err != nil:
			add(field+".cidr", "%q is not a CIDR prefix such as 10.0.0.0/8", r.CIDR)
		case p != p.Masked():
			add(field+".cidr", "%q has host bits set; did you mean %s?", r.CIDR, p.Masked())
		default:
			for i, e := range r.Except {
				ep, err := netip.ParsePrefix(e)
				switch {
				case err != nil:
					add(fmt.Sprintf("%s.except[%d]", field, i), "%q is not a CIDR prefix", e)
				case ep.Bits() < p.Bits() || !p.Contains(ep.Addr()):
					add(fmt.Sprintf("%s.except[%d]", field, i), "%s is not inside %s", e, r.CIDR)
				}
			}
		}
	} else if len(r.Except) > 0 {
		add(field+".except", "is only allowed with cidr")
	}
	if r.HTTPSHostname != "" {
		switch {
		case !use.egress():
			add(field+".https_hostname", "host names are for egress only")
		case !use.envelope():
			add(field+".https_hostname", "a default egress rule may not name hosts; use a CIDR, a tenant or any")
		case !validHostPattern(r.HTTPSHostname, true):
			add(field+".https_hostname", "%q is not a host name, \"*.\" followed by a host name, or \"*\"", r.HTTPSHostname)
		}
		for i, pr := range r.Ports {
			if pr.Port != 443 || pr.EndPort != 0 && pr.EndPort != 443 || !strings.EqualFold(pr.Protocol, "TCP") && pr.Protocol != "" {
				add(fmt.Sprintf("%s.ports[%d]", field, i), "host-name rules cover HTTPS only: TCP port 443")
			}
		}
	}
	if r.Tenant != "" {
		t, ok := tenantOf(r.Tenant)
		switch {
		case !ok:
			add(field+".tenant", "%q is not SAME_USER, SAME_ORG or SANDBOX_NETWORK", r.Tenant)
		case !use.egress() && t == sandboxv1.TenantScope_TENANT_SCOPE_SANDBOX_NETWORK:
			add(field+".tenant", "SANDBOX_NETWORK is not supported for ingress")
		}
	}
	for i, pr := range r.Ports {
		f := fmt.Sprintf("%s.ports[%d]", field, i)
		switch strings.ToUpper(pr.Protocol) {
		case "", "TCP", "UDP", "SCTP":
		default:
			add(f+".protocol", "%q is not TCP, UDP or SCTP", pr.Protocol)
		}
		switch {
		case pr.Port < 0 || pr.Port > 65535:
			add(f+".port", "must be 0-65535 (0 = all ports), got %d", pr.Port)
		case pr.EndPort != 0 && (pr.Port == 0 || pr.EndPort < pr.Port || pr.EndPort > 65535):
			add(f+".end_port", "must be between port and 65535, got %d", pr.EndPort)
		}
	}
}

// validHostPattern accepts "example.com", "*.example.com" and (envelopes only) "*".
func validHostPattern(h string, star bool) bool {
	if h == "*" {
		return star
	}
	h = strings.TrimPrefix(h, "*.")
	if len(h) > 253 || !strings.Contains(h, ".") && h != "localhost" {
		return false
	}
	for l := range strings.SplitSeq(h, ".") {
		if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return false
		}
		for _, c := range l {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}

func toPorts(ps []PortRange) []*sandboxv1.PortRange {
	var out []*sandboxv1.PortRange
	for _, p := range ps {
		out = append(out, &sandboxv1.PortRange{Protocol: p.Protocol, Port: p.Port, EndPort: p.EndPort})
	}
	return out
}

// toEgress converts a validated default rule into a wire rule.
func toEgress(r Rule) *sandboxv1.EgressRule {
	out := &sandboxv1.EgressRule{Ports: toPorts(r.Ports)}
	switch {
	case r.CIDR != "":
		out.Destination = &sandboxv1.EgressRule_Cidr{Cidr: &sandboxv1.CidrBlock{Cidr: r.CIDR, Except: append([]string(nil), r.Except...)}}
	case r.HTTPSHostname != "":
		out.Destination = &sandboxv1.EgressRule_HttpsHostname{HttpsHostname: r.HTTPSHostname}
	case r.Tenant != "":
		t, _ := tenantOf(r.Tenant)
		out.Destination = &sandboxv1.EgressRule_Tenant{Tenant: t}
	case r.Any:
		out.Destination = &sandboxv1.EgressRule_Any{Any: true}
	}
	return out
}

func toIngress(r Rule) *sandboxv1.IngressRule {
	out := &sandboxv1.IngressRule{Ports: toPorts(r.Ports)}
	switch {
	case r.CIDR != "":
		out.Source = &sandboxv1.IngressRule_Cidr{Cidr: &sandboxv1.CidrBlock{Cidr: r.CIDR, Except: append([]string(nil), r.Except...)}}
	case r.Tenant != "":
		t, _ := tenantOf(r.Tenant)
		out.Source = &sandboxv1.IngressRule_Tenant{Tenant: t}
	case r.Any:
		out.Source = &sandboxv1.IngressRule_Any{Any: true}
	}
	return out
}

// span is a protocol and inclusive port range; proto "" with all=true is "every port of
// every protocol".
type span struct {
	all        bool
	proto      string
	first, end int32
}

func spansOf(ps []*sandboxv1.PortRange) []span {
	if len(ps) == 0 {
		return []span{{all: true}}
	}
	out := make([]span, 0, len(ps))
	for _, p := range ps {
		out = append(out, spanOf(p.GetProtocol(), p.GetPort(), p.GetEndPort()))
	}
	return out
}

func spanOf(proto string, port, end int32) span {
	proto = strings.ToUpper(proto)
	if proto == "" {
		proto = "TCP"
	}
	switch {
	case port == 0:
		return span{proto: proto, first: 1, end: 65535}
	case end < port:
		return span{proto: proto, first: port, end: port}
	}
	return span{proto: proto, first: port, end: end}
}

// entry is one parsed envelope rule.
type entry struct {
	any      bool
	prefix   netip.Prefix
	isCIDR   bool
	except   []netip.Prefix
	host     string
	tenant   sandboxv1.TenantScope
	allPorts bool
	ports    []span
}

func parseEntries(rs []Rule) []entry {
	var out []entry
	for _, r := range rs {
		e := entry{any: r.Any, host: strings.ToLower(r.HTTPSHostname), allPorts: len(r.Ports) == 0}
		if r.CIDR != "" {
			p, err := netip.ParsePrefix(r.CIDR)
			if err != nil {
				continue // Validate reports it; an unparseable entry entitles nothing
			}
			e.prefix, e.isCIDR = p.Masked(), true
			for _, x := range r.Except {
				if xp, err := netip.ParsePrefix(x); err == nil {
					e.except = append(e.except, xp.Masked())
				}
			}
		}
		if r.Tenant != "" {
			t, ok := tenantOf(r.Tenant)
			if !ok {
				continue
			}
			e.tenant = t
		}
		for _, p := range r.Ports {
			e.ports = append(e.ports, spanOf(p.Protocol, p.Port, p.EndPort))
		}
		out = append(out, e)
	}
	return out
}

func (e entry) coversPorts(s span) bool {
	if e.allPorts {
		return true
	}
	if s.all {
		return false
	}
	for _, p := range e.ports {
		if p.proto == s.proto && p.first <= s.first && s.end <= p.end {
			return true
		}
	}
	return false
}

func describeEntries(es []Rule) string {
	parts := make([]string, 0, len(es))
	for _, r := range es {
		var d string
		switch {
		case r.Any:
			d = "any"
		case r.CIDR != "":
			d = r.CIDR
			if len(r.Except) > 0 {
				d += " except " + strings.Join(r.Except, " ")
			}
		case r.HTTPSHostname != "":
			d = r.HTTPSHostname
		case r.Tenant != "":
			d = "tenant " + r.Tenant
		}
		if len(r.Ports) > 0 {
			ps := make([]string, len(r.Ports))
			for i, p := range r.Ports {
				s := spanOf(p.Protocol, p.Port, p.EndPort)
				if s.first == s.end {
					ps[i] = fmt.Sprintf("%s/%d", s.proto, s.first)
				} else {
					ps[i] = fmt.Sprintf("%s/%d-%d", s.proto, s.first, s.end)
				}
			}
			d += " (" + strings.Join(ps, " ") + ")"
		}
		parts = append(parts, d)
	}
	return strings.Join(parts, ", ")
}

// destination is what a wire rule asks for, in the terms the envelope checks.
type destination struct {
	any      bool
	selector bool
	host     string
	tenant   sandboxv1.TenantScope
	cidr     *sandboxv1.CidrBlock
}

// covered reports whether the envelope entitles dest on every one of spans; err is set
// when dest cannot be read (a malformed CIDR).
func covered(es []entry, dest destination, spans []span, allowSelectors bool) (bool, error) {
	if dest.selector {
		return allowSelectors, nil
	}
	var prefix netip.Prefix
	var except []netip.Prefix
	if dest.cidr != nil {
		p, err := netip.ParsePrefix(dest.cidr.GetCidr())
		if err != nil {
			return false, fmt.Errorf("%q is not a CIDR prefix", dest.cidr.GetCidr())
		}
		prefix = p.Masked()
		for _, x := range dest.cidr.GetExcept() {
			if xp, err := netip.ParsePrefix(x); err == nil {
				except = append(except, xp.Masked())
			}
		}
	}
	for _, s := range spans {
		var usable []entry
		for _, e := range es {
			if e.coversPorts(s) {
				usable = append(usable, e)
			}
		}
		ok := false
		for _, e := range usable {
			switch {
			case e.any:
				ok = true
			case dest.host != "" && e.host != "":
				ok = hostCovered(e.host, strings.ToLower(dest.host))
			case dest.tenant != 0 && e.tenant == dest.tenant:
				ok = true
			}
			if ok {
				break
			}
		}
		if !ok && dest.cidr != nil {
			ok = cidrCovered(prefix, except, usable)
		}
		if !ok {
			return false, nil
		}
	}
	return true, nil
}

// hostCovered: "*" covers everything, an exact pattern covers itself, "*.x.com"
// covers "a.x.com" (one label) and itself.
func hostCovered(pattern, h string) bool {
	if pattern == "*" || pattern == h {
		return true
	}
	suffix, ok := strings.CutPrefix(pattern, "*")
	if !ok {
		return false
	}
	label, ok := strings.CutSuffix(h, suffix)
	return ok && label != "" && !strings.ContainsAny(label, ".*")
}

// cidrCovered reports whether p, minus the spec's own exceptions, lies inside the union
// of the entries' prefixes minus their exceptions. It splits p only where some boundary
// lies strictly inside it, so the work is bounded by boundaries × address bits.
func cidrCovered(p netip.Prefix, specExcept []netip.Prefix, es []entry) bool {
	for _, x := range specExcept {
		if contains(x, p) {
			return true
		}
	}
	for _, e := range es {
		if !e.isCIDR || !contains(e.prefix, p) {
			continue
		}
		clear := true
		for _, x := range e.except {
			if x.Overlaps(p) {
				clear = false
				break
			}
		}
		if clear {
			return true
		}
	}
	if p.Bits() >= p.Addr().BitLen() || !boundaryInside(p, specExcept, es) {
		return false
	}
	lo, hi := split(p)
	return cidrCovered(lo, specExcept, es) && cidrCovered(hi, specExcept, es)
}

func contains(outer, inner netip.Prefix) bool {
	return outer.Addr().Is4() == inner.Addr().Is4() && outer.Bits() <= inner.Bits() && outer.Contains(inner.Addr())
}

func boundaryInside(p netip.Prefix, specExcept []netip.Prefix, es []entry) bool {
	inside := func(q netip.Prefix) bool { return q.Bits() > p.Bits() && contains(p, q) }
	for _, x := range specExcept {
		if inside(x) {
			return true
		}
	}
	for _, e := range es {
		if e.isCIDR && inside(e.prefix) {
			return true
		}
		for _, x := range e.except {
			if inside(x) {
				return true
			}
		}
	}
	return false
}

// split halves p.
func split(p netip.Prefix) (netip.Prefix, netip.Prefix) {
	bits := p.Bits()
	lo := netip.PrefixFrom(p.Addr(), bits+1)
	b := p.Addr().AsSlice()
	b[bits/8] |= 0x80 >> (bits % 8)
	a, _ := netip.AddrFromSlice(b)
	return lo, netip.PrefixFrom(a, bits+1)
}
