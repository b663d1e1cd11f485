package gateway

import (
	"testing"

	"google.golang.org/protobuf/proto"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/runner"
)

func statusNetSpec(n *sandboxv1.NetworkOptions) *sandboxv1.SandboxSpec {
	return &sandboxv1.SandboxSpec{Containers: []*sandboxv1.Container{{Image: "busybox"}}, Network: n}
}

func TestEffectiveNetworkInStatus(t *testing.T) {
	spec := statusNetSpec(&sandboxv1.NetworkOptions{Egress: []*sandboxv1.EgressRule{{Destination: &sandboxv1.EgressRule_HttpsHostname{HttpsHostname: "PyPI.org"}, Ports: []*sandboxv1.PortRange{{Protocol: "TCP", Port: 443}}}, {Destination: &sandboxv1.EgressRule_Tenant{Tenant: sandboxv1.TenantScope_TENANT_SCOPE_SAME_ORG}}}})
	r := &scriptedRunner{id: "r1"}
	sb := runner.Sandbox{ID: "sb", State: runner.StateRunning}
	st := sandboxProto("sb", spec, sb, r).GetStatus()
	if len(st.EffectiveEgress) != 2 || st.EffectiveEgress[0].GetHttpsHostname() != "pypi.org" || len(st.EffectiveEgress[0].GetPorts()) != 0 ||
		st.EffectiveEgress[1].GetTenant() != sandboxv1.TenantScope_TENANT_SCOPE_SAME_ORG || len(st.EffectiveIngress) != 0 {
		t.Errorf("effective egress %v ingress %v", st.EffectiveEgress, st.EffectiveIngress)
	}
	if st.EffectiveDnsEgress != sandboxv1.DNSEgressMode_DNS_EGRESS_MODE_ALLOW {
		t.Errorf("effective dns egress %v", st.EffectiveDnsEgress)
	}
	denied := sandboxProto("sb", statusNetSpec(&sandboxv1.NetworkOptions{DenyEgress: proto.Bool(true)}), sb, r).GetStatus()
	if len(denied.EffectiveEgress) != 0 {
		t.Errorf("deny_egress echoes %v", denied.EffectiveEgress)
	}
}
