package controlplane_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/structpb"

	controlplanev1 "github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1/controlplanev1connect"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/controlplane"
	"github.com/sandboxd/sandboxd/internal/store"
)

var (
	hexA = strings.Repeat("a1", 32)
	hexB = strings.Repeat("b2", 32)
)

func releaseMsg(version string) *controlplanev1.Release {
	return &controlplanev1.Release{Version: version, RunnerImageDigest: "sha256:" + hexA, AgentImageDigest: "sha256:" + hexB,
		BinaryChecksums: map[string]string{"amd64": hexA, "arm64": hexB}}
}

func TestValidateRelease(t *testing.T) {
	for _, tc := range []struct {
		name   string
		edit   func(r *controlplanev1.Release)
		fields []string // nil: valid
	}{
		{"valid", func(*controlplanev1.Release) {}, nil},
		{"valid without checksums", func(r *controlplanev1.Release) { r.BinaryChecksums = nil }, nil},
		{"valid prerelease, no v", func(r *controlplanev1.Release) { r.Version = "1.4.0-rc.1" }, nil},
		{"version missing", func(r *controlplanev1.Release) { r.Version = "" }, []string{"release.version"}},
		{"version not semver", func(r *controlplanev1.Release) { r.Version = "latest" }, []string{"release.version"}},
		{"version with build metadata", func(r *controlplanev1.Release) { r.Version = "v1.0.0+abc" }, []string{"release.version"}},
		{"runner digest without algorithm", func(r *controlplanev1.Release) { r.RunnerImageDigest = hexA }, []string{"release.runner_image_digest"}},
		{"agent digest missing", func(r *controlplanev1.Release) { r.AgentImageDigest = "" }, []string{"release.agent_image_digest"}},
		{"unknown arch", func(r *controlplanev1.Release) { r.BinaryChecksums["x86_64"] = hexA }, []string{`release.binary_checksums["x86_64"]`}},
		{"checksum not hex", func(r *controlplanev1.Release) { r.BinaryChecksums["arm64"] = "sha256:" + hexA }, []string{`release.binary_checksums["arm64"]`}},
		{"channels are output only", func(r *controlplanev1.Release) {
			r.Channels = []controlplanev1.ReleaseChannel{controlplanev1.ReleaseChannel_STABLE}
		}, []string{"release.channels"}},
		{"several at once", func(r *controlplanev1.Release) { r.Version, r.RunnerImageDigest, r.AgentImageDigest = "1.0", "x", "y" },
			[]string{"release.agent_image_digest", "release.runner_image_digest", "release.version"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := releaseMsg("v1.2.3")
			tc.edit(r)
			rec, err := controlplane.ValidateRelease(r)
			if tc.fields == nil {
				if err != nil || rec.Version != r.Version || len(rec.BinaryChecksums) != len(r.BinaryChecksums) {
					t.Fatalf("valid release: %+v %v", rec, err)
				}
				return
			}
			if connect.CodeOf(err) != connect.CodeInvalidArgument || apierr.Reason(err) != apierr.InvalidRequest {
				t.Fatalf("err = %v, want INVALID_ARGUMENT", err)
			}
			if got := fields(err); !slices.Equal(got, tc.fields) {
				t.Fatalf("violations on %v, want %v (%v)", got, tc.fields, err)
			}
		})
	}
	if _, err := controlplane.ValidateRelease(nil); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("nil release: %v", err)
	}
}

// releaseBed is a service over a fresh SQLite store (releases are platform-wide, so every
// test needs a database of its own) with two runners on version v1.0.0: "stable" and
// "rapid", following those channels. The configured targets are v1.0.0 on both.
type releaseBed struct {
	st   store.Store
	svc  *controlplane.Service
	actx context.Context
	org  string
}

