package pgtest

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
)

var schemaSeq atomic.Int64

// NewSchema creates a fresh schema named prefix_<pid>_<n> on the server at admin (a
// postgres:// URL) and returns a DSN whose search_path is it, and a func that drops it.
func NewSchema(ctx context.Context, admin, prefix string) (dsn string, drop func(), err error) {
	u, err := url.Parse(admin)
	if err != nil || u.Scheme != "postgres" && u.Scheme != "postgresql" {
		return "", nil, fmt.Errorf("pgtest: %q is not a postgres:// URL", admin)
	}
	c, err := pgx.Connect(ctx, admin)
	if err != nil {
		return "", nil, fmt.Errorf("pgtest: connect: %w", err)
	}
	defer func() { _ = c.Close(ctx) }()
	schema := fmt.Sprintf("%s_%d_%d", prefix, os.Getpid(), schemaSeq.Add(1))
	if _, err := c.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		return "", nil, fmt.Errorf("pgtest: create schema: %w", err)
	}
	drop = func() {
		ctx := context.Background()
		if c, err := pgx.Connect(ctx, admin); err == nil {
			_, _ = c.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
			_ = c.Close(ctx)
		}
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String(), drop, nil
}

// T is the part of testing.TB the helpers below use (this package is also used by
// test/bed, a program, so it does not import testing).
type T interface {
	Helper()
	Context() context.Context
	Cleanup(func())
	Fatalf(format string, args ...any)
	Logf(format string, args ...any)
}

// SchemaFor returns, for a test, the DSN of a fresh schema (dropped when t ends) on
// SANDBOXD_TEST_POSTGRES_DSN or on a server started for t (stopped when t ends). Without
// PostgreSQL it returns "" (the test runs on SQLite only), unless Required, where t fails.
func SchemaFor(t T, prefix string) string {
	t.Helper()
	admin := os.Getenv("SANDBOXD_TEST_POSTGRES_DSN")
	if admin == "" {
		stop, d, err := Start()
		if err != nil {
			if Required() {
				t.Fatalf("PostgreSQL required: %v", err)
			}
			t.Logf("no PostgreSQL (%v): SQLite only", err)
			return ""
		}
		t.Cleanup(stop)
		admin = d
	}
	dsn, drop, err := NewSchema(t.Context(), admin, prefix)
	if err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(drop)
	return dsn
}
