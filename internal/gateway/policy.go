package gateway

import (
	"context"

	"github.com/sandboxd/sandboxd/internal/policy"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// PolicySource gives a runner's current policy document (JSON; nil or empty = never set,
// treated as the empty policy) and its revision.
type PolicySource interface {
	Policy(ctx context.Context, runnerID string) (doc []byte, revision int64, err error)
}

// DefaultRuntimeClasses are what a runner offers when it does not say: runc alone.
var DefaultRuntimeClasses = []string{"runc"}

// Platform is what a runner offering runtime classes (its default first; none means
// DefaultRuntimeClasses) supports whatever the policy says: the platform the runner
// resolves its own policy against, and the gateway its view of the runner's, so both
// decide alike.
func Platform(classes []string) policy.Platform {
	if len(classes) == 0 {
		classes = DefaultRuntimeClasses
	}
	p := policy.DefaultPlatform()
	p.RuntimeClasses = classes
	p.DefaultCPURuntimeClass = classes[0]
	// Containers add capabilities only where a policy's allowed_capabilities lists them.
	p.AllowedCapabilities = []string{}
	p.DefaultEgress = policyRules(runtime.DefaultEgress())
	return p
}
