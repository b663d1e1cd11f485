package spec

import (
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/runtimetest"
)

// notForPolicy are the parts of a create request that ForPolicy does not render (by
// path, as runtimetest names them), and why: ForPolicy is the form the runner checks
// its policy against, so it carries what a policy constrains, no more.
var notForPolicy = map[string]string{
	"Spec.ID":                                   "assigned by the gateway after the policy check; no wire field",
	"Spec.Container.PullCredentials":            "a pull secret, never part of a spec a policy sees (the public field names a secret store)",
	"Spec.Container.SecretEnv":                  "secret values resolved at create, never part of a spec a policy sees (the public field names a secret store)",
	"Spec.Container.SecretRefs":                 "references to a KUBERNETES store's secrets, resolved at create like SecretEnv (the public field names a secret store)",
	"Spec.Network.Egress[].Secret":              "no policy constrains the secrets of egress rules (ForPolicy leaves them out)",
	"Spec.EgressSecretValues":                   "egress secret values resolved at create, never part of a spec a policy sees (the rule names the secret)",
	"Spec.Container.Files":                      "file contents are not constrained by any policy",
	"Spec.Container.Resources.Pids":             "the runner's own limit (its defaults), not a public field",
	"Spec.Container.Resources.DiskBytes":        "the backend's own limit, not a public field",
	"Spec.Volumes":                              "scratch volumes are not constrained by any policy",
	"Restores":                                  "the snapshots volumes start from, looked up by the gateway; no policy constrains them (the runner refuses them when it takes no snapshots)",
	"Spec.Container.VolumeMounts":               "scratch volumes are not constrained by any policy",
	"Spec.Container.RestartLimit":               "the runner's setting, not a public field",
	"Spec.Container.Tmpfs":                      "no public wire field (Compose's tmpfs sets it); an empty private tmpfs is not constrained by any policy, like a scratch volume",
	"Spec.Container.DependsOn":                  "no public wire field (Compose's depends_on sets it); start order is not constrained by any policy",
	"Spec.Sidecars[].PullCredentials":           "a pull secret, never part of a spec a policy sees (the public field names a secret store)",
	"Spec.Sidecars[].SecretEnv":                 "secret values resolved at create, never part of a spec a policy sees (the public field names a secret store)",
	"Spec.Sidecars[].SecretRefs":                "references to a KUBERNETES store's secrets, resolved at create like SecretEnv (the public field names a secret store)",
	"Spec.Sidecars[].Files":                     "file contents are not constrained by any policy",
	"Spec.Sidecars[].Resources.Pids":            "the runner's own limit (its defaults), not a public field",
	"Spec.Sidecars[].Resources.DiskBytes":       "the backend's own limit, not a public field",
	"Spec.Sidecars[].VolumeMounts":              "scratch volumes are not constrained by any policy",
	"Spec.Sidecars[].RestartLimit":              "the runner's setting, not a public field",
	"Spec.Sidecars[].Tmpfs":                     "no public wire field (Compose's tmpfs sets it); an empty private tmpfs is not constrained by any policy, like a scratch volume",
	"Spec.Sidecars[].DependsOn":                 "no public wire field (Compose's depends_on sets it); start order is not constrained by any policy",
	"Spec.InitContainers[].PullCredentials":     "a pull secret, never part of a spec a policy sees (the public field names a secret store)",
	"Spec.InitContainers[].SecretEnv":           "secret values resolved at create, never part of a spec a policy sees (the public field names a secret store)",
	"Spec.InitContainers[].SecretRefs":          "references to a KUBERNETES store's secrets, resolved at create like SecretEnv (the public field names a secret store)",
	"Spec.InitContainers[].Files":               "file contents are not constrained by any policy",
	"Spec.InitContainers[].Resources.Pids":      "the runner's own limit (its defaults), not a public field",
	"Spec.InitContainers[].Resources.DiskBytes": "the backend's own limit, not a public field",
	"Spec.InitContainers[].VolumeMounts":        "scratch volumes are not constrained by any policy",
	"Spec.InitContainers[].RestartLimit":        "the runner's setting, not a public field",
	"Spec.InitContainers[].Tmpfs":               "no public wire field; an empty private tmpfs is not constrained by any policy, like a scratch volume",
	"Spec.InitContainers[].DependsOn":           "an init container takes none (runtime.ValidateSpec); no public wire field",
	"Spec.HostAliases":                          "no public wire field (Compose's service names); names resolving to 127.0.0.1 inside the sandbox are not constrained by any policy",
	"Spec.Services[].TokenAuth":                 "the endpoint's auth: whether a runner checks share tokens is its support (runtime.Support, placement's check), no policy constraint",
	"Spec.Services[].TimeoutSeconds":            "the edge bounds it, not the policy",
	"Spec.ShareTokenHash":                       "derived by the gateway from a token it never gives a runner",
	"Spec.Pod":                                  "the policy's output: admit replaces it with what the runner's own policy resolves",
	"Spec.Meta":                                 "the platform's bookkeeping, set after the policy check",
	"Spec.Engine":                               "the public SandboxSpec has no field for it (CreateSandboxFromFile's control): policy.ResolveEngine checks it beside the spec",
}

