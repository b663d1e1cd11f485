package stack

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestEgressNoUpstreams: the egress DNS's upstreams are the given ones, else the
// usable nameservers of resolv.conf; with none at all the Kubernetes stack refuses to
// start (every name but the granted ones would fail) rather than serve SERVFAIL.
func TestEgressNoUpstreams(t *testing.T) {
	dir := t.TempDir()
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
	_, err := NewKubernetes(t.Context(), KubernetesConfig{Kubeconfig: kc, Egress: &KubernetesEgress{
		ProxyListen: "127.0.0.1:0", DNSListen: "127.0.0.1:0", Upstreams: []string{},
	}})
	if err == nil || !strings.Contains(err.Error(), "no upstream nameserver") {
		t.Errorf("NewKubernetes without upstreams: %v, want a refusal", err)
	}
}
