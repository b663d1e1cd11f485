package policy

import (
	"fmt"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
)

func mustParse(t testing.TB, js string) *Policy {
	t.Helper()
	p, err := Parse([]byte(js))
	if err != nil {
		t.Fatalf("Parse(%s): %v", js, err)
	}
	if vs := Validate(p); len(vs) > 0 {
		t.Fatalf("Validate(%s): %v", js, vs)
	}
	return p
}

func spec(mods ...func(*sandboxv1.SandboxSpec)) *sandboxv1.SandboxSpec {
	s := &sandboxv1.SandboxSpec{Containers: []*sandboxv1.Container{{Name: "main", Image: "python:3.11"}}}
	for _, m := range mods {
		m(s)
	}
	return s
}

func limits(cpu, mem string) func(*sandboxv1.SandboxSpec) {
	return func(s *sandboxv1.SandboxSpec) {
		s.Containers[0].ResourceRequirements = &sandboxv1.ResourceRequirements{Limits: &sandboxv1.Resources{Cpu: cpu, Memory: mem}}
	}
}

func gpus(n int64) func(*sandboxv1.SandboxSpec) {
	return func(s *sandboxv1.SandboxSpec) {
		s.Containers[0].ResourceRequirements = &sandboxv1.ResourceRequirements{Requests: &sandboxv1.Resources{Gpu: &sandboxv1.Gpu{Count: n}}}
	}
}

func second(image string) func(*sandboxv1.SandboxSpec) {
	return func(s *sandboxv1.SandboxSpec) {
		s.Containers = append(s.Containers, &sandboxv1.Container{Name: "side", Image: image})
	}
}

// want is an expected violation: field, constraint and limit (limit "" = not checked).
type want struct{ field, constraint, limit string }

func (w want) String() string { return w.field + " " + w.constraint + " " + w.limit }

func checkViolations(t *testing.T, got []Violation, wants []want) {
	t.Helper()
	if len(got) != len(wants) {
		t.Fatalf("got %d violations %s, want %v", len(got), fmtVs(got), wants)
	}
	for i, w := range wants {
		g := got[i]
		if g.Field != w.field || g.Constraint != w.constraint || w.limit != "" && g.Limit != w.limit {
			t.Errorf("violation %d = %s, want %v", i, fmtVs(got[i:i+1]), w)
		}
		if g.Description == "" {
			t.Errorf("violation %d has no description", i)
		}
	}
}

func fmtVs(vs []Violation) string {
	var b strings.Builder
	for _, v := range vs {
		fmt.Fprintf(&b, "\n  %s | %s | %s | %s | ceiling=%v", v.Field, v.Constraint, v.Limit, v.Description, v.Ceiling)
	}
	return b.String()
}

