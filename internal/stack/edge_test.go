package stack

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/sandboxd/sandboxd/internal/auth"
)

type plainAuth struct{}

func (plainAuth) Authenticate(string) (auth.Principal, error) {
	return auth.Principal{}, auth.ErrInvalidKey
}

// TestKeyActivity: a session's key is active while it exists, unrevoked, in the session's
// organization.
func TestKeyActivity(t *testing.T) {
	k, err := auth.OpenKeyring(filepath.Join(t.TempDir(), "keys.json"))
	if err != nil {
		t.Fatal(err)
	}
	_, p, err := k.Create("org-a", auth.RoleUser, "")
	if err != nil {
		t.Fatal(err)
	}
	active := KeyActivity(k)
	ctx := context.Background()
	if err := active(ctx, p.KeyID, "org-a"); err != nil {
		t.Errorf("live key: %v", err)
	}
	if err := active(ctx, p.KeyID, "org-b"); err == nil {
		t.Error("key of org-a active for org-b")
	}
	if err := k.Revoke(p.KeyID); err != nil {
		t.Fatal(err)
	}
	if err := active(ctx, p.KeyID, "org-a"); err == nil {
		t.Error("revoked key still active")
	}
	if KeyActivity(plainAuth{}) != nil {
		t.Error("an authenticator that cannot tell got a KeyActive")
	}
}
