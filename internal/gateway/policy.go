package gateway

import (
	"context"
	"fmt"
	"strconv"

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

// policyOf returns runner id's current policy (the empty policy when none is set) and
// its revision.
func (s *Server) policyOf(ctx context.Context, id string) (*policy.Policy, string, error) {
	var (
		doc []byte
		rev int64
	)
	if s.policies != nil {
		var err error
		doc, rev, err = s.policies.Policy(ctx, id)
		if err != nil {
			return nil, "", fmt.Errorf("policy of runner %s unavailable: %w", id, err)
		}
	}
	p := &policy.Policy{}
	if len(doc) > 0 {
		parsed, err := policy.Parse(doc)
		if err != nil {
			return nil, "", fmt.Errorf("policy of runner %s: %w", id, err)
		}
		p = parsed
	}
	return p, strconv.FormatInt(rev, 10), nil
}