func TestDefaults(t *testing.T) {
	base := `{"base": {
		"max_lifetime_seconds": 3600,
		"resources": {"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"cpu": "1", "memory": "1Gi"}},
		"env": {"HTTP_PROXY": "http://proxy:3128", "LANG": "C.UTF-8"},
		"annotations": {"cost-center": "research"},
		"tags": ["team-a"],
		"default_cpu_runtime_class": "gvisor",
		"default_gpu_runtime_class": "kata-gpu",
		"default_egress": [{"cidr": "10.0.0.0/8", "ports": [{"port": 443}]}],
		"default_ingress": [{"tenant": "SAME_ORG"}]
	}}`
	p := mustParse(t, base)
	for _, tc := range []struct {
		name  string
		spec  *sandboxv1.SandboxSpec
		check func(t *testing.T, s *sandboxv1.SandboxSpec)
	}{
		{"lifetime from base", spec(), func(t *testing.T, s *sandboxv1.SandboxSpec) {
			if s.MaxLifetimeSeconds != 3600 {
				t.Errorf("lifetime %d", s.MaxLifetimeSeconds)
			}
		}},
		{"spec lifetime wins", spec(func(s *sandboxv1.SandboxSpec) { s.MaxLifetimeSeconds = 60 }), func(t *testing.T, s *sandboxv1.SandboxSpec) {
			if s.MaxLifetimeSeconds != 60 {
				t.Errorf("lifetime %d", s.MaxLifetimeSeconds)
			}
		}},
		{"resources filled", spec(), func(t *testing.T, s *sandboxv1.SandboxSpec) {
			rr := s.Containers[0].ResourceRequirements
			if rr.GetRequests().GetCpu() != "500m" || rr.GetRequests().GetMemory() != "512Mi" || rr.GetLimits().GetCpu() != "1" || rr.GetLimits().GetMemory() != "1Gi" {
				t.Errorf("resources %v", rr)
			}
		}},
		{"a limit alone is also the request", spec(limits("2", "")), func(t *testing.T, s *sandboxv1.SandboxSpec) {
			rr := s.Containers[0].ResourceRequirements
			if rr.GetLimits().GetCpu() != "2" || rr.GetRequests().GetCpu() != "2" || rr.GetLimits().GetMemory() != "1Gi" || rr.GetRequests().GetMemory() != "512Mi" {
				t.Errorf("resources %v", rr)
			}
		}},
		{"a request alone takes the default limit", spec(func(s *sandboxv1.SandboxSpec) {
			s.Containers[0].ResourceRequirements = &sandboxv1.ResourceRequirements{Requests: &sandboxv1.Resources{Cpu: "250m", Memory: "2Gi"}}
		}), func(t *testing.T, s *sandboxv1.SandboxSpec) {
			rr := s.Containers[0].ResourceRequirements
			if rr.GetLimits().GetCpu() != "1" || rr.GetRequests().GetCpu() != "250m" || rr.GetLimits().GetMemory() != "2Gi" || rr.GetRequests().GetMemory() != "2Gi" {
				t.Errorf("resources %v, want cpu 250m..1 (the default limit), memory 2Gi..2Gi (never below the request)", rr)
			}
		}},
		{"what the client sends is kept as sent", spec(func(s *sandboxv1.SandboxSpec) {
			s.Containers[0].ResourceRequirements = &sandboxv1.ResourceRequirements{
				Requests: &sandboxv1.Resources{Cpu: "500m", Memory: "512Mi"}, Limits: &sandboxv1.Resources{Cpu: "1", Memory: "1Gi"}}
		}), func(t *testing.T, s *sandboxv1.SandboxSpec) {
			rr := s.Containers[0].ResourceRequirements
			if rr.GetRequests().GetCpu() != "500m" || rr.GetRequests().GetMemory() != "512Mi" || rr.GetLimits().GetCpu() != "1" || rr.GetLimits().GetMemory() != "1Gi" {
				t.Errorf("resources %v", rr)
			}
		}},
		{"default request never above spec limit", spec(limits("250m", "")), func(t *testing.T, s *sandboxv1.SandboxSpec) {
			if got := s.Containers[0].ResourceRequirements.GetRequests().GetCpu(); got != "250m" {
				t.Errorf("request %q, want the spec's limit 250m", got)
			}
		}},
		{"default limit never below spec request", spec(func(s *sandboxv1.SandboxSpec) {
			s.Containers[0].ResourceRequirements = &sandboxv1.ResourceRequirements{Requests: &sandboxv1.Resources{Cpu: "3"}}
		}), func(t *testing.T, s *sandboxv1.SandboxSpec) {
			if got := s.Containers[0].ResourceRequirements.GetLimits().GetCpu(); got != "3" {
				t.Errorf("limit %q, want the spec's request 3", got)
			}
		}},
		{"legacy resources filled from limits", spec(func(s *sandboxv1.SandboxSpec) {
			s.Containers[0].Resources = &sandboxv1.Resources{Cpu: "2"}
		}), func(t *testing.T, s *sandboxv1.SandboxSpec) {
			c := s.Containers[0]
			if c.Resources.GetCpu() != "2" || c.Resources.GetMemory() != "1Gi" || c.ResourceRequirements != nil {
				t.Errorf("container %v", c)
			}
		}},
		{"env attached, spec wins", spec(second("busybox"), func(s *sandboxv1.SandboxSpec) {
			s.Containers[0].EnvironmentVariables = map[string]string{"LANG": "de_DE", "MINE": "1"}
		}), func(t *testing.T, s *sandboxv1.SandboxSpec) {
			e := s.Containers[0].EnvironmentVariables
			if e["LANG"] != "de_DE" || e["MINE"] != "1" || e["HTTP_PROXY"] != "http://proxy:3128" {
				t.Errorf("env %v", e)
			}
			if s.Containers[1].EnvironmentVariables["LANG"] != "C.UTF-8" {
				t.Errorf("second container env %v", s.Containers[1].EnvironmentVariables)
			}
		}},
		{"annotations attached, spec wins", spec(func(s *sandboxv1.SandboxSpec) {
			s.Annotations = map[string]string{"cost-center": "mine", "x": "y"}
		}), func(t *testing.T, s *sandboxv1.SandboxSpec) {
			if s.Annotations["cost-center"] != "mine" || s.Annotations["x"] != "y" || len(s.Annotations) != 2 {
				t.Errorf("annotations %v", s.Annotations)
			}
		}},
		{"base annotation attached", spec(), func(t *testing.T, s *sandboxv1.SandboxSpec) {
			if s.Annotations["cost-center"] != "research" {
				t.Errorf("annotations %v", s.Annotations)
			}
		}},
		{"tags attached once", spec(func(s *sandboxv1.SandboxSpec) { s.Tags = []string{"mine", "team-a"} }), func(t *testing.T, s *sandboxv1.SandboxSpec) {
			if fmt.Sprint(s.Tags) != "[mine team-a]" {
				t.Errorf("tags %v", s.Tags)
			}
		}},
		{"cpu runtime class", spec(), func(t *testing.T, s *sandboxv1.SandboxSpec) {
			if s.RuntimeClass != "gvisor" {
				t.Errorf("runtime class %q", s.RuntimeClass)
			}
		}},
		{"gpu runtime class", spec(gpus(1)), func(t *testing.T, s *sandboxv1.SandboxSpec) {
			if s.RuntimeClass != "kata-gpu" {
				t.Errorf("runtime class %q", s.RuntimeClass)
			}
		}},
		{"default network rules", spec(), func(t *testing.T, s *sandboxv1.SandboxSpec) {
			n := s.GetNetwork()
			if len(n.GetEgress()) != 1 || n.GetEgress()[0].GetCidr().GetCidr() != "10.0.0.0/8" || n.GetEgress()[0].GetPorts()[0].GetPort() != 443 {
				t.Errorf("egress %v", n.GetEgress())
			}
			if len(n.GetIngress()) != 1 || n.GetIngress()[0].GetTenant() != sandboxv1.TenantScope_TENANT_SCOPE_SAME_ORG {
				t.Errorf("ingress %v", n.GetIngress())
			}
		}},
		{"spec network rules win", spec(func(s *sandboxv1.SandboxSpec) {
			s.Network = &sandboxv1.NetworkOptions{Egress: []*sandboxv1.EgressRule{{Destination: &sandboxv1.EgressRule_Any{Any: true}}}}
		}), func(t *testing.T, s *sandboxv1.SandboxSpec) {
			if len(s.Network.Egress) != 1 || !s.Network.Egress[0].GetAny() {
				t.Errorf("egress %v", s.Network.Egress)
			}
		}},
		{"deny_egress keeps defaults out", spec(func(s *sandboxv1.SandboxSpec) {
			s.Network = &sandboxv1.NetworkOptions{DenyEgress: proto.Bool(true)}
		}), func(t *testing.T, s *sandboxv1.SandboxSpec) {
			if len(s.Network.Egress) != 0 || len(s.Network.Ingress) != 1 {
				t.Errorf("network %v", s.Network)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := proto.CloneOf(tc.spec)
			got, vs := Resolve(p, tc.spec, DefaultPlatform())
			if len(vs) > 0 {
				t.Fatalf("violations: %s", fmtVs(vs))
			}
			if !proto.Equal(before, tc.spec) {
				t.Fatal("Resolve modified its input")
			}
			tc.check(t, got)
		})
	}
}

func TestPlatformDefaults(t *testing.T) {
	pl := DefaultPlatform()
	pl.DefaultCPURuntimeClass, pl.DefaultGPURuntimeClass = "runc", "runc-nvidia"
	pl.DefaultResources = &ResourceDefaults{Limits: ResourceValues{CPU: "1", Memory: "1Gi"}}
	s, vs := Resolve(&Policy{}, spec(), pl)
	if len(vs) > 0 {
		t.Fatal(fmtVs(vs))
	}
	if s.MaxLifetimeSeconds != 600 || s.RuntimeClass != "runc" || s.Containers[0].ResourceRequirements.GetLimits().GetMemory() != "1Gi" {
		t.Errorf("resolved %v", s)
	}
	// The base wins over the platform per quantity.
	p := mustParse(t, `{"base": {"resources": {"limits": {"cpu": "2"}}}}`)
	s, _ = Resolve(p, spec(gpus(1)), pl)
	if l := s.Containers[0].ResourceRequirements.GetLimits(); l.GetCpu() != "2" || l.GetMemory() != "1Gi" || s.RuntimeClass != "runc-nvidia" {
		t.Errorf("resolved %v", s)
	}
	// Without a request default, the request is the default limit (Kubernetes' rule).
	if r := s.Containers[0].ResourceRequirements.GetRequests(); r.GetCpu() != "2" || r.GetMemory() != "1Gi" {
		t.Errorf("requests %v, want the limits", r)
	}
	// The runner's defaults stay under the policy's maxima; a spec's own value does not.
	p = mustParse(t, `{"constraints": {"resources": {"max_cpu": "500m", "max_memory": "256Mi"}}}`)
	pl.DefaultResources = &ResourceDefaults{Requests: ResourceValues{CPU: "100m", Memory: "512Mi"}, Limits: ResourceValues{CPU: "1", Memory: "1Gi"}}
	s, vs = Resolve(p, spec(), pl)
	if len(vs) > 0 {
		t.Fatalf("runner defaults above the policy's maxima: %s", fmtVs(vs))
	}
	if rr := s.Containers[0].ResourceRequirements; rr.GetRequests().GetCpu() != "100m" || rr.GetLimits().GetCpu() != "500m" ||
		rr.GetRequests().GetMemory() != "256Mi" || rr.GetLimits().GetMemory() != "256Mi" {
		t.Errorf("capped defaults %v", rr)
	}
	if _, vs = Resolve(p, spec(limits("1", "")), pl); len(vs) != 1 || vs[0].Field != "sandbox.spec.containers[0].resource_requirements.limits.cpu" {
		t.Errorf("a spec limit above max_cpu (its mirrored request not reported again): %s", fmtVs(vs))
	}
	// A zero Platform still has the documented defaults.
	s, _ = Resolve(nil, spec(), Platform{})
	if s.MaxLifetimeSeconds != DefaultLifetimeSeconds {
		t.Errorf("lifetime %d", s.MaxLifetimeSeconds)
	}
}

func TestConstraints(t *testing.T) {
	const pub = sandboxv1.Visibility_VISIBILITY_PUBLIC
	svc := func(n int, vis sandboxv1.Visibility, kind sandboxv1.EndpointKind) func(*sandboxv1.SandboxSpec) {
		return func(s *sandboxv1.SandboxSpec) {
			for i := range n {
				sv := &sandboxv1.Service{Port: int32(8000 + i), Visibility: vis}
				if kind != 0 {
					sv.Endpoint = &sandboxv1.EndpointSpec{Kind: kind, Auth: sandboxv1.EndpointAuth_ENDPOINT_AUTH_OPEN}
				}
				s.Services = append(s.Services, sv)
			}
		}
	}
	egress := func(rules ...*sandboxv1.EgressRule) func(*sandboxv1.SandboxSpec) {
		return func(s *sandboxv1.SandboxSpec) { s.Network = &sandboxv1.NetworkOptions{Egress: rules} }
	}
	cidr := func(c string, ports ...int32) *sandboxv1.EgressRule {
		r := &sandboxv1.EgressRule{Destination: &sandboxv1.EgressRule_Cidr{Cidr: &sandboxv1.CidrBlock{Cidr: c}}}
		for _, p := range ports {
			r.Ports = append(r.Ports, &sandboxv1.PortRange{Protocol: "TCP", Port: p})
		}
		return r
	}
	host := func(h string) *sandboxv1.EgressRule {
		return &sandboxv1.EgressRule{Destination: &sandboxv1.EgressRule_HttpsHostname{HttpsHostname: h}, Ports: []*sandboxv1.PortRange{{Port: 443}}}
	}
	anyRule := &sandboxv1.EgressRule{Destination: &sandboxv1.EgressRule_Any{Any: true}}
	tenant := func(t sandboxv1.TenantScope) *sandboxv1.EgressRule {
		return &sandboxv1.EgressRule{Destination: &sandboxv1.EgressRule_Tenant{Tenant: t}}
	}
	selector := &sandboxv1.EgressRule{Destination: &sandboxv1.EgressRule_Selector{Selector: &sandboxv1.SelectorBlock{PodLabels: map[string]string{"a": "b"}}}}
	ingress := func(c string) func(*sandboxv1.SandboxSpec) {
		return func(s *sandboxv1.SandboxSpec) {
			s.Network = &sandboxv1.NetworkOptions{Ingress: []*sandboxv1.IngressRule{{Source: &sandboxv1.IngressRule_Cidr{Cidr: &sandboxv1.CidrBlock{Cidr: c}}}}}
		}
	}
	secctx := func(sc *sandboxv1.SecurityContext) func(*sandboxv1.SandboxSpec) {
		return func(s *sandboxv1.SandboxSpec) { s.Containers[0].SecurityContext = sc }
	}
	envelope := `{"constraints": {"network": {"allowed_egress": [
		{"cidr": "10.0.0.0/9"}, {"cidr": "10.128.0.0/9"}, {"cidr": "192.168.0.0/16", "except": ["192.168.1.0/24"]},
		{"cidr": "172.16.0.0/12", "ports": [{"protocol": "TCP", "port": 443}]},
		{"https_hostname": "*.pypi.org"}, {"https_hostname": "github.com"}, {"tenant": "SAME_ORG"}],
		"allowed_ingress": [{"cidr": "203.0.113.0/24"}]}}}`
	const c0 = "sandbox.spec.containers[0]"
	for _, tc := range []struct {
		name   string
		policy string
		spec   *sandboxv1.SandboxSpec
		want   []want
	}{
		// lifetime
		{"lifetime within max", `{"constraints": {"lifetime": {"max_seconds": 3600}}}`, spec(func(s *sandboxv1.SandboxSpec) { s.MaxLifetimeSeconds = 3600 }), nil},
		{"lifetime above max", `{"constraints": {"lifetime": {"max_seconds": 3600}}}`, spec(func(s *sandboxv1.SandboxSpec) { s.MaxLifetimeSeconds = 3601 }),
			[]want{{"sandbox.spec.max_lifetime_seconds", "constraints.lifetime.max_seconds", "3600"}}},
		{"default lifetime checked too", `{"constraints": {"lifetime": {"max_seconds": 300}}}`, spec(),
			[]want{{"sandbox.spec.max_lifetime_seconds", "constraints.lifetime.max_seconds", "300"}}},
		{"30 days under permissive policy", `{}`, spec(func(s *sandboxv1.SandboxSpec) { s.MaxLifetimeSeconds = MaxLifetimeSeconds + 1 }),
			[]want{{"sandbox.spec.max_lifetime_seconds", ConstraintPlatformLifetime, "2592000"}}},
		{"exactly 30 days", `{}`, spec(func(s *sandboxv1.SandboxSpec) { s.MaxLifetimeSeconds = MaxLifetimeSeconds }), nil},
		{"negative lifetime", `{}`, spec(func(s *sandboxv1.SandboxSpec) { s.MaxLifetimeSeconds = -1 }),
			[]want{{"sandbox.spec.max_lifetime_seconds", ConstraintSpec, ""}}},
		// resources
		{"cpu within max", `{"constraints": {"resources": {"max_cpu": "2"}}}`, spec(limits("2", "")), nil},
		{"cpu above max", `{"constraints": {"resources": {"max_cpu": "2"}}}`, spec(limits("4", "")),
			[]want{{c0 + ".resource_requirements.limits.cpu", "constraints.resources.max_cpu", "2"}}},
		{"cpu request above max", `{"constraints": {"resources": {"max_cpu": 2}}}`, spec(func(s *sandboxv1.SandboxSpec) {
			s.Containers[0].ResourceRequirements = &sandboxv1.ResourceRequirements{Requests: &sandboxv1.Resources{Cpu: "2500m"}}
		}), []want{{c0 + ".resource_requirements.requests.cpu", "constraints.resources.max_cpu", "2"}}},
		{"legacy cpu above max", `{"constraints": {"resources": {"max_cpu": "500m"}}}`, spec(func(s *sandboxv1.SandboxSpec) {
			s.Containers[0].Resources = &sandboxv1.Resources{Cpu: "1"}
		}), []want{{c0 + ".resources.cpu", "constraints.resources.max_cpu", "500m"}}},
		{"memory above max", `{"constraints": {"resources": {"max_memory": "4Gi"}}}`, spec(limits("", "5Gi")),
			[]want{{c0 + ".resource_requirements.limits.memory", "constraints.resources.max_memory", "4Gi"}}},
		{"unbounded cpu under max", `{"constraints": {"resources": {"max_cpu": "2"}}}`, spec(),
			[]want{{c0 + ".resource_requirements.limits.cpu", "constraints.resources.max_cpu", "2"}}},
		{"base default satisfies max", `{"base": {"resources": {"limits": {"cpu": "1"}}}, "constraints": {"resources": {"max_cpu": "2"}}}`, spec(), nil},
		{"gpu above max", `{"constraints": {"resources": {"max_gpu": 1}}}`, spec(gpus(2)),
			[]want{{c0 + ".resource_requirements.requests.gpu.count", "constraints.resources.max_gpu", "1"}}},
		{"gpu forbidden", `{"constraints": {"resources": {"max_gpu": 0}}}`, spec(gpus(1)),
			[]want{{c0 + ".resource_requirements.requests.gpu.count", "constraints.resources.max_gpu", "0"}}},
		{"total cpu ceiling", `{"constraints": {"resources": {"total_cpu": "3"}}}`, spec(limits("2", ""), second("busybox"), func(s *sandboxv1.SandboxSpec) {
			s.Containers[1].Resources = &sandboxv1.Resources{Cpu: "1500m"}
		}), []want{{"sandbox.spec.containers", "constraints.resources.total_cpu", "3"}}},
		{"total memory ceiling with base", `{"base": {"resources": {"limits": {"memory": "2Gi"}}}, "constraints": {"resources": {"total_memory": "3Gi"}}}`,
			spec(second("busybox")), []want{{"sandbox.spec.containers", "constraints.resources.total_memory", "3Gi"}}},
		{"total gpu ceiling", `{"constraints": {"resources": {"total_gpu": 1}}}`, spec(gpus(2)),
			[]want{{"sandbox.spec.containers", "constraints.resources.total_gpu", "1"}}},
		{"bad quantity", `{}`, spec(limits("lots", "")), []want{{c0 + ".resource_requirements.limits.cpu", ConstraintSpec, ""}}},
		{"request above limit", `{}`, spec(func(s *sandboxv1.SandboxSpec) {
			s.Containers[0].ResourceRequirements = &sandboxv1.ResourceRequirements{Requests: &sandboxv1.Resources{Cpu: "2"}, Limits: &sandboxv1.Resources{Cpu: "1"}}
		}), []want{{c0 + ".resource_requirements.requests.cpu", ConstraintSpec, ""}}},
		// images
		{"registry allowed (docker.io unqualified)", `{"constraints": {"images": {"allowed_registries": ["docker.io"]}}}`, spec(), nil},
		{"registry denied", `{"constraints": {"images": {"allowed_registries": ["ghcr.io"]}}}`, spec(),
			[]want{{c0 + ".image", "constraints.images.allowed_registries", "ghcr.io"}}},
		{"registry wildcard", `{"constraints": {"images": {"allowed_registries": ["*.example.com"]}}}`, spec(func(s *sandboxv1.SandboxSpec) {
			s.Containers[0].Image = "reg.example.com/x/y:1"
		}), nil},
		{"repository library/*", `{"constraints": {"images": {"allowed_repositories": ["library/*"]}}}`, spec(), nil},
		{"repository denied", `{"constraints": {"images": {"allowed_repositories": ["myorg/**"]}}}`, spec(),
			[]want{{c0 + ".image", "constraints.images.allowed_repositories", "myorg/**"}}},
		{"repository ** deep", `{"constraints": {"images": {"allowed_repositories": ["ghcr.io/myorg/**"]}}}`, spec(func(s *sandboxv1.SandboxSpec) {
			s.Containers[0].Image = "ghcr.io/myorg/a/b/c:latest"
		}), nil},
		{"digest required", `{"constraints": {"images": {"require_digest": true}}}`, spec(),
			[]want{{c0 + ".image", "constraints.images.require_digest", "true"}}},
		{"digest given", `{"constraints": {"images": {"require_digest": true}}}`, spec(func(s *sandboxv1.SandboxSpec) {
			s.Containers[0].Image = "python@sha256:" + strings.Repeat("ab", 32)
		}), nil},
		{"second container image checked", `{"constraints": {"images": {"allowed_registries": ["docker.io"]}}}`, spec(second("ghcr.io/x/y")),
			[]want{{"sandbox.spec.containers[1].image", "constraints.images.allowed_registries", ""}}},
		// services
		{"platform max services", `{}`, spec(svc(6, 0, 0)), []want{{"sandbox.spec.services", ConstraintPlatformServices, "5"}}},
		{"five services fine", `{}`, spec(svc(5, 0, 0)), nil},
		{"policy raises max", `{"constraints": {"services": {"max_services": 8}}}`, spec(svc(6, 0, 0)), nil},
		{"policy lowers max", `{"constraints": {"services": {"max_services": 1}}}`, spec(svc(2, 0, 0)),
			[]want{{"sandbox.spec.services", "constraints.services.max_services", "1"}}},
		{"visibility denied", `{"constraints": {"services": {"allowed_visibilities": ["PRIVATE"]}}}`, spec(svc(1, pub, 0)),
			[]want{{"sandbox.spec.services[0].visibility", "constraints.services.allowed_visibilities", "PRIVATE"}}},
		{"unspecified visibility always allowed", `{"constraints": {"services": {"allowed_visibilities": []}}}`, spec(svc(1, 0, 0)), nil},
		{"endpoint kind denied", `{"constraints": {"services": {"allowed_endpoint_kinds": ["HTTPS"]}}}`,
			spec(svc(1, pub, sandboxv1.EndpointKind_ENDPOINT_KIND_TLS_PASSTHROUGH)),
			[]want{{"sandbox.spec.services[0].endpoint.kind", "constraints.services.allowed_endpoint_kinds", "HTTPS"}}},
		{"endpoint kind allowed", `{"constraints": {"services": {"allowed_endpoint_kinds": ["HTTPS"], "allowed_visibilities": ["PUBLIC"]}}}`,
			spec(svc(1, pub, sandboxv1.EndpointKind_ENDPOINT_KIND_HTTPS)), nil},
		// network
		{"cidr inside union", envelope, spec(egress(cidr("10.0.0.0/8"))), nil},
		{"cidr inside one", envelope, spec(egress(cidr("10.1.2.0/24", 80))), nil},
		{"cidr outside", envelope, spec(egress(cidr("11.0.0.0/8"))),
			[]want{{"sandbox.spec.network.egress[0]", "constraints.network.allowed_egress", ""}}},
		{"cidr hits except", envelope, spec(egress(cidr("192.168.0.0/16"))),
			[]want{{"sandbox.spec.network.egress[0]", "constraints.network.allowed_egress", ""}}},
		{"cidr beside except", envelope, spec(egress(cidr("192.168.2.0/24"))), nil},
		{"spec except removes the hole", envelope, spec(egress(&sandboxv1.EgressRule{Destination: &sandboxv1.EgressRule_Cidr{
			Cidr: &sandboxv1.CidrBlock{Cidr: "192.168.0.0/16", Except: []string{"192.168.1.0/24"}}}})), nil},
		{"port-limited entry, right port", envelope, spec(egress(cidr("172.16.5.0/24", 443))), nil},
		{"port-limited entry, all ports", envelope, spec(egress(cidr("172.16.5.0/24"))),
			[]want{{"sandbox.spec.network.egress[0]", "constraints.network.allowed_egress", ""}}},
		{"host matches wildcard", envelope, spec(egress(host("files.pypi.org"))), nil},
		{"wildcard is one level", envelope, spec(egress(host("a.b.pypi.org"))),
			[]want{{"sandbox.spec.network.egress[0]", "constraints.network.allowed_egress", ""}}},
		{"host not listed", envelope, spec(egress(host("evil.com"))),
			[]want{{"sandbox.spec.network.egress[0]", "constraints.network.allowed_egress", ""}}},
		{"any needs any", envelope, spec(egress(anyRule)),
			[]want{{"sandbox.spec.network.egress[0]", "constraints.network.allowed_egress", ""}}},
		{"tenant matches", envelope, spec(egress(tenant(sandboxv1.TenantScope_TENANT_SCOPE_SAME_ORG))), nil},
		{"tenant differs", envelope, spec(egress(tenant(sandboxv1.TenantScope_TENANT_SCOPE_SANDBOX_NETWORK))),
			[]want{{"sandbox.spec.network.egress[0]", "constraints.network.allowed_egress", ""}}},
		{"selector needs entitlement", `{"constraints": {"network": {"allowed_egress": [{"any": true}]}}}`, spec(egress(selector)),
			[]want{{"sandbox.spec.network.egress[0]", "constraints.network.allowed_egress", ""}}},
		{"selector entitled", `{"constraints": {"network": {"allowed_egress": [{"any": true}], "allow_selectors": true}}}`, spec(egress(selector)), nil},
		{"any envelope covers hosts and cidrs", `{"constraints": {"network": {"allowed_egress": [{"any": true}]}}}`,
			spec(egress(host("x.com"), cidr("0.0.0.0/0"), anyRule)), nil},
		{"cidr-only envelope does not entitle names", `{"constraints": {"network": {"allowed_egress": [{"cidr": "0.0.0.0/0"}]}}}`, spec(egress(host("x.com"))),
			[]want{{"sandbox.spec.network.egress[0]", "constraints.network.allowed_egress", ""}}},
		{"star host entitles names", `{"constraints": {"network": {"allowed_egress": [{"https_hostname": "*"}]}}}`, spec(egress(host("x.com"))), nil},
		{"ipv6 cidr", `{"constraints": {"network": {"allowed_egress": [{"cidr": "2001:db8::/32"}]}}}`, spec(egress(cidr("2001:db8:1::/48"), cidr("2001:db9::/32"))),
			[]want{{"sandbox.spec.network.egress[1]", "constraints.network.allowed_egress", ""}}},
		{"empty envelope constrains nothing", `{"constraints": {"network": {}}}`, spec(egress(anyRule, selector)), nil},
		{"ingress outside", envelope, spec(ingress("198.51.100.0/24")),
			[]want{{"sandbox.spec.network.ingress[0]", "constraints.network.allowed_ingress", "203.0.113.0/24"}}},
		{"ingress inside", envelope, spec(ingress("203.0.113.128/25")), nil},
		{"base default checked against envelope", `{"base": {"default_egress": [{"any": true}]}, "constraints": {"network": {"allowed_egress": [{"any": true}]}}}`, spec(), nil},
		// security
		{"pin without allow-list", `{}`, spec(func(s *sandboxv1.SandboxSpec) { s.RuntimeClass = "runc" }),
			[]want{{"sandbox.spec.runtime_class", "constraints.security.allowed_runtime_classes", "(none)"}}},
		{"pin in allow-list", `{"constraints": {"security": {"allowed_runtime_classes": ["gvisor", "kata"]}}}`, spec(func(s *sandboxv1.SandboxSpec) { s.RuntimeClass = "kata" }), nil},
		{"pin outside allow-list", `{"constraints": {"security": {"allowed_runtime_classes": ["gvisor"]}}}`, spec(func(s *sandboxv1.SandboxSpec) { s.RuntimeClass = "runc" }),
			[]want{{"sandbox.spec.runtime_class", "constraints.security.allowed_runtime_classes", "gvisor"}}},
		{"pin equal to default needs no allow-list", `{"base": {"default_cpu_runtime_class": "gvisor"}}`, spec(func(s *sandboxv1.SandboxSpec) { s.RuntimeClass = "gvisor" }), nil},
		{"privileged denied by policy", `{"constraints": {"security": {"privileged_allowed": false}}}`, spec(secctx(&sandboxv1.SecurityContext{Privileged: proto.Bool(true)})),
			[]want{{c0 + ".security_context.privileged", "constraints.security.privileged_allowed", "false"}}},
		{"privileged denied by platform", `{}`, spec(secctx(&sandboxv1.SecurityContext{Privileged: proto.Bool(true)})),
			[]want{{c0 + ".security_context.privileged", ConstraintPlatformPrivileged, "false"}}},
		{"unprivileged fine", `{"constraints": {"security": {"privileged_allowed": false}}}`, spec(secctx(&sandboxv1.SecurityContext{Privileged: proto.Bool(false)})), nil},
		{"capability allowed", `{"constraints": {"security": {"allowed_capabilities": ["CAP_NET_BIND_SERVICE"]}}}`,
			spec(secctx(&sandboxv1.SecurityContext{CapabilitiesAdd: []string{"net_bind_service"}})), nil},
		{"capability denied", `{"constraints": {"security": {"allowed_capabilities": ["NET_BIND_SERVICE"]}}}`,
			spec(secctx(&sandboxv1.SecurityContext{CapabilitiesAdd: []string{"NET_BIND_SERVICE", "SYS_ADMIN"}})),
			[]want{{c0 + ".security_context.capabilities_add[1]", "constraints.security.allowed_capabilities", "NET_BIND_SERVICE"}}},
		// annotations
		{"annotation count", `{"constraints": {"annotations": {"max_count": 1}}}`, spec(func(s *sandboxv1.SandboxSpec) {
			s.Annotations = map[string]string{"a": "1", "b": "2"}
		}), []want{{"sandbox.spec.annotations", "constraints.annotations.max_count", "1"}}},
		{"base annotations count", `{"base": {"annotations": {"x": "1"}}, "constraints": {"annotations": {"max_count": 1}}}`, spec(func(s *sandboxv1.SandboxSpec) {
			s.Annotations = map[string]string{"a": "1"}
		}), []want{{"sandbox.spec.annotations", "constraints.annotations.max_count", "1"}}},
		{"annotation prefix", `{"constraints": {"annotations": {"denied_prefixes": ["kubernetes.io/", "sandboxd.io/"]}}}`, spec(func(s *sandboxv1.SandboxSpec) {
			s.Annotations = map[string]string{"sandboxd.io/owner": "me", "ok": "1"}
		}), []want{{`sandbox.spec.annotations["sandboxd.io/owner"]`, "constraints.annotations.denied_prefixes", ""}}},
		// instance types
		{"instance type allowed", `{"constraints": {"instance_types": {"allowed": ["gd-8xh100"]}}}`, spec(func(s *sandboxv1.SandboxSpec) { s.InstanceType = "gd-8xh100" }), nil},
		{"instance type denied", `{"constraints": {"instance_types": {"allowed": ["gd-8xh100"]}}}`, spec(func(s *sandboxv1.SandboxSpec) { s.InstanceType = "cd-gp-a192" }),
			[]want{{"sandbox.spec.instance_type", "constraints.instance_types.allowed", "gd-8xh100"}}},
		{"no instance type pinned", `{"constraints": {"instance_types": {"allowed": []}}}`, spec(), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := mustParse(t, tc.policy)
			before := proto.CloneOf(tc.spec)
			_, vs := Resolve(p, tc.spec, DefaultPlatform())
			checkViolations(t, vs, tc.want)
			if !proto.Equal(before, tc.spec) {
				t.Fatal("Resolve modified its input")
			}
		})
	}
}

