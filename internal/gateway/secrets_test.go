package gateway

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	settingsv1 "github.com/sandboxd/sandboxd/gen/sandboxd/settings/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/secretbox"
	"github.com/sandboxd/sandboxd/internal/store"
)

const secretValue = "s3cr3t-value-0f-acme-4711"

func secretsServer(t *testing.T, o SecretOptions) (*Server, *acceptingRunner, store.Store) {
	t.Helper()
	st := openFSSStore(t)
	keys, err := auth.OpenKeyring(filepath.Join(t.TempDir(), "keys.json"))
	if err != nil {
		t.Fatal(err)
	}
	ring, err := secretbox.LoadOrCreate(filepath.Join(t.TempDir(), secretbox.DefaultFile))
	if err != nil {
		t.Fatal(err)
	}
	o.Store, o.Keys = st.SecretStores(), ring
	r := &acceptingRunner{id: "r1"}
	s, err := New(Config{Auth: keys, Runners: []runner.Handle{r}, Logger: quietLog(), Secrets: o})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s, r, st
}

func secretCtx(org string, role auth.Role) context.Context {
	return auth.WithPrincipal(context.Background(), auth.Principal{KeyID: string(role) + "-" + org, Org: org, Role: role})
}

func wantSecretErr(t *testing.T, what string, err error, code connect.Code, reason string) {
	t.Helper()
	if connect.CodeOf(err) != code || apierr.Reason(err) != reason {
		t.Fatalf("%s: got %v (reason %q), want %v %s", what, err, apierr.Reason(err), code, reason)
	}
}

func mkStore(t *testing.T, s *Server, org, name string) {
	t.Helper()
	if _, err := s.CreateSecretStore(secretCtx(org, auth.RoleAdmin), connect.NewRequest(&sandboxv1.CreateSecretStoreRequest{SecretStore: &sandboxv1.SecretStore{Name: name}})); err != nil {
		t.Fatalf("create store %s/%s: %v", org, name, err)
	}
}

func putSecret(t *testing.T, s *Server, org, st, path, field, value string) {
	t.Helper()
	if _, err := (secretService{s}).PutSecret(secretCtx(org, auth.RoleAdmin), connect.NewRequest(&settingsv1.PutSecretRequest{StoreName: st, Path: path, Field: field, Value: value})); err != nil {
		t.Fatalf("put %s %s#%s: %v", st, path, field, err)
	}
}

