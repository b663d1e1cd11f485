package security

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1/sandboxv1connect"
	settingsv1 "github.com/sandboxd/sandboxd/gen/sandboxd/settings/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/settings/v1/settingsv1connect"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/connecttest"
)

// TestBuildStorageCredentialsStayOut attacks an organization's own build storage
// (CUSTOMER_OWNED, docs/builds.md): its bucket credentials live in the built-in secret
// store sandboxd-build-storage, which any key of the organization could name in a sandbox
// spec. A user key cannot take them into a sandbox (environment, image pull credentials),
// cannot change the build storage, and an administrator cannot make the gateway connect
// to a host of its choosing (the dev server allows no S3 endpoint: CUSTOMER_OWNED is
// refused before any connection). The values are in no response. (That they are not in
// the log is checked where they are used, with a real bucket: the dev server here allows
// no endpoint, so it never reads them; TestBuildStorageCustomerOwned, internal/gateway.)
func TestBuildStorageCredentialsStayOut(t *testing.T) {
	d := needDev(t)
	const secret = "bsc-secret-7f3a9c01e2"
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	adminA, err := d.NewKey("org-a", "admin")
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
	const store = "sandboxd-build-storage"
	if _, err := settings(adminA).CreateSecretStore(ctx, connect.NewRequest(&sandboxv1.CreateSecretStoreRequest{SecretStore: &sandboxv1.SecretStore{Name: store}})); err != nil &&
		connect.CodeOf(err) != connect.CodeAlreadyExists {
		t.Fatal(err)
	}
	sec := settingsv1connect.NewSecretServiceClient(hc, d.API, opts(adminA)...)
	for f, v := range map[string]string{"access_key_id": "bsc-access", "secret_access_key": secret} {
		if _, err := sec.PutSecret(ctx, connect.NewRequest(&settingsv1.PutSecretRequest{StoreName: store, Path: "s3", Field: f, Value: v})); err != nil {
			t.Fatal(err)
		}
	}
	want := func(what string, err error, code connect.Code, reason, field string) {
		t.Helper()
		if connect.CodeOf(err) != code || apierr.Reason(err) != reason {
			t.Fatalf("%s: %v (reason %q), want %v %s", what, err, apierr.Reason(err), code, reason)
		}
		if strings.Contains(err.Error(), secret) {
			t.Fatalf("%s: the error carries the secret", what)
		}
		for _, v := range apierr.Violations(err) {
			if v.Field == field {
				return
			}
		}
		t.Fatalf("%s: %v: no violation of %s", what, err, field)
	}

	// A user key of org-a (d.KeyA) takes the secret into a sandbox's environment, or as
	// the credentials of its image pull (which a registry it names would receive).
	sbc := sandboxv1connect.NewSandboxServiceClient(hc, d.API, opts(d.KeyA)...)
	env := &sandboxv1.SandboxSpec{Containers: []*sandboxv1.Container{{Name: "main", Image: "busybox", Command: "/bin/sh", Args: []string{"-c", "env"},
		SecretStores: []*sandboxv1.SecretStoreReference{{StoreName: store, Secrets: []*sandboxv1.SecretMapping{{Path: "s3", Field: "secret_access_key", EnvVar: "K"}}}}}}}
	_, err = sbc.CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: env}}))
	want("environment", err, connect.CodeInvalidArgument, apierr.InvalidRequest, "sandbox.spec.containers[0].secret_stores[0].store_name")
	pull := &sandboxv1.SandboxSpec{Containers: []*sandboxv1.Container{{Name: "main", Image: "attacker.example:5000/x:1",
		ImagePullCredentials: &sandboxv1.ImagePullCredentials{Registry: "attacker.example:5000", Credentials: &sandboxv1.SecretSource{StoreName: store, Path: "s3"}}}}}
	_, err = sbc.CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: pull}}))
	if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), store) {
		t.Fatalf("image pull credentials from the build storage store: %v", err)
	}

	// A user key cannot change the build storage.
	mask := &fieldmaskpb.FieldMask{Paths: []string{"mode", "bucket_name", "location"}}
	own := &sandboxv1.BuildStorageConfig{Mode: sandboxv1.BuildStorageMode_BUILD_STORAGE_MODE_CUSTOMER_OWNED, BucketName: "acme-builds", Location: "169.254.169.254:80"}
	_, err = settings(d.KeyA).UpdateBuildStorageConfig(ctx, connect.NewRequest(&sandboxv1.UpdateBuildStorageConfigRequest{BuildStorageConfig: own, UpdateMask: mask}))
	if connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Fatalf("user update: %v", err)
	}
	// The administrator names a host: refused, no endpoint being allowed.
	_, err = settings(adminA).UpdateBuildStorageConfig(ctx, connect.NewRequest(&sandboxv1.UpdateBuildStorageConfigRequest{BuildStorageConfig: own, UpdateMask: mask}))
	want("admin-named endpoint", err, connect.CodeFailedPrecondition, apierr.BuildStorageUnavailable, "build_storage_config.mode")
	if g, err := settings(adminA).GetBuildStorageConfig(ctx, connect.NewRequest(&sandboxv1.GetBuildStorageConfigRequest{})); err != nil ||
		g.Msg.GetMode() == sandboxv1.BuildStorageMode_BUILD_STORAGE_MODE_CUSTOMER_OWNED || g.Msg.GetLocation() != "" {
		t.Fatalf("after the refusals: %v %v", g, err)
	}
}
