package auth

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/internal/store"
)

// Authenticator checks an API key. *Keyring and *StoreAuthenticator implement it (and so
// does gateway.Authenticator's method set).
type Authenticator interface {
	Authenticate(key string) (Principal, error)
}

// NewKey makes a fresh key sbx_<id>_<secret> and returns it with its id and hash.
func NewKey() (key, id, keyHash string) {
	id = randomHex(8)
	key = "sbx_" + id + "_" + randomHex(32)
	return key, id, hash(key)
}

// KeyID is the id part of a well-formed key.
func KeyID(key string) (string, bool) {
	rest, ok := strings.CutPrefix(key, "sbx_")
	if !ok {
		return "", false
	}
	id, secret, ok := strings.Cut(rest, "_")
	if !ok || id == "" || secret == "" {
		return "", false
	}
	return id, true
}

// IssueKey creates a key for org with role in st and returns its secret (not kept) and
// record. The organization must exist.
func IssueKey(ctx context.Context, st store.Store, org string, role Role, name string) (string, store.APIKey, error) {
	if org == "" {
		return "", store.APIKey{}, errors.New("create API key: organization is required")
	}
	if role != RoleAdmin && role != RoleUser {
		return "", store.APIKey{}, fmt.Errorf("create API key: unknown role %q", role)
	}
	key, id, h := NewKey()
	rec, err := st.APIKeys().Create(ctx, store.APIKey{ID: id, Org: org, Role: string(role), Name: name, Hash: h})
	if err != nil {
		return "", store.APIKey{}, fmt.Errorf("create API key: %w", err)
	}
	return key, rec, nil
}

// touchEvery is how often at most a key's last use is written.
const touchEvery = time.Minute

// StoreAuthenticator checks keys against the store: a lookup by key id, then a
// constant-time comparison of hashes. Revoked keys are refused. A key's last use is
// recorded in the background, at most once a minute per key.
type StoreAuthenticator struct {
	st      store.Store
	timeout time.Duration
	log     *slog.Logger

	mu      sync.Mutex
	touched map[string]time.Time // key id -> last TouchLastUsed
	wg      sync.WaitGroup
}

// NewStoreAuthenticator returns an authenticator over st.
func NewStoreAuthenticator(st store.Store, log *slog.Logger) *StoreAuthenticator {
	if log == nil {
		log = slog.Default()
	}
	return &StoreAuthenticator{st: st, timeout: 5 * time.Second, log: log, touched: map[string]time.Time{}}
}

// Authenticate returns the principal of key. Malformed, unknown and revoked keys are all
// ErrInvalidKey; a store failure is another error.
func (a *StoreAuthenticator) Authenticate(key string) (Principal, error) {
	id, ok := KeyID(key)
	if !ok {
		return Principal{}, ErrInvalidKey
	}
	rec, err := a.active(id, "authenticate")
	if err != nil {
		return Principal{}, err
	}
	if subtle.ConstantTimeCompare([]byte(hash(key)), []byte(rec.Hash)) != 1 {
		return Principal{}, ErrInvalidKey
	}
	a.touch(id)
	return principalOf(rec), nil
}

// active looks up key id: ErrInvalidKey when it is unknown or revoked, another error
// (prefixed with what) when the store cannot answer.
func (a *StoreAuthenticator) active(id, what string) (store.APIKey, error) {
	ctx, cancel := context.WithTimeout(context.Background(), a.timeout)
	defer cancel()
	rec, err := a.st.APIKeys().Get(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return store.APIKey{}, ErrInvalidKey
	}
	if err != nil {
		return store.APIKey{}, fmt.Errorf("%s: %w", what, err)
	}
	if rec.RevokedAt != nil {
		return store.APIKey{}, ErrInvalidKey
	}
	return rec, nil
}

func principalOf(rec store.APIKey) Principal {
	return Principal{KeyID: rec.ID, Org: rec.Org, Role: Role(rec.Role), Name: rec.Name}
}

func (a *StoreAuthenticator) touch(id string) {
	now := time.Now()
	a.mu.Lock()
	if last, ok := a.touched[id]; ok && now.Sub(last) < touchEvery {
		a.mu.Unlock()
		return
	}
	a.touched[id] = now
	a.mu.Unlock()
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), a.timeout)
		defer cancel()
		if err := a.st.APIKeys().TouchLastUsed(ctx, id, now); err != nil {
			a.log.Debug("record API key use", "key", id, "err", err)
		}
	}()
}

// Wait waits for background writes (tests, shutdown).
func (a *StoreAuthenticator) Wait() { a.wg.Wait() }

// KeyChecker says whether a key, by its id, is still active (not revoked, not deleted):
// for credentials derived from a key after it was checked (edge login sessions,
// data-plane certificates), which must end or stop being issued once it is revoked.
type KeyChecker interface {
	// KeyActive returns the principal of key id, ErrInvalidKey if it is revoked or
	// unknown, another error if that cannot be known now.
	KeyActive(id string) (Principal, error)
}

// KeyActive implements KeyChecker.
func (a *StoreAuthenticator) KeyActive(id string) (Principal, error) {
	if id == "" {
		return Principal{}, ErrInvalidKey
	}
	rec, err := a.active(id, "check API key")
	if err != nil {
		return Principal{}, err
	}
	return principalOf(rec), nil
}
