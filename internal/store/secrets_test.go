package store_test

import (
	"bytes"
	"database/sql"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/sandboxd/sandboxd/internal/secretbox"
	"github.com/sandboxd/sandboxd/internal/store"
)

func TestSecretStores(t *testing.T) {
	eachBackend(t, func(t *testing.T, dsn string) {
		s := openStore(t, dsn)
		ctx := t.Context()
		ss := s.SecretStores()
		st, err := ss.Create(ctx, store.SecretStore{Org: "acme", Name: "prod", ProviderType: 100, RequestID: "r1"}, 2)
		if err != nil || st.CreateTime.IsZero() {
			t.Fatalf("create = %+v, %v", st, err)
		}
		var ae *store.AlreadyExistsError
		if _, err := ss.Create(ctx, store.SecretStore{Org: "acme", Name: "prod"}, 0); !errors.As(err, &ae) || ae.Key != store.KeyName {
			t.Fatalf("same name: %v", err)
		}
		if _, err := ss.Create(ctx, store.SecretStore{Org: "acme", Name: "other", RequestID: "r1"}, 0); !errors.As(err, &ae) || ae.Key != store.KeyRequestID {
			t.Fatalf("same request_id: %v", err)
		}
		if got, err := ss.GetByRequestID(ctx, "acme", "r1"); err != nil || got.Name != "prod" || got.ProviderType != 100 {
			t.Fatalf("by request id = %+v, %v", got, err)
		}
		// Another organization has its own names and sees nothing of acme's.
		if _, err := ss.Create(ctx, store.SecretStore{Org: "globex", Name: "prod", RequestID: "r1"}, 0); err != nil {
			t.Fatalf("globex: %v", err)
		}
		if _, err := ss.Create(ctx, store.SecretStore{Org: "acme", Name: "dev"}, 2); err != nil {
			t.Fatal(err)
		}
		if _, err := ss.Create(ctx, store.SecretStore{Org: "acme", Name: "third"}, 2); !errors.Is(err, store.ErrLimitExceeded) {
			t.Fatalf("over the limit: %v", err)
		}
		page, next, err := ss.List(ctx, "acme", store.Page{Size: 1})
		if err != nil || len(page) != 1 || page[0].Name != "dev" || next == "" {
			t.Fatalf("list page 1 = %+v %q %v", page, next, err)
		}
		page, next, err = ss.List(ctx, "acme", store.Page{Size: 1, Token: next})
		if err != nil || len(page) != 1 || page[0].Name != "prod" || next != "" {
			t.Fatalf("list page 2 = %+v %q %v", page, next, err)
		}
		if _, _, err := ss.List(ctx, "acme", store.Page{Token: "!!"}); !errors.Is(err, store.ErrInvalid) {
			t.Fatalf("bad token: %v", err)
		}

		// Secrets: sealed by the caller; the database holds the ciphertext only.
		ring, _ := secretbox.New(secretbox.NewKey())
		const value = "correct-horse-battery-staple-4711"
		kid, ct := ring.Seal([]byte(value), secretbox.AD("acme", "prod", "db/main", "password"))
		x, err := ss.PutSecret(ctx, store.Secret{Org: "acme", Store: "prod", Path: "db/main", Field: "password", KeyID: kid, Ciphertext: ct}, 2)
		if err != nil || x.Ciphertext != nil || x.CreateTime.IsZero() {
			t.Fatalf("put = %+v, %v", x, err)
		}
		got, err := ss.GetSecret(ctx, "acme", "prod", "db/main", "password")
		if err != nil || got.KeyID != kid || !bytes.Equal(got.Ciphertext, ct) {
			t.Fatalf("get = %+v, %v", got, err)
		}
		if v, err := ring.Open(got.KeyID, got.Ciphertext, secretbox.AD("acme", "prod", "db/main", "password")); err != nil || string(v) != value {
			t.Fatalf("open = %q %v", v, err)
		}
		// Replacing keeps create_time; the limit counts secrets, not puts.
		if _, err := ss.PutSecret(ctx, store.Secret{Org: "acme", Store: "prod", Path: "db/main", Field: "password", KeyID: kid, Ciphertext: ct}, 1); err != nil {
			t.Fatalf("replace at the limit: %v", err)
		}
		if _, err := ss.PutSecret(ctx, store.Secret{Org: "acme", Store: "prod", Path: "db/main", Field: "user", KeyID: kid, Ciphertext: ct}, 1); !errors.Is(err, store.ErrLimitExceeded) {
			t.Fatalf("over the secret limit: %v", err)
		}
		if _, err := ss.PutSecret(ctx, store.Secret{Org: "acme", Store: "prod", Path: "db/main", Field: "", KeyID: kid, Ciphertext: ct}, 0); err != nil {
			t.Fatalf("default field: %v", err)
		}
		// Another org's store of the same name, and a missing store.
		if _, err := ss.GetSecret(ctx, "globex", "prod", "db/main", "password"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("globex reads acme's secret: %v", err)
		}
		if _, err := ss.PutSecret(ctx, store.Secret{Org: "acme", Store: "nope", Path: "p", KeyID: kid, Ciphertext: ct}, 0); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("put into a missing store: %v", err)
		}
		if _, err := ss.PutSecret(ctx, store.Secret{Org: "acme", Store: "prod", Path: "p", KeyID: kid}, 0); !errors.Is(err, store.ErrInvalid) {
			t.Fatalf("no ciphertext: %v", err)
		}
		list, next, err := ss.ListSecrets(ctx, "acme", "prod", store.Page{Size: 1})
		if err != nil || len(list) != 1 || list[0].Field != "" || list[0].Ciphertext != nil || next == "" {
			t.Fatalf("list secrets = %+v %q %v", list, next, err)
		}
		list, next, err = ss.ListSecrets(ctx, "acme", "prod", store.Page{Size: 1, Token: next})
		if err != nil || len(list) != 1 || list[0].Field != "password" || list[0].Ciphertext != nil || next != "" {
			t.Fatalf("list secrets 2 = %+v %q %v", list, next, err)
		}
		if l, _, _ := ss.ListSecrets(ctx, "globex", "prod", store.Page{}); len(l) != 0 {
			t.Fatalf("globex lists acme's secrets: %+v", l)
		}

		// At rest: the value appears nowhere in the database.
		assertNotInDB(t, dsn, value)

		if err := ss.DeleteSecret(ctx, "acme", "prod", "db/main", ""); err != nil {
			t.Fatal(err)
		}
		if err := ss.DeleteSecret(ctx, "acme", "prod", "db/main", ""); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("delete twice: %v", err)
		}
		if _, err := ss.Touch(ctx, "acme", "prod", 0); err != nil {
			t.Fatal(err)
		}
		if _, err := ss.Touch(ctx, "acme", "nope", 0); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("touch missing: %v", err)
		}
		// Deleting a store deletes its secrets: a store made again under the name is empty.
		if err := ss.Delete(ctx, "acme", "prod"); err != nil {
			t.Fatal(err)
		}
		if err := ss.Delete(ctx, "acme", "prod"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("delete twice: %v", err)
		}
		if _, err := ss.Create(ctx, store.SecretStore{Org: "acme", Name: "prod"}, 0); err != nil {
			t.Fatal(err)
		}
		if _, err := ss.GetSecret(ctx, "acme", "prod", "db/main", "password"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("secret outlived its store: %v", err)
		}
		if _, err := ss.GetSecret(ctx, "globex", "prod", "db/main", "password"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("globex: %v", err)
		}
	})
}

