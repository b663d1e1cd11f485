package gateway

import (
	"encoding/json"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1/sandboxv1connect"
	buildv1 "github.com/sandboxd/sandboxd/gen/sandboxd/build/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/blob/dir"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/store"
)

func bscUpdate(c *sandboxv1.BuildStorageConfig, paths ...string) *sandboxv1.UpdateBuildStorageConfigRequest {
	r := &sandboxv1.UpdateBuildStorageConfigRequest{BuildStorageConfig: c}
	if paths != nil {
		r.UpdateMask = &fieldmaskpb.FieldMask{Paths: paths}
	}
	return r
}

// TestBuildStorageConfig: Get answers the defaults until an administrator updates; the
// update mask, etag and revision behave like a template's; mode, bucket_name, location and
// registry_namespace take only the platform's values; enabled=false refuses StartBuild and
// Compose builds of that organization only, naming the setting.
func TestBuildStorageConfig(t *testing.T) {
	ctx := t.Context()
	r := &buildingRunner{acceptingRunner: acceptingRunner{id: "r1"}, builderImage: "localhost/builder:1"}
	r.build = okBuild(testDigest)
	e := newBuildEnv(t, t.TempDir(), nil, r)
	sc := sandboxv1connect.NewSettingsServiceClient(http.DefaultClient, e.url)

	get := func(key string) *sandboxv1.BuildStorageConfig {
		t.Helper()
		res, err := sc.GetBuildStorageConfig(ctx, as(key, &sandboxv1.GetBuildStorageConfigRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		return res.Msg
	}
	def := get(e.user)
	if !def.GetEnabled() || def.GetMode() != sandboxv1.BuildStorageMode_BUILD_STORAGE_MODE_MANAGED || def.GetRegistryNamespace() != "reg.test:5000/"+testOrg ||
		def.GetEtag() != "r0" || def.GetRevision() != 0 || def.GetEffectiveBucketName() != "" || def.GetBucketName() != "" || def.GetBillingReference() != "" {
		t.Fatalf("defaults = %v", def)
	}

	// Only administrators write.
	_, err := sc.UpdateBuildStorageConfig(ctx, as(e.user, bscUpdate(&sandboxv1.BuildStorageConfig{}, "enabled")))
	wantTmplErr(t, err, connect.CodePermissionDenied, apierr.PermissionDenied, "")

	// Bad masks and values: INVALID_ARGUMENT naming each; nothing written.
	for _, tc := range []struct {
		name  string
		req   *sandboxv1.UpdateBuildStorageConfigRequest
		field string
	}{
		{"no config", &sandboxv1.UpdateBuildStorageConfigRequest{}, "build_storage_config"},
		{"unknown path", bscUpdate(&sandboxv1.BuildStorageConfig{}, "enabled", "colour"), "update_mask"},
		{"output-only path", bscUpdate(&sandboxv1.BuildStorageConfig{}, "etag"), "update_mask"},
		{"effective bucket path", bscUpdate(&sandboxv1.BuildStorageConfig{}, "effective_bucket_name"), "update_mask"},
		{"unknown mode", bscUpdate(&sandboxv1.BuildStorageConfig{Mode: 9}, "mode"), "build_storage_config.mode"},
		{"own bucket", bscUpdate(&sandboxv1.BuildStorageConfig{BucketName: "acme-builds"}, "bucket_name"), "build_storage_config.bucket_name"},
		{"location", bscUpdate(&sandboxv1.BuildStorageConfig{Location: "us-east-1"}, "location"), "build_storage_config.location"},
		{"namespace", bscUpdate(&sandboxv1.BuildStorageConfig{RegistryNamespace: "reg.test:5000/org-b"}, "registry_namespace"), "build_storage_config.registry_namespace"},
		{"billing too long", bscUpdate(&sandboxv1.BuildStorageConfig{BillingReference: strings.Repeat("x", 129)}, "billing_reference"), "build_storage_config.billing_reference"},
		{"billing control", bscUpdate(&sandboxv1.BuildStorageConfig{BillingReference: "a\nb"}, "billing_reference"), "build_storage_config.billing_reference"},
		{"effective bucket set", bscUpdate(&sandboxv1.BuildStorageConfig{Enabled: true, EffectiveBucketName: "x"}), "build_storage_config.effective_bucket_name"},
	} {
		_, err := sc.UpdateBuildStorageConfig(ctx, as(e.admin, tc.req))
		if connect.CodeOf(err) != connect.CodeInvalidArgument {
			t.Fatalf("%s: %v", tc.name, err)
		}
		wantTmplErr(t, err, connect.CodeInvalidArgument, apierr.InvalidRequest, tc.field)
	}
	// CUSTOMER_OWNED without an allowed S3 endpoint (no --build-storage-endpoints):
	// FAILED_PRECONDITION naming mode.
	_, err = sc.UpdateBuildStorageConfig(ctx, as(e.admin, bscUpdate(&sandboxv1.BuildStorageConfig{Mode: sandboxv1.BuildStorageMode_BUILD_STORAGE_MODE_CUSTOMER_OWNED, BucketName: "acme-builds"}, "mode", "bucket_name")))
	wantTmplErr(t, err, connect.CodeFailedPrecondition, apierr.BuildStorageUnavailable, "build_storage_config.mode")
	if got := get(e.admin); got.GetRevision() != 0 {
		t.Fatalf("a refused update wrote: %v", got)
	}

	// Disable builds (with the platform's own values named, which are accepted).
	res, err := sc.UpdateBuildStorageConfig(ctx, as(e.admin, bscUpdate(&sandboxv1.BuildStorageConfig{Enabled: false, BillingReference: "cost-center 42",
		Mode: sandboxv1.BuildStorageMode_BUILD_STORAGE_MODE_MANAGED, RegistryNamespace: "reg.test:5000/" + testOrg, Etag: "r0"})))
	if err != nil || res.Msg.GetEnabled() || res.Msg.GetRevision() != 1 || res.Msg.GetEtag() != "r1" || res.Msg.GetBillingReference() != "cost-center 42" {
		t.Fatalf("disable = %v, %v", res, err)
	}
	if got := get(e.user); got.GetEnabled() || got.GetRevision() != 1 || got.GetBillingReference() != "cost-center 42" {
		t.Fatalf("after disable = %v", got)
	}
	// A stale etag or revision: ABORTED, nothing written.
	_, err = sc.UpdateBuildStorageConfig(ctx, as(e.admin, bscUpdate(&sandboxv1.BuildStorageConfig{Enabled: true, Etag: "r0"}, "enabled")))
	wantTmplErr(t, err, connect.CodeAborted, apierr.EtagMismatch, "")
	if md := apierr.Info(err).GetMetadata(); md["current_etag"] != "r1" {
		t.Errorf("metadata = %v", md)
	}
	_, err = sc.UpdateBuildStorageConfig(ctx, as(e.admin, bscUpdate(&sandboxv1.BuildStorageConfig{Enabled: true, Revision: 7}, "enabled")))
	wantTmplErr(t, err, connect.CodeAborted, apierr.EtagMismatch, "")

	// Builds of the organization are refused, naming the setting; another's are not.
	_, err = e.c.StartBuild(ctx, as(e.admin, buildReq("py", "ctx")))
	wantBuildErr(t, err, connect.CodeFailedPrecondition, apierr.BuildNotSupported, "")
	if md := apierr.Info(err).GetMetadata(); md["setting"] != "build_storage_config.enabled" || !strings.Contains(err.Error(), "enabled: false") {
		t.Errorf("refusal = %v (%v)", err, md)
	}
	ssc := sandboxv1connect.NewSandboxServiceClient(http.DefaultClient, e.url)
	_, err = ssc.CreateSandboxFromFile(ctx, as(e.user, fileReq("services: {app: {build: {dockerfile_inline: 'FROM busybox'}, command: [sleep, inf]}}")))
	wantBuildErr(t, err, connect.CodeFailedPrecondition, apierr.BuildNotSupported, "")
	if reqs, _ := r.requests(); len(reqs) != 0 {
		t.Fatalf("a disabled organization built: %v", reqs)
	}
	if other := get(e.otherAdmin); !other.GetEnabled() || other.GetRevision() != 0 || other.GetBillingReference() != "" {
		t.Fatalf("another organization's = %v", other)
	}
	ob, err := e.c.StartBuild(ctx, as(e.otherAdmin, &buildv1.StartBuildRequest{Target: &buildv1.StartBuildRequest_Repository{Repository: "app"}, Context: []byte("x")}))
	if err != nil {
		t.Fatalf("another organization's build: %v", err)
	}
	e.waitBuild2(t, e.otherAdmin, ob.Msg.GetBuild().GetBuildId(), buildv1.BuildState_BUILD_STATE_SUCCEEDED)

	// Enabled again (the mask names only enabled: billing_reference is kept).
	res, err = sc.UpdateBuildStorageConfig(ctx, as(e.admin, bscUpdate(&sandboxv1.BuildStorageConfig{Enabled: true, Revision: 1}, "enabled")))
	if err != nil || !res.Msg.GetEnabled() || res.Msg.GetRevision() != 2 || res.Msg.GetBillingReference() != "cost-center 42" {
		t.Fatalf("enable = %v, %v", res, err)
	}
	b, err := e.c.StartBuild(ctx, as(e.admin, buildReq("py", "ctx")))
	if err != nil {
		t.Fatal(err)
	}
	e.waitBuild(t, b.Msg.GetBuild().GetBuildId(), buildv1.BuildState_BUILD_STATE_SUCCEEDED)
}

// waitBuild2 is waitBuild as key.
func (e *buildEnv) waitBuild2(t *testing.T, key, id string, want buildv1.BuildState) {
	t.Helper()
	saved := e.admin
	e.admin = key
	defer func() { e.admin = saved }()
	e.waitBuild(t, id, want)
}

// TestBuildStorageConfigREST: the REST mapping (GET and PATCH /v1/settings/buildStorageConfig)
// with camelCase JSON; an unknown JSON field is refused; a user key cannot PATCH.
func TestBuildStorageConfigREST(t *testing.T) {
	e := newBuildEnv(t, t.TempDir(), nil, &acceptingRunner{id: "r1"})
	call := func(method, path, key, body string) (int, map[string]any) {
		t.Helper()
		req, err := http.NewRequest(method, e.url+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Content-Type", "application/json")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		var out map[string]any
		_ = json.NewDecoder(res.Body).Decode(&out)
		return res.StatusCode, out
	}
	if code, out := call("GET", "/v1/settings/buildStorageConfig", e.user, ""); code != http.StatusOK || out["enabled"] != true ||
		out["mode"] != "BUILD_STORAGE_MODE_MANAGED" || out["registryNamespace"] != "reg.test:5000/"+testOrg || out["etag"] != "r0" {
		t.Fatalf("get: %d %v", code, out)
	}
	if code, out := call("PATCH", "/v1/settings/buildStorageConfig?updateMask=billingReference", e.user, `{"billingReference": "x"}`); code != http.StatusForbidden {
		t.Fatalf("user patch: %d %v", code, out)
	}
	if code, out := call("PATCH", "/v1/settings/buildStorageConfig?updateMask=billingReference", e.admin, `{"billingReference": "x", "colour": "red"}`); code != http.StatusBadRequest {
		t.Fatalf("unknown field: %d %v", code, out)
	}
	if code, out := call("PATCH", "/v1/settings/buildStorageConfig?updateMask=billingReference,enabled", e.admin, `{"billingReference": "cc-1", "etag": "r0"}`); code != http.StatusOK ||
		out["billingReference"] != "cc-1" || out["revision"] != "1" || out["enabled"] != false {
		t.Fatalf("patch: %d %v", code, out)
	}
	if code, out := call("PATCH", "/v1/settings/buildStorageConfig?updateMask=enabled", e.admin, `{"enabled": true, "etag": "r0"}`); code != http.StatusConflict {
		t.Fatalf("stale etag: %d %v", code, out)
	}
	if code, out := call("GET", "/v1/settings/buildStorageConfig", e.otherAdmin, ""); code != http.StatusOK || out["enabled"] != true || out["billingReference"] != "" {
		t.Fatalf("another organization: %d %v", code, out)
	}
}

// TestBuildStorageConfigBucket: effective_bucket_name is the gateway's blob store's bucket,
// and bucket_name may name it; without a store or a registry both are empty.
func TestBuildStorageConfigBucket(t *testing.T) {
	blobs, err := dir.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	st := openFSSStore(t)
	keys, err := auth.OpenKeyring(filepath.Join(t.TempDir(), "keys.json"))
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Config{Auth: keys, Runners: []runner.Handle{&acceptingRunner{id: "r1"}}, Blobs: blobs, SnapshotBucket: "local", Logger: quietLog(),
		Builds: BuildOptions{Store: st.Builds(), Settings: st.BuildStorageConfigs()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	ctx := asRole("acme", auth.RoleAdmin)
	res, err := s.UpdateBuildStorageConfig(ctx, connect.NewRequest(bscUpdate(&sandboxv1.BuildStorageConfig{Enabled: true, BucketName: "local", EffectiveBucketName: "local"})))
	if err != nil || res.Msg.GetEffectiveBucketName() != "local" || res.Msg.GetBucketName() != "" || res.Msg.GetRegistryNamespace() != "" || res.Msg.GetRevision() != 1 {
		t.Fatalf("update = %v, %v", res, err)
	}
	if c, err := st.BuildStorageConfigs().Get(ctx, "acme"); err != nil || c.Bucket != "" || !c.Enabled {
		t.Fatalf("stored %+v, %v", c, err)
	}
	// Without a store: the defaults, and updates are UNIMPLEMENTED.
	bare := &Server{}
	g, err := bare.GetBuildStorageConfig(ctx, connect.NewRequest(&sandboxv1.GetBuildStorageConfigRequest{}))
	if err != nil || !g.Msg.GetEnabled() || g.Msg.GetEffectiveBucketName() != "" {
		t.Fatalf("bare get = %v, %v", g, err)
	}
	_, err = bare.UpdateBuildStorageConfig(ctx, connect.NewRequest(bscUpdate(&sandboxv1.BuildStorageConfig{Enabled: true})))
	if connect.CodeOf(err) != connect.CodeUnimplemented {
		t.Fatalf("bare update: %v", err)
	}
	var _ store.BuildStorageConfigs = st.BuildStorageConfigs()
}
