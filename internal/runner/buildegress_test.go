package runner

import (
	"reflect"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

func TestParseBuildEgress(t *testing.T) {
	for in, want := range map[string]runtime.EgressRule{
		"any":                                {Any: true},
		"any,port=443":                       {Any: true, Ports: []runtime.PortRange{{Port: 443}}},
		"cidr=203.0.113.80/32,port=80":       {CIDR: "203.0.113.80/32", Ports: []runtime.PortRange{{Port: 80}}},
		"cidr=2001:db8::/32,port=53/udp":     {CIDR: "2001:db8::/32", Ports: []runtime.PortRange{{Protocol: "udp", Port: 53}}},
		"cidr=10.0.0.0/8,port=8000-8080/tcp": {CIDR: "10.0.0.0/8", Ports: []runtime.PortRange{{Protocol: "tcp", Port: 8000, EndPort: 8080}}},
		"dns=Deb.Debian.org":                 {DNSName: "deb.debian.org"},
		"dns=*.pypi.org":                     {DNSName: "*.pypi.org"},
		"cidr=198.51.100.0/24,port=1,port=2": {CIDR: "198.51.100.0/24", Ports: []runtime.PortRange{{Port: 1}, {Port: 2}}},
	} {
		got, err := ParseBuildEgress(in)
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("%q: %+v %v, want %+v", in, got, err, want)
		}
	}
	for in, why := range map[string]string{
		"":                            "want any",
		"any=1":                       "want any",
		"cidr=":                       "exactly one destination",
		"cidr=10.1.2.3/8":             "10.0.0.0/8",
		"cidr=10.0.0.0/8,port=x":      "not a number",
		"cidr=10.0.0.0/8,port=0":      "rule.ports[0]",
		"cidr=10.0.0.0/8,port=9-3":    "rule.ports[0]",
		"cidr=10.0.0.0/8,port=1/icmp": "rule.ports[0]",
		"cidr=10.0.0.0/8,ports=1":     "want port=",
		"dns=1.2.3.4":                 "https_hostname",
		"dns=a.org,port=80":           "HTTPS only",
		"tenant=same_org":             "tenant rules do not apply",
		"udp=1":                       "want any",
	} {
		if _, err := ParseBuildEgress(in); err == nil || !strings.Contains(err.Error(), why) {
			t.Errorf("%q: %v, want an error naming %q", in, err, why)
		}
	}
}

// FuzzParseBuildEgress: no input panics, and what parses is a rule a sandbox's spec
// would pass with.
func FuzzParseBuildEgress(f *testing.F) {
	for _, s := range []string{"any", "cidr=203.0.113.80/32,port=80", "dns=deb.debian.org", "cidr=::/0,port=1-2/udp", "tenant=same_org", "cidr=10.0.0.0/8,port=-1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := ParseBuildEgress(s)
		if err != nil {
			return
		}
		ValidateEgressRule("rule", r, func(field, format string, args ...any) {
			t.Errorf("%q parsed to %+v, which is invalid at %s", s, r, field)
		})
		if r.Tenant != "" {
			t.Errorf("%q: a tenant rule", s)
		}
	})
}
