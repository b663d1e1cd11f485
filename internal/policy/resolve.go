package policy

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"google.golang.org/protobuf/proto"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/quantity"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// Platform limits and defaults, which hold under every policy.
const (
	// MaxLifetimeSeconds (30 days) caps every sandbox's lifetime, whatever the policy says.
	MaxLifetimeSeconds int32 = 30 * 24 * 60 * 60
	// DefaultLifetimeSeconds is the lifetime of a sandbox when neither spec nor policy
	// sets one.
	DefaultLifetimeSeconds int32 = 600
	// DefaultMaxServices is the services per sandbox when the policy sets no max.
	DefaultMaxServices = 5
)

// Platform is what the runner itself allows and defaults to, below any policy.
type Platform struct {
	// MaxLifetimeSeconds: 0 or anything above MaxLifetimeSeconds means MaxLifetimeSeconds.
	MaxLifetimeSeconds int32
	// DefaultLifetimeSeconds: 0 means DefaultLifetimeSeconds.
	DefaultLifetimeSeconds int32
	// MaxServices is the services per sandbox when the policy sets no max; 0 means
	// DefaultMaxServices.
	MaxServices int
	// RuntimeClasses the runner can run; empty means it does not restrict the name.
	RuntimeClasses []string
	// DefaultCPURuntimeClass and DefaultGPURuntimeClass are the runner's own defaults,
	// used when neither spec nor policy base names one ("" = the backend's default).
	DefaultCPURuntimeClass string
	DefaultGPURuntimeClass string
	// PrivilegedAllowed says whether the runner can run privileged containers at all.
	PrivilegedAllowed bool
	// AllowedCapabilities are the capabilities a container may add when the policy has
	// no allowed_capabilities of its own (a policy's list replaces it). nil leaves adds
	// unconstrained; empty allows none without the policy's consent.
	AllowedCapabilities []string
	// Support is what the runner cannot do (no edge, no host-name egress rules, no share
	// tokens): a spec asking for it is refused with a platform.* constraint.
	runtime.Support
	// DefaultEgress is the runner's egress for a sandbox left without egress rules by
	// both its spec and its policy's base (and not denying egress). Only the rules the
	// policy's allowed_egress covers apply: a default never widens an envelope.
	DefaultEgress []Rule
	// DefaultResources are the runner's per-container defaults, below the policy base.
	DefaultResources *ResourceDefaults
	// EngineImage and EngineRuntimeClass are what the runner runs a container-engine
	// sandbox (runtime.Spec.Engine) with: ResolveEngine gives them to the sandbox's one
	// container. Meaningless when Support.NoContainerEngine.
	EngineImage        string
	EngineRuntimeClass string
	// EngineUnavailable says why the runner runs no container-engine sandboxes (for the
	// refusal's message); "" says nothing.
	EngineUnavailable string
}

// DefaultsOf is a runner's default requests and limits (the request and limit fields of
// r; zero ones unset) as Platform.DefaultResources takes them.
func DefaultsOf(r runtime.Resources) ResourceDefaults {
	q := func(v int64, format func(int64) string) Quantity {
		if v <= 0 {
			return ""
		}
		return Quantity(format(v))
	}
	return ResourceDefaults{
		Requests: ResourceValues{CPU: q(r.RequestMilliCPU, quantity.FormatCPU), Memory: q(r.RequestMemoryBytes, quantity.FormatMemory)},
		Limits:   ResourceValues{CPU: q(r.MilliCPU, quantity.FormatCPU), Memory: q(r.MemoryBytes, quantity.FormatMemory)},
	}
}

// DefaultPlatform is the platform of the documented product: 600 s default lifetime,
// 30-day maximum, 5 services, no privileged containers, no restriction on names.
func DefaultPlatform() Platform {
	return Platform{MaxLifetimeSeconds: MaxLifetimeSeconds, DefaultLifetimeSeconds: DefaultLifetimeSeconds, MaxServices: DefaultMaxServices}
}

// Result is a resolution: the resolved spec, the violations (empty means accepted), and
// the revision of the policy that was applied, which the caller records with the
// sandbox so that later policy changes do not affect it.
type Result struct {
	Spec           *sandboxv1.SandboxSpec
	Violations     []Violation
	PolicyRevision string
	// Pod is the policy's Kubernetes Pod settings (base.pod) for the backend; nil when
	// the policy has none. The public spec has no place for them.
	Pod *runtime.PodSettings
	// meta: see Meta.
	meta map[string]string
}

// Meta is what the policy adds to the sandbox's runtime.Spec.Meta (the pause settings
// of base.pause: runtime.MetaPauseLifetime, MetaAutoResume, MetaIdlePause, only those
// that differ from the defaults); nil when nothing.
func (r Result) Meta() map[string]string { return maps.Clone(r.meta) }

// SetMeta writes the policy's part of a spec's Meta (Meta) into m, replacing what
// another resolution wrote there (a runner that checks its own policy replaces the
// gateway's), and returns m (a new map when m is nil).
func (r Result) SetMeta(m map[string]string) map[string]string {
	if m == nil {
		m = map[string]string{}
	}
	for _, k := range policyMetaKeys {
		delete(m, k)
	}
	maps.Copy(m, r.meta)
	return m
}