func TestSeveralViolations(t *testing.T) {
	p := mustParse(t, `{"constraints": {
		"lifetime": {"max_seconds": 3600},
		"resources": {"max_cpu": "2", "total_memory": "1Gi"},
		"images": {"allowed_registries": ["ghcr.io"]},
		"annotations": {"denied_prefixes": ["x/"]}}}`)
	s := spec(limits("4", "2Gi"), func(s *sandboxv1.SandboxSpec) {
		s.MaxLifetimeSeconds = 7200
		s.Annotations = map[string]string{"x/y": "z"}
	})
	_, vs := Resolve(p, s, DefaultPlatform())
	checkViolations(t, vs, []want{
		{"sandbox.spec.max_lifetime_seconds", "constraints.lifetime.max_seconds", "3600"},
		{c0f + ".resource_requirements.limits.cpu", "constraints.resources.max_cpu", "2"},
		{"sandbox.spec.containers", "constraints.resources.total_memory", "1Gi"},
		{c0f + ".image", "constraints.images.allowed_registries", "ghcr.io"},
		{`sandbox.spec.annotations["x/y"]`, "constraints.annotations.denied_prefixes", "x/"},
	})
	if Reason(vs) != apierr.PlacementRejected {
		t.Errorf("reason %q", Reason(vs))
	}
}