func newReleaseBed(t *testing.T) *releaseBed {
	t.Helper()
	ctx := t.Context()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "cp.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	org := "o1"
	if err := controlplane.EnsureOrg(ctx, st, org); err != nil {
		t.Fatal(err)
	}
	svc, err := controlplane.New(controlplane.Config{Store: st, Auth: auth.NewStoreAuthenticator(st, nil), PlatformOrg: org, Logger: slog.New(slog.DiscardHandler),
		TargetVersions: map[string]string{store.ChannelStable: "v1.0.0", store.ChannelRapid: "v1.0.0"}})
	if err != nil {
		t.Fatal(err)
	}
	b := &releaseBed{st: st, svc: svc, org: org, actx: auth.WithPrincipal(ctx, auth.Principal{KeyID: "k", Org: org, Role: auth.RoleAdmin})}
	for i, ch := range []controlplanev1.ReleaseChannel{controlplanev1.ReleaseChannel_STABLE, controlplanev1.ReleaseChannel_RAPID} {
		id := strings.ToLower(ch.String())
		if _, err := svc.CreateManagedRunner(b.actx, connect.NewRequest(&controlplanev1.CreateManagedRunnerRequest{ManagedRunner: &controlplanev1.ManagedRunner{
			RunnerId: id, ClusterId: "c" + string(rune('0'+i)), Zone: "z1", ReleaseChannel: ch, Policy: &structpb.Struct{}}})); err != nil {
			t.Fatal(err)
		}
		if err := st.Runners().RecordHeartbeat(ctx, org, id, store.RunnerStatus{Version: "v1.0.0", Ready: true}); err != nil {
			t.Fatal(err)
		}
	}
	return b
}

