package gateway

import (
	"strings"
	"testing"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	settingsv1 "github.com/sandboxd/sandboxd/gen/sandboxd/settings/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// TestKubernetesSecretStoreAtCreate: a KUBERNETES store's references reach the runner as
// references (runtime.SecretRef), never as values; PutSecret into one is refused, as is a
// reference without a field and pull credentials from one.
func TestKubernetesSecretStoreAtCreate(t *testing.T) {
	s, r, _ := secretsServer(t, SecretOptions{})
	admin, user := secretCtx("acme", auth.RoleAdmin), secretCtx("acme", auth.RoleUser)
	kube := sandboxv1.SecretStoreProviderType_SECRET_STORE_PROVIDER_TYPE_KUBERNETES
	res, err := s.CreateSecretStore(admin, connect.NewRequest(&sandboxv1.CreateSecretStoreRequest{SecretStore: &sandboxv1.SecretStore{Name: "kube", ProviderType: kube}}))
	if err != nil || res.Msg.GetProviderType() != kube {
		t.Fatalf("create KUBERNETES store: %v %v", res, err)
	}
	_, err = (secretService{s}).PutSecret(admin, connect.NewRequest(&settingsv1.PutSecretRequest{StoreName: "kube", Path: "db", Field: "password", Value: "v"}))
	wantSecretErr(t, "PutSecret into a KUBERNETES store", err, connect.CodeFailedPrecondition, apierr.SecretStoreProviderUnsupported)

	ref := func(path, field, env string) []*sandboxv1.SecretStoreReference {
		return []*sandboxv1.SecretStoreReference{{StoreName: "kube", Secrets: []*sandboxv1.SecretMapping{{Path: path, Field: field, EnvVar: env}}}}
	}
	sb, err := createSecretSandbox(s, user, &sandboxv1.Container{Image: "busybox", SecretStores: ref("db-creds", "password", "DB_PASSWORD")})
	if err != nil {
		t.Fatal(err)
	}
	r.mu.Lock()
	got := r.got[sb.GetSandboxId()].Spec
	r.mu.Unlock()
	want := runtime.SecretRef{EnvVar: "DB_PASSWORD", Store: "kube", Secret: "db-creds", Key: "password"}
	if len(got.SecretRefs) != 1 || got.SecretRefs[0] != want || len(got.SecretEnv) != 0 {
		t.Fatalf("runner spec: refs %+v, %d secret env", got.SecretRefs, len(got.SecretEnv))
	}
	_, err = createSecretSandbox(s, user, &sandboxv1.Container{Image: "busybox", SecretStores: ref("db-creds", "", "DB_PASSWORD")})
	wantSecretErr(t, "no field", err, connect.CodeFailedPrecondition, apierr.SecretNotProvisioned)
	if !strings.Contains(err.Error(), "key of the Secret") {
		t.Errorf("no field: %v", err)
	}
	_, err = createSecretSandbox(s, user, &sandboxv1.Container{Image: "reg.example:5000/app:1",
		ImagePullCredentials: &sandboxv1.ImagePullCredentials{Registry: "reg.example:5000", Credentials: &sandboxv1.SecretSource{StoreName: "kube", Path: "pull", Field: "x"}}})
	wantSecretErr(t, "pull credentials", err, connect.CodeInvalidArgument, apierr.InvalidRequest)
}
