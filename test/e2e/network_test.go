package e2e

import (
	"context"
	"reflect"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/gateway"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// egressOf is a compact form of effective egress rules: "any", "tenant SAME_ORG", a CIDR
// (with " except …") or a host name.
func egressOf(rs []*sandboxv1.EgressRule) string {
	var parts []string
	for _, r := range rs {
		switch d := r.GetDestination().(type) {
		case *sandboxv1.EgressRule_Any:
			parts = append(parts, "any")
		case *sandboxv1.EgressRule_Tenant:
			parts = append(parts, "tenant "+strings.TrimPrefix(d.Tenant.String(), "TENANT_SCOPE_"))
		case *sandboxv1.EgressRule_Cidr:
			parts = append(parts, d.Cidr.GetCidr()+strings.Join(append([]string{""}, d.Cidr.GetExcept()...), " except "))
		case *sandboxv1.EgressRule_HttpsHostname:
			parts = append(parts, d.HttpsHostname)
		}
	}
	return strings.Join(parts, ", ")
}

// TestGatewayNetworkOptions: the rules a sandbox gets (the platform default, its own, or
// none under deny_egress) are echoed in effective_egress on create, get and list, and
// are what its runner holds for the backend.
func TestGatewayNetworkOptions(t *testing.T) {
	var local *runner.Local
	g := startGateway(t, func(c *gateway.Config) { local = c.Runners[0].(*runner.Local) })
	ctx := context.Background()
	withNetwork := func(n *sandboxv1.NetworkOptions) *sandboxv1.SandboxSpec {
		s := spec(busybox(), "sleep", "60")
		s.Network = n
		return s
	}
	for _, tc := range []struct {
		name    string
		network *sandboxv1.NetworkOptions
		want    string // effective egress
		runtime *runtime.Network
	}{
		{"platform default", nil, "any, tenant SAME_ORG", &runtime.Network{Egress: runtime.DefaultEgress()}},
		{"explicit rules", &sandboxv1.NetworkOptions{Egress: []*sandboxv1.EgressRule{
			{Destination: &sandboxv1.EgressRule_Cidr{Cidr: &sandboxv1.CidrBlock{Cidr: "203.0.0.0/8", Except: []string{"203.1.0.0/16"}}}},
			{Destination: &sandboxv1.EgressRule_HttpsHostname{HttpsHostname: "PyPI.org"}, Ports: []*sandboxv1.PortRange{{Protocol: "TCP", Port: 443}}},
		}}, "203.0.0.0/8 except 203.1.0.0/16, pypi.org", &runtime.Network{Egress: []runtime.EgressRule{
			{CIDR: "203.0.0.0/8", Except: []string{"203.1.0.0/16"}}, {DNSName: "pypi.org"}}}},
		{"deny_egress", &sandboxv1.NetworkOptions{DenyEgress: proto.Bool(true)}, "", &runtime.Network{DenyEgress: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			created := g.create(t, withNetwork(tc.network), "")
			id := created.GetSandboxId()
			got, err := g.sandboxes.GetSandbox(ctx, connect.NewRequest(&sandboxv1.GetSandboxRequest{SandboxId: id}))
			if err != nil {
				t.Fatalf("get: %v", err)
			}
			list, err := g.sandboxes.ListSandboxes(ctx, connect.NewRequest(&sandboxv1.ListSandboxesRequest{}))
			if err != nil {
				t.Fatalf("list: %v", err)
			}
			var listed *sandboxv1.Sandbox
			for _, sb := range list.Msg.GetSandboxes() {
				if sb.GetSandboxId() == id {
					listed = sb
				}
			}
			for what, sb := range map[string]*sandboxv1.Sandbox{"create": created, "get": got.Msg, "list": listed} {
				if e := egressOf(sb.GetStatus().GetEffectiveEgress()); e != tc.want || len(sb.GetStatus().GetEffectiveIngress()) != 0 {
					t.Errorf("%s: effective egress %q ingress %v, want %q and none", what, e, sb.GetStatus().GetEffectiveIngress(), tc.want)
				}
			}
			rsb, err := local.Get(ctx, id)
			if err != nil {
				t.Fatalf("runner get: %v", err)
			}
			if !reflect.DeepEqual(rsb.Spec.Network, tc.runtime) {
				t.Errorf("the runner holds %+v, want %+v", rsb.Spec.Network, tc.runtime)
			}
			if _, err := g.sandboxes.DeleteSandbox(ctx, connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: id})); err != nil {
				t.Errorf("delete: %v", err)
			}
		})
	}
}