// policyMetaKeys are the Meta keys a resolution writes.
var policyMetaKeys = []string{runtime.MetaPauseLifetime, runtime.MetaAutoResume, runtime.MetaIdlePause}

// OK reports whether the spec was accepted.
func (r Result) OK() bool { return len(r.Violations) == 0 }

// ResolveRevision is Resolve recording revision, the caller's identifier of p (its etag).
func ResolveRevision(p *Policy, revision string, spec *sandboxv1.SandboxSpec, platform Platform) Result {
	return ResolveEngine(p, revision, spec, nil, platform)
}

// Resolve merges platform defaults, then p's base, then spec (the spec wins per scalar;
// base env, annotations and tags are attached), and checks every constraint on the
// result, returning every violation. spec is never modified. The resolved spec is
// returned even when there are violations (for messages); it must not be run then.
// A nil p is the empty, permissive policy.
func Resolve(p *Policy, spec *sandboxv1.SandboxSpec, platform Platform) (*sandboxv1.SandboxSpec, []Violation) {
	return resolve(p, spec, nil, platform)
}

func resolve(p *Policy, spec *sandboxv1.SandboxSpec, engine *runtime.Engine, platform Platform) (*sandboxv1.SandboxSpec, []Violation) {
	if p == nil {
		p = &Policy{}
	}
	r := &resolver{p: p, c: &p.Constraints, pl: platform, mirrored: map[string]bool{}}
	if spec == nil {
		r.add("sandbox.spec", ConstraintSpec, "", false, "a sandbox spec is required")
		return nil, r.vs
	}
	s := proto.CloneOf(spec)
	pinned := s.GetRuntimeClass() != ""
	if engine != nil {
		r.engine(s, engine)
		pinned = false // the runner's choice, not the caller's
	}
	r.merge(s)
	r.checkLifetime(s)
	r.checkResources(s)
	r.checkImages(s)
	if engine != nil {
		for i, img := range engine.Images {
			r.checkImage(fmt.Sprintf("engine.images[%d]", i), img)
		}
	}
	r.checkServices(s)
	r.checkNetwork(s)
	r.checkSecurity(s, pinned)
	r.checkAnnotations(s)
	r.checkInstanceType(s)
	r.checkSnapshots(s)
	return s, r.vs
}

type resolver struct {
	p  *Policy
	c  *Constraints
	pl Platform
	vs []Violation
	// mirrored are the request and limit fields merge copied from the other side the
	// spec stated: a violation of theirs is the stated side's.
	mirrored map[string]bool
}

func (r *resolver) add(field, constraint, limit string, ceiling bool, format string, args ...any) {
	r.vs = append(r.vs, Violation{Violation: apierr.Violation{Field: field, Description: fmt.Sprintf(format, args...)}, Constraint: constraint, Limit: limit, Ceiling: ceiling})
}

func containerField(i int) string { return fmt.Sprintf("sandbox.spec.containers[%d]", i) }

// ---- merge ----

func (r *resolver) merge(s *sandboxv1.SandboxSpec) {
	b := &r.p.Base
	if s.MaxLifetimeSeconds == 0 {
		s.MaxLifetimeSeconds = b.MaxLifetimeSeconds
		if s.MaxLifetimeSeconds <= 0 {
			s.MaxLifetimeSeconds = r.pl.DefaultLifetimeSeconds
		}
		if s.MaxLifetimeSeconds <= 0 {
			s.MaxLifetimeSeconds = DefaultLifetimeSeconds
		}
	}
	defaults := overlay(capped(r.pl.DefaultResources, r.c.Resources), b.Resources)
	for i, c := range s.Containers {
		if c == nil {
			continue
		}
		for k, v := range b.Env {
			if _, ok := c.EnvironmentVariables[k]; !ok {
				if c.EnvironmentVariables == nil {
					c.EnvironmentVariables = map[string]string{}
				}
				c.EnvironmentVariables[k] = v
			}
		}
		r.fillResources(c, containerField(i), defaults)
	}
	for k, v := range b.Annotations {
		if _, ok := s.Annotations[k]; !ok {
			if s.Annotations == nil {
				s.Annotations = map[string]string{}
			}
			s.Annotations[k] = v
		}
	}
	for _, t := range b.Tags {
		if !slices.Contains(s.Tags, t) {
			s.Tags = append(s.Tags, t)
		}
	}
	if s.RuntimeClass == "" {
		s.RuntimeClass = r.defaultRuntimeClass(hasGPU(s))
	}
	if len(b.DefaultEgress) > 0 && len(s.GetNetwork().GetEgress()) == 0 && !s.GetNetwork().GetDenyEgress() {
		if s.Network == nil {
			s.Network = &sandboxv1.NetworkOptions{}
		}
		for _, rule := range b.DefaultEgress {
			s.Network.Egress = append(s.Network.Egress, toEgress(rule))
		}
	}
	if len(r.pl.DefaultEgress) > 0 && len(s.GetNetwork().GetEgress()) == 0 && !s.GetNetwork().GetDenyEgress() {
		var envelope []entry
		if nc := r.c.Network; nc != nil && len(nc.AllowedEgress) > 0 {
			envelope = parseEntries(nc.AllowedEgress)
		}
		for _, rule := range r.pl.DefaultEgress {
			w := toEgress(rule)
			d := destination{any: rule.Any, cidr: w.GetCidr(), tenant: w.GetTenant()}
			if envelope != nil {
				if ok, _ := covered(envelope, d, spansOf(w.GetPorts()), false); !ok {
					continue
				}
			}
			if s.Network == nil {
				s.Network = &sandboxv1.NetworkOptions{}
			}
			s.Network.Egress = append(s.Network.Egress, w)
		}
	}
	if len(b.DefaultIngress) > 0 && len(s.GetNetwork().GetIngress()) == 0 && !s.GetNetwork().GetDenyIngress() {
		if s.Network == nil {
			s.Network = &sandboxv1.NetworkOptions{}
		}
		for _, rule := range b.DefaultIngress {
			s.Network.Ingress = append(s.Network.Ingress, toIngress(rule))
		}
	}
}