func TestSecretStoreCRUD(t *testing.T) {
	s, _, _ := secretsServer(t, SecretOptions{MaxStores: 2})
	admin, user := secretCtx("acme", auth.RoleAdmin), secretCtx("acme", auth.RoleUser)
	create := func(ctx context.Context, st *sandboxv1.SecretStore, rid string) (*sandboxv1.SecretStore, error) {
		res, err := s.CreateSecretStore(ctx, connect.NewRequest(&sandboxv1.CreateSecretStoreRequest{SecretStore: st, RequestId: rid}))
		if err != nil {
			return nil, err
		}
		return res.Msg, nil
	}
	// Writes need an admin.
	_, err := create(user, &sandboxv1.SecretStore{Name: "prod"}, "")
	wantSecretErr(t, "user create", err, connect.CodePermissionDenied, apierr.PermissionDenied)
	// The built-in provider: UNSPECIFIED or SANDBOXD; WANDB is refused with its reason.
	got, err := create(admin, &sandboxv1.SecretStore{Name: "prod"}, "req-1")
	if err != nil || got.GetName() != "prod" || got.GetCreateTime() == nil {
		t.Fatalf("create = %v, %v", got, err)
	}
	_, err = create(admin, &sandboxv1.SecretStore{Name: "wb", ProviderType: sandboxv1.SecretStoreProviderType_SECRET_STORE_PROVIDER_TYPE_WANDB}, "")
	wantSecretErr(t, "wandb", err, connect.CodeFailedPrecondition, apierr.SecretStoreProviderUnsupported)
	_, err = create(admin, &sandboxv1.SecretStore{Name: "x", ProviderType: 7}, "")
	wantSecretErr(t, "unknown provider", err, connect.CodeInvalidArgument, apierr.InvalidRequest)
	_, err = create(admin, &sandboxv1.SecretStore{Name: "x", ProviderConfig: &sandboxv1.SecretStore_Wandb{Wandb: &sandboxv1.WandBStoreConfig{Team: "t"}}}, "")
	wantSecretErr(t, "wandb config", err, connect.CodeInvalidArgument, apierr.InvalidRequest)
	// Name rules.
	for _, bad := range []string{"", "Prod", "-a", "a-", "a/b", "a b", strings.Repeat("a", 64), "a\x00"} {
		_, err = create(admin, &sandboxv1.SecretStore{Name: bad}, "")
		wantSecretErr(t, "name "+bad, err, connect.CodeInvalidArgument, apierr.InvalidRequest)
	}
	_, err = create(admin, nil, "")
	wantSecretErr(t, "no body", err, connect.CodeInvalidArgument, apierr.InvalidRequest)
	// request_id: the same request returns the same store; another request conflicts.
	again, err := create(admin, &sandboxv1.SecretStore{Name: "prod"}, "req-1")
	if err != nil || !proto.Equal(again, got) {
		t.Fatalf("replay = %v, %v", again, err)
	}
	_, err = create(admin, &sandboxv1.SecretStore{Name: "dev"}, "req-1")
	wantSecretErr(t, "request_id reuse", err, connect.CodeInvalidArgument, apierr.RequestIDConflict)
	_, err = create(admin, &sandboxv1.SecretStore{Name: "prod"}, "")
	wantSecretErr(t, "taken name", err, connect.CodeAlreadyExists, apierr.AlreadyExists)
	sd := sandboxv1.SecretStoreProviderType_SECRET_STORE_PROVIDER_TYPE_SANDBOXD
	if dev, err := create(admin, &sandboxv1.SecretStore{Name: "dev", ProviderType: sd}, ""); err != nil || dev.GetProviderType() != sd {
		t.Fatalf("sandboxd provider = %v, %v", dev, err)
	}
	_, err = create(admin, &sandboxv1.SecretStore{Name: "third"}, "")
	wantSecretErr(t, "stores per org", err, connect.CodeResourceExhausted, apierr.SecretLimitExceeded)

	// Reads: any key of the organization; another organization sees nothing.
	if g, err := s.GetSecretStore(user, connect.NewRequest(&sandboxv1.GetSecretStoreRequest{Name: "prod"})); err != nil || g.Msg.GetName() != "prod" {
		t.Fatalf("get = %v, %v", g, err)
	}
	_, err = s.GetSecretStore(secretCtx("globex", auth.RoleAdmin), connect.NewRequest(&sandboxv1.GetSecretStoreRequest{Name: "prod"}))
	wantSecretErr(t, "other org get", err, connect.CodeNotFound, apierr.SecretStoreNotFound)
	l, err := s.ListSecretStores(user, connect.NewRequest(&sandboxv1.ListSecretStoresRequest{PageSize: 1}))
	if err != nil || len(l.Msg.GetSecretStores()) != 1 || l.Msg.GetSecretStores()[0].GetName() != "dev" || l.Msg.GetNextPageToken() == "" {
		t.Fatalf("list = %v, %v", l, err)
	}
	l, err = s.ListSecretStores(user, connect.NewRequest(&sandboxv1.ListSecretStoresRequest{PageSize: 1, PageToken: l.Msg.GetNextPageToken()}))
	if err != nil || len(l.Msg.GetSecretStores()) != 1 || l.Msg.GetSecretStores()[0].GetName() != "prod" || l.Msg.GetNextPageToken() != "" {
		t.Fatalf("list 2 = %v, %v", l, err)
	}
	if l, err := s.ListSecretStores(secretCtx("globex", auth.RoleUser), connect.NewRequest(&sandboxv1.ListSecretStoresRequest{})); err != nil || len(l.Msg.GetSecretStores()) != 0 {
		t.Fatalf("globex list = %v, %v", l, err)
	}
	_, err = s.ListSecretStores(user, connect.NewRequest(&sandboxv1.ListSecretStoresRequest{PageToken: "garbage!"}))
	wantSecretErr(t, "bad token", err, connect.CodeInvalidArgument, apierr.InvalidRequest)

	// Update: provider_type only, between the built-in's two names.
	up := func(ctx context.Context, st *sandboxv1.SecretStore, paths ...string) (*sandboxv1.SecretStore, error) {
		req := &sandboxv1.UpdateSecretStoreRequest{SecretStore: st}
		if paths != nil {
			req.UpdateMask = &fieldmaskpb.FieldMask{Paths: paths}
		}
		res, err := s.UpdateSecretStore(ctx, connect.NewRequest(req))
		if err != nil {
			return nil, err
		}
		return res.Msg, nil
	}
	if u, err := up(admin, &sandboxv1.SecretStore{Name: "prod", ProviderType: sd}, "provider_type"); err != nil || u.GetProviderType() != sd {
		t.Fatalf("update = %v, %v", u, err)
	}
	_, err = up(user, &sandboxv1.SecretStore{Name: "prod"})
	wantSecretErr(t, "user update", err, connect.CodePermissionDenied, apierr.PermissionDenied)
	_, err = up(admin, &sandboxv1.SecretStore{Name: "prod", ProviderType: sandboxv1.SecretStoreProviderType_SECRET_STORE_PROVIDER_TYPE_WANDB})
	wantSecretErr(t, "update to wandb", err, connect.CodeFailedPrecondition, apierr.SecretStoreProviderUnsupported)
	_, err = up(admin, &sandboxv1.SecretStore{Name: "prod"}, "name")
	wantSecretErr(t, "update name", err, connect.CodeInvalidArgument, apierr.InvalidRequest)
	_, err = up(admin, &sandboxv1.SecretStore{Name: "prod"}, "bogus")
	wantSecretErr(t, "update bogus", err, connect.CodeInvalidArgument, apierr.InvalidRequest)
	_, err = up(secretCtx("globex", auth.RoleAdmin), &sandboxv1.SecretStore{Name: "prod"})
	wantSecretErr(t, "other org update", err, connect.CodeNotFound, apierr.SecretStoreNotFound)

	// Delete.
	del := func(ctx context.Context, name string, allowMissing bool) error {
		_, err := s.DeleteSecretStore(ctx, connect.NewRequest(&sandboxv1.DeleteSecretStoreRequest{Name: name, AllowMissing: allowMissing}))
		return err
	}
	wantSecretErr(t, "user delete", del(user, "dev", false), connect.CodePermissionDenied, apierr.PermissionDenied)
	wantSecretErr(t, "other org delete", del(secretCtx("globex", auth.RoleAdmin), "dev", false), connect.CodeNotFound, apierr.SecretStoreNotFound)
	if err := del(secretCtx("globex", auth.RoleAdmin), "dev", true); err != nil {
		t.Fatalf("allow_missing: %v", err)
	}
	if err := del(admin, "dev", false); err != nil {
		t.Fatal(err)
	}
	wantSecretErr(t, "delete twice", del(admin, "dev", false), connect.CodeNotFound, apierr.SecretStoreNotFound)

	// Off: UNIMPLEMENTED.
	bare, _ := New(Config{Auth: s.auth, Runners: s.runners, Logger: quietLog()})
	t.Cleanup(bare.Close)
	_, err = bare.CreateSecretStore(admin, connect.NewRequest(&sandboxv1.CreateSecretStoreRequest{SecretStore: &sandboxv1.SecretStore{Name: "prod"}}))
	wantSecretErr(t, "no store", err, connect.CodeUnimplemented, apierr.NotImplemented)
}

