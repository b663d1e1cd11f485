package placement

import (
	"slices"
	"strings"
	"testing"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/policy"
)

func TestPlaceHostNameRules(t *testing.T) {
	free := mustPolicy(t, `{}`)
	k8s := rn("k8s", free)
	k8s.NoDNSEgress = true
	local := rn("local", free)
	withHost := spec("1", "1Gi")
	withHost.Network = &sandboxv1.NetworkOptions{Egress: []*sandboxv1.EgressRule{{Destination: &sandboxv1.EgressRule_HttpsHostname{HttpsHostname: "pypi.org"}}}}
	withCIDR := spec("1", "1Gi")
	withCIDR.Network = &sandboxv1.NetworkOptions{Egress: []*sandboxv1.EgressRule{{Destination: &sandboxv1.EgressRule_Cidr{Cidr: &sandboxv1.CidrBlock{Cidr: "10.0.0.0/8"}}}}}

	// A runner that cannot enforce host names is skipped; address rules go anywhere.
	cands, err := Place(Request{Spec: withHost, Runners: []Runner{k8s, local}, Platform: policy.DefaultPlatform()})
	if err != nil || !slices.Equal(ids(cands), []string{"local"}) {
		t.Errorf("host-name rule placed on %v (%v), want local", ids(cands), err)
	}
	cands, err = Place(Request{Spec: withCIDR, Runners: []Runner{k8s, local}, Platform: policy.DefaultPlatform()})
	if err != nil || len(cands) != 2 {
		t.Errorf("CIDR rule placed on %v (%v), want both", ids(cands), err)
	}
	// No runner can: NO_SUITABLE_RUNNER naming the constraint per runner.
	k8s2 := k8s
	k8s2.ID = "k8s-2"
	_, err = Place(Request{Spec: withHost, Runners: []Runner{k8s, k8s2}, Platform: policy.DefaultPlatform()})
	if connect.CodeOf(err) != connect.CodeFailedPrecondition || apierr.Reason(err) != apierr.NoSuitableRunner {
		t.Fatalf("no capable runner: %v, want FAILED_PRECONDITION %s", err, apierr.NoSuitableRunner)
	}
	vs := apierr.Violations(err)
	if len(vs) != 2 || vs[0].Field != "runner[k8s].sandbox.spec.network.egress[0].https_hostname" || !strings.Contains(vs[0].Description, policy.ConstraintPlatformDNSEgress) {
		t.Errorf("violations %v", vs)
	}
}