// validForWire makes a request filled by runtimetest.FillAll (every field set, "s" and
// 7 everywhere) one the public wire can say: values from the sets the wire allows, a
// rule per destination (the wire has one destination per rule), whole seconds of
// lifetime. It sets only fields that have such a constraint, so that a field added to
// runtime.Spec stays filled and is caught if ForPolicy drops it.
func validForWire(req *runner.CreateRequest) {
	s := &req.Spec
	req.Lifetime = time.Duration(req.Lifetime.Nanoseconds()) * time.Second
	// Distinct names (FillAll names every container "s").
	for i := range s.Sidecars {
		s.Sidecars[i].Name = fmt.Sprintf("side%d", i)
	}
	for i := range s.InitContainers {
		s.InitContainers[i].Name = fmt.Sprintf("init%d", i)
	}
	for _, c := range s.AllContainers() {
		c.Security.SeccompProfile = runtime.SeccompRuntimeDefault
		c.Security.CapAdd = []string{"CAP_NET_ADMIN"}
		c.Security.CapDrop = []string{"CAP_NET_RAW"}
		p := c.StartupProbe // whole seconds, as the wire has them
		p.InitialDelay, p.Period, p.Timeout = p.InitialDelay*time.Second, p.Period*time.Second, p.Timeout*time.Second
	}
	for i := range s.Services {
		s.Services[i].Visibility = "public"
		s.Services[i].Endpoint = runtime.EndpointHTTPS
	}
	n := s.Network
	n.DenyEgress, n.DenyIngress = false, false // the deny flags take no rules: see the deny case
	ports := func(ps []runtime.PortRange) []runtime.PortRange {
		for i := range ps {
			ps[i].Protocol = "tcp"
		}
		return ps
	}
	e := n.Egress[0]
	e.Ports = ports(e.Ports)
	cidr, dns, tenant, anyDest := e, e, e, e
	cidr.CIDR, cidr.Except, cidr.DNSName, cidr.Tenant, cidr.Any = "10.0.0.0/8", []string{"10.1.0.0/16"}, "", "", false
	dns.CIDR, dns.Except, dns.DNSName, dns.Tenant, dns.Any = "", nil, "example.com", "", false
	dns.Ports = nil // a host-name rule is TCP 443, which the wire leaves implicit
	tenant.CIDR, tenant.Except, tenant.DNSName, tenant.Tenant, tenant.Any = "", nil, "", runtime.TenantSameOrg, false
	anyDest.CIDR, anyDest.Except, anyDest.DNSName, anyDest.Tenant, anyDest.Any = "", nil, "", "", true
	for _, r := range []*runtime.EgressRule{&cidr, &dns, &tenant, &anyDest} {
		r.Except, r.Ports = slices.Clone(r.Except), slices.Clone(r.Ports)
		r.Secret = nil
	}
	dns.Secret = &runtime.EgressSecret{Store: "prod", Path: "api/x", Field: "token", Header: "X-Api-Key", EnvVar: "EGRESS_TOKEN"}
	n.Egress = []runtime.EgressRule{cidr, dns, tenant, anyDest}
	in := n.Ingress[0]
	in.Ports = ports(in.Ports)
	icidr, itenant, iany := in, in, in
	icidr.CIDR, icidr.Except, icidr.Tenant, icidr.Any = "10.0.0.0/8", []string{"10.1.0.0/16"}, "", false
	itenant.CIDR, itenant.Except, itenant.Tenant, itenant.Any = "", nil, runtime.TenantSameOrg, false
	iany.CIDR, iany.Except, iany.Tenant, iany.Any = "", nil, "", true
	for _, r := range []*runtime.IngressRule{&icidr, &itenant, &iany} {
		r.Except, r.Ports = slices.Clone(r.Except), slices.Clone(r.Ports)
	}
	n.Ingress = []runtime.IngressRule{icidr, itenant, iany}
}

// TestForPolicyRoundTrip, in the manner of Tailscale's ipn/prefs_test.go: a create
// request with every field set (runtimetest.FillAll, made valid for the public wire)
// goes to the public wire (ForPolicy) and back (ToCreateRequest); what does not come back
// must be listed in notForPolicy with the reason. A field added to runtime.Spec (or to
// what it holds) fails here with its path until ForPolicy renders it or it is listed.
func TestForPolicyRoundTrip(t *testing.T) {
	var full runner.CreateRequest
	runtimetest.FillAll(t, reflect.ValueOf(&full).Elem(), "")
	validForWire(&full)
	deny := full
	deny.Spec.Network = &runtime.Network{DenyEgress: true, DenyIngress: true}

	// Every leaf of a create request is set in one case or another.
	set := map[string]bool{}
	for _, req := range []runner.CreateRequest{full, deny} {
		for _, p := range runtimetest.Set(reflect.ValueOf(req), "") {
			set[p] = true
		}
	}
	for _, p := range runtimetest.Leaves(reflect.TypeFor[runner.CreateRequest](), "") {
		if !set[p] {
			t.Errorf("%s is set in no case: validForWire must not clear it", p)
		}
	}

	lost := map[string]bool{}
	for name, req := range map[string]runner.CreateRequest{"every field": full, "deny flags": deny} {
		back, err := ToCreateRequest(ForPolicy(req))
		if err != nil {
			t.Fatalf("%s: ToCreateRequest(ForPolicy(req)): %v", name, err)
		}
		// ForPolicy renders init containers as the last rows (the wire has no field for
		// them), which come back as the last sidecars.
		if n, m := len(req.Spec.InitContainers), len(back.Spec.Sidecars); n > 0 && m >= n {
			back.Spec.Sidecars, back.Spec.InitContainers = back.Spec.Sidecars[:m-n], back.Spec.Sidecars[m-n:]
		}
		for _, p := range runtimetest.Diff(reflect.ValueOf(back), reflect.ValueOf(req), "") {
			lost[p] = true
			if _, ok := notForPolicy[p]; !ok {
				t.Errorf("%s: %s does not survive ForPolicy and ToCreateRequest: render it in ForPolicy, or list it in notForPolicy with why", name, p)
			}
		}
	}
	for p := range notForPolicy {
		if !lost[p] {
			t.Errorf("notForPolicy lists %s, which ForPolicy carries: delete the entry", p)
		}
	}
}