func TestSecretValues(t *testing.T) {
	s, _, st := secretsServer(t, SecretOptions{MaxSecretsPerStore: 2, MaxValueBytes: 64})
	svc := secretService{s}
	admin, user := secretCtx("acme", auth.RoleAdmin), secretCtx("acme", auth.RoleUser)
	mkStore(t, s, "acme", "prod")
	put := func(ctx context.Context, r *settingsv1.PutSecretRequest) (*settingsv1.Secret, error) {
		res, err := svc.PutSecret(ctx, connect.NewRequest(r))
		if err != nil {
			return nil, err
		}
		return res.Msg, nil
	}
	x, err := put(admin, &settingsv1.PutSecretRequest{StoreName: "prod", Path: "db/main", Field: "password", Value: secretValue})
	if err != nil || x.GetPath() != "db/main" || x.GetField() != "password" || x.GetCreateTime() == nil {
		t.Fatalf("put = %v, %v", x, err)
	}
	// The response carries no value (the message has no such field; check the bytes too).
	if b, _ := proto.Marshal(x); strings.Contains(string(b), secretValue) {
		t.Fatal("PutSecret returns the value")
	}
	// Refusals, each with its reason; none quotes the value.
	for name, c := range map[string]struct {
		ctx    context.Context
		req    *settingsv1.PutSecretRequest
		code   connect.Code
		reason string
	}{
		"user":          {user, &settingsv1.PutSecretRequest{StoreName: "prod", Path: "a", Value: secretValue}, connect.CodePermissionDenied, apierr.PermissionDenied},
		"no store":      {admin, &settingsv1.PutSecretRequest{StoreName: "nope", Path: "a", Value: secretValue}, connect.CodeFailedPrecondition, apierr.SecretStoreNotProvisioned},
		"other org":     {secretCtx("globex", auth.RoleAdmin), &settingsv1.PutSecretRequest{StoreName: "prod", Path: "a", Value: secretValue}, connect.CodeFailedPrecondition, apierr.SecretStoreNotProvisioned},
		"bad store":     {admin, &settingsv1.PutSecretRequest{StoreName: "../x", Path: "a", Value: secretValue}, connect.CodeInvalidArgument, apierr.InvalidRequest},
		"no path":       {admin, &settingsv1.PutSecretRequest{StoreName: "prod", Value: secretValue}, connect.CodeInvalidArgument, apierr.InvalidRequest},
		"dotdot path":   {admin, &settingsv1.PutSecretRequest{StoreName: "prod", Path: "a/../b", Value: secretValue}, connect.CodeInvalidArgument, apierr.InvalidRequest},
		"empty segment": {admin, &settingsv1.PutSecretRequest{StoreName: "prod", Path: "a//b", Value: secretValue}, connect.CodeInvalidArgument, apierr.InvalidRequest},
		"long path":     {admin, &settingsv1.PutSecretRequest{StoreName: "prod", Path: strings.Repeat("a", 257), Value: secretValue}, connect.CodeInvalidArgument, apierr.InvalidRequest},
		"bad field":     {admin, &settingsv1.PutSecretRequest{StoreName: "prod", Path: "a", Field: "a b", Value: secretValue}, connect.CodeInvalidArgument, apierr.InvalidRequest},
		"too big":       {admin, &settingsv1.PutSecretRequest{StoreName: "prod", Path: "a", Value: secretValue + strings.Repeat("x", 64)}, connect.CodeInvalidArgument, apierr.InvalidRequest},
		"nul":           {admin, &settingsv1.PutSecretRequest{StoreName: "prod", Path: "a", Value: secretValue + "\x00"}, connect.CodeInvalidArgument, apierr.InvalidRequest},
	} {
		_, err := put(c.ctx, c.req)
		wantSecretErr(t, name, err, c.code, c.reason)
		if strings.Contains(err.Error(), secretValue) {
			t.Fatalf("%s: the error quotes the value: %v", name, err)
		}
	}
	if _, err := put(admin, &settingsv1.PutSecretRequest{StoreName: "prod", Path: "db/main", Field: "user", Value: "u"}); err != nil {
		t.Fatal(err)
	}
	_, err = put(admin, &settingsv1.PutSecretRequest{StoreName: "prod", Path: "db/third", Value: "v"})
	wantSecretErr(t, "secrets per store", err, connect.CodeResourceExhausted, apierr.SecretLimitExceeded)
	// Replacing an existing one is not a new secret.
	if _, err := put(admin, &settingsv1.PutSecretRequest{StoreName: "prod", Path: "db/main", Field: "password", Value: secretValue}); err != nil {
		t.Fatal(err)
	}
	// List: addresses, never values; any key of the org; not another org.
	l, err := svc.ListSecrets(user, connect.NewRequest(&settingsv1.ListSecretsRequest{StoreName: "prod"}))
	if err != nil || len(l.Msg.GetSecrets()) != 2 {
		t.Fatalf("list = %v, %v", l, err)
	}
	if b, _ := protojson.Marshal(l.Msg); strings.Contains(string(b), secretValue) {
		t.Fatal("ListSecrets returns a value")
	}
	_, err = svc.ListSecrets(secretCtx("globex", auth.RoleAdmin), connect.NewRequest(&settingsv1.ListSecretsRequest{StoreName: "prod"}))
	wantSecretErr(t, "other org list", err, connect.CodeNotFound, apierr.SecretStoreNotFound)
	// At rest the store holds the ciphertext only.
	raw, err := st.SecretStores().GetSecret(t.Context(), "acme", "prod", "db/main", "password")
	if err != nil || strings.Contains(string(raw.Ciphertext), secretValue) || raw.KeyID != s.secrets.Keys.CurrentID() {
		t.Fatalf("stored %+v, %v", raw, err)
	}
	// A ciphertext moved to another row does not open (associated data).
	if _, err := s.secrets.Keys.Open(raw.KeyID, raw.Ciphertext, secretbox.AD("acme", "prod", "db/main", "user")); err == nil {
		t.Fatal("a ciphertext opens for another row")
	}
	// Delete.
	del := func(ctx context.Context, r *settingsv1.DeleteSecretRequest) error {
		_, err := svc.DeleteSecret(ctx, connect.NewRequest(r))
		return err
	}
	wantSecretErr(t, "user delete", del(user, &settingsv1.DeleteSecretRequest{StoreName: "prod", Path: "db/main", Field: "user"}), connect.CodePermissionDenied, apierr.PermissionDenied)
	wantSecretErr(t, "other org delete", del(secretCtx("globex", auth.RoleAdmin), &settingsv1.DeleteSecretRequest{StoreName: "prod", Path: "db/main", Field: "user"}), connect.CodeNotFound, apierr.SecretStoreNotFound)
	if err := del(admin, &settingsv1.DeleteSecretRequest{StoreName: "prod", Path: "db/main", Field: "user"}); err != nil {
		t.Fatal(err)
	}
	wantSecretErr(t, "delete twice", del(admin, &settingsv1.DeleteSecretRequest{StoreName: "prod", Path: "db/main", Field: "user"}), connect.CodeNotFound, apierr.SecretNotFound)
	if err := del(admin, &settingsv1.DeleteSecretRequest{StoreName: "prod", Path: "db/main", Field: "user", AllowMissing: true}); err != nil {
		t.Fatal(err)
	}
}

