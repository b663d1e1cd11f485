package gateway

import (
	"context"
	"fmt"
	"strconv"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/policy"
)

// PolicySource gives a runner's current policy document (JSON; nil or empty = never set,
// treated as the empty policy) and its revision.
type PolicySource interface {
	Policy(ctx context.Context, runnerID string) (doc []byte, revision int64, err error)
}

// platform is what this gateway's runners support whatever the policy says.
func platform() policy.Platform {
	p := policy.DefaultPlatform()
	p.RuntimeClasses = supportedRuntimeClasses
	p.DefaultCPURuntimeClass = supportedRuntimeClasses[0]
	return p
}

// resolve merges the runner's policy into spec and checks its constraints: the runner
// accepts the resolved spec or the caller learns every violation. Nothing is narrowed.
func (s *Server) resolve(ctx context.Context, r Runner, spec *sandboxv1.SandboxSpec) (policy.Result, error) {
	var (
		doc []byte
		rev int64
	)
	if s.policies != nil {
		var err error
		doc, rev, err = s.policies.Policy(ctx, r.ID())
		if err != nil {
			return policy.Result{}, apierr.WithRetry(apierr.Newf(connect.CodeUnavailable, apierr.RunnerUnavailable,
				"policy of runner %s unavailable: %v", r.ID(), err), 0)
		}
	}
	p := &policy.Policy{}
	if len(doc) > 0 {
		parsed, err := policy.Parse(doc)
		if err != nil {
			return policy.Result{}, connect.NewError(connect.CodeInternal, fmt.Errorf("policy of runner %s: %w", r.ID(), err))
		}
		p = parsed
	}
	res := policy.ResolveRevision(p, strconv.FormatInt(rev, 10), spec, platform())
	if !res.OK() {
		vs := policy.ToAPI(res.Violations)
		return res, apierr.Invalid(policy.Reason(res.Violations),
			fmt.Sprintf("runner %s's policy rejects this sandbox: %s", r.ID(), describe(vs)), vs)
	}
	return res, nil
}
