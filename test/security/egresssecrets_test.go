package security

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1/sandboxv1connect"
	settingsv1 "github.com/sandboxd/sandboxd/gen/sandboxd/settings/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/settings/v1/settingsv1connect"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/connecttest"
)

// TestEgressSecretAttacks attacks egress secret injection (docs/secrets.md, "Secrets
// that never enter the sandbox") on a running `sandboxd dev`: a sandbox sees only its
// placeholder; the sandbox CA's key is in no file the sandbox can read (its CA mount
// holds certificates only and is read-only) nor anywhere in the runner's data dir;
// another organization cannot attach org-a's secret; a wildcard host, a framing header
// (Host, Content-Length, …) or a rule without a host name cannot carry a secret. The
// requests themselves (SNI of the injection host with another Host, a URL naming another
// host, a second request for another host on the same connection) are attacked from
// inside a sandbox in test/e2e TestEgressSecretInjection, which has the network
// namespace "internet" the proxy must reach, and at the proxy in internal/egress
// (TestInjectRefusals).
func TestEgressSecretAttacks(t *testing.T) {
	d := needDev(t)
	const value = "egress-sec-value-61c2f0a7"
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	adminA, err := d.NewKey("org-a", "admin")
	if err != nil {
		t.Fatal(err)
	}
	hc := h2cClient()
	opts := func(key string) []connect.ClientOption {
		return []connect.ClientOption{connect.WithGRPC(), connect.WithInterceptors(connecttest.Bearer(key))}
	}
	settings := sandboxv1connect.NewSettingsServiceClient(hc, d.API, opts(adminA)...)
	secrets := settingsv1connect.NewSecretServiceClient(hc, d.API, opts(adminA)...)
	if _, err := settings.CreateSecretStore(ctx, connect.NewRequest(&sandboxv1.CreateSecretStoreRequest{SecretStore: &sandboxv1.SecretStore{Name: "egress"}})); err != nil {
		t.Fatal(err)
	}
	if _, err := secrets.PutSecret(ctx, connect.NewRequest(&settingsv1.PutSecretRequest{StoreName: "egress", Path: "api", Field: "token", Value: value})); err != nil {
		t.Fatal(err)
	}
	sbxA := sandboxv1connect.NewSandboxServiceClient(hc, d.API, opts(d.KeyA)...)
	sbxB := sandboxv1connect.NewSandboxServiceClient(hc, d.API, opts(d.KeyB)...)
	rule := func(host string, sec *sandboxv1.EgressSecretInjection) *sandboxv1.SandboxSpec {
		return &sandboxv1.SandboxSpec{
			Containers: []*sandboxv1.Container{{Name: "main", Image: "busybox", Command: "sleep", Args: []string{"600"}}},
			Network: &sandboxv1.NetworkOptions{Egress: []*sandboxv1.EgressRule{{
				Destination: &sandboxv1.EgressRule_HttpsHostname{HttpsHostname: host}, SandboxdSecret: sec}}},
		}
	}
	create := func(c sandboxv1connect.SandboxServiceClient, sp *sandboxv1.SandboxSpec) (*sandboxv1.Sandbox, error) {
		res, err := c.CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: sp}}))
		if err != nil {
			return nil, err
		}
		id := res.Msg.GetSandboxId()
		t.Cleanup(func() {
			_, _ = c.DeleteSandbox(context.Background(), connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: id}))
		})
		return res.Msg, nil
	}
	sec := func() *sandboxv1.EgressSecretInjection {
		return &sandboxv1.EgressSecretInjection{StoreName: "egress", Path: "api", Field: "token", EnvVar: "API_TOKEN"}
	}

	// Refused shapes, each with its field.
	for name, tc := range map[string]struct {
		sp    *sandboxv1.SandboxSpec
		field string
	}{
		"wildcard host": {rule("*.example.com", sec()), "sandbox.spec.network.egress[0].sandboxd_secret"},
		"host header": {rule("api.example.com", func() *sandboxv1.EgressSecretInjection {
			s := sec()
			s.Header = "Host"
			return s
		}()), "sandbox.spec.network.egress[0].sandboxd_secret.header"},
		"content-length header": {rule("api.example.com", func() *sandboxv1.EgressSecretInjection {
			s := sec()
			s.Header = "content-length"
			return s
		}()), "sandbox.spec.network.egress[0].sandboxd_secret.header"},
		"bad env var": {rule("api.example.com", func() *sandboxv1.EgressSecretInjection {
			s := sec()
			s.EnvVar = "A=B"
			return s
		}()), "sandbox.spec.network.egress[0].sandboxd_secret.env_var"},
		"cidr rule": {&sandboxv1.SandboxSpec{
			Containers: []*sandboxv1.Container{{Name: "main", Image: "busybox", Command: "sleep", Args: []string{"600"}}},
			Network: &sandboxv1.NetworkOptions{Egress: []*sandboxv1.EgressRule{{
				Destination:    &sandboxv1.EgressRule_Cidr{Cidr: &sandboxv1.CidrBlock{Cidr: "203.0.113.0/24"}},
				SandboxdSecret: sec()}}},
		}, "sandbox.spec.network.egress[0].sandboxd_secret"},
	} {
		_, err := create(sbxA, tc.sp)
		if connect.CodeOf(err) != connect.CodeInvalidArgument || !hasViolation(err, tc.field) {
			t.Errorf("%s: %v, want INVALID_ARGUMENT on %s", name, err, tc.field)
		}
	}
	// Another organization cannot use org-a's store: as for a store that does not exist.
	_, err = create(sbxB, rule("api.example.com", sec()))
	if connect.CodeOf(err) != connect.CodeFailedPrecondition || apierr.Reason(err) != apierr.SecretStoreNotProvisioned {
		t.Errorf("org-b: %v (reason %q), want FAILED_PRECONDITION %s", err, apierr.Reason(err), apierr.SecretStoreNotProvisioned)
	}

	// org-a's sandbox: the placeholder only; a CA of certificates, read-only.
	sb, err := create(sbxA, rule("api.example.com", sec()))
	if err != nil {
		t.Fatal(err)
	}
	id := sb.GetSandboxId()
	if st, body := d.wait(t, d.KeyA, id); st != "STATE_RUNNING" {
		t.Fatalf("sandbox %s: %s", st, body)
	}
	out := d.exec(t, d.KeyA, id, `env; cat /proc/1/environ | tr '\0' '\n'; echo ---; ls -a /etc/sandboxd-egress; echo ---; grep -l "PRIVATE KEY" /etc/sandboxd-egress/* || echo no-key; echo x >> /etc/sandboxd-egress/ca.pem 2>/dev/null && echo written || echo write-refused`)
	if strings.Contains(out, value) {
		t.Fatalf("the value is inside the sandbox:\n%s", out)
	}
	if !strings.Contains(out, "API_TOKEN=sbx-secret-") || !strings.Contains(out, "no-key") || !strings.Contains(out, "write-refused") {
		t.Errorf("inside the sandbox:\n%s", out)
	}
	// On the host: the sandbox's dir holds the certificates, no key; nothing in the data
	// dir holds the value.
	caDir := filepath.Join(d.DataDir, "sandboxes", id, "egress-ca")
	ents, err := os.ReadDir(caDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		b, _ := os.ReadFile(filepath.Join(caDir, e.Name()))
		if strings.Contains(string(b), "PRIVATE KEY") {
			t.Errorf("%s holds a private key", e.Name())
		}
	}
	var hits []string
	_ = filepath.WalkDir(d.DataDir, func(p string, de os.DirEntry, err error) error {
		if err != nil || !de.Type().IsRegular() {
			return nil
		}
		if st, err := de.Info(); err != nil || st.Size() > 64<<20 {
			return nil
		}
		if b, err := os.ReadFile(p); err == nil && strings.Contains(string(b), value) {
			hits = append(hits, p)
		}
		return nil
	})
	if len(hits) > 0 {
		t.Errorf("the value is in files of the data dir: %v", hits)
	}
	if log, err := os.ReadFile(d.Log); err == nil && strings.Contains(string(log), value) {
		t.Error("the value is in the server's log")
	}
}

// hasViolation reports whether err carries a field violation on field.
func hasViolation(err error, field string) bool {
	for _, v := range apierr.Violations(err) {
		if v.Field == field {
			return true
		}
	}
	return false
}