func createSecretSandbox(s *Server, ctx context.Context, c *sandboxv1.Container) (*sandboxv1.Sandbox, error) {
	res, err := s.CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: &sandboxv1.SandboxSpec{Containers: []*sandboxv1.Container{c}}}}))
	if err != nil {
		return nil, err
	}
	return res.Msg, nil
}

func TestSecretsAtCreate(t *testing.T) {
	s, r, _ := secretsServer(t, SecretOptions{})
	mkStore(t, s, "acme", "prod")
	putSecret(t, s, "acme", "prod", "db/main", "password", secretValue)
	putSecret(t, s, "acme", "prod", "registry", "", `{"username":"puller","password":"pull-pass-0815"}`)
	putSecret(t, s, "acme", "prod", "registry2", "username", "u2")
	putSecret(t, s, "acme", "prod", "registry2", "password", "p2")
	user := secretCtx("acme", auth.RoleUser)
	ref := func(st, path, field, env string) []*sandboxv1.SecretStoreReference {
		return []*sandboxv1.SecretStoreReference{{StoreName: st, Secrets: []*sandboxv1.SecretMapping{{Path: path, Field: field, EnvVar: env}}}}
	}
	sb, err := createSecretSandbox(s, user, &sandboxv1.Container{Image: "reg.example:5000/app:1", SecretStores: ref("prod", "db/main", "password", "DB_PASSWORD"),
		ImagePullCredentials: &sandboxv1.ImagePullCredentials{Registry: "reg.example:5000", Credentials: &sandboxv1.SecretSource{StoreName: "prod", Path: "registry"}}})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	// The runner got the value in the secret environment and the pull credentials.
	r.mu.Lock()
	got := r.got[sb.GetSandboxId()].Spec
	r.mu.Unlock()
	if got.SecretEnv["DB_PASSWORD"] != secretValue || got.Env["DB_PASSWORD"] != "" {
		t.Fatalf("runner spec env %v secret env keys %d", got.Env, len(got.SecretEnv))
	}
	if c := got.PullCredentials; c == nil || c.Username != "puller" || c.Password != "pull-pass-0815" {
		t.Fatalf("pull credentials %+v", c)
	}
	// The create response and GetSandbox keep the references only.
	g, err := s.GetSandbox(user, connect.NewRequest(&sandboxv1.GetSandboxRequest{SandboxId: sb.GetSandboxId()}))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []proto.Message{sb, g.Msg} {
		b, _ := protojson.Marshal(m)
		if strings.Contains(string(b), secretValue) || strings.Contains(string(b), "pull-pass-0815") {
			t.Fatalf("a value in %s", b)
		}
		if !strings.Contains(string(b), "DB_PASSWORD") {
			t.Fatalf("the reference is gone: %s", b)
		}
	}
	// The index keeps references only.
	rec, ok := s.index.get(context.Background(), "acme", sb.GetSandboxId())
	if !ok {
		t.Fatal("not indexed")
	}
	if b, _ := proto.Marshal(rec.spec); strings.Contains(string(b), secretValue) {
		t.Fatal("the indexed spec holds the value")
	}
	// Pull credentials from username/password fields.
	if _, err := createSecretSandbox(s, user, &sandboxv1.Container{Image: "reg.example:5000/app:1",
		ImagePullCredentials: &sandboxv1.ImagePullCredentials{Registry: "reg.example:5000", Credentials: &sandboxv1.SecretSource{StoreName: "prod", Path: "registry2"}}}); err != nil {
		t.Fatalf("fields: %v", err)
	}

	// Refusals.
	for name, c := range map[string]struct {
		ctx    context.Context
		c      *sandboxv1.Container
		code   connect.Code
		reason string
		field  string
	}{
		"unknown store": {user, &sandboxv1.Container{Image: "busybox", SecretStores: ref("nope", "db/main", "password", "X")},
			connect.CodeFailedPrecondition, apierr.SecretStoreNotProvisioned, "sandbox.spec.containers[0].secret_stores[0].store_name"},
		"another org's store": {secretCtx("globex", auth.RoleUser), &sandboxv1.Container{Image: "busybox", SecretStores: ref("prod", "db/main", "password", "X")},
			connect.CodeFailedPrecondition, apierr.SecretStoreNotProvisioned, "sandbox.spec.containers[0].secret_stores[0].store_name"},
		"unknown path": {user, &sandboxv1.Container{Image: "busybox", SecretStores: ref("prod", "db/other", "password", "X")},
			connect.CodeFailedPrecondition, apierr.SecretNotProvisioned, "sandbox.spec.containers[0].secret_stores[0].secrets[0]"},
		"unknown field": {user, &sandboxv1.Container{Image: "busybox", SecretStores: ref("prod", "db/main", "user", "X")},
			connect.CodeFailedPrecondition, apierr.SecretNotProvisioned, "sandbox.spec.containers[0].secret_stores[0].secrets[0]"},
		"bad env var": {user, &sandboxv1.Container{Image: "busybox", SecretStores: ref("prod", "db/main", "password", "1X")},
			connect.CodeInvalidArgument, apierr.InvalidRequest, "sandbox.spec.containers[0].secret_stores[0].secrets[0].env_var"},
		"env var also plain": {user, &sandboxv1.Container{Image: "busybox", EnvironmentVariables: map[string]string{"X": "1"}, SecretStores: ref("prod", "db/main", "password", "X")},
			connect.CodeInvalidArgument, apierr.InvalidRequest, "sandbox.spec.containers[0].secret_stores[0].secrets[0].env_var"},
		"no secrets": {user, &sandboxv1.Container{Image: "busybox", SecretStores: []*sandboxv1.SecretStoreReference{{StoreName: "prod"}}},
			connect.CodeInvalidArgument, apierr.InvalidRequest, "sandbox.spec.containers[0].secret_stores[0].secrets"},
		"bad path": {user, &sandboxv1.Container{Image: "busybox", SecretStores: ref("prod", "../etc", "", "X")},
			connect.CodeInvalidArgument, apierr.InvalidRequest, "sandbox.spec.containers[0].secret_stores[0].secrets[0].path"},
		"registry mismatch": {user, &sandboxv1.Container{Image: "busybox",
			ImagePullCredentials: &sandboxv1.ImagePullCredentials{Registry: "reg.example:5000", Credentials: &sandboxv1.SecretSource{StoreName: "prod", Path: "registry"}}},
			connect.CodeInvalidArgument, apierr.InvalidRequest, "sandbox.spec.containers[0].image_pull_credentials.registry"},
		"pull store unknown": {user, &sandboxv1.Container{Image: "reg.example:5000/app:1",
			ImagePullCredentials: &sandboxv1.ImagePullCredentials{Registry: "reg.example:5000", Credentials: &sandboxv1.SecretSource{StoreName: "nope", Path: "registry"}}},
			connect.CodeFailedPrecondition, apierr.SecretStoreNotProvisioned, "sandbox.spec.containers[0].image_pull_credentials.credentials.store_name"},
		"pull value not a credential": {user, &sandboxv1.Container{Image: "reg.example:5000/app:1",
			ImagePullCredentials: &sandboxv1.ImagePullCredentials{Registry: "reg.example:5000", Credentials: &sandboxv1.SecretSource{StoreName: "prod", Path: "registry2", Field: "username"}}},
			connect.CodeFailedPrecondition, apierr.SecretNotProvisioned, "sandbox.spec.containers[0].image_pull_credentials.credentials"},
	} {
		_, err := createSecretSandbox(s, c.ctx, c.c)
		wantSecretErr(t, name, err, c.code, c.reason)
		if vs := apierr.Violations(err); len(vs) == 0 || vs[0].Field != c.field {
			t.Errorf("%s: violations %+v, want field %s", name, vs, c.field)
		}
		if strings.Contains(err.Error(), secretValue) || strings.Contains(err.Error(), "u2") && name == "pull value not a credential" {
			t.Fatalf("%s: the error quotes a value: %v", name, err)
		}
	}
	// More than 50 secrets per sandbox.
	var many []*sandboxv1.SecretMapping
	for i := range 51 {
		many = append(many, &sandboxv1.SecretMapping{Path: "db/main", Field: "password", EnvVar: "V" + strings.Repeat("X", i)})
	}
	_, err = createSecretSandbox(s, user, &sandboxv1.Container{Image: "busybox", SecretStores: []*sandboxv1.SecretStoreReference{{StoreName: "prod", Secrets: many}}})
	wantSecretErr(t, "51 secrets", err, connect.CodeInvalidArgument, apierr.InvalidRequest)
	// Without secret stores configured, references are not implemented.
	bare, _ := New(Config{Auth: s.auth, Runners: s.runners, Logger: quietLog()})
	t.Cleanup(bare.Close)
	_, err = createSecretSandbox(bare, user, &sandboxv1.Container{Image: "busybox", SecretStores: ref("prod", "db/main", "password", "X")})
	wantSecretErr(t, "off", err, connect.CodeUnimplemented, apierr.NotImplemented)
	_ = errors.New
}

