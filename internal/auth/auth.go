// Package auth issues and checks API keys. A key is shown once when created; only its
// SHA-256 is kept. Keys look like sbx_<key id>_<secret>, so a lookup is by key id and a
// constant-time comparison of hashes.
package auth

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// Role is what a key may do.
type Role string

const (
	RoleAdmin Role = "SANDBOX_ADMIN" // everything, including runners and policies
	RoleUser  Role = "SANDBOX_USER"  // sandboxes of its organization
)

// Principal is who a request acts as.
type Principal struct {
	KeyID string
	Org   string
	Role  Role
	Name  string
}

// ErrInvalidKey covers malformed, unknown and revoked keys alike, so a caller learns
// nothing about which keys exist.
var ErrInvalidKey = errors.New("invalid API key")

type record struct {
	Hash      string    `json:"hash"`
	Org       string    `json:"org"`
	Role      Role      `json:"role"`
	Name      string    `json:"name,omitempty"`
	CreatedAt time.Time `json:"created_at"`
}

// Keyring holds API keys in a JSON file (0600).
type Keyring struct {
	path  string
	mu    sync.RWMutex
	keys  map[string]record // key id -> record
	mtime time.Time         // of the file when last read or written
}

// OpenKeyring loads the keyring at path, creating an empty one if missing.
func OpenKeyring(path string) (*Keyring, error) {
	k := &Keyring{path: path, keys: map[string]record{}}
	if err := k.load(); err != nil {
		return nil, err
	}
	return k, nil
}

// load (re)reads the file; a missing file is an empty keyring.
func (k *Keyring) load() error {
	st, err := os.Stat(k.path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("open keyring: %w", err)
	}
	b, err := os.ReadFile(k.path)
	if err != nil {
		return fmt.Errorf("open keyring: %w", err)
	}
	keys := map[string]record{}
	if err := json.Unmarshal(b, &keys); err != nil {
		return fmt.Errorf("parse keyring %s: %w", k.path, err)
	}
	k.keys, k.mtime = keys, st.ModTime()
	return nil
}

// reloadIfChanged picks up keys another process (`sandboxd apikey create`) added.
func (k *Keyring) reloadIfChanged() {
	st, err := os.Stat(k.path)
	if err != nil {
		return
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if st.ModTime().Equal(k.mtime) {
		return
	}
	_ = k.load()
}

// Create issues a key for org with role and returns its secret, which is not kept.
func (k *Keyring) Create(org string, role Role, name string) (string, Principal, error) {
	if org == "" {
		return "", Principal{}, errors.New("create API key: organization is required")
	}
	if role != RoleAdmin && role != RoleUser {
		return "", Principal{}, fmt.Errorf("create API key: unknown role %q", role)
	}
	id, secret := randomHex(8), randomHex(32)
	key := "sbx_" + id + "_" + secret
	k.mu.Lock()
	defer k.mu.Unlock()
	k.keys[id] = record{Hash: hash(key), Org: org, Role: role, Name: name, CreatedAt: time.Now().UTC()}
	if err := k.saveLocked(); err != nil {
		delete(k.keys, id)
		return "", Principal{}, err
	}
	return key, Principal{KeyID: id, Org: org, Role: role, Name: name}, nil
}

// Revoke removes a key.
func (k *Keyring) Revoke(id string) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	r, ok := k.keys[id]
	if !ok {
		return fmt.Errorf("revoke: no key %q", id)
	}
	delete(k.keys, id)
	if err := k.saveLocked(); err != nil {
		k.keys[id] = r
		return err
	}
	return nil
}

// Authenticate returns the principal of key.
func (k *Keyring) Authenticate(key string) (Principal, error) {
	rest, ok := strings.CutPrefix(key, "sbx_")
	if !ok {
		return Principal{}, ErrInvalidKey
	}
	id, _, ok := strings.Cut(rest, "_")
	if !ok {
		return Principal{}, ErrInvalidKey
	}
	k.mu.RLock()
	r, found := k.keys[id]
	k.mu.RUnlock()
	if !found {
		k.reloadIfChanged()
		k.mu.RLock()
		r, found = k.keys[id]
		k.mu.RUnlock()
	}
	if !found || subtle.ConstantTimeCompare([]byte(hash(key)), []byte(r.Hash)) != 1 {
		return Principal{}, ErrInvalidKey
	}
	return Principal{KeyID: id, Org: r.Org, Role: r.Role, Name: r.Name}, nil
}

// Len is the number of keys.
func (k *Keyring) Len() int {
	k.mu.RLock()
	defer k.mu.RUnlock()
	return len(k.keys)
}

func (k *Keyring) saveLocked() error {
	b, err := json.MarshalIndent(k.keys, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(k.path), 0o700); err != nil {
		return fmt.Errorf("save keyring: %w", err)
	}
	tmp := k.path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("save keyring: %w", err)
	}
	if err := os.Rename(tmp, k.path); err != nil {
		return fmt.Errorf("save keyring: %w", err)
	}
	if st, err := os.Stat(k.path); err == nil {
		k.mtime = st.ModTime()
	}
	return nil
}

func hash(key string) string {
	h := sha256.Sum256([]byte(key))
	return hex.EncodeToString(h[:])
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(fmt.Sprintf("crypto/rand: %v", err))
	}
	return hex.EncodeToString(b)
}

type principalKey struct{}

// WithPrincipal returns ctx carrying p.
func WithPrincipal(ctx context.Context, p Principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

// FromContext returns the principal of an authenticated request.
func FromContext(ctx context.Context) (Principal, bool) {
	p, ok := ctx.Value(principalKey{}).(Principal)
	return p, ok
}

// KeyActive implements KeyChecker.
func (k *Keyring) KeyActive(id string) (Principal, error) {
	k.reloadIfChanged()
	k.mu.RLock()
	r, found := k.keys[id]
	k.mu.RUnlock()
	if !found {
		return Principal{}, ErrInvalidKey
	}
	return Principal{KeyID: id, Org: r.Org, Role: r.Role, Name: r.Name}, nil
}
