package kubernetes

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// describePeers renders peers compactly: "ip:10.0.0.0/8-10.1.0.0/16", "pods:k=v", "ns:k=v".
func describePeers(ps []networkingv1.NetworkPolicyPeer) string {
	if len(ps) == 0 {
		return "*"
	}
	sel := func(s *metav1.LabelSelector) string {
		var kv []string
		for _, k := range slices.Sorted(maps.Keys(s.MatchLabels)) {
			kv = append(kv, k+"="+s.MatchLabels[k])
		}
		return strings.Join(kv, ",")
	}
	var out []string
	for _, p := range ps {
		var parts []string
		if p.IPBlock != nil {
			parts = append(parts, "ip:"+strings.Join(append([]string{p.IPBlock.CIDR}, p.IPBlock.Except...), "-"))
		}
		if p.NamespaceSelector != nil {
			parts = append(parts, "ns:"+sel(p.NamespaceSelector))
		}
		if p.PodSelector != nil {
			parts = append(parts, "pods:"+sel(p.PodSelector))
		}
		out = append(out, strings.Join(parts, "&"))
	}
	return strings.Join(out, "|")
}

func describePorts(ps []networkingv1.NetworkPolicyPort) string {
	if len(ps) == 0 {
		return "all"
	}
	var out []string
	for _, p := range ps {
		s := string(*p.Protocol)
		if p.Port != nil {
			s += "/" + p.Port.String()
		}
		if p.EndPort != nil {
			s += fmt.Sprintf("-%d", *p.EndPort)
		}
		out = append(out, s)
	}
	return strings.Join(out, ",")
}

func describePolicy(np *networkingv1.NetworkPolicy) (in, out []string) {
	for _, r := range np.Spec.Ingress {
		in = append(in, describePeers(r.From)+" "+describePorts(r.Ports))
	}
	for _, r := range np.Spec.Egress {
		out = append(out, describePeers(r.To)+" "+describePorts(r.Ports))
	}
	return in, out
}