// TestSecretsREST: the REST routes of the secret stores and secrets (docs/secrets.md),
// with an admin key; no response carries the value.
func TestSecretsREST(t *testing.T) {
	s, _, _ := secretsServer(t, SecretOptions{})
	key, _, err := s.auth.(*auth.Keyring).Create("acme", auth.RoleAdmin, "")
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	call := func(method, path, body string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Content-Type", "application/json")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		if strings.Contains(string(b), secretValue) {
			t.Fatalf("%s %s answers the value: %s", method, path, b)
		}
		return res.StatusCode, string(b)
	}
	for _, c := range []struct {
		method, path, body string
		want               int
		has                string
	}{
		{"POST", "/v1/settings/secretStores?request_id=r1", `{"name":"prod"}`, 200, `"name":"prod"`},
		{"GET", "/v1/settings/secretStores/prod", "", 200, `"name":"prod"`},
		{"POST", "/v1/settings/secretStores/prod/secrets", `{"path":"db/main","field":"password","value":"` + secretValue + `"}`, 200, `"path":"db/main"`},
		{"GET", "/v1/settings/secretStores/prod/secrets", "", 200, `"field":"password"`},
		{"POST", "/v1/settings/secretStores/prod/secrets", `{"path":"x","value":"v","bogus":1}`, 400, ""},
		{"DELETE", "/v1/settings/secretStores/prod/secrets?path=db/main&field=password", "", 200, ""},
		{"DELETE", "/v1/settings/secretStores/prod/secrets?path=db/main&field=password", "", 404, apierr.SecretNotFound},
		{"POST", "/v1/settings/secretStores/nope/secrets", `{"path":"x","value":"v"}`, 400, apierr.SecretStoreNotProvisioned},
		{"GET", "/v1/settings/secretStores", "", 200, `"prod"`},
		{"DELETE", "/v1/settings/secretStores/prod", "", 200, ""},
		{"GET", "/v1/settings/secretStores/prod", "", 404, apierr.SecretStoreNotFound},
	} {
		code, body := call(c.method, c.path, c.body)
		if code != c.want || !strings.Contains(body, c.has) {
			t.Errorf("%s %s: %d %s, want %d with %q", c.method, c.path, code, body, c.want, c.has)
		}
	}
}

