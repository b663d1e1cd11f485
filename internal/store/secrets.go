package store

import (
	"context"
	"database/sql"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"time"
)

// ---- secret stores ----

// SecretStores are the organizations' built-in secret stores and their secrets
// (SettingsService *SecretStore, sandboxd.settings.v1.SecretService; docs/secrets.md). The
// store keeps a secret's value only as the caller sealed it (Ciphertext, with KeyID):
// the gateway encrypts and decrypts (internal/secretbox). A store of another organization
// is ErrNotFound, exactly like a missing one.
type SecretStores interface {
	// Create inserts st unless org already has maxStores stores (ErrLimitExceeded;
	// <= 0: no limit). *AlreadyExistsError with key KeyName (the name is taken) or
	// KeyRequestID (the request_id made another store).
	Create(ctx context.Context, st SecretStore, maxStores int) (SecretStore, error)
	Get(ctx context.Context, org, name string) (SecretStore, error)
	// GetByRequestID returns the store the request requestID created.
	GetByRequestID(ctx context.Context, org, requestID string) (SecretStore, error)
	// List pages through org's stores by name. A token this store did not issue is
	// ErrInvalid.
	List(ctx context.Context, org string, page Page) ([]SecretStore, string, error)
	// Touch sets the store's provider type and update time (UpdateSecretStore).
	Touch(ctx context.Context, org, name string, providerType int32) (SecretStore, error)
	// Delete removes the store and every secret of it.
	Delete(ctx context.Context, org, name string) error

	// PutSecret sets a secret of an existing store (ErrNotFound without it), creating it
	// unless the store holds maxSecrets secrets already (ErrLimitExceeded; <= 0: no
	// limit). It returns the secret without its ciphertext.
	PutSecret(ctx context.Context, s Secret, maxSecrets int) (Secret, error)
	// GetSecret returns one secret with its ciphertext.
	GetSecret(ctx context.Context, org, store, path, field string) (Secret, error)
	// ListSecrets pages through a store's secrets by (path, field), without ciphertexts.
	ListSecrets(ctx context.Context, org, store string, page Page) ([]Secret, string, error)
	// DeleteSecret removes one secret (ErrNotFound when missing).
	DeleteSecret(ctx context.Context, org, store, path, field string) error

	// Key rotation (sandboxd secret-key; docs/secrets.md), across organizations:
	// KeyUsage counts the secrets sealed under each key ID.
	KeyUsage(ctx context.Context) (map[string]int64, error)
	// SealedNotUnder returns up to limit secrets (with ciphertexts) sealed under another
	// key than keyID, in (org, store, path, field) order after the secret after (nil:
	// from the first).
	SealedNotUnder(ctx context.Context, keyID string, after *Secret, limit int) ([]Secret, error)
	// Reseal replaces old's ciphertext and key ID by keyID and ciphertext only if the row
	// still holds old's (compare and swap: a value put meanwhile is left as it is); it
	// reports whether it did. The update time stays (the value is the same).
	Reseal(ctx context.Context, old Secret, keyID string, ciphertext []byte) (bool, error)
	// RetireUnusedKeys retires those of ids that no stored value is sealed under, and
	// returns them: in one transaction per key that first takes the key's row (as every
	// write of a value under it does), so a value being written under a key either is
	// counted (the key stays) or is refused afterwards (ErrKeyRetired). prune removes
	// only the keys it returns from the key file.
	RetireUnusedKeys(ctx context.Context, ids []string) ([]string, error)
}

// ErrKeyRetired: a value sealed under a key that `sandboxd secret-key prune` retired (the
// writer's key ring is older than the key file): seal it again under the current key.
var ErrKeyRetired = errors.New("the secret key was retired (pruned from the key file)")

// takeSecretKey takes keyID's row in transaction q (the lock that orders writes under a
// key against its retirement) and refuses a retired key.
func takeSecretKey(ctx context.Context, q querier, keyID string) error {
	var retired bool
	if err := q.queryRow(ctx, `INSERT INTO secret_keys (key_id, n) VALUES ($1, 1)
		ON CONFLICT (key_id) DO UPDATE SET n = secret_keys.n + 1 RETURNING retired`, keyID).Scan(&retired); err != nil {
		return fmt.Errorf("secret key %s: %w", keyID, err)
	}
	if retired {
		return fmt.Errorf("%w: %s", ErrKeyRetired, keyID)
	}
	return nil
}

