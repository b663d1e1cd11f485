package auth

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestKeyring(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys.json")
	k, err := OpenKeyring(path)
	if err != nil {
		t.Fatal(err)
	}
	admin, p, err := k.Create("org-a", RoleAdmin, "admin")
	if err != nil || p.Org != "org-a" || p.Role != RoleAdmin {
		t.Fatalf("create: %+v %v", p, err)
	}
	user, _, err := k.Create("org-b", RoleUser, "")
	if err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("keyring file mode: %v %v", st.Mode(), err)
	}
	if b, _ := os.ReadFile(path); strings.Contains(string(b), admin) || strings.Contains(string(b), user) {
		t.Fatal("keyring stores a secret in clear")
	}
	reloaded, err := OpenKeyring(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		key  string
		org  string
		err  error
	}{
		{"admin", admin, "org-a", nil},
		{"user", user, "org-b", nil},
		{"empty", "", "", ErrInvalidKey},
		{"no prefix", strings.TrimPrefix(admin, "sbx_"), "", ErrInvalidKey},
		{"wrong secret", admin[:len(admin)-1] + "x", "", ErrInvalidKey},
		{"unknown id", "sbx_0000000000000000_" + strings.Repeat("a", 64), "", ErrInvalidKey},
		{"no separator", "sbx_abc", "", ErrInvalidKey},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := reloaded.Authenticate(tc.key)
			if !errors.Is(err, tc.err) || got.Org != tc.org {
				t.Errorf("Authenticate = %+v, %v; want org %q, %v", got, err, tc.org, tc.err)
			}
		})
	}
	if err := reloaded.Revoke(p.KeyID); err != nil {
		t.Fatal(err)
	}
	if _, err := reloaded.Authenticate(admin); !errors.Is(err, ErrInvalidKey) {
		t.Errorf("revoked key still works: %v", err)
	}
	if _, _, err := k.Create("", RoleUser, ""); err == nil {
		t.Error("key without organization accepted")
	}
	if _, _, err := k.Create("o", "ROOT", ""); err == nil {
		t.Error("unknown role accepted")
	}
}

// TestKeyringSeesKeysAddedByAnotherProcess: a running server picks up keys that
// `sandboxd apikey create` wrote to the same file.
func TestKeyringSeesKeysAddedByAnotherProcess(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys.json")
	server, err := OpenKeyring(path)
	if err != nil {
		t.Fatal(err)
	}
	cli, err := OpenKeyring(path)
	if err != nil {
		t.Fatal(err)
	}
	key, _, err := cli.Create("org-c", RoleUser, "")
	if err != nil {
		t.Fatal(err)
	}
	if p, err := server.Authenticate(key); err != nil || p.Org != "org-c" {
		t.Fatalf("server did not see the new key: %+v %v", p, err)
	}
}
