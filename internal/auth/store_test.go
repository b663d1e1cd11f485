package auth_test

import (
	"context"
	"errors"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/store"
)

func openStore(t *testing.T) store.Store {
	t.Helper()
	st, err := store.Open(t.Context(), filepath.Join(t.TempDir(), "auth.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	if _, err := st.Orgs().Create(t.Context(), store.Org{ID: "o1"}); err != nil {
		t.Fatal(err)
	}
	return st
}

func TestStoreAuthenticator(t *testing.T) {
	st := openStore(t)
	ctx := t.Context()
	key, rec, err := auth.IssueKey(ctx, st, "o1", auth.RoleUser, "ci")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := auth.IssueKey(ctx, st, "o1", "root", ""); err == nil {
		t.Error("unknown role accepted")
	}
	a := auth.NewStoreAuthenticator(st, nil)
	p, err := a.Authenticate(key)
	if err != nil || p.KeyID != rec.ID || p.Org != "o1" || p.Role != auth.RoleUser || p.Name != "ci" {
		t.Fatalf("authenticate: %+v %v", p, err)
	}
	a.Wait()
	got, err := st.APIKeys().Get(ctx, rec.ID)
	if err != nil || got.LastUsedAt == nil {
		t.Fatalf("last use not recorded: %+v %v", got, err)
	}
	first := *got.LastUsedAt
	// Within a minute, a second use writes nothing.
	if _, err := a.Authenticate(key); err != nil {
		t.Fatal(err)
	}
	a.Wait()
	if got, _ := st.APIKeys().Get(ctx, rec.ID); !got.LastUsedAt.Equal(first) {
		t.Errorf("last use written twice within a minute: %v then %v", first, got.LastUsedAt)
	}
	if p, err := a.KeyActive(rec.ID); err != nil || p.Org != "o1" {
		t.Errorf("KeyActive of a live key: %+v %v", p, err)
	}
	for _, bad := range []string{"", "nope", "sbx_", "sbx_" + rec.ID, "sbx_" + rec.ID + "_wrong", "sbx_ffffffffffffffff_x", key + "x"} {
		if _, err := a.Authenticate(bad); !errors.Is(err, auth.ErrInvalidKey) {
			t.Errorf("Authenticate(%q) = %v, want ErrInvalidKey", bad, err)
		}
	}
	if _, err := st.APIKeys().Revoke(ctx, "o1", rec.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Authenticate(key); !errors.Is(err, auth.ErrInvalidKey) {
		t.Errorf("revoked key: %v", err)
	}
	if _, err := a.KeyActive(rec.ID); !errors.Is(err, auth.ErrInvalidKey) {
		t.Errorf("KeyActive of a revoked key: %v", err)
	}
	if _, err := a.KeyActive("ffffffffffffffff"); !errors.Is(err, auth.ErrInvalidKey) {
		t.Errorf("KeyActive of an unknown key: %v", err)
	}
}

func TestInterceptor(t *testing.T) {
	st := openStore(t)
	ctx := t.Context()
	admin, _, _ := auth.IssueKey(ctx, st, "o1", auth.RoleAdmin, "")
	user, _, _ := auth.IssueKey(ctx, st, "o1", auth.RoleUser, "")
	a := auth.NewStoreAuthenticator(st, nil)
	defer a.Wait()
	hdr := func(v string) http.Header {
		h := http.Header{}
		if v != "" {
			h.Set("Authorization", v)
		}
		return h
	}
	for _, tc := range []struct {
		name    string
		require auth.Role
		header  string
		code    connect.Code
		reason  string
	}{
		{"admin for admin", auth.RoleAdmin, "Bearer " + admin, 0, ""},
		{"user for admin", auth.RoleAdmin, "Bearer " + user, connect.CodePermissionDenied, apierr.PermissionDenied},
		{"admin for user", auth.RoleUser, "Bearer " + admin, 0, ""},
		{"user for any", "", "Bearer " + user, 0, ""},
		{"lowercase scheme", "", "bearer " + user, 0, ""},
		{"uppercase scheme", "", "BEARER " + user, 0, ""},
		{"scheme only", "", "bearer ", connect.CodeUnauthenticated, apierr.Unauthenticated},
		{"oversized key", "", "Bearer " + user + strings.Repeat("x", 300), connect.CodeUnauthenticated, apierr.Unauthenticated},
		{"no header", auth.RoleAdmin, "", connect.CodeUnauthenticated, apierr.Unauthenticated},
		{"not bearer", "", "Basic " + user, connect.CodeUnauthenticated, apierr.Unauthenticated},
		{"unknown key", "", "Bearer sbx_00_11", connect.CodeUnauthenticated, apierr.Unauthenticated},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := auth.Interceptor{Auth: a, Require: tc.require}.Authorize(context.Background(), hdr(tc.header))
			if tc.code == 0 {
				if _, ok := auth.FromContext(c); err != nil || !ok {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if connect.CodeOf(err) != tc.code || apierr.Reason(err) != tc.reason {
				t.Fatalf("err = %v (%s), want %v %s", err, apierr.Reason(err), tc.code, tc.reason)
			}
		})
	}
}

type countingAuth struct{ n int }

func (c *countingAuth) Authenticate(string) (auth.Principal, error) {
	c.n++
	return auth.Principal{}, auth.ErrInvalidKey
}

// TestCheckBoundsTheWork: an oversized key is refused without a lookup.
func TestCheckBoundsTheWork(t *testing.T) {
	c := &countingAuth{}
	h := http.Header{"Authorization": {"Bearer sbx_" + strings.Repeat("a", 1<<20)}}
	if _, err := auth.Check(c, h); connect.CodeOf(err) != connect.CodeUnauthenticated || c.n != 0 {
		t.Errorf("oversized key: %v after %d lookups, want UNAUTHENTICATED after none", err, c.n)
	}
	h.Set("Authorization", "Bearer sbx_0123456789abcdef_x")
	if _, err := auth.Check(c, h); connect.CodeOf(err) != connect.CodeUnauthenticated || c.n != 1 {
		t.Errorf("ordinary key: %v after %d lookups, want one", err, c.n)
	}
}

type failingAuth struct{}

func (failingAuth) Authenticate(string) (auth.Principal, error) {
	return auth.Principal{}, errors.New("database is down")
}

// TestCheckStoreDown: a key store that cannot answer is UNAVAILABLE with
// CWSANDBOX_BACKEND_UNAVAILABLE (the clients retry it), never an authentication failure.
func TestCheckStoreDown(t *testing.T) {
	h := http.Header{"Authorization": {"Bearer sbx_0123456789abcdef_x"}}
	_, err := auth.Check(failingAuth{}, h)
	if connect.CodeOf(err) != connect.CodeUnavailable || apierr.Reason(err) != apierr.BackendUnavailable {
		t.Errorf("store down: %v (reason %q), want UNAVAILABLE %s", err, apierr.Reason(err), apierr.BackendUnavailable)
	}
}
