package kubernetes

import (
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandboxd/sandboxd/internal/agentconfig"
	"github.com/sandboxd/sandboxd/internal/egress"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

func envMap(env []string) map[string]string {
	m := map[string]string{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	return m
}

// TestEgressStartEnv: the Start environment carries the placeholders and the trust
// variables; a variable the container sets itself (SSL_CERT_FILE) keeps its value;
// without placeholders, the container's own environment alone.
func TestEgressStartEnv(t *testing.T) {
	c := &runtime.Container{Env: map[string]string{"SSL_CERT_FILE": "/mine.pem", "X": "1"}}
	got := envMap(egressStartEnv(c, map[string]string{"API_TOKEN": "sbx-secret-abc"}))
	if got["API_TOKEN"] != "sbx-secret-abc" || got["SSL_CERT_FILE"] != "/mine.pem" || got["X"] != "1" ||
		got["CURL_CA_BUNDLE"] != egress.CAMount+"/bundle.pem" || got["NODE_EXTRA_CA_CERTS"] != egress.CAMount+"/ca.pem" {
		t.Fatalf("Start env %v", got)
	}
	if len(c.Env) != 2 {
		t.Fatalf("the container's env changed: %v", c.Env)
	}
	if got := envMap(egressStartEnv(c, nil)); !maps.Equal(got, c.Env) {
		t.Fatalf("without placeholders: %v", got)
	}
}

// TestEgressSecretsGroupStart: in a group, what each held container's agent is sent in
// its Start (group.start) carries the placeholder and the trust variables, a sidecar
// that sets SSL_CERT_FILE keeps its own, and the in-Pod configs (the Secret) carry none.
func TestEgressSecretsGroupStart(t *testing.T) {
	b, cs := newFakeBackend(t, Config{Egress: testEgress(), StartTimeout: time.Second, MaxPrepull: -1})
	spec := egressSecretSpec("grp-1")
	spec.Name = "main"
	spec.Sidecars = []runtime.Container{{Name: "side", Image: "busybox", Command: "sleep", Args: []string{"60"}, Env: map[string]string{"SSL_CERT_FILE": "/side.pem"}}}
	go func() { _, _ = b.Create(t.Context(), spec) }()
	var start map[string][]byte
	var ph string
	waitFor(t, "the group prepared", func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		s := b.sandboxes[spec.ID]
		if s == nil || s.group == nil || s.egress == nil {
			return false
		}
		start, ph = maps.Clone(s.group.start), s.egress.Injections[0].Placeholder
		return true
	})
	if len(start) != 2 {
		t.Fatalf("Start configs for %v", slices.Collect(maps.Keys(start)))
	}
	for name, raw := range start {
		var c agentconfig.Config
		if err := json.Unmarshal(raw, &c); err != nil {
			t.Fatal(err)
		}
		env := envMap(c.Env)
		wantCert := egress.CAMount + "/bundle.pem"
		if strings.Contains(name, "side") {
			wantCert = "/side.pem"
		}
		if env["API_TOKEN"] != ph || env["SSL_CERT_FILE"] != wantCert || env["REQUESTS_CA_BUNDLE"] != egress.CAMount+"/bundle.pem" {
			t.Errorf("Start of %s: env %v", name, env)
		}
	}
	waitFor(t, "the Secret", func() bool {
		_, err := cs.CoreV1().Secrets("sbx").Get(t.Context(), secretName(spec.ID), metav1.GetOptions{})
		return err == nil
	})
	sec, _ := cs.CoreV1().Secrets("sbx").Get(t.Context(), secretName(spec.ID), metav1.GetOptions{})
	for k, v := range sec.Data {
		if strings.Contains(string(v), ph) {
			t.Errorf("Secret item %s holds the placeholder", k)
		}
	}
}

// TestWarmKeyEgressSecrets: a spec with egress secrets is never served from (or kept
// in) the warm pool; the same spec without the secret is poolable.
func TestWarmKeyEgressSecrets(t *testing.T) {
	spec := egressSecretSpec("w-1")
	if _, ok := warmKey(spec); ok {
		t.Fatal("a spec with egress secrets is poolable")
	}
	spec.Network.Egress[0].Secret = nil
	spec.EgressSecretValues = nil
	if _, ok := warmKey(spec); !ok {
		t.Fatal("the same spec without the secret is not poolable (the test proves nothing)")
	}
}
