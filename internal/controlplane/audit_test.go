package controlplane_test

import (
	"context"
	"net/http/httptest"
	"testing"

	"connectrpc.com/connect"

	controlplanev1 "github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1/controlplanev1connect"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/store"
)

// TestAdminWritesAreAudited: through Handler, each admin write appears once in the
// store's audit log with its caller and result (a user key's refused write too); reads
// do not appear.
func TestAdminWritesAreAudited(t *testing.T) {
	b := newReleaseBed(t)
	ctx := t.Context()
	adminKey, admin, err := auth.IssueKey(ctx, b.st, b.org, auth.RoleAdmin, "admin")
	if err != nil {
		t.Fatal(err)
	}
	userKey, user, err := auth.IssueKey(ctx, b.st, b.org, auth.RoleUser, "user")
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(b.svc.Handler())
	defer srv.Close()
	client := func(key string) controlplanev1connect.ApiKeyServiceClient {
		return controlplanev1connect.NewApiKeyServiceClient(srv.Client(), srv.URL, connect.WithInterceptors(connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
			return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
				req.Header().Set("Authorization", "Bearer "+key)
				return next(ctx, req)
			}
		})))
	}
	created, err := client(adminKey).CreateApiKey(ctx, connect.NewRequest(&controlplanev1.CreateApiKeyRequest{DisplayName: "ci", Role: controlplanev1.Role_SANDBOX_USER}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client(adminKey).ListApiKeys(ctx, connect.NewRequest(&controlplanev1.ListApiKeysRequest{})); err != nil {
		t.Fatal(err)
	}
	newID := created.Msg.GetApiKey().GetKeyId()
	if _, err := client(userKey).RevokeApiKey(ctx, connect.NewRequest(&controlplanev1.RevokeApiKeyRequest{KeyId: newID})); connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Fatalf("revoke with a user key: %v", err)
	}
	es, _, err := b.st.Audit().List(ctx, store.AuditFilter{Org: b.org}, store.Page{})
	if err != nil {
		t.Fatal(err)
	}
	if len(es) != 2 {
		t.Fatalf("%d events, want 2: %+v", len(es), es)
	}
	revoke, create := es[0], es[1] // newest first
	if create.Method != "/sandboxd.controlplane.v1.ApiKeyService/CreateApiKey" || create.KeyID != admin.ID || create.Code != "OK" ||
		create.Kind != "apikey.create" || create.TargetType != "api_key" || create.TargetID != newID || create.RequestID == "" {
		t.Errorf("create: %+v", create)
	}
	if revoke.Method != "/sandboxd.controlplane.v1.ApiKeyService/RevokeApiKey" || revoke.KeyID != user.ID || revoke.Code != "PERMISSION_DENIED" ||
		revoke.Reason != apierr.PermissionDenied || revoke.TargetID != newID {
		t.Errorf("revoke: %+v", revoke)
	}
}
