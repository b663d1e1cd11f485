package runner

import (
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/reserved"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

func TestValidateNetwork(t *testing.T) {
	for _, tc := range []struct {
		name   string
		n      *runtime.Network
		fields []string // violated fields under spec.network., in order
	}{
		{"nil: a spec recorded before rules", nil, nil},
		{"zero: no egress", &runtime.Network{}, nil},
		{"platform default", &runtime.Network{Egress: runtime.DefaultEgress()}, nil},
		{"every valid form", &runtime.Network{
			Egress: []runtime.EgressRule{{CIDR: "10.0.0.0/8", Except: []string{"10.1.0.0/16"}}, {CIDR: "2001:db8::/32"}, {DNSName: "*.example.com"},
				{DNSName: "pypi.org", Ports: []runtime.PortRange{{Protocol: "tcp", Port: 443}}}, {Tenant: runtime.TenantSameUser},
				{Tenant: runtime.TenantSandboxNetwork}, {Any: true, Ports: []runtime.PortRange{{Protocol: "udp", Port: 53}, {Protocol: "sctp", Port: 1, EndPort: 65535}}}},
			DenyIngress: false,
			Ingress:     []runtime.IngressRule{{CIDR: "192.0.2.0/24"}, {Tenant: runtime.TenantSameOrg}, {Any: true, Ports: []runtime.PortRange{{Port: 9000}}}},
		}, nil},
		{"two destinations and none", &runtime.Network{Egress: []runtime.EgressRule{{Any: true, DNSName: "a.example.com"}, {}}, Ingress: []runtime.IngressRule{{Any: true, Tenant: runtime.TenantSameOrg}}},
			[]string{"egress[0]", "egress[1]", "ingress[0]"}},
		{"uppercase is not canonical here", &runtime.Network{Egress: []runtime.EgressRule{{DNSName: "Example.com"}, {Any: true, Ports: []runtime.PortRange{{Protocol: "TCP", Port: 1}}}}},
			[]string{"egress[0].https_hostname", "egress[1].ports[0].protocol"}},
		{"bad prefixes", &runtime.Network{Egress: []runtime.EgressRule{{CIDR: "10.0.0.1/8"}, {CIDR: "10.0.0.0/8", Except: []string{"10.0.0.0/8", "11.0.0.0/16"}}, {Tenant: runtime.TenantSameOrg, Except: []string{"10.0.0.0/8"}}}},
			[]string{"egress[0].cidr", "egress[1].cidr.except[0]", "egress[1].cidr.except[1]", "egress[2].cidr.except"}},
		{"unknown tenant, sandbox network ingress", &runtime.Network{Egress: []runtime.EgressRule{{Tenant: "everyone"}}, Ingress: []runtime.IngressRule{{Tenant: runtime.TenantSandboxNetwork}}},
			[]string{"egress[0].tenant", "ingress[0].tenant"}},
		{"DNS rule on port 80", &runtime.Network{Egress: []runtime.EgressRule{{DNSName: "example.com", Ports: []runtime.PortRange{{Port: 80}}}}}, []string{"egress[0].ports"}},
		{"deny with rules", &runtime.Network{DenyEgress: true, Egress: []runtime.EgressRule{{Any: true}}, DenyIngress: true, Ingress: []runtime.IngressRule{{Any: true}}},
			[]string{"deny_egress", "deny_ingress"}},
		{"ports", &runtime.Network{Ingress: []runtime.IngressRule{{Any: true, Ports: []runtime.PortRange{{Port: 0}, {Port: 10, EndPort: 9}, {Protocol: "icmp", Port: 1}}}}},
			[]string{"ingress[0].ports[0].port", "ingress[0].ports[1].end_port", "ingress[0].ports[2].protocol"}},
		{"too many", &runtime.Network{Egress: slices.Repeat([]runtime.EgressRule{{Any: true}}, MaxNetworkRules+1)}, []string{"egress"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			ValidateNetwork("spec.network.", tc.n, func(field, format string, args ...any) {
				got = append(got, strings.TrimPrefix(field, "spec.network."))
			})
			if !slices.Equal(got, tc.fields) {
				t.Errorf("violations on %v, want %v", got, tc.fields)
			}
			// validate reports the same through a CreateRequest.
			err := validate(&CreateRequest{Spec: runtime.Spec{Container: runtime.Container{Image: "busybox"}, Network: tc.n}})
			if (err == nil) != (tc.fields == nil) {
				t.Errorf("validate: %v", err)
			}
		})
	}
}

func TestSupportedNetwork(t *testing.T) {
	n := &runtime.Network{Egress: []runtime.EgressRule{{Any: true}, {DNSName: "example.com"}}}
	if err := supported(n, runtime.Support{}); err != nil {
		t.Errorf("a backend enforcing everything refused: %v", err)
	}
	var verr *ValidationError
	err := supported(n, runtime.Support{NoDNSEgress: true})
	if !errors.As(err, &verr) || len(verr.Violations) != 1 || verr.Violations[0].Field != "spec.network.egress[1].https_hostname" {
		t.Errorf("a backend without host-name rules: %v", err)
	}
	if err := supported(&runtime.Network{Egress: runtime.DefaultEgress()}, runtime.Support{NoDNSEgress: true}); err != nil {
		t.Errorf("the platform default refused: %v", err)
	}
}

// TestUnreserved: a cidr egress rule wholly inside the runner's reserved ranges is
// refused with a violation naming it; an overlapping one, an opened range and a public
// one pass.
func TestUnreserved(t *testing.T) {
	sub := netip.MustParsePrefix("10.88.0.0/16")
	rs := reserved.Egress([]netip.Prefix{netip.MustParsePrefix("10.20.0.0/16")}, sub, netip.MustParsePrefix("203.0.113.7/32"))
	n := &runtime.Network{Egress: []runtime.EgressRule{
		{CIDR: "169.254.169.254/32"}, {CIDR: "0.0.0.0/0"}, {CIDR: "192.168.0.0/16"}, {CIDR: "10.0.0.0/8"}, {CIDR: "127.0.0.0/8"},
		{CIDR: "10.20.0.0/16"}, {CIDR: "10.88.1.0/24"}, {CIDR: "203.0.113.7/32"}, {CIDR: "203.0.113.0/24"}, {Any: true}, {CIDR: "fe80::/10"}, {CIDR: "::/0"},
	}}
	var verr *ValidationError
	if err := unreserved(n, func() reserved.Set { return rs }); !errors.As(err, &verr) {
		t.Fatalf("unreserved = %v", err)
	}
	var got []string
	for _, v := range verr.Violations {
		got = append(got, v.Field)
		if !strings.Contains(v.Description, "reserved") || !strings.Contains(v.Description, "--egress-allow-reserved") {
			t.Errorf("%s: %s", v.Field, v.Description)
		}
	}
	want := []string{"spec.network.egress[0].cidr", "spec.network.egress[2].cidr", "spec.network.egress[4].cidr", // 10/8 holds the opened 10.20/16
		"spec.network.egress[6].cidr", "spec.network.egress[7].cidr", "spec.network.egress[10].cidr"}
	if !slices.Equal(got, want) {
		t.Errorf("refused %v, want %v", got, want)
	}
	if err := unreserved(&runtime.Network{Egress: []runtime.EgressRule{{CIDR: "10.20.0.0/16"}, {CIDR: "8.8.8.0/24"}}}, func() reserved.Set { return rs }); err != nil {
		t.Errorf("opened and public ranges refused: %v", err)
	}
	// The set is read once per check, and not at all without a cidr rule (the local
	// backend's holds the host's addresses, read from the kernel per call).
	for _, c := range []struct {
		n    *runtime.Network
		want int
	}{
		{nil, 0},
		{&runtime.Network{}, 0},
		{&runtime.Network{Egress: runtime.DefaultEgress()}, 0},
		{&runtime.Network{Egress: []runtime.EgressRule{{Any: true}, {DNSName: "example.com"}}}, 0},
		{n, 1},
	} {
		calls := 0
		_ = unreserved(c.n, func() reserved.Set { calls++; return rs })
		if calls != c.want {
			t.Errorf("%+v: the reserved set read %d times, want %d", c.n, calls, c.want)
		}
	}
}