// SecretStore is a stored secret store.
type SecretStore struct {
	Org          string
	Name         string
	ProviderType int32  // coreweave.sandbox.v1.SecretStoreProviderType as created
	RequestID    string // "" when the create had none
	CreateTime   time.Time
	UpdateTime   time.Time
}

// Secret is one secret: its value sealed (Ciphertext under key KeyID).
type Secret struct {
	Org, Store, Path, Field string
	KeyID                   string
	Ciphertext              []byte // nil in listings
	CreateTime, UpdateTime  time.Time
}

// KeyName is the key of a taken name.
const KeyName = "name"

// maxSecretCiphertext bounds a stored ciphertext (the gateway bounds the value).
const maxSecretCiphertext = 128 << 10

type secretStores struct{ s *sqlStore }

func (s *sqlStore) SecretStores() SecretStores { return secretStores{s} }

const secretStoreCols = `org_id, name, provider_type, request_id, create_time, update_time`

func scanSecretStore(r row) (SecretStore, error) {
	var st SecretStore
	var rid sql.NullString
	var c, u dbTime
	if err := r.Scan(&st.Org, &st.Name, &st.ProviderType, &rid, &c, &u); err != nil {
		return SecretStore{}, err
	}
	st.RequestID, st.CreateTime, st.UpdateTime = rid.String, c.t, u.t
	return st, nil
}

func (ss secretStores) Create(ctx context.Context, st SecretStore, maxStores int) (SecretStore, error) {
	if err := required("org", st.Org, "name", st.Name); err != nil {
		return SecretStore{}, err
	}
	st.CreateTime = now()
	st.UpdateTime = st.CreateTime
	var rid any
	if st.RequestID != "" {
		rid = st.RequestID
	}
	err := ss.s.d.tx(ctx, func(q querier) error {
		if maxStores > 0 {
			var n int64
			if err := q.queryRow(ctx, `SELECT count(*) FROM secret_stores WHERE org_id = $1`, st.Org).Scan(&n); err != nil {
				return err
			}
			if n >= int64(maxStores) {
				return fmt.Errorf("%w: organization %s has %d secret stores, at most %d", ErrLimitExceeded, st.Org, n, maxStores)
			}
		}
		_, err := q.exec(ctx, `INSERT INTO secret_stores (`+secretStoreCols+`) VALUES ($1, $2, $3, $4, $5, $6)`,
			st.Org, st.Name, st.ProviderType, rid, st.CreateTime, st.UpdateTime)
		return err
	})
	if err != nil {
		if errors.Is(err, ErrLimitExceeded) {
			return SecretStore{}, err
		}
		return SecretStore{}, ss.s.writeErr("secret store", "create", err)
	}
	return st, nil
}

func (ss secretStores) Get(ctx context.Context, org, name string) (SecretStore, error) {
	st, err := scanSecretStore(ss.s.d.queryRow(ctx, `SELECT `+secretStoreCols+` FROM secret_stores WHERE org_id = $1 AND name = $2`, org, name))
	return st, ss.s.readErr("secret store", err)
}

func (ss secretStores) GetByRequestID(ctx context.Context, org, requestID string) (SecretStore, error) {
	if requestID == "" {
		return SecretStore{}, fmt.Errorf("secret store: %w", ErrNotFound)
	}
	st, err := scanSecretStore(ss.s.d.queryRow(ctx, `SELECT `+secretStoreCols+` FROM secret_stores WHERE org_id = $1 AND request_id = $2`, org, requestID))
	return st, ss.s.readErr("secret store", err)
}

// A name page token is the last name (or "path\x00field") of a page, base64.
func encodeNameCursor(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }

func decodeNameCursor(tok string) (string, error) {
	b, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil || len(b) == 0 || len(b) > 1024 {
		return "", invalid("page token %q", tok)
	}
	return string(b), nil
}

