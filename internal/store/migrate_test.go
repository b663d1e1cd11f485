package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sandboxd/sandboxd/internal/store"
)

// actorOrgIndex reads migration 0023's index in the schema of c: whether it exists, is
// valid (a CREATE INDEX CONCURRENTLY that failed leaves it invalid), unique, and its
// number of columns.
func actorOrgIndex(t *testing.T, c *pgx.Conn) (exists, valid, unique bool, cols int) {
	t.Helper()
	err := c.QueryRow(t.Context(), `SELECT i.indisvalid, i.indisunique, i.indnatts FROM pg_index i
		JOIN pg_class x ON x.oid = i.indexrelid
		WHERE x.relname = 'audit_events_actor_org_at' AND x.relnamespace = current_schema()::regnamespace`).Scan(&valid, &unique, &cols)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, false, false, 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return true, valid, unique, cols
}

func pgConnect(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	c, err := pgx.Connect(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

func schemaVersion(t *testing.T, c *pgx.Conn) int64 {
	t.Helper()
	var v int64
	if err := c.QueryRow(t.Context(), `SELECT max(version) FROM schema_migrations`).Scan(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

// TestMigrationIndexConcurrently: PostgreSQL's migration 0023 (a no-transaction
// migration, store.NoTransactionMarker) builds its index with CREATE INDEX CONCURRENTLY:
// while the build waits for an older transaction, writes to audit_events go on; once
// that transaction ends the index is valid and the version recorded.
func TestMigrationIndexConcurrently(t *testing.T) {
	dsn := newPostgresSchema(t)
	openStore(t, dsn).Close()
	ctx := t.Context()
	mon := pgConnect(t, dsn)
	// As a crash after 0023's first statement leaves it: the column, no index, 0023 not
	// recorded.
	rawExec(t, dsn, `DROP INDEX audit_events_actor_org_at`)
	rawExec(t, dsn, `DELETE FROM schema_migrations WHERE version >= 23`)

	// An older transaction, with its snapshot (on another table): a concurrent index
	// build waits for it to end.
	old := pgConnect(t, dsn)
	tx, err := old.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(ctx, `SELECT count(*) FROM schema_migrations`); err != nil {
		t.Fatal(err)
	}
	opened := make(chan error, 1)
	go func() {
		s, err := store.Open(ctx, dsn)
		if err == nil {
			s.Close()
		}
		opened <- err
	}()
	deadline := time.Now().Add(60 * time.Second)
	for {
		var n int
		if err := mon.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
			AND state = 'active' AND query LIKE 'CREATE INDEX CONCURRENTLY IF NOT EXISTS audit_events_actor_org_at %'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			break
		}
		select {
		case err := <-opened:
			t.Fatalf("the migration ended (%v) without waiting for the older transaction: its index was not built concurrently", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("no CREATE INDEX CONCURRENTLY seen running")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Writes go on meanwhile (a plain CREATE INDEX would hold them until it committed).
	w := pgConnect(t, dsn)
	if _, err := w.Exec(ctx, `SET lock_timeout = '20s'`); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Exec(ctx, `INSERT INTO audit_events (id, at, org_id, method, code, actor_org)
		VALUES ('during-build', now(), 'o1', 'M', 'OK', 'platform')`); err != nil {
		t.Fatalf("a write while the index builds: %v", err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-opened; err != nil {
		t.Fatalf("open: %v", err)
	}
	if exists, valid, unique, cols := actorOrgIndex(t, mon); !exists || !valid || unique || cols != 3 {
		t.Fatalf("the index after 0023: exists %v, valid %v, unique %v, %d columns", exists, valid, unique, cols)
	}
	if v := schemaVersion(t, mon); v != store.SchemaVersion() {
		t.Fatalf("schema version %d, want %d", v, store.SchemaVersion())
	}
}

// TestMigrationIndexConcurrentlyAgain: 0023 applied again (a crash before it was
// recorded) over what it left: over all of it (the plain index an earlier 0023 built
// too), and over an INVALID index of that name (a concurrent build that failed), which
// it replaces by a valid one.
func TestMigrationIndexConcurrentlyAgain(t *testing.T) {
	dsn := newPostgresSchema(t)
	openStore(t, dsn).Close()
	c := pgConnect(t, dsn)

	rawExec(t, dsn, `DROP INDEX audit_events_actor_org_at`)
	rawExec(t, dsn, `CREATE INDEX audit_events_actor_org_at ON audit_events (actor_org, at, id)`)
	rawExec(t, dsn, `DELETE FROM schema_migrations WHERE version >= 23`)
	openStore(t, dsn).Close()
	if exists, valid, _, cols := actorOrgIndex(t, c); !exists || !valid || cols != 3 || schemaVersion(t, c) != store.SchemaVersion() {
		t.Fatalf("0023 over itself: index exists %v, valid %v, %d columns; version %d", exists, valid, cols, schemaVersion(t, c))
	}

	// A unique build over duplicates fails, and leaves its index INVALID.
	rawExec(t, dsn, `DROP INDEX audit_events_actor_org_at`)
	rawExec(t, dsn, `INSERT INTO audit_events (id, at, org_id, method, code) VALUES ('e1', now(), 'o1', 'M', 'OK'), ('e2', now(), 'o1', 'M', 'OK')`)
	if _, err := c.Exec(t.Context(), `CREATE UNIQUE INDEX CONCURRENTLY audit_events_actor_org_at ON audit_events (actor_org)`); err == nil {
		t.Fatal("a unique index over duplicates was built")
	}
	if exists, valid, _, _ := actorOrgIndex(t, c); !exists || valid {
		t.Fatalf("the failed build's index: exists %v, valid %v; want an invalid one", exists, valid)
	}
	rawExec(t, dsn, `DELETE FROM schema_migrations WHERE version >= 23`)
	openStore(t, dsn).Close()
	if exists, valid, unique, cols := actorOrgIndex(t, c); !exists || !valid || unique || cols != 3 || schemaVersion(t, c) != store.SchemaVersion() {
		t.Fatalf("0023 over an invalid index: exists %v, valid %v, unique %v, %d columns; version %d", exists, valid, unique, cols, schemaVersion(t, c))
	}
}
