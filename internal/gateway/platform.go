package gateway

import "github.com/sandboxd/sandboxd/internal/policy"

// Platform is what this gateway's runners support whatever the policy says: the platform
// a runner resolves its own policy against, so gateway and runner decide alike.
func Platform() policy.Platform { return platform() }
