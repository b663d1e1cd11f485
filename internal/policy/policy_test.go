package policy

import (
	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseStrict(t *testing.T) {
	for _, tc := range []struct {
		name, doc string
		bad       string // substring of the error; "" = must parse
	}{
		{"empty object", `{}`, ""},
		{"whitespace", " \n{ }\n", ""},
		{"full", `{"version": 1, "base": {"max_lifetime_seconds": 60}, "constraints": {"lifetime": {"max_seconds": 120}}}`, ""},
		{"numeric quantity", `{"constraints": {"resources": {"max_cpu": 2.5, "max_memory": "4Gi"}}}`, ""},
		{"unknown top-level field", `{"bse": {}}`, "unknown field"},
		{"unknown nested field", `{"constraints": {"resources": {"max_cpus": "2"}}}`, "unknown field"},
		{"unknown rule field", `{"base": {"default_egress": [{"dns_name": "x.com"}]}}`, "unknown field"},
		{"trailing data", `{} {}`, "after the document"},
		{"null", `null`, "JSON object"},
		{"array", `[]`, "JSON object"},
		{"empty", ``, "JSON object"},
		{"wrong type", `{"base": {"max_lifetime_seconds": "60"}}`, "cannot unmarshal"},
		{"bad quantity type", `{"constraints": {"resources": {"max_cpu": true}}}`, "quantity"},
		{"truncated", `{"base": {`, "unexpected EOF"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.doc))
			switch {
			case tc.bad == "" && err != nil:
				t.Fatalf("unexpected error %v", err)
			case tc.bad != "" && (err == nil || !strings.Contains(err.Error(), tc.bad)):
				t.Fatalf("error %v, want one containing %q", err, tc.bad)
			}
		})
	}
	p, _ := Parse([]byte(`{"constraints": {"resources": {"max_cpu": 2.5}}}`))
	if p.Constraints.Resources.MaxCPU != "2.5" {
		t.Errorf("max_cpu %q", p.Constraints.Resources.MaxCPU)
	}
}