const c0f = "sandbox.spec.containers[0]"

func TestReasonAndToAPI(t *testing.T) {
	p := mustParse(t, `{"constraints": {"resources": {"total_cpu": "1"}}}`)
	_, vs := Resolve(p, spec(limits("2", "")), DefaultPlatform())
	if len(vs) != 1 || !vs[0].Ceiling || Reason(vs) != apierr.ResourceCeilingExceeded {
		t.Fatalf("violations %s, reason %q", fmtVs(vs), Reason(vs))
	}
	a := vs[0].ToAPI()
	if a.Field != "sandbox.spec.containers" || !strings.Contains(a.Description, "constraints.resources.total_cpu") || !strings.Contains(a.Description, "limit 1") {
		t.Errorf("ToAPI = %+v", a)
	}
	if Reason(nil) != "" {
		t.Error("Reason(nil) should be empty")
	}
	err := apierr.Invalid(Reason(vs), "rejected by policy", ToAPI(vs))
	if apierr.Reason(err) != apierr.ResourceCeilingExceeded || len(apierr.Violations(err)) != 1 {
		t.Errorf("api error %v", err)
	}
}

func TestEmptyPolicyAcceptsWhatThePlatformAllows(t *testing.T) {
	s := spec(limits("64", "512Gi"), gpus(8), second("ghcr.io/any/thing:tag"), func(s *sandboxv1.SandboxSpec) {
		s.MaxLifetimeSeconds = MaxLifetimeSeconds
		s.Annotations = map[string]string{"kubernetes.io/x": "y"}
		s.InstanceType = "whatever"
		s.Services = []*sandboxv1.Service{{Port: 80, Visibility: sandboxv1.Visibility_VISIBILITY_PUBLIC,
			Endpoint: &sandboxv1.EndpointSpec{Kind: sandboxv1.EndpointKind_ENDPOINT_KIND_TLS_PASSTHROUGH}}}
		s.Network = &sandboxv1.NetworkOptions{Egress: []*sandboxv1.EgressRule{{Destination: &sandboxv1.EgressRule_Any{Any: true}}}}
		s.Containers[1].SecurityContext = &sandboxv1.SecurityContext{CapabilitiesAdd: []string{"SYS_ADMIN"}}
	})
	for _, p := range []*Policy{nil, {}, mustParse(t, `{"version": 1, "base": {}, "constraints": {}}`)} {
		if _, vs := Resolve(p, s, DefaultPlatform()); len(vs) > 0 {
			t.Errorf("empty policy rejected: %s", fmtVs(vs))
		}
	}
}

