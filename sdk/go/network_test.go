package sandbox

import (
	"reflect"
	"testing"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
)

func TestSDKParseEgress(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want EgressRule
		bad  bool
	}{
		{in: "any", want: EgressRule{Any: true}},
		{in: "cidr=10.0.0.0/8", want: EgressRule{CIDR: "10.0.0.0/8"}},
		{in: "dns=*.pypi.org", want: EgressRule{DNSName: "*.pypi.org"}},
		{in: "tenant=SAME_ORG", want: EgressRule{Tenant: TenantSameOrg}},
		{in: "tenant=same_user", want: EgressRule{Tenant: TenantSameUser}},
		{in: "tenant=sandbox_network", bad: true},
		{in: "any=1", bad: true},
		{in: "cidr=", bad: true},
		{in: "dns", bad: true},
		{in: "host=x", bad: true},
	} {
		got, err := ParseEgress(tc.in)
		if (err != nil) != tc.bad || !tc.bad && !reflect.DeepEqual(got, tc.want) {
			t.Errorf("ParseEgress(%q) = %+v, %v", tc.in, got, err)
		}
		if !tc.bad {
			if back, err := ParseEgress(got.String()); err != nil || !reflect.DeepEqual(back, got) {
				t.Errorf("%q: String %q parses to %+v, %v", tc.in, got.String(), back, err)
			}
		}
	}
}

func TestSDKSpecEgress(t *testing.T) {
	if n := (Spec{}).Proto().GetNetwork(); n != nil {
		t.Errorf("no rules sent %v: the default applies only when none are", n)
	}
	rules := []EgressRule{{CIDR: "10.0.0.0/8", Except: []string{"10.1.0.0/16"}}, {DNSName: "pypi.org"}, {Tenant: TenantSameUser},
		{Any: true, Ports: []PortRange{{Protocol: "udp", Port: 53}, {Port: 8000, EndPort: 8100}}}}
	n := Spec{Egress: rules}.Proto().GetNetwork()
	if n.DenyEgress != nil || len(n.GetEgress()) != 4 || n.GetEgress()[2].GetTenant() != sandboxv1.TenantScope_TENANT_SCOPE_SAME_USER ||
		n.GetEgress()[3].GetPorts()[0].GetProtocol() != "UDP" {
		t.Errorf("network %v", n)
	}
	if back := egressFromProto(n.GetEgress()); !reflect.DeepEqual(back, rules) {
		t.Errorf("round trip %+v, want %+v", back, rules)
	}
	if n := (Spec{DenyEgress: true}).Proto().GetNetwork(); !n.GetDenyEgress() || len(n.GetEgress()) != 0 {
		t.Errorf("deny %v", n)
	}
	// Info shows the effective rules (a selector, unknown here, is left out).
	sb := &Sandbox{proto: &sandboxv1.Sandbox{Status: &sandboxv1.SandboxStatus{EffectiveEgress: []*sandboxv1.EgressRule{
		{Destination: &sandboxv1.EgressRule_Any{Any: true}},
		{Destination: &sandboxv1.EgressRule_Selector{Selector: &sandboxv1.SelectorBlock{}}},
		{Destination: &sandboxv1.EgressRule_Tenant{Tenant: sandboxv1.TenantScope_TENANT_SCOPE_SAME_ORG}},
	}}}}
	if got := sb.Info().Egress; !reflect.DeepEqual(got, []EgressRule{{Any: true}, {Tenant: TenantSameOrg}}) {
		t.Errorf("info egress %+v", got)
	}
}