func TestNetworkPolicyFor(t *testing.T) {
	const (
		internet = "ip:0.0.0.0/0-0.0.0.0/8-10.0.0.0/8-100.64.0.0/10-127.0.0.0/8-169.254.0.0/16-172.16.0.0/12-192.168.0.0/16-224.0.0.0/4-240.0.0.0/4" +
			"|ip:::/0-::/128-::1/128-64:ff9b::/96-64:ff9b:1::/48-fc00::/7-fe80::/10-ff00::/8"
		dns     = "ns:kubernetes.io/metadata.name=kube-system UDP/53,TCP/53"
		runner  = "ip:192.0.2.2/32 all"
		sameOrg = "pods:app.kubernetes.io/managed-by=sandboxd,sandboxd.io/org-id=org-a"
	)
	sameUser := "pods:app.kubernetes.io/managed-by=sandboxd,sandboxd.io/user-hash=" + userHash("key/ID with:odd chars")
	runnerPeers := []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "192.0.2.2/32"}}}
	for _, tc := range []struct {
		name     string
		net      *runtime.Network
		services []runtime.Service
		org      string
		caller   string
		noRunner bool
		open     []netip.Prefix // Config.OpenReserved
		in, out  []string
		err      string // substring of an ErrInvalidSpec error
	}{
		{name: "platform default: internet and the organization", org: "org-a",
			net: &runtime.Network{Egress: runtime.DefaultEgress()},
			in:  []string{runner}, out: []string{dns, internet + " all", sameOrg + " all"}},
		{name: "deny egress: DNS only", net: &runtime.Network{DenyEgress: true, Egress: []runtime.EgressRule{{Any: true}}},
			in: []string{runner}, out: []string{dns}},
		{name: "zero network: DNS only, nothing in but the runner", net: &runtime.Network{},
			in: []string{runner}, out: []string{dns}},
		{name: "cidr with except and ports", net: &runtime.Network{Egress: []runtime.EgressRule{{
			CIDR: "203.0.113.7/24", Except: []string{"203.0.113.128/25"},
			Ports: []runtime.PortRange{{Port: 443}, {Protocol: "udp", Port: 5000, EndPort: 5010}, {Protocol: "sctp"}}}}},
			in: []string{runner}, out: []string{dns, "ip:203.0.113.0/24-203.0.113.128/25 TCP/443,UDP/5000-5010,SCTP"}},
		{name: "reserved cidrs grant nothing", net: &runtime.Network{Egress: []runtime.EgressRule{
			{CIDR: "169.254.169.254/32"}, {CIDR: "192.168.0.0/16"}, {CIDR: "10.0.0.0/8"}, {CIDR: "127.0.0.0/8"}, {CIDR: "fd00::/8"}}},
			in: []string{runner}, out: []string{dns}},
		{name: "a wide cidr: the reserved ranges excepted", net: &runtime.Network{Egress: []runtime.EgressRule{
			{CIDR: "0.0.0.0/0"}, {CIDR: "192.0.0.0/8", Except: []string{"192.168.7.0/24", "192.0.2.0/24"}}}},
			in: []string{runner}, out: []string{dns,
				"ip:0.0.0.0/0-0.0.0.0/8-10.0.0.0/8-100.64.0.0/10-127.0.0.0/8-169.254.0.0/16-172.16.0.0/12-192.168.0.0/16-224.0.0.0/3 all",
				"ip:192.0.0.0/8-192.0.2.0/24-192.168.0.0/16 all"}},
		{name: "a range the operator opened", open: []netip.Prefix{netip.MustParsePrefix("10.20.0.0/16")},
			net: &runtime.Network{Egress: []runtime.EgressRule{{CIDR: "10.20.0.0/16"}, {CIDR: "10.16.0.0/12"}, {Any: true}}},
			in:  []string{runner}, out: []string{dns, "ip:10.20.0.0/16 all", "ip:10.16.0.0/12-10.16.0.0/14-10.21.0.0/16-10.22.0.0/15-10.24.0.0/13 all", internet + " all"}},
		{name: "same_org without an organization selects nobody", net: &runtime.Network{Egress: []runtime.EgressRule{{Tenant: runtime.TenantSameOrg}}},
			in: []string{runner}, out: []string{dns}},
		{name: "unknown runner: the gate port only", noRunner: true, net: &runtime.Network{},
			in: []string{"* TCP/7443"}, out: []string{dns}},
		{name: "private services open to the organization, custom ones to the ingress rules", org: "org-a",
			services: []runtime.Service{{Port: 80, Visibility: "public"}, {Port: 8080, Visibility: "private"}, {Port: 9000, Visibility: "custom"}, {Port: 9001, Visibility: "custom"}},
			net: &runtime.Network{Ingress: []runtime.IngressRule{
				{CIDR: "198.51.100.0/24", Ports: []runtime.PortRange{{Port: 9001}}},
				{Any: true},
				{CIDR: "198.51.100.0/24", Ports: []runtime.PortRange{{Port: 22}}}, // no custom service there
			}},
			in:  []string{runner, sameOrg + " TCP/8080", "ip:198.51.100.0/24 TCP/9001", internet + " TCP/9000,TCP/9001"},
			out: []string{dns}},
		{name: "deny ingress keeps the runner and private services", org: "org-a",
			services: []runtime.Service{{Port: 8080, Visibility: "private"}, {Port: 9000, Visibility: "custom"}},
			net:      &runtime.Network{DenyIngress: true, Ingress: []runtime.IngressRule{{Any: true}}},
			in:       []string{runner, sameOrg + " TCP/8080"}, out: []string{dns}},
		{name: "host names cannot be expressed", net: &runtime.Network{Egress: []runtime.EgressRule{{Any: true}, {DNSName: "*.example.com"}}},
			err: `network.egress[1]: the host-name rule "*.example.com"`},
		{name: "same_user selects the caller's Pods, both ways", org: "org-a", caller: "key/ID with:odd chars",
			services: []runtime.Service{{Port: 9000, Visibility: "custom"}},
			net: &runtime.Network{Egress: []runtime.EgressRule{{Tenant: runtime.TenantSameUser, Ports: []runtime.PortRange{{Port: 5432}}}},
				Ingress: []runtime.IngressRule{{Tenant: runtime.TenantSameUser}}},
			in: []string{runner, sameUser + " TCP/9000"}, out: []string{dns, sameUser + " TCP/5432"}},
		{name: "same_user without a caller selects nobody", org: "org-a",
			net: &runtime.Network{Egress: []runtime.EgressRule{{Tenant: runtime.TenantSameUser}}},
			in:  []string{runner}, out: []string{dns}},
		{name: "sandbox networks cannot be expressed", net: &runtime.Network{Egress: []runtime.EgressRule{{Tenant: runtime.TenantSandboxNetwork}}},
			err: `network.egress[0]: the tenant rule "sandbox_network"`},
		{name: "except outside the block", net: &runtime.Network{Egress: []runtime.EgressRule{{CIDR: "10.0.0.0/16", Except: []string{"10.1.0.0/24"}}}},
			err: "except 10.1.0.0/24 is not inside 10.0.0.0/16"},
		{name: "bad protocol", net: &runtime.Network{Egress: []runtime.EgressRule{{Any: true, Ports: []runtime.PortRange{{Protocol: "icmp"}}}}},
			err: `network.egress[0]: protocol "icmp"`},
		{name: "empty rule", net: &runtime.Network{Egress: []runtime.EgressRule{{}}},
			err: "network.egress[0]: the rule names no destination"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := &Backend{cfg: Config{Namespace: "ns", RunnerID: "r1", RunnerPeers: runnerPeers, OpenReserved: tc.open}}
			if tc.noRunner {
				b.cfg.RunnerPeers = nil
			}
			spec := &runtime.Spec{ID: "s1", Network: tc.net, Services: tc.services, Meta: map[string]string{runtime.MetaOrg: tc.org, runtime.MetaCaller: tc.caller}}
			np, err := b.networkPolicyFor(spec, b.labels(spec))
			if tc.err != "" {
				if !errors.Is(err, runtime.ErrInvalidSpec) || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want ErrInvalidSpec containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			checkIPBlocks(t, np)
			if got := np.Spec.PodSelector.MatchLabels[LabelSandbox]; got != "s1" || np.Name != "sbx-s1" || np.Namespace != "ns" {
				t.Errorf("selects %q, name %s/%s", got, np.Namespace, np.Name)
			}
			if len(np.Spec.PolicyTypes) != 2 {
				t.Errorf("policy types %v, want Ingress and Egress", np.Spec.PolicyTypes)
			}
			in, out := describePolicy(np)
			if !slices.Equal(in, tc.in) {
				t.Errorf("ingress:\n got %q\nwant %q", in, tc.in)
			}
			if !slices.Equal(out, tc.out) {
				t.Errorf("egress:\n got %q\nwant %q", out, tc.out)
			}
		})
	}
	t.Run("nil network: no policy", func(t *testing.T) {
		b := &Backend{cfg: Config{Namespace: "ns", RunnerID: "r1"}}
		spec := &runtime.Spec{ID: "s1"}
		if np, err := b.networkPolicyFor(spec, b.labels(spec)); np != nil || err != nil {
			t.Errorf("got %v, %v", np, err)
		}
	})
}

