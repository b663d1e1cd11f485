package runner

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

func TestValidateEgressSecret(t *testing.T) {
	good := runtime.EgressSecret{Store: "prod", Path: "api/x", Field: "token", EnvVar: "API_TOKEN"}
	for name, tc := range map[string]struct {
		rule  runtime.EgressRule
		field string // "" = valid
	}{
		"ok":           {runtime.EgressRule{DNSName: "api.example.com", Secret: &good}, ""},
		"named header": {runtime.EgressRule{DNSName: "api.example.com", Secret: with(good, func(s *runtime.EgressSecret) { s.Header = "X-Api-Key" })}, ""},
		"wildcard":     {runtime.EgressRule{DNSName: "*.example.com", Secret: &good}, ".sandboxd_secret"},
		"cidr":         {runtime.EgressRule{CIDR: "203.0.113.0/24", Secret: &good}, ".sandboxd_secret"},
		"host header":  {runtime.EgressRule{DNSName: "a.example.com", Secret: with(good, func(s *runtime.EgressSecret) { s.Header = "host" })}, ".sandboxd_secret.header"},
		"te header":    {runtime.EgressRule{DNSName: "a.example.com", Secret: with(good, func(s *runtime.EgressSecret) { s.Header = "Transfer-Encoding" })}, ".sandboxd_secret.header"},
		"bad header":   {runtime.EgressRule{DNSName: "a.example.com", Secret: with(good, func(s *runtime.EgressSecret) { s.Header = "X Key" })}, ".sandboxd_secret.header"},
		"long header":  {runtime.EgressRule{DNSName: "a.example.com", Secret: with(good, func(s *runtime.EgressSecret) { s.Header = strings.Repeat("x", 65) })}, ".sandboxd_secret.header"},
		"bad store":    {runtime.EgressRule{DNSName: "a.example.com", Secret: with(good, func(s *runtime.EgressSecret) { s.Store = "Prod" })}, ".sandboxd_secret.store_name"},
		"dotdot path":  {runtime.EgressRule{DNSName: "a.example.com", Secret: with(good, func(s *runtime.EgressSecret) { s.Path = "a/../b" })}, ".sandboxd_secret.path"},
		"empty path":   {runtime.EgressRule{DNSName: "a.example.com", Secret: with(good, func(s *runtime.EgressSecret) { s.Path = "" })}, ".sandboxd_secret.path"},
		"bad field":    {runtime.EgressRule{DNSName: "a.example.com", Secret: with(good, func(s *runtime.EgressSecret) { s.Field = "a b" })}, ".sandboxd_secret.field"},
		"no env var":   {runtime.EgressRule{DNSName: "a.example.com", Secret: with(good, func(s *runtime.EgressSecret) { s.EnvVar = "" })}, ".sandboxd_secret.env_var"},
		"bad env var":  {runtime.EgressRule{DNSName: "a.example.com", Secret: with(good, func(s *runtime.EgressSecret) { s.EnvVar = "1X" })}, ".sandboxd_secret.env_var"},
	} {
		var got []string
		ValidateEgressRule("e", tc.rule, func(field, format string, args ...any) { got = append(got, field) })
		switch {
		case tc.field == "" && len(got) > 0:
			t.Errorf("%s: refused %v", name, got)
		case tc.field != "" && !containsString(got, "e"+tc.field):
			t.Errorf("%s: violations %v, want e%s", name, got, tc.field)
		}
	}
}