func (ss secretStores) List(ctx context.Context, org string, page Page) ([]SecretStore, string, error) {
	where, args := "org_id = $1", []any{org}
	if page.Token != "" {
		after, err := decodeNameCursor(page.Token)
		if err != nil {
			return nil, "", err
		}
		where += " AND name > $2"
		args = append(args, after)
	}
	size := pageSize(page.Size)
	args = append(args, size+1)
	rs, err := ss.s.d.query(ctx, fmt.Sprintf(`SELECT %s FROM secret_stores WHERE %s ORDER BY name LIMIT $%d`, secretStoreCols, where, len(args)), args...)
	if err != nil {
		return nil, "", fmt.Errorf("list secret stores: %w", err)
	}
	defer rs.Close()
	var out []SecretStore
	for rs.Next() {
		st, err := scanSecretStore(rs)
		if err != nil {
			return nil, "", err
		}
		out = append(out, st)
	}
	if err := rs.Err(); err != nil {
		return nil, "", err
	}
	next := ""
	if len(out) > size {
		out = out[:size]
		next = encodeNameCursor(out[size-1].Name)
	}
	return out, next, nil
}

func (ss secretStores) Touch(ctx context.Context, org, name string, providerType int32) (SecretStore, error) {
	n, err := ss.s.d.exec(ctx, `UPDATE secret_stores SET provider_type = $3, update_time = $4 WHERE org_id = $1 AND name = $2`,
		org, name, providerType, now())
	if err != nil {
		return SecretStore{}, ss.s.writeErr("secret store", "update", err)
	}
	if n == 0 {
		return SecretStore{}, fmt.Errorf("secret store: %w", ErrNotFound)
	}
	return ss.Get(ctx, org, name)
}

func (ss secretStores) Delete(ctx context.Context, org, name string) error {
	return ss.s.d.tx(ctx, func(q querier) error {
		n, err := q.exec(ctx, `DELETE FROM secret_stores WHERE org_id = $1 AND name = $2`, org, name)
		if err != nil {
			return err
		}
		if n == 0 {
			return fmt.Errorf("secret store: %w", ErrNotFound)
		}
		_, err = q.exec(ctx, `DELETE FROM secrets WHERE org_id = $1 AND store_name = $2`, org, name)
		return err
	})
}

func (ss secretStores) PutSecret(ctx context.Context, x Secret, maxSecrets int) (Secret, error) {
	if err := required("org", x.Org, "store", x.Store, "path", x.Path, "key_id", x.KeyID); err != nil {
		return Secret{}, err
	}
	if len(x.Ciphertext) == 0 || len(x.Ciphertext) > maxSecretCiphertext {
		return Secret{}, invalid("secret: ciphertext of %d bytes (1 to %d)", len(x.Ciphertext), maxSecretCiphertext)
	}
	at := now()
	err := ss.s.d.tx(ctx, func(q querier) error {
		// The key first: a prune retiring it either counts this value or refuses it.
		if err := takeSecretKey(ctx, q, x.KeyID); err != nil {
			return err
		}
		// The store row is read in the transaction: a concurrent Delete of the store
		// either sees this secret or makes this put fail.
		var one int
		if err := q.queryRow(ctx, `SELECT 1 FROM secret_stores WHERE org_id = $1 AND name = $2`, x.Org, x.Store).Scan(&one); err != nil {
			if ss.s.d.isNoRows(err) {
				return fmt.Errorf("secret store: %w", ErrNotFound)
			}
			return err
		}
		var created dbTime
		err := q.queryRow(ctx, `SELECT create_time FROM secrets WHERE org_id = $1 AND store_name = $2 AND path = $3 AND field = $4`,
			x.Org, x.Store, x.Path, x.Field).Scan(&created)
		switch {
		case err == nil:
			x.CreateTime, x.UpdateTime = created.t, at
			_, err = q.exec(ctx, `UPDATE secrets SET key_id = $5, ciphertext = $6, update_time = $7
				WHERE org_id = $1 AND store_name = $2 AND path = $3 AND field = $4`,
				x.Org, x.Store, x.Path, x.Field, x.KeyID, x.Ciphertext, at)
			return err
		case !ss.s.d.isNoRows(err):
			return err
		}
		if maxSecrets > 0 {
			var n int64
			if err := q.queryRow(ctx, `SELECT count(*) FROM secrets WHERE org_id = $1 AND store_name = $2`, x.Org, x.Store).Scan(&n); err != nil {
				return err
			}
			if n >= int64(maxSecrets) {
				return fmt.Errorf("%w: secret store %s holds %d secrets, at most %d", ErrLimitExceeded, x.Store, n, maxSecrets)
			}
		}
		x.CreateTime, x.UpdateTime = at, at
		_, err = q.exec(ctx, `INSERT INTO secrets (org_id, store_name, path, field, key_id, ciphertext, create_time, update_time)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`, x.Org, x.Store, x.Path, x.Field, x.KeyID, x.Ciphertext, at, at)
		return err
	})
	if err != nil {
		if errors.Is(err, ErrLimitExceeded) || errors.Is(err, ErrNotFound) || errors.Is(err, ErrKeyRetired) {
			return Secret{}, err
		}
		return Secret{}, ss.s.writeErr("secret", "put", err)
	}
	x.Ciphertext = nil
	return x, nil
}

