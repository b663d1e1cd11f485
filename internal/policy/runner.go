package policy

import (
	"context"
	"strings"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// Source gives a runner's current policy document (JSON; nil or empty = never set,
// treated as the empty policy) and its revision.
type Source interface {
	Policy(ctx context.Context, runnerID string) (doc []byte, revision int64, err error)
}

// OrgSource is a Source that also knows the runners of other organizations than the
// platform's: PolicyOf reads the policy of runner runnerID that belongs to org (a
// tenant's runner, whose policy is in its organization's record).
type OrgSource interface {
	Source
	PolicyOf(ctx context.Context, org, runnerID string) (doc []byte, revision int64, err error)
}

// DefaultRuntimeClasses are what a runner offers when it does not say: runc alone.
var DefaultRuntimeClasses = []string{"runc"}

// RunnerPlatform is what a runner offering runtime classes (its default first; none means
// DefaultRuntimeClasses) supports whatever the policy says: the platform the runner
// resolves its own policy against, and the gateway its view of the runner's, so both
// decide alike.
func RunnerPlatform(classes []string) Platform {
	if len(classes) == 0 {
		classes = DefaultRuntimeClasses
	}
	p := DefaultPlatform()
	p.RuntimeClasses = classes
	p.DefaultCPURuntimeClass = classes[0]
	// Containers add capabilities only where a policy's allowed_capabilities lists them.
	p.AllowedCapabilities = []string{}
	p.DefaultEgress = rulesOf(runtime.DefaultEgress())
	return p
}

// rulesOf turns runtime rules (the platform's defaults) into policy rules.
func rulesOf(rs []runtime.EgressRule) []Rule {
	out := make([]Rule, 0, len(rs))
	for _, r := range rs {
		pr := Rule{CIDR: r.CIDR, Except: r.Except, HTTPSHostname: r.DNSName, Any: r.Any, Tenant: strings.ToUpper(r.Tenant)}
		for _, p := range r.Ports {
			pr.Ports = append(pr.Ports, PortRange{Protocol: strings.ToUpper(p.Protocol), Port: int32(p.Port), EndPort: int32(p.EndPort)})
		}
		out = append(out, pr)
	}
	return out
}