func TestValidateEgressSecretsAcrossRules(t *testing.T) {
	sec := func(env, header string) *runtime.EgressSecret {
		return &runtime.EgressSecret{Store: "prod", Path: "api", EnvVar: env, Header: header}
	}
	spec := &runtime.Spec{
		Container: runtime.Container{Env: map[string]string{"TAKEN": "x"}, SecretEnv: map[string]string{"SECRET": "y"}},
		Network: &runtime.Network{Egress: []runtime.EgressRule{
			{DNSName: "a.example.com", Secret: sec("A", "")},
			{DNSName: "a.example.com", Secret: sec("B", "authorization")}, // same host and header
			{DNSName: "b.example.com", Secret: sec("A", "")},              // same variable
			{DNSName: "c.example.com", Secret: sec("TAKEN", "X-K")},
			{DNSName: "d.example.com", Secret: sec("SECRET", "X-K")},
		}},
		EgressSecretValues: map[string]string{"prod/api": "v"},
	}
	var got []string
	ValidateEgressSecrets(spec, true, func(field, format string, args ...any) { got = append(got, field) })
	if len(got) != 4 {
		t.Errorf("violations %v", got)
	}
	// Every container gets the placeholders: a sidecar's or an init container's own
	// variable of that name is refused as the primary's is.
	spec.Sidecars = []runtime.Container{{Name: "side", Env: map[string]string{"E": "x"}}}
	spec.InitContainers = []runtime.Container{{Name: "init", SecretEnv: map[string]string{"F": "y"}}}
	spec.Network.Egress = append(spec.Network.Egress,
		runtime.EgressRule{DNSName: "e.example.com", Secret: sec("E", "")},
		runtime.EgressRule{DNSName: "f.example.com", Secret: sec("F", "")})
	got = nil
	ValidateEgressSecrets(spec, true, func(field, format string, args ...any) { got = append(got, field) })
	for _, want := range []string{
		"spec.network.egress[5].sandboxd_secret.env_var", "spec.network.egress[6].sandboxd_secret.env_var",
		"spec.network.egress[1].sandboxd_secret.header", "spec.network.egress[2].sandboxd_secret.env_var",
		"spec.network.egress[3].sandboxd_secret.env_var", "spec.network.egress[4].sandboxd_secret.env_var",
	} {
		if !containsString(got, want) {
			t.Errorf("no violation on %s in %v", want, got)
		}
	}
	if len(got) != 6 {
		t.Errorf("violations %v", got)
	}
	// A value missing: refused by the runner (not by the gateway, which resolves later).
	spec.EgressSecretValues = nil
	got = nil
	ValidateEgressSecrets(spec, true, func(field, format string, args ...any) { got = append(got, field) })
	if !containsString(got, "spec.network.egress[0].sandboxd_secret") {
		t.Errorf("missing value not refused: %v", got)
	}
	if err := checkEgressSecrets(&runtime.Spec{}); err != nil {
		t.Errorf("no network: %v", err)
	}
}

// TestEgressSecretsRefusedWithoutDNSEgress: a runner that cannot enforce host names
// (Kubernetes) refuses egress secrets, saying so.
func TestEgressSecretsRefusedWithoutDNSEgress(t *testing.T) {
	n := &runtime.Network{Egress: []runtime.EgressRule{{DNSName: "a.example.com", Secret: &runtime.EgressSecret{Store: "p", Path: "a", EnvVar: "A"}}}}
	err := supported(n, runtime.Support{NoDNSEgress: true})
	if err == nil || !strings.Contains(err.Error(), "cannot inject egress secrets") {
		t.Fatalf("err = %v", err)
	}
}

func with(s runtime.EgressSecret, f func(*runtime.EgressSecret)) *runtime.EgressSecret {
	f(&s)
	return &s
}