func (ss secretStores) GetSecret(ctx context.Context, org, store, path, field string) (Secret, error) {
	x := Secret{Org: org, Store: store, Path: path, Field: field}
	var c, u dbTime
	err := ss.s.d.queryRow(ctx, `SELECT key_id, ciphertext, create_time, update_time FROM secrets
		WHERE org_id = $1 AND store_name = $2 AND path = $3 AND field = $4`, org, store, path, field).Scan(&x.KeyID, &x.Ciphertext, &c, &u)
	if err != nil {
		return Secret{}, ss.s.readErr("secret", err)
	}
	x.CreateTime, x.UpdateTime = c.t, u.t
	return x, nil
}

func (ss secretStores) ListSecrets(ctx context.Context, org, store string, page Page) ([]Secret, string, error) {
	where, args := "org_id = $1 AND store_name = $2", []any{org, store}
	if page.Token != "" {
		after, err := decodeNameCursor(page.Token)
		if err != nil {
			return nil, "", err
		}
		p, f, ok := strings.Cut(after, "\x00")
		if !ok {
			return nil, "", invalid("page token %q", page.Token)
		}
		where += " AND (path > $3 OR (path = $3 AND field > $4))"
		args = append(args, p, f)
	}
	size := pageSize(page.Size)
	args = append(args, size+1)
	rs, err := ss.s.d.query(ctx, fmt.Sprintf(`SELECT path, field, key_id, create_time, update_time FROM secrets WHERE %s ORDER BY path, field LIMIT $%d`,
		where, len(args)), args...)
	if err != nil {
		return nil, "", fmt.Errorf("list secrets: %w", err)
	}
	defer rs.Close()
	var out []Secret
	for rs.Next() {
		x := Secret{Org: org, Store: store}
		var c, u dbTime
		if err := rs.Scan(&x.Path, &x.Field, &x.KeyID, &c, &u); err != nil {
			return nil, "", err
		}
		x.CreateTime, x.UpdateTime = c.t, u.t
		out = append(out, x)
	}
	if err := rs.Err(); err != nil {
		return nil, "", err
	}
	next := ""
	if len(out) > size {
		out = out[:size]
		last := out[size-1]
		next = encodeNameCursor(last.Path + "\x00" + last.Field)
	}
	return out, next, nil
}

func (ss secretStores) DeleteSecret(ctx context.Context, org, store, path, field string) error {
	n, err := ss.s.d.exec(ctx, `DELETE FROM secrets WHERE org_id = $1 AND store_name = $2 AND path = $3 AND field = $4`, org, store, path, field)
	if err != nil {
		return ss.s.writeErr("secret", "delete", err)
	}
	if n == 0 {
		return fmt.Errorf("secret: %w", ErrNotFound)
	}
	return nil
}