func (r *resolver) defaultRuntimeClass(gpu bool) string {
	if gpu {
		return firstNonEmpty(r.p.Base.DefaultGPURuntimeClass, r.pl.DefaultGPURuntimeClass)
	}
	return firstNonEmpty(r.p.Base.DefaultCPURuntimeClass, r.pl.DefaultCPURuntimeClass)
}

// firstNonEmpty returns the first non-empty string.
func firstNonEmpty(ss ...string) string {
	for _, s := range ss {
		if s != "" {
			return s
		}
	}
	return ""
}

// overlay merges per-quantity defaults, top winning.
func overlay(bottom, top *ResourceDefaults) ResourceDefaults {
	var d ResourceDefaults
	for _, src := range []*ResourceDefaults{bottom, top} {
		if src == nil {
			continue
		}
		d.Requests.CPU = cmpQ(src.Requests.CPU, d.Requests.CPU)
		d.Requests.Memory = cmpQ(src.Requests.Memory, d.Requests.Memory)
		d.Limits.CPU = cmpQ(src.Limits.CPU, d.Limits.CPU)
		d.Limits.Memory = cmpQ(src.Limits.Memory, d.Limits.Memory)
	}
	return d
}

func cmpQ(a, b Quantity) Quantity {
	if a != "" {
		return a
	}
	return b
}

type kind int

const (
	cpu kind = iota
	memory
)

func (k kind) parse(s string) (int64, error) {
	if k == cpu {
		return quantity.ParseCPU(s)
	}
	return quantity.ParseMemory(s)
}

func (k kind) format(n int64) string {
	if k == cpu {
		return quantity.FormatCPU(n)
	}
	return quantity.FormatMemory(n)
}

func (k kind) String() string {
	if k == cpu {
		return "cpu"
	}
	return "memory"
}

func get(res *sandboxv1.Resources, k kind) string {
	if k == cpu {
		return res.GetCpu()
	}
	return res.GetMemory()
}

func set(res *sandboxv1.Resources, k kind, v string) {
	if k == cpu {
		res.Cpu = v
	} else {
		res.Memory = v
	}
}

// fillResources completes container c's (field cf) requests and limits per quantity
// from the defaults d, by runtime.Resources.WithDefaults' rule (Kubernetes' and the
// official client's): the request is the one asked, else the limit asked, else the
// default request; the limit is the one asked, else the default limit but never below
// the request (the request itself without a default limit); a request still unset is
// the limit. A legacy resources value is both request and limit; a quantity it leaves
// out takes that rule's limit. A side copied from the other side the caller stated is
// recorded in r.mirrored: the check of the stated side covers it.
func (r *resolver) fillResources(c *sandboxv1.Container, cf string, d ResourceDefaults) {
	defs := func(k kind) (req, lim string) {
		if k == cpu {
			return string(d.Requests.CPU), string(d.Limits.CPU)
		}
		return string(d.Requests.Memory), string(d.Limits.Memory)
	}
	if legacy := c.GetResources(); legacy != nil {
		for _, k := range []kind{cpu, memory} {
			if get(legacy, k) == "" {
				req, lim := defs(k)
				set(legacy, k, atLeast(k, lim, req))
			}
		}
		return
	}
	rr := c.GetResourceRequirements()
	for _, k := range []kind{cpu, memory} {
		defReq, defLim := defs(k)
		askedReq, askedLim := get(rr.GetRequests(), k), get(rr.GetLimits(), k)
		req := firstNonEmpty(askedReq, askedLim, defReq)
		lim := askedLim
		if lim == "" {
			lim = atLeast(k, defLim, req)
		}
		req = firstNonEmpty(req, lim)
		if req == "" {
			continue // nothing asked, no defaults: unbounded
		}
		if c.ResourceRequirements == nil {
			c.ResourceRequirements = &sandboxv1.ResourceRequirements{}
		}
		rr = c.ResourceRequirements
		if askedReq == "" {
			if rr.Requests == nil {
				rr.Requests = &sandboxv1.Resources{}
			}
			set(rr.Requests, k, req)
			if askedLim != "" {
				r.mirrored[cf+".resource_requirements.requests."+k.String()] = true
			}
		}
		if askedLim == "" {
			if rr.Limits == nil {
				rr.Limits = &sandboxv1.Resources{}
			}
			set(rr.Limits, k, lim)
			if askedReq != "" && lim == askedReq {
				r.mirrored[cf+".resource_requirements.limits."+k.String()] = true
			}
		}
	}
}

