package local

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/egress"
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
	if err := b.prepareEgressSecrets(s, &spec, nil); err != nil {
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

// TestPrepareForkEgressSecrets: a fork on the same runner keeps its source's CA (the same
// ca.pem) and placeholders (its restored processes hold them) with the values its own
// spec brings (resolved again: a rotated value is the new one); the fork's proxy record is
// its own (its sandbox ID); a value missing, a source whose values are lost, and a fork
// without its source's secrets (another runner's checkpoint) are refused.
func TestPrepareForkEgressSecrets(t *testing.T) {
	rootsFile := filepath.Join(t.TempDir(), "roots.pem")
	if err := os.WriteFile(rootsFile, []byte("# no roots\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	b := &Backend{cfg: Config{EgressRootsFile: rootsFile}}
	mk := func(id, value string) runtime.Spec {
		return runtime.Spec{ID: id, Meta: map[string]string{runtime.MetaOrg: "org-a"},
			Container: runtime.Container{Name: "main"},
			Network: &runtime.Network{Egress: []runtime.EgressRule{{DNSName: "api.example.com",
				Secret: &runtime.EgressSecret{Store: "prod", Path: "api", Field: "token", EnvVar: "API_TOKEN"}}}},
			EgressSecretValues: map[string]string{"prod/api#token": value}}
	}
	srcSpec := mk("src", "old-value")
	src := &sandbox{id: "src", dir: t.TempDir()}
	if err := b.prepareEgressSecrets(src, &srcSpec, nil); err != nil {
		t.Fatal(err)
	}
	forkSpec := mk("fork1", "new-value")
	fork := &sandbox{id: "fork1", dir: t.TempDir()}
	if err := b.prepareEgressSecrets(fork, &forkSpec, src.egress); err != nil {
		t.Fatal(err)
	}
	if got, want := fork.egress.Injections[0].Placeholder, srcSpec.Container.SecretEnv["API_TOKEN"]; got != want || !strings.HasPrefix(got, "sbx-secret-") {
		t.Fatalf("fork placeholder %q, source's %q", got, want)
	}
	// Its agents are restored with the source's environment: nothing handed to them.
	if forkSpec.Container.SecretEnv != nil {
		t.Fatalf("fork secret env %v", forkSpec.Container.SecretEnv)
	}
	a, _ := os.ReadFile(filepath.Join(src.egressCADir, "ca.pem"))
	c, _ := os.ReadFile(filepath.Join(fork.egressCADir, "ca.pem"))
	if len(a) == 0 || string(a) != string(c) || fork.egressCADir == src.egressCADir {
		t.Fatalf("fork CA dir %s (same CA: %v)", fork.egressCADir, string(a) == string(c))
	}
	if fork.egress.SandboxID != "fork1" || len(fork.egress.Injections) != 1 || fork.egress.Injections[0].Value != "new-value" ||
		src.egress.Injections[0].Value != "old-value" {
		t.Fatalf("fork secrets %+v, source's %+v", fork.egress, src.egress)
	}
	for name, tc := range map[string]struct {
		spec runtime.Spec
		from func() *sandbox
	}{
		"no value": {spec: func() runtime.Spec { sp := mk("f2", "x"); sp.EgressSecretValues = nil; return sp }(), from: func() *sandbox { return src }},
		"another secret": {spec: func() runtime.Spec {
			sp := mk("f3", "x")
			sp.Network.Egress[0].Secret.Path = "other"
			sp.EgressSecretValues = map[string]string{"prod/other#token": "x", "prod/api#token": "x"}
			return sp
		}(), from: func() *sandbox { return src }},
	} {
		sp := tc.spec
		if err := b.prepareEgressSecrets(&sandbox{id: sp.ID, dir: t.TempDir()}, &sp, tc.from().egress); err == nil {
			t.Errorf("%s: a fork was given egress secrets", name)
		}
	}
	// A fork living past the source's CA (its expiry counts from the source's create):
	// refused, naming both ends; one ending before it is made, and its expiry is told.
	long := mk("f5", "x")
	long.Meta[runtime.MetaCreatedAt] = time.Now().UTC().Format(time.RFC3339Nano)
	long.Meta[runtime.MetaLifetime] = (egress.CATTL + time.Hour).String()
	if err := b.prepareEgressSecrets(&sandbox{id: "f5", dir: t.TempDir()}, &long, src.egress); !errors.Is(err, egress.ErrCAExpiresFirst) {
		t.Errorf("fork outliving the CA = %v", err)
	}
	long.Meta[runtime.MetaLifetime] = (egress.CATTL - time.Hour).String()
	if err := b.prepareEgressSecrets(&sandbox{id: "f5", dir: t.TempDir()}, &long, src.egress); err != nil {
		t.Errorf("fork ending before the CA = %v", err)
	}
	b.sandboxes = map[string]*sandbox{"src": src}
	if at, ok := b.EgressCAExpiry("src"); !ok || !at.Equal(src.egress.CACert().NotAfter) {
		t.Errorf("EgressCAExpiry = %v, %v", at, ok)
	}
	if _, ok := b.EgressCAExpiry("f5"); ok {
		t.Error("EgressCAExpiry of an unknown sandbox")
	}
	// The source's values lost (a restarted runner): refused.
	lost := mk("f4", "x")
	if err := b.prepareEgressSecrets(&sandbox{id: "f4", dir: t.TempDir()}, &lost, egress.LostSecrets("src", "org-a", []string{"api.example.com"})); err == nil || !strings.Contains(err.Error(), "restarted") {
		t.Errorf("fork of a source with lost secrets = %v", err)
	}
	// Without its source's secrets (another runner's checkpoint): refused before anything.
	if why := (&Backend{cfg: Config{Network: egressSetterNet{}}}).egressSecretsUnsupported(&forkSpec, &forkParams{}); !strings.Contains(why, "without its source's egress CA") {
		t.Errorf("fork without the source's secrets: %q", why)
	}
	if why := (&Backend{cfg: Config{Network: egressSetterNet{}}}).egressSecretsUnsupported(&forkSpec, &forkParams{egress: src.egress}); why != "" {
		t.Errorf("fork with the source's secrets: %q", why)
	}
}

// egressSetterNet is a Network with an egress proxy (EgressSecretsSetter), for checks
// that make nothing.
type egressSetterNet struct{ Network }

func (egressSetterNet) SetEgressSecrets(string, *egress.SandboxSecrets) error { return nil }

// TestEgressStateAcrossBackends (docs/secrets.md, "Forks and moves"): the egress state
// one backend exports (egressStateOf: CA, key, placeholders, no value) is taken by
// another (egressFromState) for a fork or move of the same spec: the sandbox made there
// has the same ca.pem and placeholder, the value its own spec brings; a state that does
// not fit the spec (none, for a spec without secrets, another host, more injections) and
// a source whose secrets are lost are refused.
func TestEgressStateAcrossBackends(t *testing.T) {
	rootsFile := filepath.Join(t.TempDir(), "roots.pem")
	if err := os.WriteFile(rootsFile, []byte("# no roots\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	b := &Backend{cfg: Config{EgressRootsFile: rootsFile}}
	mk := func(id, host, value string) runtime.Spec {
		return runtime.Spec{ID: id, Meta: map[string]string{runtime.MetaOrg: "org-a"},
			Container: runtime.Container{Name: "main"},
			Network: &runtime.Network{Egress: []runtime.EgressRule{{DNSName: host,
				Secret: &runtime.EgressSecret{Store: "prod", Path: "api", Field: "token", EnvVar: "API_TOKEN"}}}},
			EgressSecretValues: map[string]string{"prod/api#token": value}}
	}
	srcSpec := mk("src", "api.example.com", "old-value")
	src := &sandbox{id: "src", dir: t.TempDir()}
	if err := b.prepareEgressSecrets(src, &srcSpec, nil); err != nil {
		t.Fatal(err)
	}
	st, err := egressStateOf(src.egress)
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range st.Injections {
		if strings.Contains(fmt.Sprint(in), "old-value") {
			t.Fatal("the exported state holds the value")
		}
	}
	// The other runner: a move (same ID) with the value resolved again.
	moved := mk("src", "api.example.com", "new-value")
	from, err := egressFromState(&moved, st)
	if err != nil {
		t.Fatal(err)
	}
	m := &sandbox{id: "src", dir: t.TempDir()}
	if err := b.prepareEgressSecrets(m, &moved, from); err != nil {
		t.Fatal(err)
	}
	a, _ := os.ReadFile(filepath.Join(src.egressCADir, "ca.pem"))
	c, _ := os.ReadFile(filepath.Join(m.egressCADir, "ca.pem"))
	if len(a) == 0 || string(a) != string(c) {
		t.Fatal("the moved sandbox's ca.pem is not its source's")
	}
	if got := m.egress.Injections[0]; got.Placeholder != srcSpec.Container.SecretEnv["API_TOKEN"] || got.Value != "new-value" {
		t.Fatalf("moved injection %+v", got)
	}
	plain := runtime.Spec{ID: "p", Container: runtime.Container{Name: "main"}}
	if ss, err := egressFromState(&plain, nil); ss != nil || err != nil {
		t.Fatalf("no secrets, no state = %v, %v", ss, err)
	}
	two := *st
	two.Injections = append(slices.Clone(st.Injections), st.Injections[0])
	other := mk("x", "other.example.com", "v")
	for name, tc := range map[string]struct {
		spec *runtime.Spec
		st   *runtime.EgressState
		want string
	}{
		"state for a spec without secrets": {&plain, st, "has no egress secrets"},
		"no state":                         {&moved, nil, "came without"},
		"another host":                     {&other, st, "has no injection"},
		"more injections":                  {&moved, &two, "2 injections"},
	} {
		if _, err := egressFromState(tc.spec, tc.st); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", name, err, tc.want)
		}
	}
	if _, err := egressStateOf(egress.LostSecrets("src", "org-a", []string{"api.example.com"})); err == nil {
		t.Error("lost secrets exported")
	}
}