func (ss secretStores) KeyUsage(ctx context.Context) (map[string]int64, error) {
	rs, err := ss.s.d.query(ctx, `SELECT key_id, COUNT(*) FROM secrets GROUP BY key_id`)
	if err != nil {
		return nil, fmt.Errorf("secret key usage: %w", err)
	}
	defer rs.Close()
	out := map[string]int64{}
	for rs.Next() {
		var id string
		var n int64
		if err := rs.Scan(&id, &n); err != nil {
			return nil, fmt.Errorf("secret key usage: %w", err)
		}
		out[id] = n
	}
	return out, rs.Err()
}

func (ss secretStores) SealedNotUnder(ctx context.Context, keyID string, after *Secret, limit int) ([]Secret, error) {
	where, args := "key_id <> $1", []any{keyID}
	if after != nil {
		where += ` AND (org_id > $2 OR (org_id = $2 AND (store_name > $3 OR (store_name = $3 AND
			(path > $4 OR (path = $4 AND field > $5))))))`
		args = append(args, after.Org, after.Store, after.Path, after.Field)
	}
	args = append(args, pageSize(limit))
	rs, err := ss.s.d.query(ctx, fmt.Sprintf(`SELECT org_id, store_name, path, field, key_id, ciphertext, create_time, update_time
		FROM secrets WHERE %s ORDER BY org_id, store_name, path, field LIMIT $%d`, where, len(args)), args...)
	if err != nil {
		return nil, fmt.Errorf("list sealed secrets: %w", err)
	}
	defer rs.Close()
	var out []Secret
	for rs.Next() {
		var x Secret
		var c, u dbTime
		if err := rs.Scan(&x.Org, &x.Store, &x.Path, &x.Field, &x.KeyID, &x.Ciphertext, &c, &u); err != nil {
			return nil, fmt.Errorf("list sealed secrets: %w", err)
		}
		x.CreateTime, x.UpdateTime = c.t, u.t
		out = append(out, x)
	}
	return out, rs.Err()
}

func (ss secretStores) Reseal(ctx context.Context, old Secret, keyID string, ciphertext []byte) (bool, error) {
	if err := required("key_id", keyID); err != nil {
		return false, err
	}
	if len(ciphertext) > maxSecretCiphertext {
		return false, invalid("ciphertext of %d bytes, at most %d", len(ciphertext), maxSecretCiphertext)
	}
	var n int64
	err := ss.s.d.tx(ctx, func(q querier) error {
		if err := takeSecretKey(ctx, q, keyID); err != nil {
			return err
		}
		var err error
		n, err = q.exec(ctx, `UPDATE secrets SET key_id = $5, ciphertext = $6
			WHERE org_id = $1 AND store_name = $2 AND path = $3 AND field = $4 AND key_id = $7 AND ciphertext = $8`,
			old.Org, old.Store, old.Path, old.Field, keyID, ciphertext, old.KeyID, old.Ciphertext)
		return err
	})
	if errors.Is(err, ErrKeyRetired) {
		return false, err
	}
	if err != nil {
		return false, ss.s.writeErr("secret", "reseal", err)
	}
	return n == 1, nil
}

func (ss secretStores) RetireUnusedKeys(ctx context.Context, ids []string) ([]string, error) {
	var out []string
	for _, id := range ids {
		if id == "" {
			continue
		}
		retired := false
		err := ss.s.d.tx(ctx, func(q querier) error {
			// The row first (waits for writes under the key in flight to commit), then
			// the count, which sees them.
			if _, err := q.exec(ctx, `INSERT INTO secret_keys (key_id, retired, n) VALUES ($1, TRUE, 1)
				ON CONFLICT (key_id) DO UPDATE SET retired = TRUE, n = secret_keys.n + 1`, id); err != nil {
				return err
			}
			var used int64
			if err := q.queryRow(ctx, `SELECT COUNT(*) FROM secrets WHERE key_id = $1`, id).Scan(&used); err != nil {
				return err
			}
			if used > 0 {
				_, err := q.exec(ctx, `UPDATE secret_keys SET retired = FALSE WHERE key_id = $1`, id)
				return err
			}
			retired = true
			return nil
		})
		if err != nil {
			return out, ss.s.writeErr("secret key", "retire", err)
		}
		if retired {
			out = append(out, id)
		}
	}
	return out, nil
}
