package runnerapi

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"connectrpc.com/connect"

	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/policy"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/spec"
)

// WithPolicy makes the server check every create against the runner's own policy
// (typically its cache of what the control plane last sent) before starting it, with the
// gateway's code: the gateway checks first, but the runner is the authority when its
// policy changed in between. It returns s.
func (s *Server) WithPolicy(runnerID string, p policy.Source) *Server {
	s.policies, s.runnerID = p, runnerID
	return s
}

// admit checks req against the runner's policy and records the revision applied.
func (s *Server) admit(ctx context.Context, req *runner.CreateRequest) error {
	if s.policies == nil {
		return nil
	}
	doc, rev, err := s.policies.Policy(ctx, s.runnerID)
	if err != nil {
		return apierr.WithRetry(apierr.Newf(apierr.RunnerUnavailable,
			"runner %s cannot check sandboxes against its policy: %v", s.runnerID, err), 0)
	}
	p := &policy.Policy{}
	if len(doc) > 0 {
		if p, err = policy.Parse(doc); err != nil {
			return connect.NewError(connect.CodeInternal, fmt.Errorf("policy of runner %s: %w", s.runnerID, err))
		}
	}
	platform := policy.RunnerPlatform(nil) // DefaultRuntimeClasses when the server does not know
	if s.platform != nil {
		platform = s.platform()
	}
	res := policy.ResolveEngine(p, strconv.FormatInt(rev, 10), spec.ForPolicy(*req), req.Spec.Engine, platform)
	if !res.OK() {
		vs := policy.ToAPI(res.Violations)
		parts := make([]string, len(vs))
		for i, v := range vs {
			parts[i] = v.Field + " " + v.Description
		}
		s.log.Info("sandbox refused by the runner's policy", "runner", s.runnerID, "policy_revision", rev, "violations", len(vs))
		return apierr.Invalid(policy.Reason(res.Violations),
			fmt.Sprintf("runner %s's policy (revision %d) rejects this sandbox: %s", s.runnerID, rev, strings.Join(parts, "; ")), vs)
	}
	if req.Spec.Meta == nil {
		req.Spec.Meta = map[string]string{}
	}
	if g, ok := req.Spec.Meta[runtime.MetaPolicyRevision]; ok && g != res.PolicyRevision {
		req.Spec.Meta[runtime.MetaGatewayPolicyRevision] = g
	}
	req.Spec.Meta[runtime.MetaPolicyRevision] = res.PolicyRevision
	// And its pause settings (base.pause), replacing the gateway's.
	req.Spec.Meta = res.SetMeta(req.Spec.Meta)
	// The runner's own policy decides the Pod settings (Kubernetes backend): they replace
	// what the gateway resolved, never add to it (no toleration or pull secret twice).
	req.Spec.Pod = res.Pod
	return nil
}

// volumeClasses fills v's storage classes and size bound from the runner's own policy
// (base.volume_storage_class, constraints.volumes.allowed_storage_classes and max_size): the runner,
// not the gateway, decides what its claims may be. Without a policy source: none.
func (s *Server) volumeClasses(ctx context.Context, v *runner.RegisteredVolume) error {
	if s.policies == nil {
		return nil
	}
	doc, _, err := s.policies.Policy(ctx, s.runnerID)
	if err != nil {
		return apierr.WithRetry(apierr.Newf(apierr.RunnerUnavailable,
			"runner %s cannot read its policy: %v", s.runnerID, err), 0)
	}
	if len(doc) == 0 {
		return nil
	}
	p, err := policy.Parse(doc)
	if err != nil {
		return connect.NewError(connect.CodeInternal, fmt.Errorf("policy of runner %s: %w", s.runnerID, err))
	}
	v.StorageClass, v.AllowedStorageClasses = p.VolumeStorageClasses()
	v.MaxSizeBytes = p.VolumeMaxSize()
	return nil
}
