package spec

import (
	"reflect"
	"slices"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// Wire rule builders for the tables below.
func cidrRule(c string, except ...string) *sandboxv1.EgressRule {
	return &sandboxv1.EgressRule{Destination: &sandboxv1.EgressRule_Cidr{Cidr: &sandboxv1.CidrBlock{Cidr: c, Except: except}}}
}

func hostRule(h string, ports ...*sandboxv1.PortRange) *sandboxv1.EgressRule {
	return &sandboxv1.EgressRule{Destination: &sandboxv1.EgressRule_HttpsHostname{HttpsHostname: h}, Ports: ports}
}

func tenantRule(t sandboxv1.TenantScope) *sandboxv1.EgressRule {
	return &sandboxv1.EgressRule{Destination: &sandboxv1.EgressRule_Tenant{Tenant: t}}
}

func anyRule(ports ...*sandboxv1.PortRange) *sandboxv1.EgressRule {
	return &sandboxv1.EgressRule{Destination: &sandboxv1.EgressRule_Any{Any: true}, Ports: ports}
}

func port(proto string, p, end int32) *sandboxv1.PortRange {
	return &sandboxv1.PortRange{Protocol: proto, Port: p, EndPort: end}
}

func netSpec(n *sandboxv1.NetworkOptions) *sandboxv1.SandboxSpec {
	return &sandboxv1.SandboxSpec{Containers: []*sandboxv1.Container{{Image: "busybox"}}, Network: n}
}

func TestToCreateRequestNetwork(t *testing.T) {
	const (
		sameOrg  = sandboxv1.TenantScope_TENANT_SCOPE_SAME_ORG
		sameUser = sandboxv1.TenantScope_TENANT_SCOPE_SAME_USER
	)
	for _, tc := range []struct {
		name string
		n    *sandboxv1.NetworkOptions
		want *runtime.Network
	}{
		{"no options: no rules, never nil", nil, &runtime.Network{}},
		{"every destination", &sandboxv1.NetworkOptions{Egress: []*sandboxv1.EgressRule{
			cidrRule("10.0.0.0/8", "10.1.0.0/16"), cidrRule("2001:db8::/32"),
			hostRule("API.Example.com", port("tcp", 443, 0)), hostRule("*.pypi.org"),
			tenantRule(sameOrg), tenantRule(sameUser),
			anyRule(port("UDP", 53, 0), port("", 8000, 8100)),
		}}, &runtime.Network{Egress: []runtime.EgressRule{
			{CIDR: "10.0.0.0/8", Except: []string{"10.1.0.0/16"}}, {CIDR: "2001:db8::/32"},
			{DNSName: "api.example.com"}, {DNSName: "*.pypi.org"},
			{Tenant: runtime.TenantSameOrg}, {Tenant: runtime.TenantSameUser},
			{Any: true, Ports: []runtime.PortRange{{Protocol: "udp", Port: 53}, {Port: 8000, EndPort: 8100}}},
		}}},
		{"deny both", &sandboxv1.NetworkOptions{DenyEgress: proto.Bool(true), DenyIngress: proto.Bool(true)},
			&runtime.Network{DenyEgress: true, DenyIngress: true}},
		{"explicit false deny with rules", &sandboxv1.NetworkOptions{DenyEgress: proto.Bool(false), Egress: []*sandboxv1.EgressRule{anyRule()}},
			&runtime.Network{Egress: []runtime.EgressRule{{Any: true}}}},
		{"ingress", &sandboxv1.NetworkOptions{Ingress: []*sandboxv1.IngressRule{
			{Source: &sandboxv1.IngressRule_Cidr{Cidr: &sandboxv1.CidrBlock{Cidr: "192.0.2.0/24"}}, Ports: []*sandboxv1.PortRange{port("TCP", 9000, 0)}},
			{Source: &sandboxv1.IngressRule_Tenant{Tenant: sameOrg}},
			{Source: &sandboxv1.IngressRule_Any{Any: true}},
		}}, &runtime.Network{Ingress: []runtime.IngressRule{
			{CIDR: "192.0.2.0/24", Ports: []runtime.PortRange{{Protocol: "tcp", Port: 9000}}},
			{Tenant: runtime.TenantSameOrg}, {Any: true},
		}}},
		{"dns egress allow", &sandboxv1.NetworkOptions{DnsEgress: sandboxv1.DNSEgressMode_DNS_EGRESS_MODE_ALLOW}, &runtime.Network{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, err := ToCreateRequest(netSpec(tc.n))
			if err != nil {
				t.Fatalf("toCreateRequest: %v", err)
			}
			if !reflect.DeepEqual(req.Spec.Network, tc.want) {
				t.Errorf("network %+v, want %+v", req.Spec.Network, tc.want)
			}
			// The status echoes what was converted, and converting the echo again is stable.
			eg, in := EffectiveNetwork(req.Spec.Network)
			back, vs, _ := ToNetwork(&sandboxv1.NetworkOptions{Egress: eg, Ingress: in, DenyEgress: proto.Bool(tc.want.DenyEgress), DenyIngress: proto.Bool(tc.want.DenyIngress)})
			if len(vs) > 0 || !reflect.DeepEqual(back, tc.want) {
				t.Errorf("echo converts back to %+v (%v), want %+v", back, vs, tc.want)
			}
		})
	}
}

func TestNetworkViolations(t *testing.T) {
	type v struct{ field, says string } // field under sandbox.spec.network., a word of its description
	for _, tc := range []struct {
		name string
		n    *sandboxv1.NetworkOptions
		want []v
	}{
		{"no destination", &sandboxv1.NetworkOptions{Egress: []*sandboxv1.EgressRule{{}, {Destination: &sandboxv1.EgressRule_Any{Any: false}}}},
			[]v{{"egress[0]", "exactly one destination"}, {"egress[1]", "exactly one destination"}}},
		{"cidr does not parse", &sandboxv1.NetworkOptions{Egress: []*sandboxv1.EgressRule{cidrRule("10.0.0.0"), cidrRule("example.com/8"), cidrRule("10.0.0.0/33"), cidrRule("")}},
			[]v{{"egress[0].cidr", "not an IPv4 or IPv6 prefix"}, {"egress[1].cidr", "not an IPv4 or IPv6 prefix"}, {"egress[2].cidr", "not an IPv4 or IPv6 prefix"}, {"egress[3].cidr", "is required"}}},
		{"cidr with host bits", &sandboxv1.NetworkOptions{Egress: []*sandboxv1.EgressRule{cidrRule("10.1.2.3/8"), cidrRule("2001:db8::1/32")}},
			[]v{{"egress[0].cidr", "did you mean 10.0.0.0/8"}, {"egress[1].cidr", "did you mean 2001:db8::/32"}}},
		{"IPv4-mapped IPv6", &sandboxv1.NetworkOptions{Egress: []*sandboxv1.EgressRule{cidrRule("::ffff:10.0.0.0/104")}},
			[]v{{"egress[0].cidr", "IPv4-mapped"}}},
		{"excepts outside, equal, other family, malformed", &sandboxv1.NetworkOptions{Egress: []*sandboxv1.EgressRule{
			cidrRule("10.0.0.0/8", "11.0.0.0/16", "10.0.0.0/8", "2001:db8::/64", "10.1.0.0", "10.1.0.1/16", "10.2.0.0/16")}},
			[]v{{"egress[0].cidr.except[0]", "not strictly inside"}, {"egress[0].cidr.except[1]", "not strictly inside"}, {"egress[0].cidr.except[2]", "not strictly inside"},
				{"egress[0].cidr.except[3]", "not an IPv4"}, {"egress[0].cidr.except[4]", "host bits"}}},
		{"bad host names", &sandboxv1.NetworkOptions{Egress: []*sandboxv1.EgressRule{
			hostRule("*"), hostRule("a.*.example.com"), hostRule("*example.com"), hostRule("**.example.com"), hostRule("exa_mple.com"),
			hostRule("-a.example.com"), hostRule("example.com."), hostRule("192.0.2.1"), hostRule(strings.Repeat("a", 64) + ".com"), hostRule("")}},
			[]v{{"egress[0].https_hostname", "policy ceiling"}, {"egress[1].https_hostname", "leftmost label"}, {"egress[2].https_hostname", "leftmost label"},
				{"egress[3].https_hostname", "leftmost label"}, {"egress[4].https_hostname", "not a host name"}, {"egress[5].https_hostname", "not a host name"},
				{"egress[6].https_hostname", "not a host name"}, {"egress[7].https_hostname", "IP address"}, {"egress[8].https_hostname", "not a host name"},
				{"egress[9].https_hostname", "is required"}}},
		{"host name ports other than TCP 443", &sandboxv1.NetworkOptions{Egress: []*sandboxv1.EgressRule{
			hostRule("a.example.com", port("", 80, 0)), hostRule("b.example.com", port("UDP", 443, 0)), hostRule("c.example.com", port("", 443, 444)),
			hostRule("d.example.com", port("", 443, 0), port("", 443, 0)), hostRule("e.example.com", port("TCP", 443, 443))}},
			[]v{{"egress[0].ports", "HTTPS only"}, {"egress[1].ports", "HTTPS only"}, {"egress[2].ports", "HTTPS only"}, {"egress[3].ports", "HTTPS only"}}},
		{"policy-only host exceptions", &sandboxv1.NetworkOptions{Egress: []*sandboxv1.EgressRule{{Destination: &sandboxv1.EgressRule_HttpsHostname{HttpsHostname: "*.example.com"}, HttpsHostnameExcept: []string{"a.example.com"}}}},
			[]v{{"egress[0].https_hostname_except", "policies"}}},
		{"tenant unset or unknown", &sandboxv1.NetworkOptions{Egress: []*sandboxv1.EgressRule{tenantRule(0), tenantRule(9)},
			Ingress: []*sandboxv1.IngressRule{{Source: &sandboxv1.IngressRule_Tenant{Tenant: 0}}}},
			[]v{{"egress[0].tenant", "not a tenant scope"}, {"egress[1].tenant", "not a tenant scope"}, {"ingress[0].tenant", "not a tenant scope"}}},
		{"SANDBOX_NETWORK ingress", &sandboxv1.NetworkOptions{Ingress: []*sandboxv1.IngressRule{{Source: &sandboxv1.IngressRule_Tenant{Tenant: sandboxv1.TenantScope_TENANT_SCOPE_SANDBOX_NETWORK}}}},
			[]v{{"ingress[0].tenant", "not supported for ingress"}}},
		{"ingress without a source", &sandboxv1.NetworkOptions{Ingress: []*sandboxv1.IngressRule{{}}}, []v{{"ingress[0]", "exactly one destination"}}},
		{"deny with rules", &sandboxv1.NetworkOptions{DenyEgress: proto.Bool(true), Egress: []*sandboxv1.EgressRule{anyRule()},
			DenyIngress: proto.Bool(true), Ingress: []*sandboxv1.IngressRule{{Source: &sandboxv1.IngressRule_Any{Any: true}}}},
			[]v{{"deny_egress", "cannot be combined"}, {"deny_ingress", "cannot be combined"}}},
		{"port ranges", &sandboxv1.NetworkOptions{Egress: []*sandboxv1.EgressRule{anyRule(
			port("icmp", 1, 0), port("", 0, 0), port("", 65536, 0), port("", 100, 99), port("", 100, 65536), port("", -1, 0),
			port("sctp", 1, 65535), port("Udp", 100, 100))}},
			[]v{{"egress[0].ports[0].protocol", "not TCP, UDP or SCTP"}, {"egress[0].ports[1].port", "1-65535"}, {"egress[0].ports[2].port", "1-65535"},
				{"egress[0].ports[3].end_port", "between port 100 and 65535"}, {"egress[0].ports[4].end_port", "between port 100 and 65535"}, {"egress[0].ports[5].port", "1-65535"}}},
		{"unknown dns egress mode", &sandboxv1.NetworkOptions{DnsEgress: 7}, []v{{"dns_egress", "unknown mode"}}},
		{"too many rules", &sandboxv1.NetworkOptions{Egress: slices.Repeat([]*sandboxv1.EgressRule{anyRule()}, 101)}, []v{{"egress", "at most 100"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ToCreateRequest(netSpec(tc.n))
			if connect.CodeOf(err) != connect.CodeInvalidArgument || apierr.Reason(err) != apierr.InvalidRequest {
				t.Fatalf("toCreateRequest: %v, want INVALID_ARGUMENT %s", err, apierr.InvalidRequest)
			}
			got := apierr.Violations(err)
			if len(got) != len(tc.want) {
				t.Fatalf("violations %v, want %d: %v", got, len(tc.want), tc.want)
			}
			for i, w := range tc.want {
				if got[i].Field != networkField+w.field || !strings.Contains(got[i].Description, w.says) {
					t.Errorf("violation %d: %s %q, want %s%s saying %q", i, got[i].Field, got[i].Description, networkField, w.field, w.says)
				}
			}
		})
	}
}

func TestNetworkUnimplemented(t *testing.T) {
	for _, tc := range []struct {
		name string
		n    *sandboxv1.NetworkOptions
		says string
	}{
		{"selector", &sandboxv1.NetworkOptions{Egress: []*sandboxv1.EgressRule{{Destination: &sandboxv1.EgressRule_Selector{Selector: &sandboxv1.SelectorBlock{PodLabels: map[string]string{"app": "db"}}}}}}, "selector"},
		{"sandbox network egress", &sandboxv1.NetworkOptions{Egress: []*sandboxv1.EgressRule{tenantRule(sandboxv1.TenantScope_TENANT_SCOPE_SANDBOX_NETWORK)}}, "SANDBOX_NETWORK"},
		{"dns egress deny", &sandboxv1.NetworkOptions{DnsEgress: sandboxv1.DNSEgressMode_DNS_EGRESS_MODE_DENY}, "dns_egress DENY"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ToCreateRequest(netSpec(tc.n))
			if connect.CodeOf(err) != connect.CodeUnimplemented || apierr.Reason(err) != apierr.NotImplemented || !strings.Contains(err.Error(), tc.says) {
				t.Errorf("toCreateRequest: %v, want UNIMPLEMENTED %s naming %q", err, apierr.NotImplemented, tc.says)
			}
		})
	}
	// A malformed rule next to an unsupported one is reported as malformed first: the
	// caller has to fix it whatever this sandboxd supports.
	_, err := ToCreateRequest(netSpec(&sandboxv1.NetworkOptions{Egress: []*sandboxv1.EgressRule{
		{Destination: &sandboxv1.EgressRule_Selector{Selector: &sandboxv1.SelectorBlock{}}}, cidrRule("bad")}}))
	if connect.CodeOf(err) != connect.CodeInvalidArgument || len(apierr.Violations(err)) != 1 || apierr.Violations(err)[0].Field != networkField+"egress[1].cidr" {
		t.Errorf("selector + bad cidr: %v", err)
	}
}

func TestCustomVisibility(t *testing.T) {
	s := netSpec(&sandboxv1.NetworkOptions{Ingress: []*sandboxv1.IngressRule{{Source: &sandboxv1.IngressRule_Tenant{Tenant: sandboxv1.TenantScope_TENANT_SCOPE_SAME_ORG}}}})
	s.Services = []*sandboxv1.Service{{Port: 9000, Visibility: sandboxv1.Visibility_VISIBILITY_CUSTOM}}
	req, err := ToCreateRequest(s)
	if err != nil || len(req.Spec.Services) != 1 || req.Spec.Services[0].Visibility != "custom" {
		t.Fatalf("custom service: %+v %v", req.Spec.Services, err)
	}
	// An endpoint still needs PUBLIC.
	s.Services[0].Endpoint = &sandboxv1.EndpointSpec{Kind: sandboxv1.EndpointKind_ENDPOINT_KIND_HTTPS}
	_, err = ToCreateRequest(s)
	if vs := apierr.Violations(err); len(vs) != 1 || vs[0].Field != "sandbox.spec.services[0].visibility" {
		t.Errorf("custom with endpoint: %v", err)
	}
}

func FuzzNetworkViolations(f *testing.F) {
	f.Add("10.0.0.0/8", "10.1.0.0/16", "*.example.com", int32(2), "tcp", int32(443), int32(0), true, false)
	f.Add("2001:db8::1/32", "", "", int32(3), "sctp", int32(1), int32(65535), false, true)
	f.Add("", "x", "192.0.2.1", int32(0), "", int32(0), int32(-1), true, true)
	f.Fuzz(func(t *testing.T, cidr, except, host string, tenant int32, protocol string, p, end int32, denyEgress, anyDest bool) {
		ports := []*sandboxv1.PortRange{port(protocol, p, end)}
		n := &sandboxv1.NetworkOptions{
			DenyEgress: proto.Bool(denyEgress),
			Egress: []*sandboxv1.EgressRule{
				{Destination: &sandboxv1.EgressRule_Cidr{Cidr: &sandboxv1.CidrBlock{Cidr: cidr, Except: []string{except}}}, Ports: ports},
				hostRule(host), tenantRule(sandboxv1.TenantScope(tenant)), {Destination: &sandboxv1.EgressRule_Any{Any: anyDest}, Ports: ports},
			},
			Ingress: []*sandboxv1.IngressRule{{Source: &sandboxv1.IngressRule_Cidr{Cidr: &sandboxv1.CidrBlock{Cidr: cidr}}, Ports: ports}},
		}
		out, vs, _ := ToNetwork(n)
		for _, v := range vs {
			if !strings.HasPrefix(v.Field, networkField) || v.Description == "" {
				t.Errorf("violation %+v", v)
			}
		}
		if denyEgress && len(vs) == 0 {
			t.Errorf("deny_egress with rules accepted")
		}
		if len(vs) > 0 {
			return
		}
		// Whatever the gateway accepts, a runner accepts too, and echoing it is stable.
		var rvs []string
		runner.ValidateNetwork("spec.network.", out, func(field, format string, args ...any) { rvs = append(rvs, field) })
		if len(rvs) > 0 {
			t.Errorf("gateway accepted %+v, runner refuses %v", out, rvs)
		}
		eg, in := EffectiveNetwork(out)
		back, vs2, _ := ToNetwork(&sandboxv1.NetworkOptions{Egress: eg, Ingress: in})
		if len(vs2) > 0 || !reflect.DeepEqual(back.Egress, out.Egress) || !reflect.DeepEqual(back.Ingress, out.Ingress) {
			t.Errorf("echo of %+v converts to %+v (%v)", out, back, vs2)
		}
	})
}