func containsString(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// TestForkCarriesEgressSecretValues: a fork of a sandbox with egress secrets takes the
// values its target brings (resolved again by the gateway) to the backend, as a create
// does, and keeps them in no record (the fork's Get, the runner's files); a target
// without them, or with too many, is refused before anything is made.
func TestForkCarriesEgressSecretValues(t *testing.T) {
	be := newPauseFake(checkpointing)
	dataDir := t.TempDir()
	l := pauseLocal(t, be, dataDir)
	ctx := context.Background()
	const value = "fork-egress-value-93af"
	net := &runtime.Network{Egress: []runtime.EgressRule{{DNSName: "api.example.com",
		Secret: &runtime.EgressSecret{Store: "prod", Path: "api", Field: "token", EnvVar: "API_TOKEN"}}}}
	sb, err := l.Create(ctx, CreateRequest{Spec: runtime.Spec{Container: runtime.Container{Image: "busybox"}, Network: net,
		EgressSecretValues: map[string]string{"prod/api#token": "create-value"}, Meta: map[string]string{runtime.MetaOrg: "org-a"}}, Lifetime: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	src := awaitState(t, l.R, sb.ID, StateRunning)
	res, err := l.Fork(ctx, src.ID, []ForkTarget{{ID: "fork-s", EgressSecretValues: map[string]string{"prod/api#token": value}}})
	if err != nil || len(res) != 1 || res[0].Err != nil {
		t.Fatalf("fork = %+v, %v", res, err)
	}
	be.mu.Lock()
	got := be.forkValues["fork-s"]
	be.mu.Unlock()
	if got["prod/api#token"] != value {
		t.Fatalf("the backend got %v", got)
	}
	if f, _ := l.Get(ctx, "fork-s"); f.Spec.EgressSecretValues != nil || f.Spec.Network == nil || f.Spec.Network.Egress[0].Secret == nil {
		t.Fatalf("the fork's record: values %v, network %+v", f.Spec.EgressSecretValues, f.Spec.Network)
	}
	if err := filepath.Walk(dataDir, func(p string, fi os.FileInfo, err error) error {
		if err != nil || fi.IsDir() {
			return err
		}
		if b, _ := os.ReadFile(p); strings.Contains(string(b), value) {
			t.Errorf("%s holds the value", p)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// Without the values: refused, naming the rule; nothing forked.
	_, _, forks0 := be.counts()
	if _, err := l.Fork(ctx, src.ID, []ForkTarget{{ID: "fork-n"}}); err == nil || !strings.Contains(err.Error(), "not resolved") {
		t.Fatalf("fork without values = %v", err)
	}
	many := map[string]string{}
	for i := range runtime.MaxSecretEnvVars + 1 {
		many[fmt.Sprintf("prod/k%d", i)] = "v"
	}
	if _, err := l.Fork(ctx, src.ID, []ForkTarget{{ID: "fork-m", EgressSecretValues: many}}); err == nil || !strings.Contains(err.Error(), "egress_secret_values") {
		t.Fatalf("fork with too many values = %v", err)
	}
	if _, _, n := be.counts(); n != forks0 {
		t.Fatalf("refused forks reached the backend (%d forks, was %d)", n, forks0)
	}
}

// TestForkOutlivingEgressCARefused: a fork keeps its source's egress CA, whose expiry
// counts from the source's create; a fork whose lifetime (its own, or the source's
// when it names none) would end after that is refused up front, FAILED_PRECONDITION
// CWSANDBOX_CHECKPOINT_NOT_SUPPORTED naming both times with a violation on the target's
// lifetime, never made (its lifetime is not shortened either); one ending before it is made.
func TestForkOutlivingEgressCARefused(t *testing.T) {
	be := newPauseFake(checkpointing)
	l := pauseLocal(t, be, t.TempDir())
	ctx := context.Background()
	net := &runtime.Network{Egress: []runtime.EgressRule{{DNSName: "api.example.com",
		Secret: &runtime.EgressSecret{Store: "prod", Path: "api", Field: "token", EnvVar: "API_TOKEN"}}}}
	sb, err := l.Create(ctx, CreateRequest{Spec: runtime.Spec{Container: runtime.Container{Image: "busybox"}, Network: net,
		EgressSecretValues: map[string]string{"prod/api#token": "v"}, Meta: map[string]string{runtime.MetaOrg: "org-a"}}, Lifetime: 30 * 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	src := awaitState(t, l.R, sb.ID, StateRunning)
	// The source is 29 days old: its CA (31 days) has 2 days left.
	notAfter := time.Now().Add(2 * 24 * time.Hour)
	be.mu.Lock()
	be.caExpiry = map[string]time.Time{src.ID: notAfter}
	be.mu.Unlock()
	values := map[string]string{"prod/api#token": "v2"}
	_, _, forks0 := be.counts()
	for _, tc := range []struct {
		name     string
		lifetime time.Duration
	}{{"the source's lifetime", 0}, {"a lifetime of its own", 3 * 24 * time.Hour}} {
		_, err := l.Fork(ctx, src.ID, []ForkTarget{{ID: "fork-ok", Lifetime: time.Hour, EgressSecretValues: values}, {ID: "fork-long", Lifetime: tc.lifetime, EgressSecretValues: values}})
		api := APIError(src.ID, err, "")
		vs := apierr.Violations(api)
		if !errors.Is(err, ErrCannotCheckpoint) || connect.CodeOf(api) != connect.CodeFailedPrecondition || apierr.Reason(api) != apierr.CheckpointNotSupported ||
			!strings.Contains(err.Error(), notAfter.UTC().Format(time.RFC3339)) || !strings.Contains(err.Error(), "egress CA") ||
			len(vs) != 1 || vs[0].Field != "targets[1].lifetime" {
			t.Fatalf("%s: fork outliving the CA = %v (violations %+v)", tc.name, api, vs)
		}
		if _, err := l.Get(ctx, "fork-ok"); err == nil {
			t.Fatalf("%s: a target of the refused fork was made", tc.name)
		}
	}
	if _, _, n := be.counts(); n != forks0 {
		t.Fatalf("refused forks reached the backend (%d forks, was %d)", n, forks0)
	}
	res, err := l.Fork(ctx, src.ID, []ForkTarget{{ID: "fork-ok", Lifetime: 24 * time.Hour, EgressSecretValues: values}})
	if err != nil || len(res) != 1 || res[0].Err != nil {
		t.Fatalf("fork ending before the CA = %+v, %v", res, err)
	}
	if f, _ := l.Get(ctx, "fork-ok"); f.Lifetime != 24*time.Hour {
		t.Fatalf("fork lifetime %v", f.Lifetime)
	}
}

// TestEgressSecretsRefusedWithoutInjection: a runner enforcing host names through a proxy
// that does not inject (Kubernetes with its egress proxy) refuses egress secrets, saying
// so, and keeps plain host-name rules.
func TestEgressSecretsRefusedWithoutInjection(t *testing.T) {
	can := runtime.Support{NoEgressSecrets: true}
	n := &runtime.Network{Egress: []runtime.EgressRule{{DNSName: "b.example.com"}, {DNSName: "a.example.com", Secret: &runtime.EgressSecret{Store: "p", Path: "a", EnvVar: "A"}}}}
	err := supported(n, can)
	if err == nil || !strings.Contains(err.Error(), "egress[1].sandboxd_secret") || !strings.Contains(err.Error(), "does not terminate the sandbox") || strings.Contains(err.Error(), "egress[0]") {
		t.Fatalf("err = %v", err)
	}
	if err := supported(&runtime.Network{Egress: n.Egress[:1]}, can); err != nil {
		t.Errorf("a plain host-name rule: %v", err)
	}
}

// TestEgressCAPathReserved: in a sandbox with egress secrets, a volume mount or a file at
// or below /etc/sandboxd-egress (any container) is a field violation; without egress
// secrets the path is the user's.
func TestEgressCAPathReserved(t *testing.T) {
	spec := &runtime.Spec{
		Container: runtime.Container{Files: []runtime.File{{Path: "/etc/sandboxd-egress/bundle.pem"}, {Path: "/etc/sandboxd-egressx"}}},
		Sidecars: []runtime.Container{{Name: "side", VolumeMounts: []runtime.VolumeMount{{Volume: "v", Path: "/etc/sandboxd-egress/"}, {Volume: "v", Path: "/data"}},
			Files: []runtime.File{{Path: "/etc/../etc/sandboxd-egress/ca.pem"}}}},
		Network:            &runtime.Network{Egress: []runtime.EgressRule{{DNSName: "a.example.com", Secret: &runtime.EgressSecret{Store: "prod", Path: "api", EnvVar: "A"}}}},
		EgressSecretValues: map[string]string{"prod/api": "v"},
	}
	err := checkEgressSecrets(spec)
	var verr *ValidationError
	if !errors.As(err, &verr) {
		t.Fatalf("err %v, want a *ValidationError", err)
	}
	var got []string
	for _, v := range verr.Violations {
		got = append(got, v.Field)
	}
	want := []string{"spec.containers[0].files[0].path", "spec.containers[1].volume_mounts[0].path", "spec.containers[1].files[0].path"}
	if !slices.Equal(got, want) {
		t.Fatalf("violations %v, want %v", got, want)
	}
	spec.Network, spec.EgressSecretValues = nil, nil
	if err := checkEgressSecrets(spec); err != nil {
		t.Fatalf("without egress secrets: %v", err)
	}
}
