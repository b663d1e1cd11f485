package security

import (
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/controlplane"
)

// TestTenantCannotSquatPlatformRunnerID: runner IDs are unique across organizations and
// first come, first served, so a tenant's admin could take the ID the operator means to
// give a platform runner (its endpoint hosts and certificates are named by it). Runner
// IDs beginning "platform-" are the platform organization's: org-b's admin is refused
// (PERMISSION_DENIED CWSANDBOX_RUNNER_ID_RESERVED, a violation on
// managed_runner.runner_id), over the control plane's real API with its real key
// check, and nothing is created; an org-b member (not admin) is refused too; the
// platform's admin then creates the ID (before the fix org-b's create succeeded and the
// platform's was ALREADY_EXISTS).
func TestTenantCannotSquatPlatformRunnerID(t *testing.T) {
	p, ctx := newTenantPlatform(t, time.Minute, "runner prefix test CA", "org-b")
	p.startControlPlane(controlplane.Config{})
	const id = "platform-edge-1"

	err := p.createRunner(p.key("org-b", auth.RoleAdmin), id)
	if connect.CodeOf(err) != connect.CodePermissionDenied || apierr.Reason(err) != apierr.RunnerIDReserved {
		t.Fatalf("org-b's admin creates %s: %v (reason %q), want PERMISSION_DENIED %s", id, err, apierr.Reason(err), apierr.RunnerIDReserved)
	}
	if vs := apierr.Violations(err); len(vs) != 1 || vs[0].Field != "managed_runner.runner_id" {
		t.Errorf("violations %v, want one on managed_runner.runner_id", vs)
	}
	if err := p.createRunner(p.key("org-b", auth.RoleUser), id); connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Errorf("org-b's member creates %s: %v, want PERMISSION_DENIED", id, err)
	}
	if _, err := p.St.Runners().Get(ctx, "org-b", id); err == nil {
		t.Fatalf("org-b's %s exists", id)
	}
	if err := p.createRunner(p.key("platform", auth.RoleAdmin), id); err != nil {
		t.Fatalf("the platform's admin creates %s: %v", id, err)
	}
	if r, err := p.St.Runners().Get(ctx, "platform", id); err != nil || r.Org != "platform" {
		t.Fatalf("the platform's %s: %+v %v", id, r, err)
	}
}