// atLeast is v, or floor when v is empty or below it.
func atLeast(k kind, v, floor string) string {
	if v == "" || floor != "" && less(k, v, floor) {
		return floor
	}
	return v
}

// capped is the platform's defaults d held under the policy's per-container maxima: a
// runner's default never makes a sandbox break its policy (the policy's own base
// defaults are checked against its maxima when it is saved).
func capped(d *ResourceDefaults, rc *ResourceConstraints) *ResourceDefaults {
	if d == nil || rc == nil {
		return d
	}
	out := *d
	for _, q := range []struct {
		k    kind
		max  Quantity
		vals []*Quantity
	}{
		{cpu, rc.MaxCPU, []*Quantity{&out.Requests.CPU, &out.Limits.CPU}},
		{memory, rc.MaxMemory, []*Quantity{&out.Requests.Memory, &out.Limits.Memory}},
	} {
		if q.max == "" {
			continue
		}
		for _, v := range q.vals {
			if *v != "" && less(q.k, string(q.max), string(*v)) {
				*v = q.max
			}
		}
	}
	return &out
}

// less reports a < b, false when either does not parse.
func less(k kind, a, b string) bool {
	x, err1 := k.parse(a)
	y, err2 := k.parse(b)
	return err1 == nil && err2 == nil && x < y
}

func gpuCount(c *sandboxv1.Container) int64 {
	n := c.GetResources().GetGpu().GetCount()
	n = max(n, c.GetResourceRequirements().GetRequests().GetGpu().GetCount())
	return max(n, c.GetResourceRequirements().GetLimits().GetGpu().GetCount())
}

func hasGPU(s *sandboxv1.SandboxSpec) bool {
	for _, c := range s.GetContainers() {
		if gpuCount(c) > 0 {
			return true
		}
	}
	return false
}

// ---- checks ----

func (r *resolver) checkLifetime(s *sandboxv1.SandboxSpec) {
	const f = "sandbox.spec.max_lifetime_seconds"
	lt := s.GetMaxLifetimeSeconds()
	if lt < 0 {
		r.add(f, ConstraintSpec, "", false, "max_lifetime_seconds must not be negative, got %d; use 0 for the default", lt)
		return
	}
	platformMax := r.pl.MaxLifetimeSeconds
	if platformMax <= 0 || platformMax > MaxLifetimeSeconds {
		platformMax = MaxLifetimeSeconds
	}
	if lt > platformMax {
		r.add(f, ConstraintPlatformLifetime, strconv.Itoa(int(platformMax)), false,
			"max_lifetime_seconds %d is above the platform maximum of %d seconds; ask for %d or less", lt, platformMax, platformMax)
	}
	if l := r.c.Lifetime; l != nil && l.MaxSeconds > 0 && lt > l.MaxSeconds {
		r.add(f, "constraints.lifetime.max_seconds", strconv.Itoa(int(l.MaxSeconds)), false,
			"max_lifetime_seconds %d is above this runner's maximum of %d seconds; ask for %d or less", lt, l.MaxSeconds, l.MaxSeconds)
	}
}

// quantityRef is one quantity of one container as the spec states it.
type quantityRef struct {
	field string
	value string
}

