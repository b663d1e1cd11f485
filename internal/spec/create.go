package spec

import (
	"cmp"
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
// after the spec's own and with them. Snapshot restores are NOT_IMPLEMENTED here: a
// caller that can look snapshots up uses Convert with a Restorer.
func ToCreateRequest(spec *sandboxv1.SandboxSpec, extra ...apierr.Violation) (runner.CreateRequest, error) {
	return Convert(spec, Options{Extra: extra})
}

// Options are what Convert needs besides the spec.
type Options struct {
	// Extra: see ToCreateRequest.
	Extra []apierr.Violation
	// Restore looks up the snapshots scratch volumes restore (restore_from_snapshot_id),
	// once the spec is otherwise valid; the request's Restores carry them by volume
	// name. nil: restores are NOT_IMPLEMENTED.
	Restore Restorer
	// Registered resolves the registered volumes the spec mounts (volume_id), once the
	// spec is otherwise valid. nil: registered volumes are NOT_IMPLEMENTED.
	Registered RegisteredResolver
	// Secrets resolves the secrets containers reference (secret_stores,
	// image_pull_credentials; secrets.go) into the runtime spec's SecretEnv and
	// PullCredentials, once the spec is otherwise valid. nil: they are NOT_IMPLEMENTED.
	Secrets SecretResolver
}

// RegisteredVolume is what a registered volume (volume_id) is on its runner.
type RegisteredVolume struct {
	Managed string // runtime.Volume.Managed
	// Global, for a GLOBAL volume: the mount is a scratch volume of SizeBytes tied to the
	// volume's blob prefix (runtime.Volume.Global), restored from Restore when set (the
	// volume's latest committed generation; nil for an empty one).
	Global    *runtime.GlobalVolume
	SizeBytes int64
	Restore   *runner.SnapshotSource
	SubPath   string // the volume-level root inside it ("" = its root)
	ReadOnly  bool   // every mount of it is read-only
}

// RegisteredResolver looks up registered volume volumeID at field
// (sandbox.spec.volumes[i].volume_id): the volume, or the API error that refuses the
// create (CWSANDBOX_VOLUME_NOT_FOUND, CWSANDBOX_VOLUME_NOT_READY, …).
type RegisteredResolver func(field, volumeID string) (RegisteredVolume, error)

// Convert is ToCreateRequest with Options.
func Convert(spec *sandboxv1.SandboxSpec, o Options) (runner.CreateRequest, error) {
	extra := o.Extra
	var vs []apierr.Violation
	add := func(field, format string, args ...any) {
		vs = append(vs, apierr.Violation{Field: field, Description: fmt.Sprintf(format, args...)})
	}
	var (
		unsupported []string
		notApplied  []apierr.Violation // what of unsupported a field names
	)
	if spec == nil {
		return runner.CreateRequest{}, apierr.Invalid(apierr.InvalidRequest, "sandbox.spec is required", []apierr.Violation{{Field: "sandbox.spec", Description: "is required"}})
	}
	cs := spec.GetContainers()
	switch n := len(cs); {
	case n == 0:
		add("sandbox.spec.containers", "at least one container is required")
	case n > runtime.MaxContainers:
		add("sandbox.spec.containers", "has %d containers, at most %d allowed", n, runtime.MaxContainers)
		cs = cs[:runtime.MaxContainers] // bounded work on untrusted input: the rest is refused above
	}
	vs = append(vs, containerNameViolations("sandbox.spec.containers", cs)...)
	vs = append(vs, primaryViolations("sandbox.spec.containers", cs)...)
	vs = append(vs, tagViolations("sandbox.spec.tags", spec.GetTags())...)
	vs = append(vs, annotationViolations("sandbox.spec.annotations", spec.GetAnnotations())...)
	var req runner.CreateRequest
	vols, volNames, volVs, volUnsupported, restores := scratchVolumes(spec, o.Restore != nil, o.Registered != nil)
	req.Spec.Volumes = vols
	vs, unsupported = append(vs, volVs...), append(unsupported, volUnsupported...)
	pi := primaryIndex(cs)
	fields := make([]string, len(cs))
	secrets := 0
	for i, c := range cs {
		fields[i] = fmt.Sprintf("sandbox.spec.containers[%d]", i)
		rc, cvs, cunsupported := toContainer(c, fields[i], volNames)
		vs, notApplied = append(vs, cvs...), append(notApplied, cunsupported...)
		for _, u := range cunsupported {
			unsupported = append(unsupported, u.Description)
		}
		if len(c.GetSecretStores()) > 0 || c.GetImagePullCredentials() != nil {
			if o.Secrets == nil {
				notSupportedSecrets(c, fields[i], &unsupported, &notApplied)
			} else {
				uses, _, svs := containerSecrets(c, fields[i])
				vs, secrets = append(vs, svs...), secrets+len(uses)
			}
		}
		if i == pi {
			req.Spec.Container = rc
		} else {
			req.Spec.Sidecars = append(req.Spec.Sidecars, rc)
		}
	}
	if secrets > runtime.MaxSecretEnvVars {
		add("sandbox.spec.containers", "reference %d secrets (secret_stores) in all, at most %d per sandbox", secrets, runtime.MaxSecretEnvVars)
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
	notSupported := func(field, what string) {
		unsupported = append(unsupported, what)
		notApplied = append(notApplied, apierr.Violation{Field: field, Description: what})
	}
	if len(network.EgressSecrets()) > 0 {
		if o.Secrets == nil {
			for i, r := range network.Egress {
				if r.Secret != nil {
					notSupported(fmt.Sprintf("%segress[%d].sandboxd_secret", networkField, i), "egress secrets")
				}
			}
		} else {
			runner.ValidateEgressSecrets(&req.Spec, false, func(field, format string, args ...any) {
				add("sandbox."+field, format, args...)
			})
		}
	}
	if len(spec.GetNetworkIds()) > 0 {
		notSupported("sandbox.spec.network_ids", "networks")
	}
	if spec.GetNetworkConfigId() != "" {
		notSupported("sandbox.spec.network_config_id", "networks")
	}
	if spec.GetObjectStorageAccess() != nil {
		notSupported("sandbox.spec.object_storage_access", "object storage access")
	}
	if spec.GetInstanceType() != "" {
		notSupported("sandbox.spec.instance_type", "instance types")
	}
	if len(vs) > 0 {
		return req, apierr.Invalid(apierr.InvalidRequest, "invalid sandbox spec: "+apierr.Describe(vs), vs)
	}
	if len(unsupported) > 0 {
		slices.Sort(unsupported)
		err := apierr.Newf(apierr.NotImplemented,
			"not supported by this sandboxd yet: %s", strings.Join(slices.Compact(unsupported), ", "))
		if len(notApplied) > 0 {
			err = apierr.WithViolations(err, notApplied)
		}
		return req, err
	}
	// Last: the lookups of a valid spec's restores (they read the snapshot index).
	srcs, err := resolveRestores(restores, o.Restore)
	if err != nil {
		return req, err
	}
	req.Restores = srcs
	if err := resolveRegistered(spec, &req, o.Registered); err != nil {
		return req, err
	}
	if o.Secrets != nil && secrets+countPulls(cs) > 0 {
		outs := make([]*runtime.Container, len(cs))
		for i, k := 0, 0; i < len(cs); i++ {
			if i == pi {
				outs[i] = &req.Spec.Container
			} else {
				outs[i] = &req.Spec.Sidecars[k]
				k++
			}
		}
		if err := resolveSecrets(cs, fields, outs, o.Secrets); err != nil {
			return req, err
		}
	}
	if o.Secrets != nil && len(network.EgressSecrets()) > 0 {
		if err := resolveEgressSecrets(&req.Spec, o.Secrets); err != nil {
			return req, err
		}
	}
	return req, nil
}

// notSupportedSecrets records c's secret references as not supported (no resolver).
func notSupportedSecrets(c *sandboxv1.Container, f string, unsupported *[]string, notApplied *[]apierr.Violation) {
	if len(c.GetSecretStores()) > 0 {
		*unsupported = append(*unsupported, "secret stores")
		*notApplied = append(*notApplied, apierr.Violation{Field: f + ".secret_stores", Description: "secret stores"})
	}
	if c.GetImagePullCredentials() != nil {
		*unsupported = append(*unsupported, "image pull credentials from secret stores")
		*notApplied = append(*notApplied, apierr.Violation{Field: f + ".image_pull_credentials", Description: "image pull credentials from secret stores"})
	}
}

func countPulls(cs []*sandboxv1.Container) int {
	n := 0
	for _, c := range cs {
		if c.GetImagePullCredentials() != nil {
			n++
		}
	}
	return n
}

// Primary returns the primary container: the one marked primary, else the first.
func Primary(spec *sandboxv1.SandboxSpec) *sandboxv1.Container {
	if cs := spec.GetContainers(); len(cs) > 0 {
		return cs[primaryIndex(cs)]
	}
	return nil
}

// primaryIndex is the index of the primary container in cs: the first marked primary,
// else 0 (the official client marks one when there are several, and may mark none when
// there is one).
func primaryIndex(cs []*sandboxv1.Container) int {
	for i, c := range cs {
		if c.GetPrimary() {
			return i
		}
	}
	return 0
}

// primaryViolations: at most one container is marked primary.
func primaryViolations(field string, cs []*sandboxv1.Container) []apierr.Violation {
	var vs []apierr.Violation
	first := -1
	for i, c := range cs {
		if !c.GetPrimary() {
			continue
		}
		if first >= 0 {
			vs = append(vs, apierr.Violation{Field: fmt.Sprintf("%s[%d].primary", field, i),
				Description: fmt.Sprintf("only one container may be primary, and %s[%d] already is", field, first)})
			continue
		}
		first = i
	}
	return vs
}

// toContainer converts one wire container (at field f) into the runtime's: every
// problem as a violation under f, what this sandboxd cannot do yet in unsupported (the
// field, and the feature as the description).
// volumes are the names of the sandbox's volumes, which its mounts must name.
func toContainer(c *sandboxv1.Container, f string, volumes map[string]bool) (runtime.Container, []apierr.Violation, []apierr.Violation) {
	var (
		vs          []apierr.Violation
		unsupported []apierr.Violation
	)
	add := func(field, format string, args ...any) {
		vs = append(vs, apierr.Violation{Field: field, Description: fmt.Sprintf(format, args...)})
	}
	if strings.TrimSpace(c.GetImage()) == "" {
		add(f+".image", "is required")
	}
	out := runtime.Container{Name: c.GetName(), Image: c.GetImage(), Command: c.GetCommand(), Args: c.GetArgs(), Env: c.GetEnvironmentVariables(), WorkingDir: c.GetWorkingDir()}
	for _, fm := range c.GetFiles() {
		out.Files = append(out.Files, runtime.File{Path: fm.GetPath(), Content: fm.GetContent()})
	}
	if c.GetResources() != nil && c.GetResourceRequirements() != nil {
		add(f+".resource_requirements", "set either resources or resource_requirements, not both")
	}
	if res := EffectiveLimits(c); res != nil {
		out.Resources.MilliCPU, out.Resources.MemoryBytes = parseResources(res, f+".resources", add)
		if res.GetGpu().GetCount() > 0 {
			field := f + ".resources.gpu"
			if c.GetResources() == nil {
				field = f + ".resource_requirements.limits.gpu"
				if c.GetResourceRequirements().GetLimits() == nil {
					field = f + ".resource_requirements.requests.gpu"
				}
			}
			unsupported = append(unsupported, apierr.Violation{Field: field, Description: "GPUs"})
		}
	}
	switch res := effectiveRequests(c); {
	case res == nil:
	case res == c.GetResources(): // legacy resources: one value, the request and the limit (parsed once, reported once)
		out.Resources.RequestMilliCPU, out.Resources.RequestMemoryBytes = out.Resources.MilliCPU, out.Resources.MemoryBytes
	default:
		out.Resources.RequestMilliCPU, out.Resources.RequestMemoryBytes = parseResources(res, f+".resource_requirements.requests", add)
	}
	out.VolumeMounts, vs = volumeMounts(c, f, volumes, vs)
	sec, secVs := securityContext(c.GetSecurityContext(), f+".security_context")
	out.Security, vs = sec, append(vs, secVs...)
	out.StartupProbe, vs = toProbe(c.GetStartupProbe(), f+".startup_probe", vs)
	return out, vs, unsupported
}

// Bounds of a startup probe's timing (seconds): a day is far beyond any start-up, and
// keeps the product of period and threshold from overflowing a Duration.
const (
	maxProbeSeconds   = 86400
	maxProbeFailures  = 10000
	maxProbeExecBytes = 64 << 10
)

// toProbe converts a wire startup probe (at field f); nil stays nil. Zero timings are
// the runtime's defaults (runtime.DefaultProbePeriod …).
func toProbe(p *sandboxv1.Probe, f string, vs []apierr.Violation) (*runtime.Probe, []apierr.Violation) {
	if p == nil {
		return nil, vs
	}
	add := func(field, format string, args ...any) {
		vs = append(vs, apierr.Violation{Field: field, Description: fmt.Sprintf(format, args...)})
	}
	n := 0
	for _, a := range p.GetExec() {
		n += len(a)
	}
	switch {
	case len(p.GetExec()) == 0:
		add(f+".exec", "is required: the command (argv) whose exit 0 passes the probe")
	case len(p.GetExec()) > runtime.MaxArgs || n > maxProbeExecBytes:
		add(f+".exec", "has %d arguments of %d bytes in all, at most %d and %d bytes allowed", len(p.GetExec()), n, runtime.MaxArgs, maxProbeExecBytes)
	case p.GetExec()[0] == "":
		add(f+".exec[0]", "must name the command to run")
	}
	secs := func(field string, v int32) time.Duration {
		if v < 0 || v > maxProbeSeconds {
			add(f+"."+field, "must be 0 (the default) to %d seconds, got %d", maxProbeSeconds, v)
			return 0
		}
		return time.Duration(v) * time.Second
	}
	out := &runtime.Probe{
		Exec:         p.GetExec(),
		InitialDelay: secs("initial_delay_seconds", p.GetInitialDelaySeconds()),
		Period:       secs("period_seconds", p.GetPeriodSeconds()),
		Timeout:      secs("timeout_seconds", p.GetTimeoutSeconds()),
	}
	if t := p.GetFailureThreshold(); t < 0 || t > maxProbeFailures {
		add(f+".failure_threshold", "must be 0 (the default) to %d, got %d", maxProbeFailures, t)
	} else {
		out.FailureThreshold = int(t)
	}
	return out, vs
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

// EffectiveTotal is what a sandbox's status reports as its effective resources: for one
// container its own (the legacy resources, else its limits, else its requests) and
// requirements; for a group the sum over its containers, the total the policy's ceilings
// (constraints.resources.total_*) and the runner's admission apply to. A limit that one
// container leaves unset is unlimited for the sandbox (no total of it is shown); a
// request it leaves unset is its limit. GPUs are summed by count.
func EffectiveTotal(spec *sandboxv1.SandboxSpec) (*sandboxv1.Resources, *sandboxv1.ResourceRequirements) {
	cs := spec.GetContainers()
	if len(cs) <= 1 {
		c := Primary(spec)
		if c == nil {
			return nil, nil
		}
		rr := c.GetResourceRequirements()
		if rr == nil && c.GetResources() != nil {
			rr = &sandboxv1.ResourceRequirements{Requests: c.GetResources(), Limits: c.GetResources()}
		}
		return EffectiveLimits(c), rr
	}
	type sum struct {
		cpu, mem, gpu int64
		noCPU, noMem  bool // some container sets none
	}
	add := func(t *sum, r *sandboxv1.Resources) {
		cpu, err := quantity.ParseCPU(r.GetCpu())
		if err != nil || cpu <= 0 {
			t.noCPU = true
		}
		mem, err := quantity.ParseMemory(r.GetMemory())
		if err != nil || mem <= 0 {
			t.noMem = true
		}
		t.cpu, t.mem, t.gpu = t.cpu+max(cpu, 0), t.mem+max(mem, 0), t.gpu+max(r.GetGpu().GetCount(), 0)
	}
	var lim, req sum
	for _, c := range cs {
		l := EffectiveLimits(c)
		add(&lim, l)
		r := effectiveRequests(c)
		add(&req, &sandboxv1.Resources{Cpu: cmp.Or(r.GetCpu(), l.GetCpu()), Memory: cmp.Or(r.GetMemory(), l.GetMemory()), Gpu: cmp.Or(r.GetGpu(), l.GetGpu())})
	}
	wire := func(t sum) *sandboxv1.Resources {
		r := &sandboxv1.Resources{}
		if !t.noCPU {
			r.Cpu = quantity.FormatCPU(t.cpu)
		}
		if !t.noMem {
			r.Memory = quantity.FormatMemory(t.mem)
		}
		if t.gpu > 0 {
			r.Gpu = &sandboxv1.Gpu{Count: t.gpu}
		}
		if r.Cpu == "" && r.Memory == "" && r.Gpu == nil {
			return nil
		}
		return r
	}
	limits, requests := wire(lim), wire(req)
	if limits == nil && requests == nil {
		return nil, nil
	}
	return limits, &sandboxv1.ResourceRequirements{Requests: requests, Limits: limits}
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