// TestPutSecretAfterPrune: a gateway whose ring has not read the key file since a
// rotation seals under the old key; after prune retired that key in the store, the store
// refuses the value (store.ErrKeyRetired) and the gateway reads the file again and seals
// it under the current key: PutSecret succeeds, and the value opens with the file's ring.
func TestPutSecretAfterPrune(t *testing.T) {
	st := openFSSStore(t)
	keys, err := auth.OpenKeyring(filepath.Join(t.TempDir(), "keys.json"))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), secretbox.DefaultFile)
	ring, err := secretbox.LoadOrCreate(path)
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Config{Auth: keys, Runners: []runner.Handle{&acceptingRunner{id: "r1"}}, Logger: quietLog(),
		Secrets: SecretOptions{Store: st.SecretStores(), Keys: ring}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	mkStore(t, s, "acme", "prod")
	old := ring.CurrentID()
	k, err := secretbox.AddKey(path) // rotate: nothing to reseal
	if err != nil {
		t.Fatal(err)
	}
	if got, err := st.SecretStores().RetireUnusedKeys(t.Context(), []string{old}); err != nil || len(got) != 1 {
		t.Fatalf("retire = %v, %v", got, err)
	}
	if err := secretbox.RemoveKeys(path, []string{old}); err != nil {
		t.Fatal(err)
	}
	putSecret(t, s, "acme", "prod", "db", "pw", secretValue)
	x, err := st.SecretStores().GetSecret(t.Context(), "acme", "prod", "db", "pw")
	if err != nil || x.KeyID != k.ID {
		t.Fatalf("stored under %q (%v), want the current key %s", x.KeyID, err, k.ID)
	}
	file, err := secretbox.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if v, err := file.Open(x.KeyID, x.Ciphertext, secretbox.AD("acme", "prod", "db", "pw")); err != nil || string(v) != secretValue {
		t.Fatalf("open = %v", err)
	}
}
