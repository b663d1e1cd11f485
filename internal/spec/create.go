package spec

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/quantity"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// ToCreateRequest turns a wire spec into a runner request. It reports every shape problem
// at once as field violations, and features this sandboxd cannot honour yet as
// NOT_IMPLEMENTED rather than silently ignoring them. extra are problems of the same
// request its caller found (the gateway: runner_ids, which placement checks), reported
// after the spec's own and with them.
func ToCreateRequest(spec *sandboxv1.SandboxSpec, extra ...apierr.Violation) (runner.CreateRequest, error) {
	var vs []apierr.Violation
	add := func(field, format string, args ...any) {
		vs = append(vs, apierr.Violation{Field: field, Description: fmt.Sprintf(format, args...)})
	}
	var unsupported []string
	if spec == nil {
		return runner.CreateRequest{}, apierr.Invalid(apierr.InvalidRequest, "sandbox.spec is required", []apierr.Violation{{Field: "sandbox.spec", Description: "is required"}})
	}
	switch n := len(spec.GetContainers()); {
	case n == 0:
		add("sandbox.spec.containers", "at least one container is required")
	case n > 1:
		unsupported = append(unsupported, "more than one container")
	}
	vs = append(vs, containerNameViolations("sandbox.spec.containers", spec.GetContainers())...)
	vs = append(vs, tagViolations("sandbox.spec.tags", spec.GetTags())...)
	vs = append(vs, annotationViolations("sandbox.spec.annotations", spec.GetAnnotations())...)
	var req runner.CreateRequest
	if c := Primary(spec); c != nil {
		f := "sandbox.spec.containers[0]"
		if strings.TrimSpace(c.GetImage()) == "" {
			add(f+".image", "is required")
		}
		req.Spec = runtime.Spec{
			Container: runtime.Container{Image: c.GetImage(), Command: c.GetCommand(), Args: c.GetArgs(), Env: c.GetEnvironmentVariables(), WorkingDir: c.GetWorkingDir()},
		}
		for _, fm := range c.GetFiles() {
			req.Spec.Files = append(req.Spec.Files, runtime.File{Path: fm.GetPath(), Content: fm.GetContent()})
		}
		if c.GetResources() != nil && c.GetResourceRequirements() != nil {
			add(f+".resource_requirements", "set either resources or resource_requirements, not both")
		}
		if res := EffectiveLimits(c); res != nil {
			req.Spec.Resources.MilliCPU, req.Spec.Resources.MemoryBytes = parseResources(res, f+".resources", add)
			if res.GetGpu().GetCount() > 0 {
				unsupported = append(unsupported, "GPUs")
			}
		}
		if res := effectiveRequests(c); res != nil {
			req.Spec.Resources.RequestMilliCPU, req.Spec.Resources.RequestMemoryBytes = parseResources(res, f+".resource_requirements.requests", add)
		}
		vols, mounts, volVs, volUnsupported := scratchVolumes(spec, c, f)
		req.Spec.Volumes, req.Spec.VolumeMounts = vols, mounts
		vs, unsupported = append(vs, volVs...), append(unsupported, volUnsupported...)
		if len(c.GetSecretStores()) > 0 {
			unsupported = append(unsupported, "secret stores")
		}
		sec, secVs := securityContext(c.GetSecurityContext(), f+".security_context")
		req.Spec.Security, vs = sec, append(vs, secVs...)
		if c.GetStartupProbe() != nil {
			unsupported = append(unsupported, "startup probes")
		}
		if c.GetImagePullCredentials() != nil {
			unsupported = append(unsupported, "image pull credentials from secret stores")
		}
	}
	req.Lifetime = time.Duration(spec.GetMaxLifetimeSeconds()) * time.Second
	switch limit := int32(runner.MaxLifetime / time.Second); {
	case spec.GetMaxLifetimeSeconds() < 0:
		add("sandbox.spec.max_lifetime_seconds", "must not be negative, got %d", spec.GetMaxLifetimeSeconds())
	case spec.GetMaxLifetimeSeconds() > limit:
		add("sandbox.spec.max_lifetime_seconds", "must be at most %d (30 days) under any policy, got %d", limit, spec.GetMaxLifetimeSeconds())
	}
	// Which classes exist is each runner's to say (placement checks it); here only the
	// shape of the name, a DNS label as in Kubernetes' RuntimeClass.
	if rc := spec.GetRuntimeClass(); rc == "" || dnsLabel.MatchString(rc) {
		req.Spec.RuntimeClass = rc
	} else {
		add("sandbox.spec.runtime_class", "must be a lowercase DNS label such as runc or gvisor (a-z, 0-9, '-', at most 63), got %q", rc)
	}
	vs = append(vs, serviceViolations(spec.GetServices())...)
	for _, s := range spec.GetServices() {
		req.Spec.Services = append(req.Spec.Services, toRuntimeService(s))
	}
	network, nvs, nunsupported := ToNetwork(spec.GetNetwork())
	req.Spec.Network = network
	vs = append(vs, nvs...)
	unsupported = append(unsupported, nunsupported...)
	vs = append(vs, extra...)
	if len(spec.GetNetworkIds()) > 0 || spec.GetNetworkConfigId() != "" {
		unsupported = append(unsupported, "networks")
	}
	if spec.GetObjectStorageAccess() != nil {
		unsupported = append(unsupported, "object storage access")
	}
	if spec.GetInstanceType() != "" {
		unsupported = append(unsupported, "instance types")
	}
	if len(vs) > 0 {
		return req, apierr.Invalid(apierr.InvalidRequest, "invalid sandbox spec: "+apierr.Describe(vs), vs)
	}
	if len(unsupported) > 0 {
		slices.Sort(unsupported)
		return req, apierr.Newf(apierr.NotImplemented,
			"not supported by this sandboxd yet: %s", strings.Join(slices.Compact(unsupported), ", "))
	}
	return req, nil
}