func (r *resolver) checkResources(s *sandboxv1.SandboxSpec) {
	rc := r.c.Resources
	var maxQ, totalQ [2]int64
	var hasMax, hasTotal [2]bool
	if rc != nil {
		for _, k := range []kind{cpu, memory} {
			mq, tq := rc.MaxCPU, rc.TotalCPU
			if k == memory {
				mq, tq = rc.MaxMemory, rc.TotalMemory
			}
			if n, err := k.parse(string(mq)); err == nil && mq != "" {
				maxQ[k], hasMax[k] = n, true
			}
			if n, err := k.parse(string(tq)); err == nil && tq != "" {
				totalQ[k], hasTotal[k] = n, true
			}
		}
	}
	var sum [2]int64
	var gpuSum int64
	for i, c := range s.GetContainers() {
		cf := containerField(i)
		if c.GetResources() != nil && c.GetResourceRequirements() != nil {
			r.add(cf+".resource_requirements", ConstraintSpec, "", false, "set either resources or resource_requirements, not both")
		}
		for _, k := range []kind{cpu, memory} {
			refs, enforced := quantities(c, cf, k)
			var vals = map[string]int64{}
			bad := false
			for _, q := range refs {
				n, err := k.parse(q.value)
				if err != nil && r.mirrored[q.field] {
					bad = true
					continue
				}
				if err != nil {
					r.add(q.field, ConstraintSpec, "", false, "%v", err)
					bad = true
					continue
				}
				vals[q.field] = n
				if hasMax[k] && n > maxQ[k] && !r.mirrored[q.field] {
					r.add(q.field, "constraints.resources.max_"+k.String(), k.format(maxQ[k]), false,
						"%s %s is above this runner's per-container maximum of %s; lower it to %s or less",
						strings.TrimPrefix(q.field, cf+"."), q.value, k.format(maxQ[k]), k.format(maxQ[k]))
				}
			}
			if rr := c.GetResourceRequirements(); rr != nil {
				rq, lm := cf+".resource_requirements.requests."+k.String(), cf+".resource_requirements.limits."+k.String()
				if a, okA := vals[rq]; okA {
					if b, okB := vals[lm]; okB && a > b {
						r.add(rq, ConstraintSpec, "", false, "requests.%s %s is above limits.%s %s; a request may not exceed its limit",
							k, get(rr.Requests, k), k, get(rr.Limits, k))
					}
				}
			}
			if enforced.field == "" {
				lf := cf + ".resource_requirements.limits." + k.String()
				if hasMax[k] {
					r.add(lf, "constraints.resources.max_"+k.String(), k.format(maxQ[k]), false,
						"sets no %s limit and the policy gives no default; set limits.%s to %s or less", k, k, k.format(maxQ[k]))
				}
				if hasTotal[k] {
					r.add(lf, "constraints.resources.total_"+k.String(), k.format(totalQ[k]), true,
						"sets no %s limit, so the sandbox total cannot be held under %s; set limits.%s", k, k.format(totalQ[k]), k)
				}
			} else if !bad {
				sum[k] += vals[enforced.field]
			}
		}
		for _, q := range gpuRefs(c, cf) {
			if rc != nil && rc.MaxGPU != nil && q.n > *rc.MaxGPU {
				r.add(q.field, "constraints.resources.max_gpu", strconv.FormatInt(*rc.MaxGPU, 10), false,
					"%s %d is above this runner's per-container maximum of %d GPUs; lower it to %d or less", strings.TrimPrefix(q.field, cf+"."), q.n, *rc.MaxGPU, *rc.MaxGPU)
			}
			if q.n < 0 {
				r.add(q.field, ConstraintSpec, "", false, "gpu.count must not be negative")
			}
		}
		gpuSum += max(gpuCount(c), 0)
	}
	for _, k := range []kind{cpu, memory} {
		if hasTotal[k] && sum[k] > totalQ[k] {
			r.add("sandbox.spec.containers", "constraints.resources.total_"+k.String(), k.format(totalQ[k]), true,
				"the containers' %s limits add up to %s, above this runner's per-sandbox ceiling of %s; lower them",
				k, k.format(sum[k]), k.format(totalQ[k]))
		}
	}
	if rc != nil && rc.TotalGPU != nil && gpuSum > *rc.TotalGPU {
		r.add("sandbox.spec.containers", "constraints.resources.total_gpu", strconv.FormatInt(*rc.TotalGPU, 10), true,
			"the containers ask for %d GPUs in total, above this runner's per-sandbox ceiling of %d; lower them", gpuSum, *rc.TotalGPU)
	}
}

// quantities lists a container's stated values of k, and which one is enforced: the
// legacy resources value, else the limit, else the request (a lone request is enforced
// as the limit). enforced.field is "" when nothing bounds the container.
func quantities(c *sandboxv1.Container, cf string, k kind) (refs []quantityRef, enforced quantityRef) {
	if legacy := c.GetResources(); legacy != nil {
		if v := get(legacy, k); v != "" {
			q := quantityRef{cf + ".resources." + k.String(), v}
			return []quantityRef{q}, q
		}
		return nil, quantityRef{}
	}
	rr := c.GetResourceRequirements()
	if v := get(rr.GetRequests(), k); v != "" {
		q := quantityRef{cf + ".resource_requirements.requests." + k.String(), v}
		refs, enforced = append(refs, q), q
	}
	if v := get(rr.GetLimits(), k); v != "" {
		q := quantityRef{cf + ".resource_requirements.limits." + k.String(), v}
		refs, enforced = append(refs, q), q
	}
	return refs, enforced
}

type gpuRef struct {
	field string
	n     int64
}

func gpuRefs(c *sandboxv1.Container, cf string) []gpuRef {
	var out []gpuRef
	if g := c.GetResources().GetGpu(); g != nil {
		out = append(out, gpuRef{cf + ".resources.gpu.count", g.GetCount()})
	}
	if g := c.GetResourceRequirements().GetRequests().GetGpu(); g != nil {
		out = append(out, gpuRef{cf + ".resource_requirements.requests.gpu.count", g.GetCount()})
	}
	if g := c.GetResourceRequirements().GetLimits().GetGpu(); g != nil {
		out = append(out, gpuRef{cf + ".resource_requirements.limits.gpu.count", g.GetCount()})
	}
	return out
}

