package spec

import (
	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/quantity"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// ForPolicy is the public-API form of what the runner is asked to run: what the
// policy constrains of it (image, resources, environment, runtime class, lifetime,
// services and network rules).
func ForPolicy(req runner.CreateRequest) *sandboxv1.SandboxSpec {
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
		egress, ingress := EffectiveNetwork(n)
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
