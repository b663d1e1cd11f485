package stack

import (
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes"
)

// TestEgressNoUpstreams: the egress DNS's upstreams are the given ones, else the
// usable nameservers of resolv.conf; with none at all the Kubernetes stack refuses to
// start (every name but the granted ones would fail) rather than serve SERVFAIL.
func TestEgressNoUpstreams(t *testing.T) {
	dir := t.TempDir()
	kc := testKubeconfig(t, dir)
	rc := filepath.Join(dir, "resolv.conf")
	if err := os.WriteFile(rc, []byte("nameserver 127.0.0.53\nsearch example\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if ups := egressUpstreams(&KubernetesEgress{}, rc); len(ups) != 0 {
		t.Errorf("loopback-only resolv.conf: %q, want none", ups)
	}
	if err := os.WriteFile(rc, []byte("nameserver 10.255.255.53\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if ups := egressUpstreams(&KubernetesEgress{}, rc); !slices.Equal(ups, []string{"10.255.255.53:53"}) {
		t.Errorf("resolv.conf: %q", ups)
	}
	if ups := egressUpstreams(&KubernetesEgress{Upstreams: []string{"192.0.2.1:53"}}, rc); !slices.Equal(ups, []string{"192.0.2.1:53"}) {
		t.Errorf("given: %q", ups)
	}

	_, err := NewKubernetes(t.Context(), KubernetesConfig{Kubeconfig: kc, Egress: &KubernetesEgress{
		ProxyListen: "127.0.0.1:0", DNSListen: "127.0.0.1:0", Upstreams: []string{},
	}})
	if err == nil || !strings.Contains(err.Error(), "no upstream nameserver") {
		t.Errorf("NewKubernetes without upstreams: %v, want a refusal", err)
	}
}

// testKubeconfig writes a kubeconfig naming an API server nothing answers at.
func testKubeconfig(t *testing.T, dir string) string {
	t.Helper()
	kc := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kc, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://192.0.2.1:6443"}}]
users: [{name: u, user: {token: x}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`), 0o600); err != nil {
		t.Fatal(err)
	}
	return kc
}

// TestEgressTrustFilesNamed: a Kubernetes runner whose --egress-roots or
// --egress-upstream-ca file holds no PEM certificate refuses to start naming the flag and
// the file (where the Helm chart mounts egress.roots and egress.upstreamCA: what its user
// reads in the runner's log).
func TestEgressTrustFilesNamed(t *testing.T) {
	dir := t.TempDir()
	kc := testKubeconfig(t, dir)
	notPEM := filepath.Join(dir, "roots.pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		roots, upstream, want string
	}{
		{roots: notPEM, want: "the roots bundle --egress-roots " + notPEM + " holds no PEM certificate"},
		{upstream: notPEM, want: "egress upstream CA (--egress-upstream-ca) " + notPEM + " holds no PEM certificate"},
	} {
		ip := netip.MustParseAddr("10.96.0.53")
		_, err := NewKubernetes(t.Context(), KubernetesConfig{Kubeconfig: kc,
			Backend: &kubernetes.Config{Client: fake.NewSimpleClientset(), Namespace: "sbx", RunnerID: "r1", AgentImage: "agent:1", MaxPrepull: -1,
				RunnerPeers: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.1/32"}}}},
			Egress: &KubernetesEgress{ProxyListen: "127.0.0.1:0", DNSListen: "127.0.0.1:0", Upstreams: []string{"192.0.2.1:53"},
				ProxyAddrs: []netip.Addr{ip}, DNSAddr: ip, RootsFile: c.roots, UpstreamCAFile: c.upstream},
		})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("roots %q upstream CA %q: %v, want %q", c.roots, c.upstream, err, c.want)
		}
	}
}