func (r *resolver) checkImages(s *sandboxv1.SandboxSpec) {
	ic := r.c.Images
	if ic == nil || ic.AllowedRegistries == nil && ic.AllowedRepositories == nil && !ic.RequireDigest {
		return
	}
	for i, c := range s.GetContainers() {
		r.checkImage(containerField(i)+".image", c.GetImage())
	}
}

// checkImage checks one image (field f) against the policy's image rules.
func (r *resolver) checkImage(f, img string) {
	ic := r.c.Images
	if ic == nil || ic.AllowedRegistries == nil && ic.AllowedRepositories == nil && !ic.RequireDigest {
		return
	}
	ref, err := parseImage(img)
	if err != nil {
		r.add(f, "constraints.images", "", false, "image %q %v", img, err)
		return
	}
	if ic.AllowedRegistries != nil && !slices.ContainsFunc(ic.AllowedRegistries, func(p string) bool { return registryAllowed(p, ref.host) }) {
		r.add(f, "constraints.images.allowed_registries", listLimit(ic.AllowedRegistries), false,
			"image %q is from registry %s, which this runner does not allow; use an image from %s", img, ref.host, listLimit(ic.AllowedRegistries))
	}
	if ic.AllowedRepositories != nil && !slices.ContainsFunc(ic.AllowedRepositories, func(p string) bool { return repositoryAllowed(p, ref) }) {
		r.add(f, "constraints.images.allowed_repositories", listLimit(ic.AllowedRepositories), false,
			"image %q (repository %s/%s) matches no allowed repository pattern; use one matching %s", img, ref.host, ref.repo, listLimit(ic.AllowedRepositories))
	}
	if ic.RequireDigest && ref.digest == "" {
		r.add(f, "constraints.images.require_digest", "true", false,
			"image %q is not pinned by digest; this runner requires name@sha256:<digest>", img)
	}
}

func listLimit(l []string) string {
	if len(l) == 0 {
		return "(none)"
	}
	return strings.Join(l, ", ")
}

var visibilityNames = map[string]sandboxv1.Visibility{
	"UNSPECIFIED": sandboxv1.Visibility_VISIBILITY_UNSPECIFIED,
	"PUBLIC":      sandboxv1.Visibility_VISIBILITY_PUBLIC,
	"PRIVATE":     sandboxv1.Visibility_VISIBILITY_PRIVATE,
	"CUSTOM":      sandboxv1.Visibility_VISIBILITY_CUSTOM,
}

var endpointKindNames = map[string]sandboxv1.EndpointKind{
	"HTTPS":           sandboxv1.EndpointKind_ENDPOINT_KIND_HTTPS,
	"TLS_PASSTHROUGH": sandboxv1.EndpointKind_ENDPOINT_KIND_TLS_PASSTHROUGH,
}

func visibilityOf(s string) (sandboxv1.Visibility, bool) {
	v, ok := visibilityNames[strings.TrimPrefix(strings.ToUpper(strings.TrimSpace(s)), "VISIBILITY_")]
	return v, ok
}

func endpointKindOf(s string) (sandboxv1.EndpointKind, bool) {
	v, ok := endpointKindNames[strings.TrimPrefix(strings.ToUpper(strings.TrimSpace(s)), "ENDPOINT_KIND_")]
	return v, ok
}

