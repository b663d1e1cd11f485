package spec

import (
	"time"

	"google.golang.org/protobuf/proto"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/quantity"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// ForPolicy is the public-API form of what the runner is asked to run: what the
// policy constrains of it (images, resources, environment, security, runtime class,
// lifetime, services and network rules), for every container. The primary is the first
// row, marked primary when there are several; the sidecars follow in order, then the
// init containers, which the public wire has no field for: as rows, the policy checks
// their images, security and resources like any container's (in the sum too, which is
// then above their true peak, runtime.Spec.TotalResources: stricter, never looser).
func ForPolicy(req runner.CreateRequest) *sandboxv1.SandboxSpec {
	var cs []*sandboxv1.Container
	for _, c := range req.Spec.Containers() {
		cs = append(cs, containerForPolicy(c))
	}
	for i := range req.Spec.InitContainers {
		cs = append(cs, containerForPolicy(&req.Spec.InitContainers[i]))
	}
	if len(cs) > 1 {
		cs[0].Primary = proto.Bool(true)
	}
	spec := &sandboxv1.SandboxSpec{
		Containers:         cs,
		RuntimeClass:       req.Spec.RuntimeClass,
		MaxLifetimeSeconds: int32(req.Lifetime.Seconds()),
		Services:           servicesForPolicy(req.Spec.Services),
	}
	if n := req.Spec.Network; n != nil {
		egress, ingress := EffectiveNetwork(n)
		for _, e := range egress {
			e.SandboxdSecret = nil // no policy constrains which secrets a rule carries
		}
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

// containerForPolicy is the wire form of one container, as ForPolicy renders it.
func containerForPolicy(rc *runtime.Container) *sandboxv1.Container {
	c := &sandboxv1.Container{
		Name:                 rc.Name,
		Image:                rc.Image,
		Command:              rc.Command,
		Args:                 rc.Args,
		EnvironmentVariables: rc.Env,
		WorkingDir:           rc.WorkingDir,
		SecurityContext:      securityForPolicy(rc.Security),
		StartupProbe:         probeForPolicy(rc.StartupProbe),
	}
	r := rc.Resources
	if limits := wireResources(r.MilliCPU, r.MemoryBytes); limits != nil || r.RequestMilliCPU > 0 || r.RequestMemoryBytes > 0 {
		c.ResourceRequirements = &sandboxv1.ResourceRequirements{Limits: limits, Requests: wireResources(r.RequestMilliCPU, r.RequestMemoryBytes)}
	}
	return c
}

// probeForPolicy is the wire form of a startup probe (whole seconds, as the wire has
// them); nil stays nil.
func probeForPolicy(p *runtime.Probe) *sandboxv1.Probe {
	if p == nil {
		return nil
	}
	return &sandboxv1.Probe{
		Exec:                p.Exec,
		InitialDelaySeconds: int32(p.InitialDelay / time.Second),
		PeriodSeconds:       int32(p.Period / time.Second),
		TimeoutSeconds:      int32(p.Timeout / time.Second),
		FailureThreshold:    int32(p.FailureThreshold),
	}
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
