package gateway

import (
	"strings"

	"github.com/sandboxd/sandboxd/internal/policy"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// policyRules turns runtime rules (the platform's defaults) into policy rules.
func policyRules(rs []runtime.EgressRule) []policy.Rule {
	out := make([]policy.Rule, 0, len(rs))
	for _, r := range rs {
		pr := policy.Rule{CIDR: r.CIDR, Except: r.Except, HTTPSHostname: r.DNSName, Any: r.Any, Tenant: strings.ToUpper(r.Tenant)}
		for _, p := range r.Ports {
			pr.Ports = append(pr.Ports, policy.PortRange{Protocol: strings.ToUpper(p.Protocol), Port: int32(p.Port), EndPort: int32(p.EndPort)})
		}
		out = append(out, pr)
	}
	return out
}