// status returns runner id's target version and update_available, from Get and List alike.
func (b *releaseBed) status(t *testing.T, id string) (string, bool) {
	t.Helper()
	got, err := b.svc.GetManagedRunner(b.actx, connect.NewRequest(&controlplanev1.GetManagedRunnerRequest{RunnerId: id}))
	if err != nil {
		t.Fatal(err)
	}
	st := got.Msg.GetStatus()
	list, err := b.svc.ListManagedRunners(b.actx, connect.NewRequest(&controlplanev1.ListManagedRunnersRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range list.Msg.GetManagedRunners() {
		if r.GetRunnerId() == id && (r.GetStatus().GetTargetVersion() != st.GetTargetVersion() || r.GetStatus().GetUpdateAvailable() != st.GetUpdateAvailable()) {
			t.Fatalf("list and get disagree on %s: %v / %v", id, r.GetStatus(), st)
		}
	}
	return st.GetTargetVersion(), st.GetUpdateAvailable()
}

func (b *releaseBed) wantStatus(t *testing.T, id, target string, update bool) {
	t.Helper()
	if gotT, gotU := b.status(t, id); gotT != target || gotU != update {
		t.Fatalf("runner %s: target %q update_available %v; want %q %v", id, gotT, gotU, target, update)
	}
}

func (b *releaseBed) publish(t *testing.T, version string) *controlplanev1.Release {
	t.Helper()
	r, err := b.svc.PublishRelease(b.actx, connect.NewRequest(&controlplanev1.PublishReleaseRequest{Release: releaseMsg(version)}))
	if err != nil {
		t.Fatalf("publish %s: %v", version, err)
	}
	return r.Msg
}

func (b *releaseBed) promote(version string) (*controlplanev1.Release, error) {
	r, err := b.svc.PromoteRelease(b.actx, connect.NewRequest(&controlplanev1.PromoteReleaseRequest{Version: version}))
	if err != nil {
		return nil, err
	}
	return r.Msg, nil
}

func wantReason(t *testing.T, what string, err error, code connect.Code, reason string) {
	t.Helper()
	if connect.CodeOf(err) != code || apierr.Reason(err) != reason {
		t.Fatalf("%s: err = %v (reason %q), want %v %s", what, err, apierr.Reason(err), code, reason)
	}
}

func TestReleasesDriveChannelTargets(t *testing.T) {
	b := newReleaseBed(t)
	// No release records: the configured targets, as before.
	b.wantStatus(t, "stable", "v1.0.0", false)
	b.wantStatus(t, "rapid", "v1.0.0", false)
	list, err := b.svc.ListReleases(b.actx, connect.NewRequest(&controlplanev1.ListReleasesRequest{}))
	if err != nil || len(list.Msg.GetReleases()) != 0 || list.Msg.GetStableVersion() != "v1.0.0" || list.Msg.GetRapidVersion() != "v1.0.0" {
		t.Fatalf("empty list: %v %v", list, err)
	}

	// Publish: RAPID offers it, STABLE offers nothing yet.
	p := b.publish(t, "v1.1.0")
	if !slices.Equal(p.GetChannels(), []controlplanev1.ReleaseChannel{controlplanev1.ReleaseChannel_RAPID}) ||
		p.GetRapidTime() == nil || p.GetStableTime() != nil || p.GetBinaryChecksums()["arm64"] != hexB {
		t.Fatalf("published: %v", p)
	}
	b.wantStatus(t, "rapid", "v1.1.0", true)
	b.wantStatus(t, "stable", "", false)
	_, err = b.svc.ApplyAvailableUpdate(b.actx, connect.NewRequest(&controlplanev1.ApplyAvailableUpdateRequest{RunnerId: "stable"}))
	wantReason(t, "apply on stable before promotion", err, connect.CodeFailedPrecondition, apierr.NoUpdateAvailable)
	applied, err := b.svc.ApplyAvailableUpdate(b.actx, connect.NewRequest(&controlplanev1.ApplyAvailableUpdateRequest{RunnerId: "rapid"}))
	if err != nil || applied.Msg.GetStatus().GetDesiredVersion() != "v1.1.0" {
		t.Fatalf("apply on rapid: %v %v", applied, err)
	}

	// Promote: STABLE offers it too.
	pr, err := b.promote("v1.1.0")
	if err != nil || !slices.Equal(pr.GetChannels(), []controlplanev1.ReleaseChannel{controlplanev1.ReleaseChannel_STABLE, controlplanev1.ReleaseChannel_RAPID}) || pr.GetStableTime() == nil {
		t.Fatalf("promote: %v %v", pr, err)
	}
	b.wantStatus(t, "stable", "v1.1.0", true)
	b.wantStatus(t, "rapid", "v1.1.0", true)

	// A runner on the channel's version has no update.
	if err := b.st.Runners().RecordHeartbeat(t.Context(), b.org, "stable", store.RunnerStatus{Version: "v1.1.0", Ready: true}); err != nil {
		t.Fatal(err)
	}
	b.wantStatus(t, "stable", "v1.1.0", false)

	// A newer RAPID version: only RAPID moves; an older publication changes no channel.
	b.publish(t, "v1.2.0")
	b.publish(t, "v1.1.1")
	b.wantStatus(t, "rapid", "v1.2.0", true)
	b.wantStatus(t, "stable", "v1.1.0", false)

	list, err = b.svc.ListReleases(b.actx, connect.NewRequest(&controlplanev1.ListReleasesRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	var versions []string
	for _, r := range list.Msg.GetReleases() {
		versions = append(versions, r.GetVersion())
	}
	if strings.Join(versions, " ") != "v1.2.0 v1.1.1 v1.1.0" || list.Msg.GetStableVersion() != "v1.1.0" || list.Msg.GetRapidVersion() != "v1.2.0" {
		t.Fatalf("list: %v stable %q rapid %q", versions, list.Msg.GetStableVersion(), list.Msg.GetRapidVersion())
	}
}

func TestReleaseErrors(t *testing.T) {
	b := newReleaseBed(t)
	b.publish(t, "v1.0.0")
	b.publish(t, "v2.0.0")

	_, err := b.svc.PublishRelease(b.actx, connect.NewRequest(&controlplanev1.PublishReleaseRequest{Release: releaseMsg("v1.0.0")}))
	wantReason(t, "publish twice", err, connect.CodeAlreadyExists, apierr.AlreadyExists)

	bad := releaseMsg("v1")
	bad.AgentImageDigest = "latest"
	_, err = b.svc.PublishRelease(b.actx, connect.NewRequest(&controlplanev1.PublishReleaseRequest{Release: bad}))
	wantReason(t, "publish invalid", err, connect.CodeInvalidArgument, apierr.InvalidRequest)
	if got := fields(err); !slices.Equal(got, []string{"release.agent_image_digest", "release.version"}) {
		t.Fatalf("violations %v", got)
	}
	_, err = b.svc.PublishRelease(b.actx, connect.NewRequest(&controlplanev1.PublishReleaseRequest{}))
	wantReason(t, "publish nothing", err, connect.CodeInvalidArgument, apierr.InvalidRequest)

	_, err = b.promote("not a version")
	wantReason(t, "promote invalid", err, connect.CodeInvalidArgument, apierr.InvalidRequest)
	if got := fields(err); !slices.Equal(got, []string{"version"}) {
		t.Fatalf("violations %v", got)
	}
	_, err = b.promote("v9.0.0")
	wantReason(t, "promote unknown", err, connect.CodeNotFound, apierr.ReleaseNotFound)

	if _, err := b.promote("v2.0.0"); err != nil {
		t.Fatal(err)
	}
	_, err = b.promote("v1.0.0")
	wantReason(t, "promote older", err, connect.CodeFailedPrecondition, apierr.ReleaseNotPromotable)
	if !strings.Contains(err.Error(), "v2.0.0") {
		t.Fatalf("the error does not name the current STABLE version: %v", err)
	}
	if _, err := b.promote("v2.0.0"); err != nil {
		t.Fatalf("promote again: %v", err)
	}
}

// TestReleaseServiceOverHTTP: through Handler, the release RPCs need an admin key (a
// user key is PERMISSION_DENIED, none UNAUTHENTICATED), answer on REST, and refuse
// unknown JSON fields.
func TestReleaseServiceOverHTTP(t *testing.T) {
	b := newReleaseBed(t)
	ctx := t.Context()
	admin, _, err := auth.IssueKey(ctx, b.st, b.org, auth.RoleAdmin, "admin")
	if err != nil {
		t.Fatal(err)
	}
	user, _, err := auth.IssueKey(ctx, b.st, b.org, auth.RoleUser, "user")
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(b.svc.Handler())
	defer srv.Close()
	client := func(key string) controlplanev1connect.ReleaseServiceClient {
		var opts []connect.ClientOption
		if key != "" {
			opts = append(opts, connect.WithInterceptors(connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
				return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
					req.Header().Set("Authorization", "Bearer "+key)
					return next(ctx, req)
				}
			})))
		}
		return controlplanev1connect.NewReleaseServiceClient(srv.Client(), srv.URL, opts...)
	}
	for name, key := range map[string]string{"user key": user, "no key": ""} {
		code := connect.CodePermissionDenied
		if key == "" {
			code = connect.CodeUnauthenticated
		}
		c := client(key)
		_, err := c.PublishRelease(ctx, connect.NewRequest(&controlplanev1.PublishReleaseRequest{Release: releaseMsg("v1.1.0")}))
		if connect.CodeOf(err) != code {
			t.Errorf("%s: publish: %v, want %v", name, err, code)
		}
		_, err = c.PromoteRelease(ctx, connect.NewRequest(&controlplanev1.PromoteReleaseRequest{Version: "v1.1.0"}))
		if connect.CodeOf(err) != code {
			t.Errorf("%s: promote: %v, want %v", name, err, code)
		}
		_, err = c.ListReleases(ctx, connect.NewRequest(&controlplanev1.ListReleasesRequest{}))
		if connect.CodeOf(err) != code {
			t.Errorf("%s: list: %v, want %v", name, err, code)
		}
	}
	if rs, _ := b.st.Releases().List(ctx); len(rs) != 0 {
		t.Fatalf("a refused call wrote: %v", rs)
	}

	rest := func(method, path, body string) (int, string) {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, method, srv.URL+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+admin)
		req.Header.Set("Content-Type", "application/json")
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(out)
	}
	rel, _ := json.Marshal(map[string]any{"version": "v1.1.0", "runnerImageDigest": "sha256:" + hexA, "agentImageDigest": "sha256:" + hexB,
		"binaryChecksums": map[string]string{"amd64": hexA}})
	withUnknown := strings.Replace(string(rel), "{", `{"channel":"STABLE",`, 1)
	if code, body := rest("POST", "/v1/sandbox/releases", withUnknown); code != http.StatusBadRequest {
		t.Fatalf("unknown field: %d %s", code, body)
	}
	if code, body := rest("POST", "/v1/sandbox/releases", string(rel)); code != http.StatusOK || !strings.Contains(body, `"RAPID"`) {
		t.Fatalf("publish over REST: %d %s", code, body)
	}
	if code, body := rest("POST", "/v1/sandbox/releases/v1.1.0:promote", `{}`); code != http.StatusOK || !strings.Contains(body, `"STABLE"`) {
		t.Fatalf("promote over REST: %d %s", code, body)
	}
	if code, body := rest("POST", "/v1/sandbox/releases/v1.1.0:promote", `{"force":true}`); code != http.StatusBadRequest {
		t.Fatalf("promote with an unknown field: %d %s", code, body)
	}
	code, body := rest("GET", "/v1/sandbox/releases", "")
	if code != http.StatusOK || !strings.Contains(body, `"stableVersion":"v1.1.0"`) {
		t.Fatalf("list over REST: %d %s", code, body)
	}
	if _, err := client(admin).ListReleases(ctx, connect.NewRequest(&controlplanev1.ListReleasesRequest{})); err != nil {
		t.Fatalf("admin over Connect: %v", err)
	}
}