func (r *resolver) checkServices(s *sandboxv1.SandboxSpec) {
	sc := r.c.Services
	limit, constraint := r.pl.MaxServices, ConstraintPlatformServices
	if limit <= 0 {
		limit = DefaultMaxServices
	}
	if sc != nil && sc.MaxServices != nil {
		limit, constraint = *sc.MaxServices, "constraints.services.max_services"
	}
	if n := len(s.GetServices()); n > limit {
		r.add("sandbox.spec.services", constraint, strconv.Itoa(limit), false,
			"declares %d services, above this runner's maximum of %d per sandbox; remove %d", n, limit, n-limit)
	}
	if r.pl.NoEndpoints {
		for i, svc := range s.GetServices() {
			if svc.GetEndpoint() != nil {
				r.add(fmt.Sprintf("sandbox.spec.services[%d].endpoint", i), ConstraintPlatformEndpoints, "none", false,
					"this runner publishes no endpoints (it has no edge); remove the endpoint or pick a runner with one")
			}
		}
	} else if r.pl.NoShareTokens {
		for i, svc := range s.GetServices() {
			if ep := svc.GetEndpoint(); ep.GetKind() == sandboxv1.EndpointKind_ENDPOINT_KIND_HTTPS && ep.GetAuth() == sandboxv1.EndpointAuth_ENDPOINT_AUTH_SHARE_TOKEN {
				r.add(fmt.Sprintf("sandbox.spec.services[%d].endpoint.auth", i), ConstraintPlatformShareTokens, "none", false,
					"this runner's edge cannot check endpoint share tokens; use auth OPEN or pick a runner that can")
			}
		}
	}
	if sc == nil {
		return
	}
	for i, svc := range s.GetServices() {
		f := fmt.Sprintf("sandbox.spec.services[%d]", i)
		if vis := svc.GetVisibility(); sc.AllowedVisibilities != nil && vis != sandboxv1.Visibility_VISIBILITY_UNSPECIFIED &&
			!slices.ContainsFunc(sc.AllowedVisibilities, func(n string) bool { v, ok := visibilityOf(n); return ok && v == vis }) {
			r.add(f+".visibility", "constraints.services.allowed_visibilities", listLimit(sc.AllowedVisibilities), false,
				"visibility %s is not allowed on this runner; use one of: %s (or leave it unset for no outside access)",
				strings.TrimPrefix(vis.String(), "VISIBILITY_"), listLimit(sc.AllowedVisibilities))
		}
		if ep := svc.GetEndpoint(); ep != nil && sc.AllowedEndpointKinds != nil && ep.GetKind() != sandboxv1.EndpointKind_ENDPOINT_KIND_UNSPECIFIED &&
			!slices.ContainsFunc(sc.AllowedEndpointKinds, func(n string) bool { k, ok := endpointKindOf(n); return ok && k == ep.GetKind() }) {
			r.add(f+".endpoint.kind", "constraints.services.allowed_endpoint_kinds", listLimit(sc.AllowedEndpointKinds), false,
				"endpoint kind %s is not allowed on this runner; use one of: %s, or remove the endpoint",
				strings.TrimPrefix(ep.GetKind().String(), "ENDPOINT_KIND_"), listLimit(sc.AllowedEndpointKinds))
		}
	}
}

func (r *resolver) checkNetwork(s *sandboxv1.SandboxSpec) {
	if r.pl.NoDNSEgress {
		for i, rule := range s.GetNetwork().GetEgress() {
			if _, ok := rule.GetDestination().(*sandboxv1.EgressRule_HttpsHostname); ok {
				r.add(fmt.Sprintf("sandbox.spec.network.egress[%d].https_hostname", i), ConstraintPlatformDNSEgress, "none", false,
					"this runner cannot enforce host-name rules (it filters by address only); use a cidr rule or pick a runner that can")
			}
		}
	} else if r.pl.NoEgressSecrets {
		for i, rule := range s.GetNetwork().GetEgress() {
			if rule.GetSandboxdSecret() != nil {
				r.add(fmt.Sprintf("sandbox.spec.network.egress[%d].sandboxd_secret", i), ConstraintPlatformEgressSecrets, "none", false,
					"this runner cannot inject egress secrets (its egress proxy does not terminate the sandbox's TLS); pick a runner that can")
			}
		}
	}
	nc := r.c.Network
	if nc == nil {
		return
	}
	if len(nc.AllowedEgress) > 0 {
		es := parseEntries(nc.AllowedEgress)
		for i, rule := range s.GetNetwork().GetEgress() {
			d := destination{any: rule.GetAny(), host: rule.GetHttpsHostname(), cidr: rule.GetCidr(), selector: rule.GetSelector() != nil}
			if t, ok := rule.GetDestination().(*sandboxv1.EgressRule_Tenant); ok {
				d.tenant = t.Tenant
			}
			r.checkRule(fmt.Sprintf("sandbox.spec.network.egress[%d]", i), "egress", "constraints.network.allowed_egress", nc.AllowedEgress, es, d, rule.GetPorts(), nc.AllowSelectors)
		}
	}
	if len(nc.AllowedIngress) > 0 {
		es := parseEntries(nc.AllowedIngress)
		for i, rule := range s.GetNetwork().GetIngress() {
			d := destination{any: rule.GetAny(), cidr: rule.GetCidr()}
			if t, ok := rule.GetSource().(*sandboxv1.IngressRule_Tenant); ok {
				d.tenant = t.Tenant
			}
			r.checkRule(fmt.Sprintf("sandbox.spec.network.ingress[%d]", i), "ingress", "constraints.network.allowed_ingress", nc.AllowedIngress, es, d, rule.GetPorts(), false)
		}
	}
}

func (r *resolver) checkRule(f, dir, constraint string, rules []Rule, es []entry, d destination, ports []*sandboxv1.PortRange, selectors bool) {
	ok, err := covered(es, d, spansOf(ports), selectors)
	if err != nil {
		r.add(f+".cidr.cidr", ConstraintSpec, "", false, "%v", err)
		return
	}
	if ok {
		return
	}
	var what string
	switch {
	case d.selector:
		what = "a selector rule (this runner does not allow selectors)"
	case d.any:
		what = "any destination"
	case d.host != "":
		what = "host " + d.host
	case d.tenant != 0:
		what = "tenant " + tenantName(d.tenant)
	case d.cidr != nil:
		what = d.cidr.GetCidr()
	default:
		what = "an empty rule"
	}
	if len(ports) > 0 {
		what += " on the requested ports"
	}
	r.add(f, constraint, describeEntries(rules), false,
		"%s rule for %s is outside what this runner allows; narrow it to fit: %s", dir, what, describeEntries(rules))
}