func TestUserLabel(t *testing.T) {
	b := &Backend{cfg: Config{Namespace: "ns", RunnerID: "r1"}}
	for _, tc := range []struct {
		name, caller string
		want         bool
	}{
		{"no caller: no label", "", false},
		{"plain key ID", "k_123", true},
		{"key ID no label value allows", strings.Repeat("é/", 80), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := b.labels(&runtime.Spec{ID: "s", Meta: map[string]string{runtime.MetaCaller: tc.caller}})
			v, ok := l[LabelUser]
			if ok != tc.want {
				t.Fatalf("label present %v, want %v", ok, tc.want)
			}
			if ok && (len(validation.IsValidLabelValue(v)) > 0 || v != userHash(tc.caller) || v == userHash(tc.caller+"x")) {
				t.Errorf("label %q", v)
			}
		})
	}
}

// checkIPBlocks applies the apiserver's rule for ipBlocks (its ValidateIPBlock, parsing
// as it does with net.ParseCIDR): every exception is a strict subset of its block's cidr,
// of the same family. A policy that breaks it is refused at create, and with it every
// sandbox (an IPv4-mapped ::ffff:0:0/96 exception once did).
func checkIPBlocks(t *testing.T, np *networkingv1.NetworkPolicy) {
	t.Helper()
	var peers []networkingv1.NetworkPolicyPeer
	for _, r := range np.Spec.Egress {
		peers = append(peers, r.To...)
	}
	for _, r := range np.Spec.Ingress {
		peers = append(peers, r.From...)
	}
	for _, p := range peers {
		if p.IPBlock == nil {
			continue
		}
		_, block, err := net.ParseCIDR(p.IPBlock.CIDR)
		if err != nil {
			t.Errorf("ipBlock cidr %q: %v", p.IPBlock.CIDR, err)
			continue
		}
		bl, _ := block.Mask.Size()
		for _, e := range p.IPBlock.Except {
			ip, ex, err := net.ParseCIDR(e)
			if err != nil {
				t.Errorf("ipBlock %s except %q: %v", p.IPBlock.CIDR, e, err)
				continue
			}
			el, _ := ex.Mask.Size()
			if !block.Contains(ip) || el <= bl {
				t.Errorf("ipBlock %s except %s: not a strict subset (the apiserver refuses the policy)", p.IPBlock.CIDR, e)
			}
		}
	}
}