func TestMarshalRoundTripKeepsEmptyAllowLists(t *testing.T) {
	p := mustParse(t, `{"constraints": {"images": {"allowed_registries": []}, "security": {"allowed_runtime_classes": []}}}`)
	b, err := Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	q, err := Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	if q.Constraints.Images.AllowedRegistries == nil || q.Constraints.Security.AllowedRuntimeClasses == nil {
		t.Errorf("an empty allow-list (allow nothing) became absent (allow all): %s", b)
	}
	if b, _ := Marshal(&Policy{}); string(b) != "{}" {
		t.Errorf("empty policy marshals as %s", b)
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name   string
		doc    string
		fields []string // expected violation fields, in order
	}{
		{"empty", `{}`, nil},
		{"version", `{"version": 2}`, []string{"policy.version"}},
		{"negative lifetime", `{"base": {"max_lifetime_seconds": -1}, "constraints": {"lifetime": {"max_seconds": -5}}}`,
			[]string{"policy.constraints.lifetime.max_seconds", "policy.base.max_lifetime_seconds"}},
		{"max above 30 days", `{"constraints": {"lifetime": {"max_seconds": 2592001}}}`, []string{"policy.constraints.lifetime.max_seconds"}},
		{"default above max", `{"base": {"max_lifetime_seconds": 7200}, "constraints": {"lifetime": {"max_seconds": 3600}}}`,
			[]string{"policy.base.max_lifetime_seconds"}},
		{"bad quantities", `{"base": {"resources": {"limits": {"memory": "4GB"}}}, "constraints": {"resources": {"max_cpu": "-1", "total_memory": "lots"}}}`,
			[]string{"policy.constraints.resources.max_cpu", "policy.constraints.resources.total_memory", "policy.base.resources.limits.memory"}},
		{"negative gpu", `{"constraints": {"resources": {"max_gpu": -1, "total_gpu": -2}}}`,
			[]string{"policy.constraints.resources.max_gpu", "policy.constraints.resources.total_gpu"}},
		{"base resources above max", `{"base": {"resources": {"requests": {"cpu": "1"}, "limits": {"cpu": "4"}}}, "constraints": {"resources": {"max_cpu": "2"}}}`,
			[]string{"policy.base.resources.limits.cpu"}},
		{"base request above limit", `{"base": {"resources": {"requests": {"memory": "2Gi"}, "limits": {"memory": "1Gi"}}}}`,
			[]string{"policy.base.resources.requests.memory"}},
		{"base above total", `{"base": {"resources": {"limits": {"memory": "8Gi"}}}, "constraints": {"resources": {"total_memory": "4Gi"}}}`,
			[]string{"policy.base.resources.limits.memory"}},
		{"bad env and tags", `{"base": {"env": {"A=B": "x", "": "y"}, "tags": [" "]}}`,
			[]string{`policy.base.env[""]`, `policy.base.env["A=B"]`, "policy.base.tags[0]"}},
		{"base annotation denied", `{"base": {"annotations": {"kubernetes.io/x": "1"}}, "constraints": {"annotations": {"denied_prefixes": ["kubernetes.io/"]}}}`,
			[]string{`policy.base.annotations["kubernetes.io/x"]`}},
		{"base annotation key not a qualified name", `{"base": {"annotations": {"a b": "1", "example.com/ok": "2", "Example.com/x": "3"}}}`,
			[]string{`policy.base.annotations["Example.com/x"]`, `policy.base.annotations["a b"]`}},
		{"base annotations above count", `{"base": {"annotations": {"a": "1", "b": "2"}}, "constraints": {"annotations": {"max_count": 1}}}`,
			[]string{"policy.base.annotations"}},
		{"annotation constraints", `{"constraints": {"annotations": {"max_count": -1, "denied_prefixes": [""]}}}`,
			[]string{"policy.constraints.annotations.max_count", "policy.constraints.annotations.denied_prefixes[0]"}},
		{"runtime class default outside allow-list", `{"base": {"default_cpu_runtime_class": "runc", "default_gpu_runtime_class": "kata"}, "constraints": {"security": {"allowed_runtime_classes": ["kata"]}}}`,
			[]string{"policy.base.default_cpu_runtime_class"}},
		{"security names", `{"constraints": {"security": {"allowed_runtime_classes": [""], "allowed_capabilities": ["NET ADMIN", "cap_"]}}}`,
			[]string{"policy.constraints.security.allowed_runtime_classes[0]", "policy.constraints.security.allowed_capabilities[0]", "policy.constraints.security.allowed_capabilities[1]"}},
		{"images", `{"constraints": {"images": {"allowed_registries": ["ghcr.io/org", ""], "allowed_repositories": ["[abc", "a//b", "myorg/**"]}}}`,
			[]string{"policy.constraints.images.allowed_registries[0]", "policy.constraints.images.allowed_registries[1]",
				"policy.constraints.images.allowed_repositories[0]", "policy.constraints.images.allowed_repositories[1]"}},
		{"services", `{"constraints": {"services": {"max_services": -1, "allowed_visibilities": ["PUBLIC", "WORLD"], "allowed_endpoint_kinds": ["HTTP"]}}}`,
			[]string{"policy.constraints.services.max_services", "policy.constraints.services.allowed_visibilities[1]", "policy.constraints.services.allowed_endpoint_kinds[0]"}},
		{"enum prefixes accepted", `{"constraints": {"services": {"allowed_visibilities": ["VISIBILITY_PUBLIC", "private"], "allowed_endpoint_kinds": ["ENDPOINT_KIND_HTTPS"]}}}`, nil},
		{"bad cidrs", `{"constraints": {"network": {"allowed_egress": [{"cidr": "10.0.0.0/33"}, {"cidr": "10.0.0.1/8"}, {"cidr": "10.0.0.0/8", "except": ["11.0.0.0/16"]}]}}}`,
			[]string{"policy.constraints.network.allowed_egress[0].cidr", "policy.constraints.network.allowed_egress[1].cidr", "policy.constraints.network.allowed_egress[2].except[0]"}},
		{"rule shape", `{"constraints": {"network": {"allowed_egress": [{}, {"any": true, "cidr": "10.0.0.0/8"}, {"tenant": "EVERYONE"}, {"https_hostname": "a..b"}]}}}`,
			[]string{"policy.constraints.network.allowed_egress[0]", "policy.constraints.network.allowed_egress[1]",
				"policy.constraints.network.allowed_egress[2].tenant", "policy.constraints.network.allowed_egress[3].https_hostname"}},
		{"ports", `{"constraints": {"network": {"allowed_ingress": [{"any": true, "ports": [{"protocol": "ICMP"}, {"port": 70000}, {"port": 10, "end_port": 5}]}]}}}`,
			[]string{"policy.constraints.network.allowed_ingress[0].ports[0].protocol", "policy.constraints.network.allowed_ingress[0].ports[1].port",
				"policy.constraints.network.allowed_ingress[0].ports[2].end_port"}},
		{"host rules", `{"base": {"default_egress": [{"https_hostname": "x.com"}]}, "constraints": {"network": {"allowed_ingress": [{"https_hostname": "x.com"}], "allowed_egress": [{"https_hostname": "*.x.com", "ports": [{"port": 80}]}]}}}`,
			[]string{"policy.base.default_egress[0].https_hostname", "policy.constraints.network.allowed_egress[0].ports[0]", "policy.constraints.network.allowed_ingress[0].https_hostname"}},
		{"ingress sandbox network", `{"base": {"default_ingress": [{"tenant": "SANDBOX_NETWORK"}]}}`, []string{"policy.base.default_ingress[0].tenant"}},
		{"default outside envelope", `{"base": {"default_egress": [{"cidr": "0.0.0.0/0"}]}, "constraints": {"network": {"allowed_egress": [{"cidr": "10.0.0.0/8"}]}}}`,
			[]string{"policy.base.default_egress[0]"}},
		{"default inside envelope", `{"base": {"default_egress": [{"cidr": "10.1.0.0/16", "ports": [{"port": 443}]}], "default_ingress": [{"tenant": "SAME_ORG"}]},
			"constraints": {"network": {"allowed_egress": [{"cidr": "10.0.0.0/8"}], "allowed_ingress": [{"tenant": "SAME_ORG"}]}}}`, nil},
		{"instance types", `{"constraints": {"instance_types": {"allowed": [""]}}}`, []string{"policy.constraints.instance_types.allowed[0]"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := Parse([]byte(tc.doc))
			if err != nil {
				t.Fatal(err)
			}
			vs := Validate(p)
			var got []string
			for _, v := range vs {
				got = append(got, v.Field)
				if v.Description == "" {
					t.Errorf("%s has no description", v.Field)
				}
			}
			if strings.Join(got, "\n") != strings.Join(tc.fields, "\n") {
				t.Errorf("violations:\n%v\nwant fields:\n%s", vs, strings.Join(tc.fields, "\n"))
			}
		})
	}
}

