package security

import (
	"bytes"
	"context"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1/sandboxv1connect"
	settingsv1 "github.com/sandboxd/sandboxd/gen/sandboxd/settings/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/settings/v1/settingsv1connect"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/connecttest"
)

// TestSecretStoresScopedAndWriteOnly attacks the built-in secret stores (issue 23 point
// 2, docs/secrets.md) of a running `sandboxd dev`: another organization cannot see, list,
// write, delete or use org-a's store (every call answers as for a store that does not
// exist); a user key of org-a cannot write; no API response (gRPC or REST) carries the
// value, not even to org-a's admin; and the value is nowhere in the data dir (store,
// runner state, agent configs) or the server's log, also while a sandbox uses it.
func TestSecretStoresScopedAndWriteOnly(t *testing.T) {
	d := needDev(t)
	const value = "sec-test-value-2b8e41d0"
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	adminA, err := d.NewKey("org-a", "admin")
	if err != nil {
		t.Fatal(err)
	}
	adminB, err := d.NewKey("org-b", "admin")
	if err != nil {
		t.Fatal(err)
	}
	hc := h2cClient()
	opts := func(key string) []connect.ClientOption {
		return []connect.ClientOption{connect.WithGRPC(), connect.WithInterceptors(connecttest.Bearer(key))}
	}
	settings := func(key string) sandboxv1connect.SettingsServiceClient {
		return sandboxv1connect.NewSettingsServiceClient(hc, d.API, opts(key)...)
	}
	secrets := func(key string) settingsv1connect.SecretServiceClient {
		return settingsv1connect.NewSecretServiceClient(hc, d.API, opts(key)...)
	}
	if _, err := settings(adminA).CreateSecretStore(ctx, connect.NewRequest(&sandboxv1.CreateSecretStoreRequest{SecretStore: &sandboxv1.SecretStore{Name: "vault"}})); err != nil {
		t.Fatal(err)
	}
	if _, err := secrets(adminA).PutSecret(ctx, connect.NewRequest(&settingsv1.PutSecretRequest{StoreName: "vault", Path: "api", Field: "token", Value: value})); err != nil {
		t.Fatal(err)
	}
	want := func(what string, err error, code connect.Code, reason string) {
		t.Helper()
		if connect.CodeOf(err) != code || apierr.Reason(err) != reason {
			t.Errorf("%s: %v (reason %q), want %v %s", what, err, apierr.Reason(err), code, reason)
		}
	}

	// org-b, even as admin, sees nothing of org-a's store.
	_, err = settings(adminB).GetSecretStore(ctx, connect.NewRequest(&sandboxv1.GetSecretStoreRequest{Name: "vault"}))
	want("org-b get", err, connect.CodeNotFound, apierr.SecretStoreNotFound)
	if l, err := settings(adminB).ListSecretStores(ctx, connect.NewRequest(&sandboxv1.ListSecretStoresRequest{})); err != nil || len(l.Msg.GetSecretStores()) != 0 {
		t.Errorf("org-b list stores = %v, %v", l, err)
	}
	_, err = secrets(adminB).ListSecrets(ctx, connect.NewRequest(&settingsv1.ListSecretsRequest{StoreName: "vault"}))
	want("org-b list secrets", err, connect.CodeNotFound, apierr.SecretStoreNotFound)
	_, err = secrets(adminB).PutSecret(ctx, connect.NewRequest(&settingsv1.PutSecretRequest{StoreName: "vault", Path: "api", Field: "token", Value: "overwritten"}))
	want("org-b put", err, connect.CodeFailedPrecondition, apierr.SecretStoreNotProvisioned)
	_, err = secrets(adminB).DeleteSecret(ctx, connect.NewRequest(&settingsv1.DeleteSecretRequest{StoreName: "vault", Path: "api", Field: "token"}))
	want("org-b delete secret", err, connect.CodeNotFound, apierr.SecretStoreNotFound)
	_, err = settings(adminB).DeleteSecretStore(ctx, connect.NewRequest(&sandboxv1.DeleteSecretStoreRequest{Name: "vault"}))
	want("org-b delete store", err, connect.CodeNotFound, apierr.SecretStoreNotFound)
	// ... and cannot use it in a sandbox.
	use := &sandboxv1.SandboxSpec{Containers: []*sandboxv1.Container{{Name: "main", Image: "busybox", Command: "/bin/sh",
		Args:         []string{"-c", `trap "exit 0" TERM; sleep infinity & wait`},
		SecretStores: []*sandboxv1.SecretStoreReference{{StoreName: "vault", Secrets: []*sandboxv1.SecretMapping{{Path: "api", Field: "token", EnvVar: "TOKEN"}}}}}}}
	_, err = sandboxv1connect.NewSandboxServiceClient(hc, d.API, opts(d.KeyB)...).CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: use}}))
	want("org-b uses org-a's store", err, connect.CodeFailedPrecondition, apierr.SecretStoreNotProvisioned)
	// A user key of org-a cannot write.
	_, err = secrets(d.KeyA).PutSecret(ctx, connect.NewRequest(&settingsv1.PutSecretRequest{StoreName: "vault", Path: "api", Field: "token", Value: "x"}))
	want("org-a user put", err, connect.CodePermissionDenied, apierr.PermissionDenied)
	_, err = settings(d.KeyA).DeleteSecretStore(ctx, connect.NewRequest(&sandboxv1.DeleteSecretStoreRequest{Name: "vault"}))
	want("org-a user delete", err, connect.CodePermissionDenied, apierr.PermissionDenied)

	// org-a's sandbox gets it (the control), and no response carries it.
	sbc := sandboxv1connect.NewSandboxServiceClient(hc, d.API, opts(d.KeyA)...)
	created, err := sbc.CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: use}}))
	if err != nil {
		t.Fatal(err)
	}
	id := created.Msg.GetSandboxId()
	t.Cleanup(func() {
		_, _ = sbc.DeleteSandbox(context.Background(), connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: id}))
	})
	var env string
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		ex, err := sbc.Exec(ctx, connect.NewRequest(&sandboxv1.ExecRequest{SandboxId: id, Command: []string{"env"}}))
		if err == nil {
			env = string(ex.Msg.GetStdout())
			break
		}
	}
	if !strings.Contains(env, "TOKEN="+value) {
		t.Fatalf("the sandbox's env lacks the secret: %q", env)
	}
	responses := []string{}
	for _, m := range []interface{ String() string }{created.Msg} {
		responses = append(responses, m.String())
	}
	if g, err := sbc.GetSandbox(ctx, connect.NewRequest(&sandboxv1.GetSandboxRequest{SandboxId: id})); err == nil {
		b, _ := protojson.Marshal(g.Msg)
		responses = append(responses, string(b))
	}
	if g, err := settings(adminA).GetSecretStore(ctx, connect.NewRequest(&sandboxv1.GetSecretStoreRequest{Name: "vault"})); err == nil {
		responses = append(responses, g.Msg.String())
	}
	if l, err := secrets(adminA).ListSecrets(ctx, connect.NewRequest(&settingsv1.ListSecretsRequest{StoreName: "vault"})); err == nil {
		responses = append(responses, l.Msg.String())
	}
	for _, path := range []string{"/v1/settings/secretStores", "/v1/settings/secretStores/vault", "/v1/settings/secretStores/vault/secrets", "/v1/sandboxes/" + id} {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, d.API+path, nil)
		req.Header.Set("Authorization", "Bearer "+adminA)
		res, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(io.LimitReader(res.Body, 1<<20))
		res.Body.Close()
		responses = append(responses, string(b))
	}
	for _, r := range responses {
		if strings.Contains(r, value) {
			t.Fatalf("an API response carries the value: %s", r)
		}
	}
	// Nowhere at rest or in the log, while the sandbox runs.
	_ = filepath.WalkDir(d.DataDir, func(p string, de fs.DirEntry, err error) error {
		if err != nil || !de.Type().IsRegular() {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return nil
		}
		defer f.Close()
		b, _ := io.ReadAll(io.LimitReader(f, 64<<20))
		if bytes.Contains(b, []byte(value)) {
			t.Errorf("the value is at rest in %s", p)
		}
		return nil
	})
	if b, _ := os.ReadFile(d.Log); bytes.Contains(b, []byte(value)) {
		t.Error("the value is in the server's log")
	}
}
