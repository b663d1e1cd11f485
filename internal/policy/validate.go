package policy

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/sandboxd/sandboxd/internal/apierr"
)

// Validate reports the errors of a policy document itself, with field paths under
// "policy" (policy.constraints.resources.max_cpu, …): unknown versions, negative numbers,
// malformed quantities, CIDRs, host names, patterns and enum names, and base defaults
// that the same policy's constraints would reject. The empty policy is valid.
func Validate(p *Policy) []apierr.Violation {
	if p == nil {
		return nil
	}
	var vs []apierr.Violation
	add := func(field, format string, args ...any) {
		vs = append(vs, apierr.Violation{Field: field, Description: fmt.Sprintf(format, args...)})
	}
	if p.Version != 0 && p.Version != Version {
		add("policy.version", "must be %d (or absent), got %d", Version, p.Version)
	}
	c := &p.Constraints
	b := &p.Base

	// lifetime
	if l := c.Lifetime; l != nil {
		switch {
		case l.MaxSeconds < 0:
			add("policy.constraints.lifetime.max_seconds", "must not be negative, got %d", l.MaxSeconds)
		case l.MaxSeconds > MaxLifetimeSeconds:
			add("policy.constraints.lifetime.max_seconds", "must be at most %d (30 days, the platform maximum), got %d", MaxLifetimeSeconds, l.MaxSeconds)
		}
	}
	switch {
	case b.MaxLifetimeSeconds < 0:
		add("policy.base.max_lifetime_seconds", "must not be negative, got %d", b.MaxLifetimeSeconds)
	case b.MaxLifetimeSeconds > MaxLifetimeSeconds:
		add("policy.base.max_lifetime_seconds", "must be at most %d (30 days), got %d", MaxLifetimeSeconds, b.MaxLifetimeSeconds)
	case c.Lifetime != nil && c.Lifetime.MaxSeconds > 0 && b.MaxLifetimeSeconds > c.Lifetime.MaxSeconds:
		add("policy.base.max_lifetime_seconds", "the default %d is above constraints.lifetime.max_seconds %d", b.MaxLifetimeSeconds, c.Lifetime.MaxSeconds)
	}

	// resources
	parse := func(field string, k kind, q Quantity) (int64, bool) {
		if q == "" {
			return 0, false
		}
		n, err := k.parse(string(q))
		if err != nil {
			add(field, "%v", err)
			return 0, false
		}
		return n, true
	}
	var maxQ, totalQ [2]int64
	var hasMax, hasTotal [2]bool
	if rc := c.Resources; rc != nil {
		const f = "policy.constraints.resources."
		maxQ[cpu], hasMax[cpu] = parse(f+"max_cpu", cpu, rc.MaxCPU)
		maxQ[memory], hasMax[memory] = parse(f+"max_memory", memory, rc.MaxMemory)
		totalQ[cpu], hasTotal[cpu] = parse(f+"total_cpu", cpu, rc.TotalCPU)
		totalQ[memory], hasTotal[memory] = parse(f+"total_memory", memory, rc.TotalMemory)
		if rc.MaxGPU != nil && *rc.MaxGPU < 0 {
			add(f+"max_gpu", "must not be negative, got %d", *rc.MaxGPU)
		}
		if rc.TotalGPU != nil && *rc.TotalGPU < 0 {
			add(f+"total_gpu", "must not be negative, got %d", *rc.TotalGPU)
		}
	}
	if d := b.Resources; d != nil {
		const f = "policy.base.resources."
		for _, k := range []kind{cpu, memory} {
			rq, lm := d.Requests.CPU, d.Limits.CPU
			if k == memory {
				rq, lm = d.Requests.Memory, d.Limits.Memory
			}
			req, okReq := parse(f+"requests."+k.String(), k, rq)
			lim, okLim := parse(f+"limits."+k.String(), k, lm)
			if okReq && okLim && req > lim {
				add(f+"requests."+k.String(), "the default request %s is above the default limit %s", rq, lm)
			}
			for _, q := range []struct {
				name string
				n    int64
				ok   bool
			}{{"requests", req, okReq}, {"limits", lim, okLim}} {
				if !q.ok {
					continue
				}
				if hasMax[k] && q.n > maxQ[k] {
					add(f+q.name+"."+k.String(), "the default %s is above constraints.resources.max_%s %s", k.format(q.n), k, k.format(maxQ[k]))
				}
				if hasTotal[k] && q.n > totalQ[k] {
					add(f+q.name+"."+k.String(), "the default %s is above constraints.resources.total_%s %s", k.format(q.n), k, k.format(totalQ[k]))
				}
			}
		}
	}

	// env, annotations, tags
	for _, k := range slices.Sorted(maps.Keys(b.Env)) {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			add(fmt.Sprintf("policy.base.env[%s]", strconv.Quote(k)), "is not a valid environment variable name")
		}
	}
	for _, k := range slices.Sorted(maps.Keys(b.Annotations)) {
		f := fmt.Sprintf("policy.base.annotations[%s]", strconv.Quote(k))
		if strings.TrimSpace(k) == "" {
			add(f, "an annotation key must not be empty")
		} else if e := qualifiedNameError(k); e != "" {
			add(f, "%s", e) // sandboxes carrying it would be refused at create
		}
		if ac := c.Annotations; ac != nil {
			for _, pre := range ac.DeniedPrefixes {
				if pre != "" && strings.HasPrefix(k, pre) {
					add(f, "uses the prefix %q that constraints.annotations.denied_prefixes forbids", pre)
				}
			}
		}
	}
	for i, t := range b.Tags {
		if strings.TrimSpace(t) == "" {
			add(fmt.Sprintf("policy.base.tags[%d]", i), "must not be empty")
		}
	}
	if ac := c.Annotations; ac != nil {
		if ac.MaxCount != nil {
			switch {
			case *ac.MaxCount < 0:
				add("policy.constraints.annotations.max_count", "must not be negative, got %d", *ac.MaxCount)
			case len(b.Annotations) > *ac.MaxCount:
				add("policy.base.annotations", "the policy attaches %d annotations, above constraints.annotations.max_count %d", len(b.Annotations), *ac.MaxCount)
			}
		}
		for i, pre := range ac.DeniedPrefixes {
			if pre == "" {
				add(fmt.Sprintf("policy.constraints.annotations.denied_prefixes[%d]", i), "must not be empty (it would deny every annotation)")
			}
		}
	}

	// runtime classes and security
	if sec := c.Security; sec != nil {
		for i, rc := range sec.AllowedRuntimeClasses {
			if strings.TrimSpace(rc) == "" {
				add(fmt.Sprintf("policy.constraints.security.allowed_runtime_classes[%d]", i), "must not be empty")
			}
		}
		for i, capName := range sec.AllowedCapabilities {
			if n := normalizeCapability(capName); n == "" || strings.ContainsAny(n, " \t") {
				add(fmt.Sprintf("policy.constraints.security.allowed_capabilities[%d]", i), "%q is not a capability name such as NET_ADMIN", capName)
			}
		}
		if sec.AllowedRuntimeClasses != nil {
			for _, d := range []struct{ field, v string }{
				{"policy.base.default_cpu_runtime_class", b.DefaultCPURuntimeClass},
				{"policy.base.default_gpu_runtime_class", b.DefaultGPURuntimeClass},
			} {
				if d.v != "" && !slices.Contains(sec.AllowedRuntimeClasses, d.v) {
					add(d.field, "%q is not in constraints.security.allowed_runtime_classes", d.v)
				}
			}
		}
	}

	// images
	if ic := c.Images; ic != nil {
		for i, r := range ic.AllowedRegistries {
			h := strings.TrimPrefix(strings.TrimSpace(r), "*.")
			if h == "" || strings.ContainsAny(h, "/*@ ") {
				add(fmt.Sprintf("policy.constraints.images.allowed_registries[%d]", i), "%q is not a registry host such as ghcr.io or localhost:5000", r)
			}
		}
		for i, pat := range ic.AllowedRepositories {
			if !validRepositoryPattern(pat) {
				add(fmt.Sprintf("policy.constraints.images.allowed_repositories[%d]", i), "%q is not a repository pattern such as library/* or myorg/**", pat)
			}
		}
	}

	// services
	if sc := c.Services; sc != nil {
		if sc.MaxServices != nil && *sc.MaxServices < 0 {
			add("policy.constraints.services.max_services", "must not be negative, got %d", *sc.MaxServices)
		}
		for i, v := range sc.AllowedVisibilities {
			if _, ok := visibilityOf(v); !ok {
				add(fmt.Sprintf("policy.constraints.services.allowed_visibilities[%d]", i), "%q is not PUBLIC, PRIVATE or CUSTOM", v)
			}
		}
		for i, k := range sc.AllowedEndpointKinds {
			if _, ok := endpointKindOf(k); !ok {
				add(fmt.Sprintf("policy.constraints.services.allowed_endpoint_kinds[%d]", i), "%q is not HTTPS or TLS_PASSTHROUGH", k)
			}
		}
	}

	// network
	addRule := func(field, format string, args ...any) { add(field, format, args...) }
	before := len(vs)
	for i, r := range b.DefaultEgress {
		validateRule(fmt.Sprintf("policy.base.default_egress[%d]", i), r, defaultEgress, addRule)
	}
	for i, r := range b.DefaultIngress {
		validateRule(fmt.Sprintf("policy.base.default_ingress[%d]", i), r, defaultIngress, addRule)
	}
	if nc := c.Network; nc != nil {
		for i, r := range nc.AllowedEgress {
			validateRule(fmt.Sprintf("policy.constraints.network.allowed_egress[%d]", i), r, envelopeEgress, addRule)
		}
		for i, r := range nc.AllowedIngress {
			validateRule(fmt.Sprintf("policy.constraints.network.allowed_ingress[%d]", i), r, envelopeIngress, addRule)
		}
		if len(vs) == before {
			// Base defaults must fit the policy's own envelope.
			check := func(field string, defaults, env []Rule, egress bool) {
				if len(env) == 0 {
					return
				}
				es := parseEntries(env)
				for i, r := range defaults {
					wire := toEgress(r)
					d := destination{any: r.Any, host: r.HTTPSHostname, cidr: wire.GetCidr(), tenant: wire.GetTenant()}
					if ok, _ := covered(es, d, spansOf(wire.GetPorts()), nc.AllowSelectors); !ok {
						add(fmt.Sprintf("%s[%d]", field, i), "this default rule is outside constraints.network.allowed_%s", map[bool]string{true: "egress", false: "ingress"}[egress])
					}
				}
			}
			check("policy.base.default_egress", b.DefaultEgress, nc.AllowedEgress, true)
			check("policy.base.default_ingress", b.DefaultIngress, nc.AllowedIngress, false)
		}
	}

	validatePod(b.Pod, add)
	validateControlPlaneAccess(p.ControlPlaneAccess, add)
	maxLifetime := MaxLifetimeSeconds
	if c.Lifetime != nil && c.Lifetime.MaxSeconds > 0 && c.Lifetime.MaxSeconds < maxLifetime {
		maxLifetime = c.Lifetime.MaxSeconds
	}
	validatePause(b.Pause, maxLifetime, add)
	validateVolumes(p, add)

	// instance types
	if it := c.InstanceTypes; it != nil {
		for i, n := range it.Allowed {
			if strings.TrimSpace(n) == "" {
				add(fmt.Sprintf("policy.constraints.instance_types.allowed[%d]", i), "must not be empty")
			}
		}
	}
	return vs
}