func (r *resolver) checkSecurity(s *sandboxv1.SandboxSpec, pinned bool) {
	sec := r.c.Security
	if rc := s.GetRuntimeClass(); rc != "" {
		const f = "sandbox.spec.runtime_class"
		if len(r.pl.RuntimeClasses) > 0 && !slices.Contains(r.pl.RuntimeClasses, rc) {
			r.add(f, ConstraintPlatformRuntimeClass, listLimit(r.pl.RuntimeClasses), false,
				"runtime class %q is not available on this runner; use one of: %s, or leave runtime_class unset", rc, listLimit(r.pl.RuntimeClasses))
		}
		switch {
		case sec != nil && sec.AllowedRuntimeClasses != nil:
			if !slices.Contains(sec.AllowedRuntimeClasses, rc) {
				r.add(f, "constraints.security.allowed_runtime_classes", listLimit(sec.AllowedRuntimeClasses), false,
					"runtime class %q is not allowed on this runner; use one of: %s", rc, listLimit(sec.AllowedRuntimeClasses))
			}
		case pinned && rc != r.defaultRuntimeClass(hasGPU(s)):
			r.add(f, "constraints.security.allowed_runtime_classes", "(none)", false,
				"this runner's policy allows no runtime class pin; leave runtime_class unset to get the default%s", quoted(r.defaultRuntimeClass(hasGPU(s))))
		}
	}
	for i, c := range s.GetContainers() {
		sc := c.GetSecurityContext()
		if sc == nil {
			continue
		}
		f := containerField(i) + ".security_context"
		if sc.GetPrivileged() {
			switch {
			case sec != nil && sec.PrivilegedAllowed != nil && !*sec.PrivilegedAllowed:
				r.add(f+".privileged", "constraints.security.privileged_allowed", "false", false,
					"privileged containers are not allowed on this runner; remove privileged")
			case !r.pl.PrivilegedAllowed:
				r.add(f+".privileged", ConstraintPlatformPrivileged, "false", false,
					"this runner cannot run privileged containers; remove privileged")
			}
		}
		list, constraint := r.pl.AllowedCapabilities, ConstraintPlatformCapabilities
		if sec != nil && sec.AllowedCapabilities != nil {
			list, constraint = sec.AllowedCapabilities, "constraints.security.allowed_capabilities"
		}
		if list != nil {
			allowed := map[string]bool{}
			for _, a := range list {
				allowed[normalizeCapability(a)] = true
			}
			for j, capName := range sc.GetCapabilitiesAdd() {
				if allowed[normalizeCapability(capName)] {
					continue
				}
				if len(list) == 0 {
					r.add(fmt.Sprintf("%s.capabilities_add[%d]", f, j), constraint, "(none)", false,
						"capability %s may not be added on this runner: its policy allows no added capabilities (constraints.security.allowed_capabilities); remove it", capName)
					continue
				}
				r.add(fmt.Sprintf("%s.capabilities_add[%d]", f, j), constraint, listLimit(list), false,
					"capability %s is not allowed on this runner; remove it or use one of: %s", capName, listLimit(list))
			}
		}
	}
}

func quoted(s string) string {
	if s == "" {
		return ""
	}
	return fmt.Sprintf(" %q", s)
}

func (r *resolver) checkAnnotations(s *sandboxv1.SandboxSpec) {
	ac := r.c.Annotations
	if ac == nil {
		return
	}
	if ac.MaxCount != nil && len(s.GetAnnotations()) > *ac.MaxCount {
		r.add("sandbox.spec.annotations", "constraints.annotations.max_count", strconv.Itoa(*ac.MaxCount), false,
			"has %d annotations (including the policy's own), above this runner's maximum of %d; remove %d",
			len(s.GetAnnotations()), *ac.MaxCount, len(s.GetAnnotations())-*ac.MaxCount)
	}
	for _, k := range slices.Sorted(maps.Keys(s.GetAnnotations())) {
		for _, p := range ac.DeniedPrefixes {
			if strings.HasPrefix(k, p) {
				r.add(fmt.Sprintf("sandbox.spec.annotations[%s]", strconv.Quote(k)), "constraints.annotations.denied_prefixes", listLimit(ac.DeniedPrefixes), false,
					"annotation %q uses the reserved prefix %q; remove it or rename it", k, p)
				break
			}
		}
	}
}

func (r *resolver) checkInstanceType(s *sandboxv1.SandboxSpec) {
	it := r.c.InstanceTypes
	if it == nil || it.Allowed == nil || s.GetInstanceType() == "" {
		return
	}
	if !slices.Contains(it.Allowed, s.GetInstanceType()) {
		r.add("sandbox.spec.instance_type", "constraints.instance_types.allowed", listLimit(it.Allowed), false,
			"instance type %q is not allowed on this runner; use one of: %s, or leave instance_type unset", s.GetInstanceType(), listLimit(it.Allowed))
	}
}