// assertNotInDB fails when value appears in the database behind dsn: SQLite's files, or
// any column of PostgreSQL's secrets table as text.
func assertNotInDB(t *testing.T, dsn, value string) {
	t.Helper()
	u, err := url.Parse(dsn)
	if err == nil && u.Scheme == "postgres" {
		c, err := pgx.Connect(t.Context(), dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(t.Context())
		var n int
		if err := c.QueryRow(t.Context(), `SELECT count(*) FROM secrets WHERE position($1::bytea in ciphertext) > 0 OR key_id LIKE '%' || $2 || '%'`,
			[]byte(value), value).Scan(&n); err != nil || n != 0 {
			t.Fatalf("PostgreSQL holds the value in %d rows (%v)", n, err)
		}
		var rows int
		if err := c.QueryRow(t.Context(), `SELECT count(*) FROM secrets`).Scan(&rows); err != nil || rows == 0 {
			t.Fatalf("no secrets rows to check (%d, %v)", rows, err)
		}
		return
	}
	path := strings.TrimPrefix(dsn, "sqlite://")
	db, err := sql.Open("sqlite", path)
	if err == nil {
		_, _ = db.Exec("PRAGMA wal_checkpoint(TRUNCATE)")
		_ = db.Close()
	}
	files, _ := filepath.Glob(path + "*")
	if len(files) == 0 {
		t.Fatalf("no database files at %s", path)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(b, []byte(value)) {
			t.Fatalf("%s holds the secret value", f)
		}
	}
}
