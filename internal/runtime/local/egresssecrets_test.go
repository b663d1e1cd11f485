package local

import (
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// TestPrepareEgressSecretsEveryContainer: every container of a group (primary, sidecar,
// init container) gets the same placeholder and the trust variables it does not set
// itself, in its secret environment only; no container gets the value; the CA dir holds
// certificates only; the caller's spec is not changed.
func TestPrepareEgressSecretsEveryContainer(t *testing.T) {
	const value = "unit-egress-value-7c1e"
	rootsFile := filepath.Join(t.TempDir(), "roots.pem")
	if err := os.WriteFile(rootsFile, []byte("# no roots\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	b := &Backend{cfg: Config{EgressRootsFile: rootsFile}}
	orig := runtime.Spec{
		ID:             "sbxunit",
		Container:      runtime.Container{Name: "main", SecretEnv: map[string]string{"DB": "pw"}},
		Sidecars:       []runtime.Container{{Name: "side", Env: map[string]string{"SSL_CERT_FILE": "/mine.pem"}}},
		InitContainers: []runtime.Container{{Name: "init"}},
		Network: &runtime.Network{Egress: []runtime.EgressRule{{DNSName: "api.example.com",
			Secret: &runtime.EgressSecret{Store: "prod", Path: "api", EnvVar: "API_TOKEN"}}}},
		EgressSecretValues: map[string]string{"prod/api": value},
	}
	spec := orig.Clone()
	s := &sandbox{id: "sbxunit", dir: t.TempDir()}
	if err := b.prepareEgressSecrets(s, &spec); err != nil {
		t.Fatal(err)
	}
	ph := spec.Container.SecretEnv["API_TOKEN"]
	if !strings.HasPrefix(ph, "sbx-secret-") {
		t.Fatalf("placeholder %q", ph)
	}
	for _, c := range spec.AllContainers() {
		env := c.SecretEnv
		if env["API_TOKEN"] != ph {
			t.Errorf("container %s: placeholder %q, want %q", c.Name, env["API_TOKEN"], ph)
		}
		for k, v := range env {
			if strings.Contains(v, value) {
				t.Errorf("container %s: %s holds the value", c.Name, k)
			}
		}
		if env["NODE_EXTRA_CA_CERTS"] != EgressCAMount+"/ca.pem" || env["CURL_CA_BUNDLE"] != EgressCAMount+"/bundle.pem" {
			t.Errorf("container %s: trust variables %v", c.Name, env)
		}
		_, set := env["SSL_CERT_FILE"]
		if want := c.Name != "side"; set != want { // the sidecar sets its own
			t.Errorf("container %s: SSL_CERT_FILE in the secret env %v, want %v", c.Name, set, want)
		}
	}
	if spec.Container.SecretEnv["DB"] != "pw" {
		t.Error("the primary's own secret env was lost")
	}
	if s.egressCADir == "" || s.egress == nil {
		t.Fatal("no CA dir or secrets recorded")
	}
	if m := newMember(s, &spec.Sidecars[0]); m.egressCADir != s.egressCADir {
		t.Errorf("member CA dir %q, want %q", m.egressCADir, s.egressCADir)
	}
	ents, _ := os.ReadDir(s.egressCADir)
	for _, e := range ents {
		data, _ := os.ReadFile(filepath.Join(s.egressCADir, e.Name()))
		if strings.Contains(string(data), "PRIVATE KEY") || strings.Contains(string(data), value) {
			t.Errorf("%s holds a key or the value", e.Name())
		}
	}
	// The caller's spec is untouched.
	if len(orig.Sidecars[0].SecretEnv) != 0 || len(orig.InitContainers[0].SecretEnv) != 0 || !maps.Equal(orig.Container.SecretEnv, map[string]string{"DB": "pw"}) {
		t.Errorf("the caller's spec changed: %+v", orig)
	}
}
