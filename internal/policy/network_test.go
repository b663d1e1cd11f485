package policy

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
)

// describeEgress is a compact form of resolved egress rules: "any", "tenant SAME_ORG",
// a CIDR or a host name, comma-separated.
func describeEgress(s *sandboxv1.SandboxSpec) string {
	var parts []string
	for _, r := range s.GetNetwork().GetEgress() {
		switch d := r.GetDestination().(type) {
		case *sandboxv1.EgressRule_Any:
			parts = append(parts, "any")
		case *sandboxv1.EgressRule_Tenant:
			parts = append(parts, "tenant "+tenantName(d.Tenant))
		case *sandboxv1.EgressRule_Cidr:
			parts = append(parts, d.Cidr.GetCidr())
		case *sandboxv1.EgressRule_HttpsHostname:
			parts = append(parts, d.HttpsHostname)
		}
	}
	return strings.Join(parts, ", ")
}

func TestPlatformDefaultEgress(t *testing.T) {
	pl := DefaultPlatform()
	pl.DefaultEgress = []Rule{{Any: true}, {Tenant: "SAME_ORG"}}
	host := &sandboxv1.EgressRule{Destination: &sandboxv1.EgressRule_HttpsHostname{HttpsHostname: "pypi.org"}}
	withEgress := func(n *sandboxv1.NetworkOptions) *sandboxv1.SandboxSpec {
		return spec(func(s *sandboxv1.SandboxSpec) { s.Network = n })
	}
	for _, tc := range []struct {
		name   string
		policy string
		spec   *sandboxv1.SandboxSpec
		want   string // resolved egress
		deny   bool
	}{
		{"nothing declared: the platform default", `{}`, spec(), "any, tenant SAME_ORG", false},
		{"empty options: the platform default", `{}`, withEgress(&sandboxv1.NetworkOptions{}), "any, tenant SAME_ORG", false},
		{"declared rules replace it", `{}`, withEgress(&sandboxv1.NetworkOptions{Egress: []*sandboxv1.EgressRule{host}}), "pypi.org", false},
		{"deny_egress keeps it out", `{}`, withEgress(&sandboxv1.NetworkOptions{DenyEgress: proto.Bool(true)}), "", true},
		{"deny_egress false does not", `{}`, withEgress(&sandboxv1.NetworkOptions{DenyEgress: proto.Bool(false)}), "any, tenant SAME_ORG", false},
		{"the policy base wins", `{"base": {"default_egress": [{"cidr": "10.0.0.0/8"}]}}`, spec(), "10.0.0.0/8", false},
		{"an envelope keeps only what it covers", `{"constraints": {"network": {"allowed_egress": [{"tenant": "SAME_ORG"}, {"https_hostname": "*.pypi.org"}]}}}`,
			spec(), "tenant SAME_ORG", false},
		{"an envelope covering nothing of it: no egress", `{"constraints": {"network": {"allowed_egress": [{"cidr": "10.0.0.0/8"}]}}}`, spec(), "", false},
		{"an any envelope covers all of it", `{"constraints": {"network": {"allowed_egress": [{"any": true}]}}}`, spec(), "any, tenant SAME_ORG", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, vs := Resolve(mustParse(t, tc.policy), tc.spec, pl)
			if len(vs) > 0 {
				t.Fatalf("violations: %s", fmtVs(vs))
			}
			if got := describeEgress(s); got != tc.want || s.GetNetwork().GetDenyEgress() != tc.deny {
				t.Errorf("egress %q deny %v, want %q deny %v", got, s.GetNetwork().GetDenyEgress(), tc.want, tc.deny)
			}
		})
	}
	// Without a platform default (DefaultPlatform), nothing is added.
	if s, _ := Resolve(nil, spec(), DefaultPlatform()); s.Network != nil {
		t.Errorf("DefaultPlatform added %v", s.Network)
	}
}

func TestPlatformNoDNSEgress(t *testing.T) {
	pl := DefaultPlatform()
	pl.NoDNSEgress = true
	s := spec(func(s *sandboxv1.SandboxSpec) {
		s.Network = &sandboxv1.NetworkOptions{Egress: []*sandboxv1.EgressRule{
			{Destination: &sandboxv1.EgressRule_Any{Any: true}},
			{Destination: &sandboxv1.EgressRule_HttpsHostname{HttpsHostname: "pypi.org"}},
		}}
	})
	_, vs := Resolve(nil, s, pl)
	if len(vs) != 1 || vs[0].Field != "sandbox.spec.network.egress[1].https_hostname" || vs[0].Constraint != ConstraintPlatformDNSEgress || Reason(vs) != apierr.PlacementRejected {
		t.Errorf("violations %s", fmtVs(vs))
	}
	pl.NoDNSEgress = false
	if _, vs := Resolve(nil, s, pl); len(vs) > 0 {
		t.Errorf("a runner enforcing host names: %s", fmtVs(vs))
	}
}

// TestPlatformNoEgressSecrets: a runner enforcing host names but injecting no egress
// secrets (a Kubernetes runner with its egress proxy) refuses a sandboxd_secret rule with
// platform.egress_secrets, so placement tries another runner; its plain host-name rules
// pass. A runner without host-name rules at all says platform.dns_egress only.
func TestPlatformNoEgressSecrets(t *testing.T) {
	pl := DefaultPlatform()
	pl.NoEgressSecrets = true
	s := spec(func(s *sandboxv1.SandboxSpec) {
		s.Network = &sandboxv1.NetworkOptions{Egress: []*sandboxv1.EgressRule{
			{Destination: &sandboxv1.EgressRule_HttpsHostname{HttpsHostname: "pypi.org"}},
			{Destination: &sandboxv1.EgressRule_HttpsHostname{HttpsHostname: "api.example.com"},
				SandboxdSecret: &sandboxv1.EgressSecretInjection{}},
		}}
	})
	_, vs := Resolve(nil, s, pl)
	if len(vs) != 1 || vs[0].Field != "sandbox.spec.network.egress[1].sandboxd_secret" || vs[0].Constraint != ConstraintPlatformEgressSecrets || Reason(vs) != apierr.PlacementRejected {
		t.Errorf("violations %s", fmtVs(vs))
	}
	pl.NoDNSEgress = true
	if _, vs := Resolve(nil, s, pl); len(vs) != 2 || vs[0].Constraint != ConstraintPlatformDNSEgress || vs[1].Constraint != ConstraintPlatformDNSEgress {
		t.Errorf("no host names at all: %s", fmtVs(vs))
	}
	pl.NoDNSEgress, pl.NoEgressSecrets = false, false
	if _, vs := Resolve(nil, s, pl); len(vs) > 0 {
		t.Errorf("a runner injecting secrets: %s", fmtVs(vs))
	}
}