func TestExamples(t *testing.T) {
	files, err := filepath.Glob("../../docs/policy/*.json")
	if err != nil || len(files) < 2 {
		t.Fatalf("examples: %v %v", files, err)
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			p, err := Parse(b)
			if err != nil {
				t.Fatal(err)
			}
			if vs := Validate(p); len(vs) > 0 {
				t.Fatalf("invalid: %v", vs)
			}
			// The single-host example (README) takes the official client's default sandbox
			// and bounds what a sandbox may ask for.
			if filepath.Base(f) == "single-host.json" {
				if _, vs := Resolve(p, spec(), DefaultPlatform()); len(vs) > 0 { // python:3.11, nothing asked
					t.Errorf("single-host rejects the default sandbox: %s", fmtVs(vs))
				}
				if _, vs := Resolve(p, spec(limits("4", "1Gi")), DefaultPlatform()); len(vs) != 1 {
					t.Errorf("single-host on 4 CPUs: %s", fmtVs(vs))
				}
			}
			// The strict example accepts a well-behaved sandbox and rejects a greedy one.
			if filepath.Base(f) == "strict.json" {
				good := spec(func(s *sandboxv1.SandboxSpec) {
					s.Containers[0].Image = "ghcr.io/myorg/app@sha256:" + strings.Repeat("0", 64)
				})
				if _, vs := Resolve(p, good, DefaultPlatform()); len(vs) > 0 {
					t.Errorf("strict rejects a good spec: %s", fmtVs(vs))
				}
				bad := spec(limits("16", "64Gi"), func(s *sandboxv1.SandboxSpec) { s.MaxLifetimeSeconds = MaxLifetimeSeconds })
				if _, vs := Resolve(p, bad, DefaultPlatform()); len(vs) < 4 {
					t.Errorf("strict accepts too much: %s", fmtVs(vs))
				}
			}
		})
	}
}
