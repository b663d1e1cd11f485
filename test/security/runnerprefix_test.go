package security

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/structpb"

	controlplanev1 "github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1/controlplanev1connect"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/connecttest"
	"github.com/sandboxd/sandboxd/internal/controlplane"
	"github.com/sandboxd/sandboxd/internal/pki"
	"github.com/sandboxd/sandboxd/internal/store"
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
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	tmp := t.TempDir()
	ca, err := pki.LoadOrCreateCA(filepath.Join(tmp, "pki"), "runner prefix test CA")
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(ctx, filepath.Join(tmp, "sandboxd.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	for _, o := range []string{"platform", "org-b"} {
		if err := controlplane.EnsureOrg(ctx, st, o); err != nil {
			t.Fatal(err)
		}
	}
	key := func(org string, role auth.Role) string {
		k, _, err := auth.IssueKey(ctx, st, org, role, org+" key")
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	cp, err := controlplane.New(controlplane.Config{Store: st, Auth: auth.NewStoreAuthenticator(st, nil), PlatformOrg: "platform",
		CA: ca, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(cp.Handler())
	t.Cleanup(srv.Close)
	create := func(k, id string) error {
		c := controlplanev1connect.NewRunnerManagementServiceClient(http.DefaultClient, srv.URL, connect.WithInterceptors(connecttest.Bearer(k)))
		_, err := c.CreateManagedRunner(ctx, connect.NewRequest(&controlplanev1.CreateManagedRunnerRequest{ManagedRunner: &controlplanev1.ManagedRunner{
			RunnerId: id, ClusterId: "c-" + id, Zone: "z", Policy: &structpb.Struct{}}}))
		return err
	}
	const id = "platform-edge-1"

	err = create(key("org-b", auth.RoleAdmin), id)
	if connect.CodeOf(err) != connect.CodePermissionDenied || apierr.Reason(err) != apierr.RunnerIDReserved {
		t.Fatalf("org-b's admin creates %s: %v (reason %q), want PERMISSION_DENIED %s", id, err, apierr.Reason(err), apierr.RunnerIDReserved)
	}
	if vs := apierr.Violations(err); len(vs) != 1 || vs[0].Field != "managed_runner.runner_id" {
		t.Errorf("violations %v, want one on managed_runner.runner_id", vs)
	}
	if err := create(key("org-b", auth.RoleUser), id); connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Errorf("org-b's member creates %s: %v, want PERMISSION_DENIED", id, err)
	}
	if _, err := st.Runners().Get(ctx, "org-b", id); err == nil {
		t.Fatalf("org-b's %s exists", id)
	}
	if err := create(key("platform", auth.RoleAdmin), id); err != nil {
		t.Fatalf("the platform's admin creates %s: %v", id, err)
	}
	if r, err := st.Runners().Get(ctx, "platform", id); err != nil || r.Org != "platform" {
		t.Fatalf("the platform's %s: %+v %v", id, r, err)
	}
}