// TestReleasesOnlyPlatformAdmins: releases decide every organization's runners' target
// version, so an admin of any organization but the platform's may list them but not
// publish or promote (PERMISSION_DENIED), directly and over HTTP with a real key, and a
// refused call changes nothing.
func TestReleasesOnlyPlatformAdmins(t *testing.T) {
	b := newReleaseBed(t)
	ctx := t.Context()
	b.publish(t, "v1.1.0") // the platform's admin: on RAPID
	if err := controlplane.EnsureOrg(ctx, b.st, "tenant"); err != nil {
		t.Fatal(err)
	}
	tenantKey, err := controlplane.EnsureAdminKey(ctx, b.st, "tenant")
	if err != nil || tenantKey == "" {
		t.Fatalf("tenant admin key: %q %v", tenantKey, err)
	}
	srv := httptest.NewServer(b.svc.Handler())
	defer srv.Close()
	overHTTP := controlplanev1connect.NewReleaseServiceClient(srv.Client(), srv.URL,
		connect.WithInterceptors(connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
			return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
				req.Header().Set("Authorization", "Bearer "+tenantKey)
				return next(ctx, req)
			}
		})))
	tctx := auth.WithPrincipal(ctx, auth.Principal{KeyID: "t", Org: "tenant", Role: auth.RoleAdmin})
	denied := func(what string, err error) {
		t.Helper()
		wantReason(t, what, err, connect.CodePermissionDenied, apierr.PermissionDenied)
		if !strings.Contains(err.Error(), "platform operator") {
			t.Errorf("%s: the message does not say why: %v", what, err)
		}
	}
	for name, c := range map[string]interface {
		PublishRelease(context.Context, *connect.Request[controlplanev1.PublishReleaseRequest]) (*connect.Response[controlplanev1.Release], error)
		PromoteRelease(context.Context, *connect.Request[controlplanev1.PromoteReleaseRequest]) (*connect.Response[controlplanev1.Release], error)
	}{"direct": b.svc, "over HTTP": overHTTP} {
		cctx := ctx
		if name == "direct" {
			cctx = tctx
		}
		_, err := c.PublishRelease(cctx, connect.NewRequest(&controlplanev1.PublishReleaseRequest{Release: releaseMsg("v9.0.0")}))
		denied(name+": tenant publishes", err)
		_, err = c.PromoteRelease(cctx, connect.NewRequest(&controlplanev1.PromoteReleaseRequest{Version: "v1.1.0"}))
		denied(name+": tenant promotes", err)
		_, err = c.PromoteRelease(cctx, connect.NewRequest(&controlplanev1.PromoteReleaseRequest{Version: "v9.9.9"}))
		denied(name+": tenant promotes an unknown version", err) // refused before any lookup: no probing
	}
	// A user of the platform organization is no more allowed than a tenant's admin.
	_, err = b.svc.PublishRelease(auth.WithPrincipal(ctx, auth.Principal{KeyID: "u", Org: b.org, Role: auth.RoleUser}),
		connect.NewRequest(&controlplanev1.PublishReleaseRequest{Release: releaseMsg("v9.0.0")}))
	denied("platform user publishes", err)

	// Nothing changed: only v1.1.0, on RAPID; STABLE offers nothing.
	list, err := overHTTP.ListReleases(ctx, connect.NewRequest(&controlplanev1.ListReleasesRequest{}))
	if err != nil {
		t.Fatalf("a tenant's admin may list: %v", err)
	}
	rs := list.Msg.GetReleases()
	if len(rs) != 1 || rs[0].GetVersion() != "v1.1.0" || rs[0].GetStableTime() != nil ||
		list.Msg.GetStableVersion() != "" || list.Msg.GetRapidVersion() != "v1.1.0" {
		t.Fatalf("after refused calls: %v", list.Msg)
	}
	b.wantStatus(t, "stable", "", false)
	b.wantStatus(t, "rapid", "v1.1.0", true)

	// The platform's admin still may.
	if _, err := b.promote("v1.1.0"); err != nil {
		t.Fatalf("platform admin promotes: %v", err)
	}
}

func TestNewNeedsPlatformOrg(t *testing.T) {
	st, err := store.Open(t.Context(), filepath.Join(t.TempDir(), "cp.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, err := controlplane.New(controlplane.Config{Store: st, Auth: auth.NewStoreAuthenticator(st, nil)}); err == nil ||
		!strings.Contains(err.Error(), "platform organization") {
		t.Fatalf("New without PlatformOrg: %v", err)
	}
}
