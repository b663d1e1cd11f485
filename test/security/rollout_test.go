package security

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"connectrpc.com/connect"

	controlplanev1 "github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1/controlplanev1connect"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/connecttest"
)

// TestRolloutResumeTenantAdminDenied: resuming a halted channel's automatic rollout moves
// every organization's runners to a version that failed its health gate, so only the
// platform's admins may; an admin of a tenant organization is refused over Connect and
// REST.
func TestRolloutResumeTenantAdminDenied(t *testing.T) {
	d := needDev(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tenant, err := d.NewKey("org-a", "admin")
	if err != nil {
		t.Fatal(err)
	}
	c := controlplanev1connect.NewRolloutServiceClient(&http.Client{}, d.API, connect.WithInterceptors(connecttest.Bearer(tenant)))
	_, err = c.ResumeRollout(ctx, connect.NewRequest(&controlplanev1.ResumeRolloutRequest{Channel: controlplanev1.ReleaseChannel_RAPID}))
	if connect.CodeOf(err) != connect.CodePermissionDenied || apierr.Reason(err) != apierr.PermissionDenied {
		t.Errorf("tenant admin resumes: %v, want PERMISSION_DENIED %s", err, apierr.PermissionDenied)
	}
	st, b := rest(t, d, "POST", "/v1/sandbox/rollouts:resume", "Bearer "+tenant, []byte(`{"channel":"RAPID"}`))
	var e apiError
	_ = json.Unmarshal(b, &e)
	if st != http.StatusForbidden || e.reason() != apierr.PermissionDenied {
		t.Errorf("tenant admin resumes over REST: HTTP %d %s, want 403 %s", st, b, apierr.PermissionDenied)
	}
	// The platform's admin may (nothing is halted here: it changes nothing).
	p := controlplanev1connect.NewRolloutServiceClient(&http.Client{}, d.API, connect.WithInterceptors(connecttest.Bearer(d.Admin)))
	if _, err := p.ResumeRollout(ctx, connect.NewRequest(&controlplanev1.ResumeRolloutRequest{Channel: controlplanev1.ReleaseChannel_RAPID})); err != nil {
		t.Errorf("platform admin resumes: %v", err)
	}
}
