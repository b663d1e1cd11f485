package gateway

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1/sandboxv1connect"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/store"
)

const (
	cwManaged = sandboxv1.FileSystemSnapshotBucketMode_FILE_SYSTEM_SNAPSHOT_BUCKET_MODE_CW_MANAGED
	byo       = sandboxv1.FileSystemSnapshotBucketMode_FILE_SYSTEM_SNAPSHOT_BUCKET_MODE_BRING_YOUR_OWN
)

// fakeProber reaches the buckets in ok and records what it was asked.
type fakeProber struct {
	mu    sync.Mutex
	ok    map[string]bool
	asked []string
}

func (p *fakeProber) probe(_ context.Context, bucket, region string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.asked = append(p.asked, bucket+"@"+region)
	if !p.ok[bucket] {
		return errors.New("The specified bucket does not exist")
	}
	return nil
}

func openFSSStore(t *testing.T) store.Store {
	t.Helper()
	st, err := store.Open(t.Context(), filepath.Join(t.TempDir(), "sandboxd.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	return st
}

func settingsServer(t *testing.T, prober *fakeProber) (*Server, store.Store) {
	st := openFSSStore(t)
	s := &Server{fss: FSSOptions{PlatformBucket: "platform-fss", BucketConfigs: st.FSSBucketConfigs()}}
	if prober != nil {
		s.fss.ProbeBucket = prober.probe
	}
	return s, st
}

func asRole(org string, role auth.Role) context.Context {
	return auth.WithPrincipal(context.Background(), auth.Principal{KeyID: "k-" + org, Org: org, Role: role})
}

func getBucketConfig(t *testing.T, s *Server, ctx context.Context) *sandboxv1.FileSystemSnapshotBucketConfig {
	t.Helper()
	res, err := s.GetFileSystemSnapshotBucketConfig(ctx, connect.NewRequest(&sandboxv1.GetFileSystemSnapshotBucketConfigRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	return res.Msg
}

func setBucket(s *Server, ctx context.Context, c *sandboxv1.FileSystemSnapshotBucketConfig, mask ...string) (*sandboxv1.FileSystemSnapshotBucketConfig, error) {
	req := &sandboxv1.UpdateFileSystemSnapshotBucketConfigRequest{FileSystemSnapshotBucketConfig: c}
	if mask != nil {
		req.UpdateMask = &fieldmaskpb.FieldMask{Paths: mask}
	}
	res, err := s.UpdateFileSystemSnapshotBucketConfig(ctx, connect.NewRequest(req))
	if err != nil {
		return nil, err
	}
	return res.Msg, nil
}

func wantBucketReason(t *testing.T, err error, code connect.Code, reason string) {
	t.Helper()
	if connect.CodeOf(err) != code || apierr.Reason(err) != reason {
		t.Fatalf("err = %v (code %v, reason %q); want %v %s", err, connect.CodeOf(err), apierr.Reason(err), code, reason)
	}
}

// TestFSSBucketConfigLifecycle: CW_MANAGED by default with the platform's bucket; an
// administrator names the organization's reachable bucket (BRING_YOUR_OWN), which new
// snapshots then go to; clearing it (what the official client's
// set_snapshot_bucket_config(bucket_name="") sends: no mask) goes back.
func TestFSSBucketConfigLifecycle(t *testing.T) {
	p := &fakeProber{ok: map[string]bool{"acme-fss": true}}
	s, _ := settingsServer(t, p)
	admin, user := asRole("acme", auth.RoleAdmin), asRole("acme", auth.RoleUser)

	got := getBucketConfig(t, s, user)
	if got.GetMode() != cwManaged || got.GetBucketName() != "" || got.GetEffectiveBucketName() != "platform-fss" {
		t.Fatalf("default = %v", got)
	}
	if b, err := s.snapshotBucketFor(user, "acme"); err != nil || b != "platform-fss" {
		t.Fatalf("snapshotBucketFor = %q, %v", b, err)
	}

	// Only an administrator may change it.
	_, err := setBucket(s, user, &sandboxv1.FileSystemSnapshotBucketConfig{BucketName: "acme-fss"})
	wantBucketReason(t, err, connect.CodePermissionDenied, apierr.PermissionDenied)

	// As the official client sends it: no mask, both fields.
	out, err := setBucket(s, admin, &sandboxv1.FileSystemSnapshotBucketConfig{BucketName: "acme-fss", Region: "us-east-1"})
	if err != nil {
		t.Fatal(err)
	}
	if out.GetMode() != byo || out.GetBucketName() != "acme-fss" || out.GetRegion() != "us-east-1" || out.GetEffectiveBucketName() != "acme-fss" {
		t.Fatalf("after set = %v", out)
	}
	if len(p.asked) != 1 || p.asked[0] != "acme-fss@us-east-1" {
		t.Errorf("probes = %v", p.asked)
	}
	if got := getBucketConfig(t, s, user); got.GetMode() != byo || got.GetEffectiveBucketName() != "acme-fss" {
		t.Errorf("get after set = %v", got)
	}
	if b, _ := s.snapshotBucketFor(user, "acme"); b != "acme-fss" {
		t.Errorf("snapshotBucketFor = %q", b)
	}
	// Another organization is not affected.
	if got := getBucketConfig(t, s, asRole("globex", auth.RoleUser)); got.GetMode() != cwManaged {
		t.Errorf("globex = %v", got)
	}

	// A mask of region alone keeps the bucket; a round trip of what Get returned is fine.
	out, err = setBucket(s, admin, &sandboxv1.FileSystemSnapshotBucketConfig{Region: "eu-west-1"}, "region")
	if err != nil || out.GetBucketName() != "acme-fss" || out.GetRegion() != "eu-west-1" {
		t.Fatalf("region only = %v, %v", out, err)
	}
	if _, err := setBucket(s, admin, getBucketConfig(t, s, user)); err != nil {
		t.Fatalf("round trip: %v", err)
	}

	// Clearing goes back to the platform's bucket.
	out, err = setBucket(s, admin, &sandboxv1.FileSystemSnapshotBucketConfig{BucketName: ""})
	if err != nil || out.GetMode() != cwManaged || out.GetBucketName() != "" || out.GetRegion() != "" || out.GetEffectiveBucketName() != "platform-fss" {
		t.Fatalf("clear = %v, %v", out, err)
	}
	if got := getBucketConfig(t, s, user); got.GetMode() != cwManaged {
		t.Errorf("get after clear = %v", got)
	}
}

func TestFSSBucketConfigRefusals(t *testing.T) {
	p := &fakeProber{ok: map[string]bool{"acme-fss": true, "globex-fss": true}}
	s, _ := settingsServer(t, p)
	admin := asRole("acme", auth.RoleAdmin)

	invalid := func(c *sandboxv1.FileSystemSnapshotBucketConfig, field string, mask ...string) {
		t.Helper()
		_, err := setBucket(s, admin, c, mask...)
		wantBucketReason(t, err, connect.CodeInvalidArgument, apierr.InvalidRequest)
		for _, v := range apierr.Violations(err) {
			if v.Field == field {
				return
			}
		}
		t.Errorf("%v: no violation of %s in %v", c, field, apierr.Violations(err))
	}
	invalid(nil, "file_system_snapshot_bucket_config")
	for _, name := range []string{"ab", "Acme-FSS", "acme_fss", "-acme", "acme..fss", "acme.-fss", "192.168.1.1", "xn--acme", "acme-s3alias", strings.Repeat("a", 64)} {
		invalid(&sandboxv1.FileSystemSnapshotBucketConfig{BucketName: name}, "file_system_snapshot_bucket_config.bucket_name")
	}
	invalid(&sandboxv1.FileSystemSnapshotBucketConfig{BucketName: "platform-fss"}, "file_system_snapshot_bucket_config.bucket_name")
	invalid(&sandboxv1.FileSystemSnapshotBucketConfig{BucketName: "acme-fss", Region: "US_EAST"}, "file_system_snapshot_bucket_config.region")
	invalid(&sandboxv1.FileSystemSnapshotBucketConfig{Region: "us-east-1"}, "file_system_snapshot_bucket_config.region")
	invalid(&sandboxv1.FileSystemSnapshotBucketConfig{BucketName: "acme-fss", Mode: cwManaged}, "file_system_snapshot_bucket_config.mode")
	invalid(&sandboxv1.FileSystemSnapshotBucketConfig{BucketName: "acme-fss", EffectiveBucketName: "x"}, "file_system_snapshot_bucket_config.effective_bucket_name")
	invalid(&sandboxv1.FileSystemSnapshotBucketConfig{BucketName: "acme-fss"}, "update_mask", "mode")
	invalid(&sandboxv1.FileSystemSnapshotBucketConfig{BucketName: "acme-fss"}, "update_mask", "bucket")
	if len(p.asked) != 0 {
		t.Errorf("invalid requests probed %v", p.asked)
	}

	// Not reachable with the platform's credentials.
	_, err := setBucket(s, admin, &sandboxv1.FileSystemSnapshotBucketConfig{BucketName: "nowhere-fss"})
	wantBucketReason(t, err, connect.CodeFailedPrecondition, apierr.FSSBucketUnavailable)
	if !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("message does not say why: %v", err)
	}

	// A bucket is one organization's.
	if _, err := setBucket(s, asRole("globex", auth.RoleAdmin), &sandboxv1.FileSystemSnapshotBucketConfig{BucketName: "globex-fss"}); err != nil {
		t.Fatal(err)
	}
	_, err = setBucket(s, admin, &sandboxv1.FileSystemSnapshotBucketConfig{BucketName: "globex-fss"})
	wantBucketReason(t, err, connect.CodeFailedPrecondition, apierr.FSSBucketUnavailable)
	if strings.Contains(err.Error(), "globex\"") || apierr.Info(err).GetMetadata()["org"] != "" {
		t.Errorf("names the other organization: %v", err)
	}

	// A platform store that is not S3: no prober, no own bucket; clearing still works.
	s.fss.ProbeBucket = nil
	_, err = setBucket(s, admin, &sandboxv1.FileSystemSnapshotBucketConfig{BucketName: "acme-fss"})
	wantBucketReason(t, err, connect.CodeFailedPrecondition, apierr.FSSBucketUnavailable)
	if out, err := setBucket(s, admin, &sandboxv1.FileSystemSnapshotBucketConfig{}); err != nil || out.GetMode() != cwManaged {
		t.Errorf("clear without S3 = %v, %v", out, err)
	}
}

// TestCheckRestoreBucket: the platform's bucket and the organization's current one
// restore; an old own bucket does not (even reachable): CWSANDBOX_FSS_BUCKET_MISMATCH.
func TestCheckRestoreBucket(t *testing.T) {
	p := &fakeProber{ok: map[string]bool{"acme-fss": true, "acme-old": true}}
	s, st := settingsServer(t, p)
	ctx := asRole("acme", auth.RoleUser)
	for _, b := range []string{"", "platform-fss"} {
		if err := s.checkRestoreBucket(ctx, "acme", b); err != nil {
			t.Errorf("%q: %v", b, err)
		}
	}
	err := s.checkRestoreBucket(ctx, "acme", "acme-old")
	wantBucketReason(t, err, connect.CodeFailedPrecondition, apierr.FSSBucketMismatch)
	if md := apierr.Info(err).GetMetadata(); md["object_bucket"] != "acme-old" || md["current_bucket"] != "platform-fss" {
		t.Errorf("metadata = %v", md)
	}
	if _, err := st.FSSBucketConfigs().Put(ctx, store.FSSBucketConfig{Org: "acme", Bucket: "acme-fss"}); err != nil {
		t.Fatal(err)
	}
	for _, b := range []string{"acme-fss", "platform-fss"} {
		if err := s.checkRestoreBucket(ctx, "acme", b); err != nil {
			t.Errorf("%q with an own bucket: %v", b, err)
		}
	}
	err = s.checkRestoreBucket(ctx, "acme", "acme-old")
	wantBucketReason(t, err, connect.CodeFailedPrecondition, apierr.FSSBucketMismatch)
	if md := apierr.Info(err).GetMetadata(); md["object_bucket"] != "acme-old" || md["current_bucket"] != "acme-fss" {
		t.Errorf("metadata = %v", md)
	}
	if len(p.asked) != 0 {
		t.Errorf("restore checks probed buckets: %v", p.asked)
	}
}

// TestSettingsServiceServesBucketConfig: the gateway's handler serves both RPCs (not the
// UNIMPLEMENTED stub), behind authentication.
func TestSettingsServiceServesBucketConfig(t *testing.T) {
	dir := t.TempDir()
	st := openFSSStore(t)
	keys, err := auth.OpenKeyring(filepath.Join(dir, "keys.json"))
	if err != nil {
		t.Fatal(err)
	}
	adminKey, _, err := keys.Create("acme", auth.RoleAdmin, "admin")
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Config{Auth: keys, Runners: []runner.Handle{&acceptingRunner{id: "r1"}},
		FSS: FSSOptions{PlatformBucket: "local", BucketConfigs: st.FSSBucketConfigs()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	c := sandboxv1connect.NewSettingsServiceClient(http.DefaultClient, srv.URL)

	req := connect.NewRequest(&sandboxv1.GetFileSystemSnapshotBucketConfigRequest{})
	if _, err := c.GetFileSystemSnapshotBucketConfig(context.Background(), req); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("without a key: %v", err)
	}
	req.Header().Set("Authorization", "Bearer "+adminKey)
	res, err := c.GetFileSystemSnapshotBucketConfig(context.Background(), req)
	if err != nil || res.Msg.GetMode() != cwManaged || res.Msg.GetEffectiveBucketName() != "local" {
		t.Fatalf("get = %v, %v", res, err)
	}
	up := connect.NewRequest(&sandboxv1.UpdateFileSystemSnapshotBucketConfigRequest{FileSystemSnapshotBucketConfig: &sandboxv1.FileSystemSnapshotBucketConfig{BucketName: "acme-fss"}})
	up.Header().Set("Authorization", "Bearer "+adminKey)
	_, err = c.UpdateFileSystemSnapshotBucketConfig(context.Background(), up)
	wantBucketReason(t, err, connect.CodeFailedPrecondition, apierr.FSSBucketUnavailable)
}