func TestNilSpec(t *testing.T) {
	_, vs := Resolve(nil, nil, DefaultPlatform())
	checkViolations(t, vs, []want{{"sandbox.spec", ConstraintSpec, ""}})
}

func TestPlatformRuntimeClasses(t *testing.T) {
	pl := DefaultPlatform()
	pl.RuntimeClasses = []string{"runc", "runsc"}
	p := mustParse(t, `{"constraints": {"security": {"allowed_runtime_classes": ["runsc", "kata"]}}}`)
	_, vs := Resolve(p, spec(func(s *sandboxv1.SandboxSpec) { s.RuntimeClass = "kata" }), pl)
	checkViolations(t, vs, []want{{"sandbox.spec.runtime_class", ConstraintPlatformRuntimeClass, "runc, runsc"}})
	_, vs = Resolve(p, spec(func(s *sandboxv1.SandboxSpec) { s.RuntimeClass = "runsc" }), pl)
	checkViolations(t, vs, nil)
}

func TestRevision(t *testing.T) {
	p := mustParse(t, `{"base": {"max_lifetime_seconds": 60}}`)
	res := ResolveRevision(p, "etag-7", spec(), DefaultPlatform())
	if !res.OK() || res.PolicyRevision != "etag-7" || res.Spec.MaxLifetimeSeconds != 60 {
		t.Errorf("result %+v", res)
	}
}

