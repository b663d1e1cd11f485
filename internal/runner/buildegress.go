package runner

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// ParseBuildEgress parses one rule of a runner's build egress (sandboxd runner|dev
// --build-egress, repeatable): the rules of docs/network.md in a flag's words,
//
//	any[,port=P]...          the internet (never the reserved ranges, the sandbox subnet
//	                         or the host's addresses)
//	cidr=PREFIX[,port=P]...  a canonical IPv4 or IPv6 prefix
//	dns=NAME                 HTTPS (TCP 443) to NAME or *.DOMAIN, checked on the TLS SNI
//
// where P is PORT or FIRST-LAST, optionally followed by /tcp (the default), /udp or
// /sctp. Tenant rules are refused: a builder belongs to no organization's network. Every
// problem is named; the rule is checked as a sandbox's would be (ValidateEgressRule).
func ParseBuildEgress(s string) (runtime.EgressRule, error) {
	var r runtime.EgressRule
	if len(s) > 1024 {
		return r, fmt.Errorf("build egress rule of %d bytes: at most 1024", len(s))
	}
	parts := strings.Split(s, ",")
	kind, value, hasValue := strings.Cut(parts[0], "=")
	switch {
	case kind == "any" && !hasValue:
		r.Any = true
	case kind == "cidr" && hasValue:
		r.CIDR = value
	case kind == "dns" && hasValue:
		r.DNSName = strings.ToLower(value)
	case kind == "tenant":
		return r, fmt.Errorf("build egress %q: tenant rules do not apply to builders (they belong to no organization's network); use cidr= or dns=", s)
	default:
		return r, fmt.Errorf("build egress %q: want any, cidr=PREFIX or dns=NAME, then ,port=P[-Q][/udp|/sctp] (repeatable)", s)
	}
	for _, p := range parts[1:] {
		spec, ok := strings.CutPrefix(p, "port=")
		if !ok {
			return r, fmt.Errorf("build egress %q: %q: want port=P, port=P-Q, optionally /udp or /sctp", s, p)
		}
		pr := runtime.PortRange{}
		if ports, proto, ok := strings.Cut(spec, "/"); ok {
			spec, pr.Protocol = ports, proto
		}
		first, last, isRange := strings.Cut(spec, "-")
		var err error
		if pr.Port, err = strconv.Atoi(first); err != nil {
			return r, fmt.Errorf("build egress %q: port %q is not a number", s, first)
		}
		if isRange {
			if pr.EndPort, err = strconv.Atoi(last); err != nil {
				return r, fmt.Errorf("build egress %q: port %q is not a number", s, last)
			}
		}
		r.Ports = append(r.Ports, pr)
	}
	var problems []string
	ValidateEgressRule("rule", r, func(field, format string, args ...any) {
		problems = append(problems, field+": "+fmt.Sprintf(format, args...))
	})
	if len(problems) > 0 {
		return r, fmt.Errorf("build egress %q: %s", s, strings.Join(problems, "; "))
	}
	return r, nil
}
