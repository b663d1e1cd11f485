package gateway

import (
	"context"

	"github.com/sandboxd/sandboxd/internal/policy"
)

// PolicySource gives a runner's current policy document (JSON; nil or empty = never set,
// treated as the empty policy) and its revision.
type PolicySource interface {
	Policy(ctx context.Context, runnerID string) (doc []byte, revision int64, err error)
}

// Platform is what this gateway's runners support whatever the policy says: the platform
// a runner resolves its own policy against, so gateway and runner decide alike.
func Platform() policy.Platform {
	p := policy.DefaultPlatform()
	p.RuntimeClasses = supportedRuntimeClasses
	p.DefaultCPURuntimeClass = supportedRuntimeClasses[0]
	return p
}