// TestHelloEgress: with the gate's hello on, every single-container sandbox's policy (deny
// egress too) allows UDP to the runner's hello port at the hello address's host only and
// at RunnerPeers' selector peers, never at RunnerPeers' CIDRs (as a destination they would
// open the hello port of every address in them, other sandboxes included); multi-container
// sandboxes (no gate hello) get no hello rule.
func TestHelloEgress(t *testing.T) {
	const dns = "ns:kubernetes.io/metadata.name=kube-system UDP/53,TCP/53"
	runnerPod := networkingv1.NetworkPolicyPeer{
		NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": "sandboxd"}},
		PodSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"app": "runner"}},
	}
	cidrPeers := []networkingv1.NetworkPolicyPeer{
		{IPBlock: &networkingv1.IPBlock{CIDR: "10.244.0.0/16"}},
		{IPBlock: &networkingv1.IPBlock{CIDR: "fd00:10:244::/56"}},
	}
	for _, tc := range []struct {
		name      string
		peers     []networkingv1.NetworkPolicyPeer
		helloAddr string
		net       *runtime.Network
		multi     bool
		out       []string
	}{
		{name: "deny egress, CIDR peers: the hello host only", peers: cidrPeers, helloAddr: "10.244.0.5:7444",
			net: &runtime.Network{DenyEgress: true, Egress: []runtime.EgressRule{{Any: true}}},
			out: []string{dns, "ip:10.244.0.5/32 UDP/7444"}},
		{name: "selector peers kept, CIDR dropped", peers: append([]networkingv1.NetworkPolicyPeer{runnerPod}, cidrPeers...), helloAddr: "10.244.0.5:7444",
			net: &runtime.Network{DenyEgress: true},
			out: []string{dns, "ns:kubernetes.io/metadata.name=sandboxd&pods:app=runner|ip:10.244.0.5/32 UDP/7444"}},
		{name: "no peers: the hello host", helloAddr: "10.244.0.5:7444", net: &runtime.Network{},
			out: []string{dns, "ip:10.244.0.5/32 UDP/7444"}},
		{name: "IPv6 hello address: its /128", peers: cidrPeers, helloAddr: "[fd00:10:244::5]:7444", net: &runtime.Network{DenyEgress: true},
			out: []string{dns, "ip:fd00:10:244::5/128 UDP/7444"}},
		{name: "multi-container: no hello rule", peers: cidrPeers, helloAddr: "10.244.0.5:7444", net: &runtime.Network{DenyEgress: true}, multi: true,
			out: []string{dns}},
		{name: "hello off: no rule", peers: cidrPeers, net: &runtime.Network{DenyEgress: true},
			out: []string{dns}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := &Backend{cfg: Config{Namespace: "ns", RunnerID: "r1", RunnerPeers: tc.peers, HelloAddr: tc.helloAddr}}
			if tc.helloAddr != "" {
				b.helloTo = netip.MustParseAddrPort(tc.helloAddr) // as New keeps it
			}
			spec := &runtime.Spec{ID: "s1", Network: tc.net}
			if tc.multi {
				spec.Sidecars = []runtime.Container{{Name: "side"}}
			}
			np, err := b.networkPolicyFor(spec, b.labels(spec))
			if err != nil {
				t.Fatal(err)
			}
			checkIPBlocks(t, np)
			_, out := describePolicy(np)
			if !slices.Equal(out, tc.out) {
				t.Errorf("egress:\n got %q\nwant %q", out, tc.out)
			}
			// The config's peers are not aliased into the policy.
			for _, r := range np.Spec.Egress {
				for _, p := range r.To {
					for _, q := range b.cfg.RunnerPeers {
						if p.PodSelector != nil && p.PodSelector == q.PodSelector {
							t.Errorf("policy shares the config's selector")
						}
					}
				}
			}
		})
	}
}