func TestResolveIsIdempotent(t *testing.T) {
	p := mustParse(t, `{"base": {"max_lifetime_seconds": 60, "env": {"A": "1"}, "tags": ["t"], "annotations": {"a": "b"},
		"default_cpu_runtime_class": "gvisor", "resources": {"requests": {"cpu": "1"}, "limits": {"cpu": "2"}},
		"default_egress": [{"cidr": "10.0.0.0/8"}]},
		"constraints": {"security": {"allowed_runtime_classes": ["gvisor"]}, "network": {"allowed_egress": [{"cidr": "10.0.0.0/8"}]}}}`)
	once, vs := Resolve(p, spec(), DefaultPlatform())
	if len(vs) > 0 {
		t.Fatal(fmtVs(vs))
	}
	twice, vs := Resolve(p, once, DefaultPlatform())
	if len(vs) > 0 {
		t.Fatal(fmtVs(vs))
	}
	if !proto.Equal(once, twice) {
		t.Errorf("not idempotent:\n%v\n%v", once, twice)
	}
}

func TestPlatformCapabilities(t *testing.T) {
	pl := DefaultPlatform()
	pl.AllowedCapabilities = []string{}
	secctx := func(sc *sandboxv1.SecurityContext) func(*sandboxv1.SandboxSpec) {
		return func(s *sandboxv1.SandboxSpec) { s.Containers[0].SecurityContext = sc }
	}
	add := spec(secctx(&sandboxv1.SecurityContext{CapabilitiesAdd: []string{"NET_ADMIN"}}))
	for _, tc := range []struct {
		name   string
		policy string
		want   []want
	}{
		{"no policy list: the platform allows none", `{}`,
			[]want{{c0f + ".security_context.capabilities_add[0]", ConstraintPlatformCapabilities, "(none)"}}},
		{"the policy's list grants it", `{"constraints": {"security": {"allowed_capabilities": ["CAP_NET_ADMIN"]}}}`, nil},
		{"an empty policy list allows none", `{"constraints": {"security": {"allowed_capabilities": []}}}`,
			[]want{{c0f + ".security_context.capabilities_add[0]", "constraints.security.allowed_capabilities", "(none)"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, vs := Resolve(mustParse(t, tc.policy), add, pl)
			checkViolations(t, vs, tc.want)
		})
	}
	if _, vs := Resolve(nil, spec(secctx(&sandboxv1.SecurityContext{CapabilitiesDrop: []string{"ALL"}})), pl); len(vs) > 0 {
		t.Errorf("dropping capabilities needs no consent: %s", fmtVs(vs))
	}
}

// TestDefaultsPerContainer: the policy's resource defaults fill each container of a
// group (not the sandbox as a whole), and its per-sandbox ceiling then holds the sum.
func TestDefaultsPerContainer(t *testing.T) {
	p := mustParse(t, `{"base": {"resources": {"requests": {"cpu": "250m"}, "limits": {"cpu": "1", "memory": "1Gi"}}},
		"constraints": {"resources": {"total_cpu": "2"}}}`)
	s := spec(second("busybox"), second("redis"))
	s.Containers[2].Name = "db"
	s.Containers[2].ResourceRequirements = &sandboxv1.ResourceRequirements{Limits: &sandboxv1.Resources{Cpu: "500m"}}
	got, vs := Resolve(p, s, DefaultPlatform())
	for i, want := range []struct{ req, lim, mem string }{{"250m", "1", "1Gi"}, {"250m", "1", "1Gi"}, {"500m", "500m", "1Gi"}} {
		rr := got.GetContainers()[i].GetResourceRequirements()
		if rr.GetRequests().GetCpu() != want.req || rr.GetLimits().GetCpu() != want.lim || rr.GetLimits().GetMemory() != want.mem {
			t.Errorf("container %d: %v, want requests.cpu %s limits.cpu %s limits.memory %s", i, rr, want.req, want.lim, want.mem)
		}
	}
	// 1 + 1 + 0.5 CPUs of limits: above the sandbox's 2.
	checkViolations(t, vs, []want{{"sandbox.spec.containers", "constraints.resources.total_cpu", "2"}})
}