// Primary returns the primary container: the one marked primary, else the first.
func Primary(spec *sandboxv1.SandboxSpec) *sandboxv1.Container {
	for _, c := range spec.GetContainers() {
		if c.GetPrimary() {
			return c
		}
	}
	if len(spec.GetContainers()) > 0 {
		return spec.GetContainers()[0]
	}
	return nil
}

// EffectiveLimits is what the runner enforces: the legacy resources, else the limits,
// else the requests (a request alone is enforced as the limit).
func EffectiveLimits(c *sandboxv1.Container) *sandboxv1.Resources {
	if r := c.GetResources(); r != nil {
		return r
	}
	rr := c.GetResourceRequirements()
	if l := rr.GetLimits(); l != nil {
		return l
	}
	return rr.GetRequests()
}

// effectiveRequests is what the runner admits a container by: the legacy resources (a
// request and limit in one), else the requests; nil means the limits (a lone limit is
// also the request).
func effectiveRequests(c *sandboxv1.Container) *sandboxv1.Resources {
	if r := c.GetResources(); r != nil {
		return r
	}
	return c.GetResourceRequirements().GetRequests()
}

// parseResources parses res's CPU and memory, reporting bad quantities under field.
func parseResources(res *sandboxv1.Resources, field string, add runtime.AddFunc) (milliCPU, memory int64) {
	milliCPU, err := quantity.ParseCPU(res.GetCpu())
	if err != nil {
		add(field+".cpu", "%v", err)
	}
	memory, err = quantity.ParseMemory(res.GetMemory())
	if err != nil {
		add(field+".memory", "%v", err)
	}
	return milliCPU, memory
}

func toRuntimeService(s *sandboxv1.Service) runtime.Service {
	out := runtime.Service{Port: int(s.GetPort()), Name: s.GetName()}
	switch s.GetVisibility() {
	case sandboxv1.Visibility_VISIBILITY_PUBLIC:
		out.Visibility = "public"
	case sandboxv1.Visibility_VISIBILITY_PRIVATE:
		out.Visibility = "private"
	case sandboxv1.Visibility_VISIBILITY_CUSTOM:
		out.Visibility = "custom" // reachable from the sources of the ingress rules
	}
	if ep := s.GetEndpoint(); ep != nil {
		switch ep.GetKind() {
		case sandboxv1.EndpointKind_ENDPOINT_KIND_HTTPS:
			out.Endpoint = runtime.EndpointHTTPS
		case sandboxv1.EndpointKind_ENDPOINT_KIND_TLS_PASSTHROUGH:
			out.Endpoint = runtime.EndpointPassthrough
		}
		out.TokenAuth = ep.GetAuth() == sandboxv1.EndpointAuth_ENDPOINT_AUTH_SHARE_TOKEN
		out.TimeoutSeconds = int(ep.GetRequestTimeoutSeconds())
	}
	return out
}

// dnsLabel is an RFC 1123 label, as Kubernetes names RuntimeClasses.
var dnsLabel = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)
