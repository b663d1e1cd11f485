package store_test

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"testing"

	"github.com/jackc/pgx/v5"
	_ "modernc.org/sqlite"

	"github.com/sandboxd/sandboxd/internal/pgtest"
	"github.com/sandboxd/sandboxd/internal/store"
)

// Every store test runs against both backends. SQLite lives in t.TempDir(). PostgreSQL is
// SANDBOXD_TEST_POSTGRES_DSN when set; otherwise TestMain starts a throwaway server from
// Debian's binaries (apt package postgresql) listening on a unix socket only, once per test
// binary. Each test gets its own schema. Without PostgreSQL its subtests are skipped, unless
// SANDBOXD_REQUIRE_POSTGRES=1 or CI=true, where that is a failure.

var (
	pgAdminDSN string // a database the tests may create schemas in; "" when unavailable
	pgMissing  string // why PostgreSQL is unavailable
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if dsn := os.Getenv("SANDBOXD_TEST_POSTGRES_DSN"); dsn != "" {
		pgAdminDSN = dsn
	} else {
		stop, dsn, err := pgtest.Start()
		switch {
		case err != nil:
			pgMissing = err.Error()
		default:
			pgAdminDSN = dsn
			defer stop()
		}
	}
	if pgAdminDSN == "" && pgtest.Required() {
		fmt.Fprintf(os.Stderr, "store tests: PostgreSQL is required (CI=true or SANDBOXD_REQUIRE_POSTGRES=1) but unavailable: %s\n", pgMissing)
		return 1
	}
	return m.Run()
}

// backend names a store implementation and makes a fresh, empty database for a test.
type backend struct {
	name  string
	newDB func(t *testing.T) string // returns a DSN for store.Open
}

var backends = []backend{
	{"sqlite", func(t *testing.T) string { return "sqlite://" + filepath.Join(t.TempDir(), "store.db") }},
	{"postgres", newPostgresSchema},
}

// newPostgresSchema creates a schema for t and returns a DSN whose search_path is it.
func newPostgresSchema(t *testing.T) string {
	t.Helper()
	if pgAdminDSN == "" {
		t.Skipf("PostgreSQL unavailable (%s); set SANDBOXD_TEST_POSTGRES_DSN or install postgresql", pgMissing)
	}
	dsn, drop, err := pgtest.NewSchema(context.Background(), pgAdminDSN, "t")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(drop)
	return dsn
}

// eachBackend runs fn as a subtest per backend, with a fresh database.
func eachBackend(t *testing.T, fn func(t *testing.T, dsn string)) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			fn(t, b.newDB(t))
		})
	}
}

// eachStore is eachBackend with the store opened (and closed at the end).
func eachStore(t *testing.T, fn func(t *testing.T, s store.Store)) {
	eachBackend(t, func(t *testing.T, dsn string) {
		fn(t, openStore(t, dsn))
	})
}

func openStore(t *testing.T, dsn string) store.Store {
	t.Helper()
	s, err := store.Open(t.Context(), dsn)
	if err != nil {
		t.Fatalf("open %s: %v", dsn, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// rawExec runs a statement on the database behind dsn, bypassing the store.
func rawExec(t *testing.T, dsn, q string) {
	t.Helper()
	ctx := t.Context()
	if u, err := url.Parse(dsn); err == nil && u.Scheme == "postgres" {
		c, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(ctx)
		if _, err := c.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		return
	}
	db, err := sql.Open("sqlite", dsn[len("sqlite://"):])
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, q); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}
