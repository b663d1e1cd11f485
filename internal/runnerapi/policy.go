package runnerapi

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/gateway"
	"github.com/sandboxd/sandboxd/internal/policy"
	"github.com/sandboxd/sandboxd/internal/quantity"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// WithPolicy makes the server check every create against the runner's own policy
// (typically its cache of what the control plane last sent) before starting it, with the
// gateway's code: the gateway checks first, but the runner is the authority when its
// policy changed in between. It returns s.
func (s *Server) WithPolicy(runnerID string, p gateway.PolicySource) *Server {
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
	platform := gateway.Platform(nil) // DefaultRuntimeClasses when the server does not know
	if s.platform != nil {
		platform = s.platform()
	}
	res := policy.ResolveRevision(p, strconv.FormatInt(rev, 10), specForPolicy(*req), platform)
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
	// The runner's own policy decides the Pod settings (Kubernetes backend): they replace
	// what the gateway resolved, never add to it (no toleration or pull secret twice).
	req.Spec.Pod = res.Pod
	return nil
}

// specForPolicy is the public-API form of what the runner is asked to run: what the
// policy constrains of it (image, resources, environment, runtime class, lifetime,
// services and network rules).
func specForPolicy(req runner.CreateRequest) *sandboxv1.SandboxSpec {
	c := &sandboxv1.Container{
		Image:                req.Spec.Image,
		Command:              req.Spec.Command,
		Args:                 req.Spec.Args,
		EnvironmentVariables: req.Spec.Env,
		WorkingDir:           req.Spec.WorkingDir,
		SecurityContext:      securityForPolicy(req.Spec.Security),
	}
	r := req.Spec.Resources
	if limits := wireResources(r.MilliCPU, r.MemoryBytes); limits != nil || r.RequestMilliCPU > 0 || r.RequestMemoryBytes > 0 {
		c.ResourceRequirements = &sandboxv1.ResourceRequirements{Limits: limits, Requests: wireResources(r.RequestMilliCPU, r.RequestMemoryBytes)}
	}
	spec := &sandboxv1.SandboxSpec{
		Containers:         []*sandboxv1.Container{c},
		RuntimeClass:       req.Spec.RuntimeClass,
		MaxLifetimeSeconds: int32(req.Lifetime.Seconds()),
		Services:           servicesForPolicy(req.Spec.Services),
	}
	if n := req.Spec.Network; n != nil {
		egress, ingress := gateway.EffectiveNetwork(n)
		// The rules arrive resolved, defaults included: empty lists are "none", which
		// the resolution must not fill with defaults again, hence the deny flags.
		deny := func(b bool) *bool { return &b }
		spec.Network = &sandboxv1.NetworkOptions{
			Egress: egress, Ingress: ingress,
			DenyEgress:  deny(n.DenyEgress || len(egress) == 0),
			DenyIngress: deny(n.DenyIngress || len(ingress) == 0),
		}
	}
	return spec
}

// wireResources renders milliCPU and memory (0 = unset) as the API writes them; nil when
// both are unset.
func wireResources(milliCPU, memory int64) *sandboxv1.Resources {
	if milliCPU <= 0 && memory <= 0 {
		return nil
	}
	res := &sandboxv1.Resources{}
	if milliCPU > 0 {
		res.Cpu = quantity.FormatCPU(milliCPU)
	}
	if memory > 0 {
		res.Memory = quantity.FormatMemory(memory)
	}
	return res
}

// servicesForPolicy renders services with what the policy constrains of them: port,
// visibility and endpoint kind.
func servicesForPolicy(ss []runtime.Service) []*sandboxv1.Service {
	var out []*sandboxv1.Service
	for _, s := range ss {
		w := &sandboxv1.Service{Port: int32(s.Port), Name: s.Name}
		switch s.Visibility {
		case "public":
			w.Visibility = sandboxv1.Visibility_VISIBILITY_PUBLIC
		case "private":
			w.Visibility = sandboxv1.Visibility_VISIBILITY_PRIVATE
		case "custom":
			w.Visibility = sandboxv1.Visibility_VISIBILITY_CUSTOM
		}
		switch s.Endpoint {
		case runtime.EndpointHTTPS:
			w.Endpoint = &sandboxv1.EndpointSpec{Kind: sandboxv1.EndpointKind_ENDPOINT_KIND_HTTPS}
		case runtime.EndpointPassthrough:
			w.Endpoint = &sandboxv1.EndpointSpec{Kind: sandboxv1.EndpointKind_ENDPOINT_KIND_TLS_PASSTHROUGH}
		}
		out = append(out, w)
	}
	return out
}
