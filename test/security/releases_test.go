package security

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	controlplanev1 "github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1/controlplanev1connect"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/connecttest"
)

// releases is the ReleaseService of d as the holder of key sees it.
func (d *Dev) releases(key string) controlplanev1connect.ReleaseServiceClient {
	return controlplanev1connect.NewReleaseServiceClient(&http.Client{}, d.API, connect.WithInterceptors(connecttest.Bearer(key)))
}

// TestReleasesTenantAdminCannotPublishOrPromote: releases decide the target version of
// every organization's runners, so an admin of a tenant organization (org-a, not the
// platform's "default") may not publish one or promote one to STABLE — over Connect or
// REST — and the refused calls change nothing. (Any organization's admin could.)
func TestReleasesTenantAdminCannotPublishOrPromote(t *testing.T) {
	d := needDev(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	tenant, err := d.NewKey("org-a", "admin")
	if err != nil {
		t.Fatal(err)
	}
	platform := d.releases(d.Admin)
	// The platform operator publishes a release (a prerelease below any real version): on
	// RAPID, for the tenant to try to promote.
	n := time.Now().UnixNano()
	onRapid := fmt.Sprintf("v0.0.1-security.%d", n)
	forged := fmt.Sprintf("v99.0.0-security.%d", n)
	release := func(v string) *controlplanev1.Release {
		return &controlplanev1.Release{Version: v, RunnerImageDigest: "sha256:" + strings.Repeat("ab", 32),
			AgentImageDigest: "sha256:" + strings.Repeat("cd", 32)}
	}
	if _, err := platform.PublishRelease(ctx, connect.NewRequest(&controlplanev1.PublishReleaseRequest{Release: release(onRapid)})); err != nil {
		t.Fatalf("the platform admin publishes: %v", err)
	}
	before, err := platform.ListReleases(ctx, connect.NewRequest(&controlplanev1.ListReleasesRequest{}))
	if err != nil {
		t.Fatal(err)
	}

	denied := func(what string, err error) {
		t.Helper()
		if connect.CodeOf(err) != connect.CodePermissionDenied || apierr.Reason(err) != apierr.PermissionDenied {
			t.Errorf("%s: %v, want PERMISSION_DENIED %s", what, err, apierr.PermissionDenied)
		}
	}
	deniedREST := func(what string, status int, body []byte) {
		t.Helper()
		var e apiError
		_ = json.Unmarshal(body, &e)
		if status != http.StatusForbidden || e.reason() != apierr.PermissionDenied {
			t.Errorf("%s: HTTP %d %s, want 403 %s", what, status, body, apierr.PermissionDenied)
		}
	}
	c := d.releases(tenant)
	_, err = c.PublishRelease(ctx, connect.NewRequest(&controlplanev1.PublishReleaseRequest{Release: release(forged)}))
	denied("tenant admin publishes", err)
	_, err = c.PromoteRelease(ctx, connect.NewRequest(&controlplanev1.PromoteReleaseRequest{Version: onRapid}))
	denied("tenant admin promotes", err)
	forgedREST := forged + ".rest"
	body, _ := json.Marshal(map[string]string{"version": forgedREST, "runnerImageDigest": release(forged).RunnerImageDigest,
		"agentImageDigest": release(forged).AgentImageDigest})
	st, b := rest(t, d, "POST", "/v1/sandbox/releases", "Bearer "+tenant, body)
	deniedREST("tenant admin publishes over REST", st, b)
	st, b = rest(t, d, "POST", "/v1/sandbox/releases/"+onRapid+":promote", "Bearer "+tenant, []byte(`{}`))
	deniedREST("tenant admin promotes over REST", st, b)

	// Nothing changed: no forged release, the published one only on RAPID, both channels
	// offering what they did.
	after, err := platform.ListReleases(ctx, connect.NewRequest(&controlplanev1.ListReleasesRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if after.Msg.GetStableVersion() != before.Msg.GetStableVersion() || after.Msg.GetRapidVersion() != before.Msg.GetRapidVersion() {
		t.Errorf("channels moved: STABLE %q -> %q, RAPID %q -> %q", before.Msg.GetStableVersion(), after.Msg.GetStableVersion(),
			before.Msg.GetRapidVersion(), after.Msg.GetRapidVersion())
	}
	if len(after.Msg.GetReleases()) != len(before.Msg.GetReleases()) {
		t.Errorf("releases: %d before, %d after", len(before.Msg.GetReleases()), len(after.Msg.GetReleases()))
	}
	for _, r := range after.Msg.GetReleases() {
		switch r.GetVersion() {
		case forged, forgedREST:
			t.Errorf("the tenant's release was recorded: %v", r)
		case onRapid:
			if r.GetStableTime() != nil {
				t.Errorf("the tenant promoted %s to STABLE: %v", onRapid, r)
			}
		}
	}
	// Listing reveals only which versions exist: any admin may.
	if _, err := c.ListReleases(ctx, connect.NewRequest(&controlplanev1.ListReleasesRequest{})); err != nil {
		t.Errorf("tenant admin lists: %v", err)
	}
}
