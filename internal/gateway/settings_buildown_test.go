package gateway

import (
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/minio/minio-go/v7"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1/sandboxv1connect"
	settingsv1 "github.com/sandboxd/sandboxd/gen/sandboxd/settings/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/settings/v1/settingsv1connect"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/blob/s3/s3test"
	"github.com/sandboxd/sandboxd/internal/registry"
	"github.com/sandboxd/sandboxd/internal/secretbox"
	"github.com/sandboxd/sandboxd/internal/spec"
	"github.com/sandboxd/sandboxd/internal/testenv/logbuf"
)

func TestParseBuildStorageEndpoints(t *testing.T) {
	eps, err := ParseBuildStorageEndpoints("s3.example.com, http://127.0.0.1:8333,https://s3.eu-west-1.amazonaws.com=eu-west-1")
	if err != nil {
		t.Fatal(err)
	}
	want := []BuildStorageEndpoint{{Host: "s3.example.com"}, {Host: "127.0.0.1:8333", Insecure: true}, {Host: "s3.eu-west-1.amazonaws.com", Region: "eu-west-1"}}
	if len(eps) != len(want) {
		t.Fatalf("%v", eps)
	}
	for i := range want {
		if eps[i] != want[i] {
			t.Fatalf("%d: %+v, want %+v", i, eps[i], want[i])
		}
	}
	for _, bad := range []string{"s3.example.com/path", "a:b:c", "x.example,x.example", "ftp://x.example", "h:99999", "h=EU WEST", strings.Repeat("a,", 40) + "a"} {
		if _, err := ParseBuildStorageEndpoints(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	if eps, err := ParseBuildStorageEndpoints(""); err != nil || eps != nil {
		t.Fatalf("empty: %v %v", eps, err)
	}
}

// TestBuildStorageCustomerOwned: against a real S3 server (SeaweedFS), an administrator
// switches the organization to its own bucket, which is probed first (bad credentials,
// an unknown bucket, an endpoint not allowed are refused naming the field, nothing
// stored); afterwards the organization's pushes through the platform registry land in
// its bucket only and pull back, another organization stays on the platform storage, and
// the credentials' secret store is never given to a sandbox.
func TestBuildStorageCustomerOwned(t *testing.T) {
	srv := s3test.Start(t)
	platform, own := srv.Bucket(t), srv.Bucket(t)
	ctx := t.Context()
	ring, err := secretbox.LoadOrCreate(filepath.Join(t.TempDir(), secretbox.DefaultFile))
	if err != nil {
		t.Fatal(err)
	}
	// Everything the gateway and the registry log, at debug level: the secret key must
	// never be in it (checked at the end).
	var logged logbuf.Buffer
	logger := slog.New(slog.NewTextHandler(&logged, &slog.HandlerOptions{Level: slog.LevelDebug}))
	t.Cleanup(func() {
		if strings.Contains(logged.String(), srv.SecretKey) {
			t.Error("the bucket's secret key is in the log")
		}
	})
	e := newBuildEnvConfig(t, t.TempDir(), func(c *Config) {
		c.Builds.StorageEndpoints = []BuildStorageEndpoint{{Host: srv.Endpoint, Insecure: true}, {Host: "s3.other.example:443"}}
		c.Logger = logger
	}, &acceptingRunner{id: "r1"})
	e.s.secrets = SecretOptions{Store: e.st.SecretStores(), Keys: ring}.withDefaults()

	// The platform registry on the platform bucket, asking the gateway where each
	// organization's repositories go.
	reg, err := registry.New(ctx, registry.Config{S3: &platform, Auth: noKeys{}, TokenKey: []byte(strings.Repeat("k", 32)),
		OrgStorage: e.s.OrgBuildStorage, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(reg.Close)
	e.s.builds.cfg.OnStorageChange = reg.ForgetOrgStorage
	rs := httptest.NewServer(reg)
	t.Cleanup(rs.Close)
	regHost := strings.TrimPrefix(rs.URL, "http://")

	sc := sandboxv1connect.NewSettingsServiceClient(http.DefaultClient, e.url)
	secrets := settingsv1connect.NewSecretServiceClient(http.DefaultClient, e.url)
	update := func(key string, c *sandboxv1.BuildStorageConfig, paths ...string) (*sandboxv1.BuildStorageConfig, error) {
		res, err := sc.UpdateBuildStorageConfig(ctx, as(key, bscUpdate(c, paths...)))
		if err != nil {
			return nil, err
		}
		return res.Msg, nil
	}
	ownCfg := func(bucket, location string) *sandboxv1.BuildStorageConfig {
		return &sandboxv1.BuildStorageConfig{Mode: sandboxv1.BuildStorageMode_BUILD_STORAGE_MODE_CUSTOMER_OWNED, BucketName: bucket, Location: location}
	}
	putCreds := func(ak, sk string) {
		t.Helper()
		for f, v := range map[string]string{buildStorageAccessKey: ak, buildStorageSecretKey: sk} {
			if _, err := secrets.PutSecret(ctx, as(e.admin, &settingsv1.PutSecretRequest{StoreName: BuildStorageSecretStore, Path: BuildStorageSecretPath, Field: f, Value: v})); err != nil {
				t.Fatal(err)
			}
		}
	}
	credField := "secret_stores/" + BuildStorageSecretStore + "/secrets/" + BuildStorageSecretPath

	// A user key is refused.
	_, err = update(e.user, ownCfg(own.Bucket, ""), "mode", "bucket_name")
	wantTmplErr(t, err, connect.CodePermissionDenied, apierr.PermissionDenied, "")
	// No credentials yet: the convention's place is named.
	_, err = update(e.admin, ownCfg(own.Bucket, srv.Endpoint), "mode", "bucket_name", "location")
	wantTmplErr(t, err, connect.CodeFailedPrecondition, apierr.BuildStorageUnavailable, credField+"#"+buildStorageAccessKey)
	if _, err := sc.CreateSecretStore(ctx, as(e.admin, &sandboxv1.CreateSecretStoreRequest{SecretStore: &sandboxv1.SecretStore{Name: BuildStorageSecretStore}})); err != nil {
		t.Fatal(err)
	}
	putCreds(srv.AccessKey, "wrong-"+srv.SecretKey)
	for _, tc := range []struct {
		name  string
		cfg   *sandboxv1.BuildStorageConfig
		code  connect.Code
		field string
	}{
		{"bad credentials", ownCfg(own.Bucket, srv.Endpoint), connect.CodeFailedPrecondition, credField},
		{"endpoint not allowed", ownCfg(own.Bucket, "169.254.169.254:80"), connect.CodeFailedPrecondition, "build_storage_config.location"},
		{"location required (two allowed)", ownCfg(own.Bucket, ""), connect.CodeFailedPrecondition, "build_storage_config.location"},
		{"bucket required", ownCfg("", srv.Endpoint), connect.CodeInvalidArgument, "build_storage_config.bucket_name"},
		{"bucket name", ownCfg("Bad_Bucket", srv.Endpoint), connect.CodeInvalidArgument, "build_storage_config.bucket_name"},
		{"location too long", ownCfg(own.Bucket, strings.Repeat("a", 300)), connect.CodeInvalidArgument, "build_storage_config.location"},
	} {
		_, err := update(e.admin, tc.cfg, "mode", "bucket_name", "location")
		reason := apierr.BuildStorageUnavailable
		if tc.code == connect.CodeInvalidArgument {
			reason = apierr.InvalidRequest
		}
		if connect.CodeOf(err) != tc.code {
			t.Fatalf("%s: %v", tc.name, err)
		}
		wantTmplErr(t, err, tc.code, reason, tc.field)
		if strings.Contains(err.Error(), srv.SecretKey) {
			t.Fatalf("%s: the error quotes the secret key", tc.name)
		}
	}
	putCreds(srv.AccessKey, srv.SecretKey)
	_, err = update(e.admin, ownCfg("no-such-bucket-zz", srv.Endpoint), "mode", "bucket_name", "location")
	wantTmplErr(t, err, connect.CodeFailedPrecondition, apierr.BuildStorageUnavailable, "build_storage_config.bucket_name")
	got, err := sc.GetBuildStorageConfig(ctx, as(e.admin, &sandboxv1.GetBuildStorageConfigRequest{}))
	if err != nil || got.Msg.GetRevision() != 0 || got.Msg.GetMode() != sandboxv1.BuildStorageMode_BUILD_STORAGE_MODE_MANAGED {
		t.Fatalf("a refused update wrote: %v %v", got, err)
	}

	// Before the switch: an image on the platform storage.
	push := func(org, repo string) {
		t.Helper()
		tok, err := reg.MintPushToken(org, 5*60e9)
		if err != nil {
			t.Fatal(err)
		}
		img, err := random.Image(512, 1)
		if err != nil {
			t.Fatal(err)
		}
		ref, err := name.ParseReference(regHost+"/"+org+"/"+repo, name.Insecure)
		if err != nil {
			t.Fatal(err)
		}
		if err := remote.Write(ref, img, remote.WithAuth(&authn.Basic{Username: "x", Password: tok})); err != nil {
			t.Fatalf("push %s/%s: %v", org, repo, err)
		}
		tok, _ = reg.MintPullToken(org, 5*60e9)
		if _, err := remote.Image(ref, remote.WithAuth(&authn.Basic{Username: "x", Password: tok})); err != nil {
			t.Fatalf("pull %s/%s: %v", org, repo, err)
		}
	}
	objects := func(bucket, repo string) int {
		t.Helper()
		n := 0
		for o := range srv.Client.ListObjects(ctx, bucket, minio.ListObjectsOptions{Recursive: true, Prefix: "registry/docker/registry/v2/repositories/" + repo + "/"}) {
			if o.Err != nil {
				t.Fatal(o.Err)
			}
			n++
		}
		return n
	}
	push(testOrg, "before:v1")

	// The switch (location "" is refused with two endpoints allowed; named, it is taken).
	res, err := update(e.admin, &sandboxv1.BuildStorageConfig{Mode: sandboxv1.BuildStorageMode_BUILD_STORAGE_MODE_CUSTOMER_OWNED, BucketName: own.Bucket, Location: srv.Endpoint, Etag: "r0"},
		"mode", "bucket_name", "location")
	if err != nil {
		t.Fatal(err)
	}
	if res.GetMode() != sandboxv1.BuildStorageMode_BUILD_STORAGE_MODE_CUSTOMER_OWNED || res.GetBucketName() != own.Bucket || res.GetEffectiveBucketName() != own.Bucket ||
		res.GetLocation() != srv.Endpoint || res.GetRevision() != 1 {
		t.Fatalf("update = %v", res)
	}
	if g, _ := sc.GetBuildStorageConfig(ctx, as(e.user, &sandboxv1.GetBuildStorageConfigRequest{})); g.Msg.GetEffectiveBucketName() != own.Bucket {
		t.Fatalf("get = %v", g.Msg)
	}
	// No probe object is left behind.
	for o := range srv.Client.ListObjects(ctx, own.Bucket, minio.ListObjectsOptions{Recursive: true, Prefix: buildStorageProbePrefix}) {
		t.Fatalf("probe object left: %s", o.Key)
	}
	push(testOrg, "app:v1")
	if objects(own.Bucket, testOrg+"/app") == 0 || objects(platform.Bucket, testOrg+"/app") != 0 {
		t.Fatalf("org-a's push: %d objects in its bucket, %d in the platform's", objects(own.Bucket, testOrg+"/app"), objects(platform.Bucket, testOrg+"/app"))
	}
	push("org-b", "app:v1")
	if objects(platform.Bucket, "org-b/app") == 0 || objects(own.Bucket, "org-b/app") != 0 {
		t.Fatal("org-b's push is not (only) on the platform storage")
	}
	// Build context objects go to the bucket too, and are read from there.
	body := []byte("a build context tar")
	code, out := putContext(t, e, e.admin, "ctx1", "", body, false)
	obj := objOf(out)
	if code != http.StatusOK || obj.GetBucket() != own.Bucket || obj.GetLocation() != srv.Endpoint {
		t.Fatalf("context put: %d %v", code, out)
	}
	if _, err := srv.Client.StatObject(ctx, own.Bucket, obj.GetKey(), minio.StatObjectOptions{}); err != nil {
		t.Fatalf("context not in the bucket: %v", err)
	}
	cst, cbucket, _, err := e.s.buildContextStore(ctx, testOrg)
	if err != nil {
		t.Fatal(err)
	}
	if data, err := e.s.readBuildContextObject(ctx, cst, cbucket, testOrg, "app", obj, 1<<20); err != nil || string(data) != string(body) {
		t.Fatalf("context read: %q %v", data, err)
	}
	// Another organization naming it (its store is the platform's): not found, never read.
	pst, pbucket := cst, own.Bucket // even handed org-a's own store, the key is not org-b's
	_, err = e.s.readBuildContextObject(ctx, pst, pbucket, "org-b", "app", obj, 1<<20)
	wantTmplErr(t, err, connect.CodeNotFound, apierr.BuildContextNotFound, "")

	// Only billing_reference: no probe needed, the storage kept.
	if res, err := update(e.admin, &sandboxv1.BuildStorageConfig{BillingReference: "cc"}, "billing_reference"); err != nil || res.GetBucketName() != own.Bucket {
		t.Fatalf("billing update: %v %v", res, err)
	}

	// The credentials' store is never a sandbox's: env, pull credentials, egress alike go
	// through the resolver, which refuses it.
	resolve := e.s.secretResolver(ctx, testOrg)
	_, err = resolve("sandbox.spec.containers[0].secret_stores[0].secrets[0]", spec.SecretRef{Store: BuildStorageSecretStore, Path: BuildStorageSecretPath, Field: buildStorageSecretKey})
	wantTmplErr(t, err, connect.CodeInvalidArgument, apierr.InvalidRequest, "sandbox.spec.containers[0].secret_stores[0].store_name")

	// Back to MANAGED: pushes go to the platform storage again.
	if res, err := update(e.admin, &sandboxv1.BuildStorageConfig{Mode: sandboxv1.BuildStorageMode_BUILD_STORAGE_MODE_MANAGED}, "mode"); err != nil ||
		res.GetBucketName() != "" || res.GetEffectiveBucketName() != "" || res.GetLocation() != "" {
		t.Fatalf("back to MANAGED: %v %v", res, err)
	}
	push(testOrg, "after:v1")
	if objects(platform.Bucket, testOrg+"/after") == 0 || objects(own.Bucket, testOrg+"/after") != 0 {
		t.Fatal("after the switch back, the push is not on the platform storage")
	}
}

// noKeys authenticates no API key (the test pushes with platform tokens).
type noKeys struct{}

func (noKeys) Authenticate(string) (auth.Principal, error) {
	return auth.Principal{}, auth.ErrInvalidKey
}

// TestBuildStorageNoSSRF: a location naming a host the platform does not allow is
// refused without the gateway connecting to it (a listener there sees nothing), whatever
// the credentials; and the gateway without allowed endpoints refuses CUSTOMER_OWNED.
func TestBuildStorageNoSSRF(t *testing.T) {
	ctx := t.Context()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	var accepted atomic.Int32
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			_ = c.Close()
		}
	}()
	ring, err := secretbox.LoadOrCreate(filepath.Join(t.TempDir(), secretbox.DefaultFile))
	if err != nil {
		t.Fatal(err)
	}
	e := newBuildEnvConfig(t, t.TempDir(), func(c *Config) {
		c.Builds.StorageEndpoints = []BuildStorageEndpoint{{Host: "s3.allowed.example:443"}}
	}, &acceptingRunner{id: "r1"})
	e.s.secrets = SecretOptions{Store: e.st.SecretStores(), Keys: ring}.withDefaults()
	sc := sandboxv1connect.NewSettingsServiceClient(http.DefaultClient, e.url)
	if _, err := sc.CreateSecretStore(ctx, as(e.admin, &sandboxv1.CreateSecretStoreRequest{SecretStore: &sandboxv1.SecretStore{Name: BuildStorageSecretStore}})); err != nil {
		t.Fatal(err)
	}
	secrets := settingsv1connect.NewSecretServiceClient(http.DefaultClient, e.url)
	for _, f := range []string{buildStorageAccessKey, buildStorageSecretKey} {
		if _, err := secrets.PutSecret(ctx, as(e.admin, &settingsv1.PutSecretRequest{StoreName: BuildStorageSecretStore, Path: BuildStorageSecretPath, Field: f, Value: "v"})); err != nil {
			t.Fatal(err)
		}
	}
	for _, loc := range []string{ln.Addr().String(), "http://" + ln.Addr().String(), "s3.allowed.example:443@" + ln.Addr().String()} {
		_, err := sc.UpdateBuildStorageConfig(ctx, as(e.admin, bscUpdate(&sandboxv1.BuildStorageConfig{Mode: sandboxv1.BuildStorageMode_BUILD_STORAGE_MODE_CUSTOMER_OWNED, BucketName: "acme-builds", Location: loc}, "mode", "bucket_name", "location")))
		if err == nil {
			t.Fatalf("%q accepted", loc)
		}
		found := false
		for _, v := range apierr.Violations(err) {
			found = found || v.Field == "build_storage_config.location"
		}
		if !found {
			t.Fatalf("%q: %v: no violation of location", loc, err)
		}
	}
	time.Sleep(100 * time.Millisecond)
	if n := accepted.Load(); n != 0 {
		t.Fatalf("the gateway connected to the caller-named host %d times", n)
	}
}
