package store

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// OpenPostgres connects a pool to the PostgreSQL database at dsn (a postgres:// URL or a
// key=value string, as libpq takes) and migrates it. Replicas may open the same database
// concurrently: migrations serialize on an advisory lock.
func OpenPostgres(ctx context.Context, dsn string) (Store, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("%w: postgres DSN: %w", ErrInvalid, err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open postgres store: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("open postgres store: %w", err)
	}
	d := &pgDB{pool: pool}
	if err := migrate(ctx, d, postgresMigrations, "migrations/postgres"); err != nil {
		pool.Close()
		return nil, fmt.Errorf("open postgres store: %w", err)
	}
	return newSQLStore(d), nil
}

type pgDB struct {
	pool *pgxpool.Pool
}

// pgConn is what *pgxpool.Pool and pgx.Tx have in common.
type pgConn interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

type pgQuerier struct{ c pgConn }

func (p pgQuerier) exec(ctx context.Context, q string, args ...any) (int64, error) {
	tag, err := p.c.Exec(ctx, q, args...)
	if err != nil {
		return 0, err
	}
	return tag.RowsAffected(), nil
}

func (p pgQuerier) query(ctx context.Context, q string, args ...any) (rows, error) {
	return p.c.Query(ctx, q, args...)
}

func (p pgQuerier) queryRow(ctx context.Context, q string, args ...any) row {
	return p.c.QueryRow(ctx, q, args...)
}

func (d *pgDB) exec(ctx context.Context, q string, args ...any) (int64, error) {
	return pgQuerier{d.pool}.exec(ctx, q, args...)
}

func (d *pgDB) query(ctx context.Context, q string, args ...any) (rows, error) {
	return pgQuerier{d.pool}.query(ctx, q, args...)
}

func (d *pgDB) queryRow(ctx context.Context, q string, args ...any) row {
	return pgQuerier{d.pool}.queryRow(ctx, q, args...)
}

// tx runs fn in a READ COMMITTED transaction whatever the database's default (lockName
// relies on it: a statement after the lock sees what its previous holder committed).
func (d *pgDB) tx(ctx context.Context, fn func(q querier) error) error {
	return pgx.BeginTxFunc(ctx, d.pool, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error { return fn(pgQuerier{tx}) })
}

// lockName takes a transaction-scoped advisory lock on (class, FNV-32a of name). Its
// two-int4 key space is apart from the migration lock's one bigint. Under READ
// COMMITTED each later statement of the transaction sees what the previous holder
// committed.
func (d *pgDB) lockName(ctx context.Context, q querier, class int32, name string) error {
	h := fnv.New32a()
	_, _ = h.Write([]byte(name))
	_, err := q.exec(ctx, `SELECT pg_advisory_xact_lock($1::int4, $2::int4)`, class, int32(h.Sum32()))
	return err
}

// pgUnique names the key behind each unique constraint of the schema.
var pgUnique = map[string][2]string{
	"organizations_pkey":                 {"organizations", KeyID},
	"api_keys_pkey":                      {"api_keys", KeyID},
	"runners_pkey":                       {"runners", KeyRunnerID},
	"runners_cluster_id_key":             {"runners", KeyClusterID},
	"bootstrap_tokens_pkey":              {"bootstrap_tokens", KeyHash},
	"sandboxes_pkey":                     {"sandboxes", KeyID},
	"sandboxes_request_id_key":           {"sandboxes", KeyRequestID},
	"releases_pkey":                      {"releases", KeyVersion},
	"clusters_pkey":                      {"clusters", KeyClusterID},
	"fss_bucket_configs_bucket_name_key": {"fss_bucket_configs", "bucket_name"},
	"snapshots_pkey":                     {"snapshots", KeyID},
	"snapshots_request_id_key":           {"snapshots", KeyRequestID},
	"templates_pkey":                     {"templates", KeyID},
	"templates_display_name_key":         {"templates", KeyDisplayName},
	"templates_request_id_key":           {"templates", KeyRequestID},
	"volumes_pkey":                       {"volumes", KeyID},
	"volumes_request_id_key":             {"volumes", KeyRequestID},
	"volumes_claim_key":                  {"volumes", KeyClaimName},
	"sandbox_volumes_pkey":               {"sandbox_volumes", "volume_id"},
	"secret_stores_pkey":                 {"secret_stores", KeyName},
	"secret_stores_request_id_key":       {"secret_stores", KeyRequestID},
}

func (d *pgDB) uniqueViolation(err error) (string, string, bool) {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "23505" {
		return "", "", false
	}
	if k, ok := pgUnique[pe.ConstraintName]; ok {
		return k[0], k[1], true
	}
	return pe.TableName, pe.ConstraintName, true
}

func (d *pgDB) foreignKeyViolation(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "23503"
}

func (d *pgDB) migrationsDDL() string {
	return `CREATE TABLE IF NOT EXISTS schema_migrations (
    version    bigint      NOT NULL PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL
)`
}

// migrationLockKey is an arbitrary constant naming sandboxd's migration advisory lock.
const migrationLockKey = 0x73627864 // "sbxd"

// migrationLockPoll is how often a waiting opener tries the migration lock again.
const migrationLockPoll = 100 * time.Millisecond

// migrationLock holds a session-level advisory lock on one connection of the pool while
// fn runs migrations on it (in transactions, and outside one for no-transaction
// migrations). The lock is tried, not waited for in PostgreSQL: an opener blocked in
// pg_advisory_lock holds a snapshot, which the CREATE INDEX CONCURRENTLY of the opener
// holding the lock waits for, and the deadlock detector would fail one of them.
func (d *pgDB) migrationLock(ctx context.Context, fn func(s migrationSession) error) (err error) {
	c, err := d.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("lock migrations: %w", err)
	}
	defer c.Release()
	for {
		var ok bool
		if err := c.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, int64(migrationLockKey)).Scan(&ok); err != nil {
			// Interrupted, it may have taken the lock: the connection goes, and the lock with it.
			_ = c.Conn().Close(context.WithoutCancel(ctx))
			return fmt.Errorf("lock migrations: %w", err)
		}
		if ok {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("lock migrations: %w", ctx.Err())
		case <-time.After(migrationLockPoll):
		}
	}
	defer func() {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if _, uerr := c.Exec(uctx, `SELECT pg_advisory_unlock($1)`, int64(migrationLockKey)); uerr != nil {
			// A connection that may still hold the lock never goes back to the pool
			// (Release drops a closed one); the server frees its locks with it.
			_ = c.Conn().Close(uctx)
			if err == nil {
				err = fmt.Errorf("unlock migrations: %w", uerr)
			}
		}
	}()
	return fn(pgMigrationSession{c})
}

// pgMigrationSession runs migrations on the connection that holds the migration lock.
type pgMigrationSession struct{ c *pgxpool.Conn }

func (m pgMigrationSession) tx(ctx context.Context, fn func(q querier) error) error {
	return pgx.BeginFunc(ctx, m.c, func(tx pgx.Tx) error { return fn(pgQuerier{tx}) })
}

// execOutsideTx runs each statement alone in the simple protocol (no arguments), in no
// transaction. A deadlock PostgreSQL broke (40P01) runs the whole migration again from
// its first statement, up to three tries: an opener of an earlier release waits for the
// migration lock in pg_advisory_xact_lock holding a snapshot that a concurrent index
// build waits for, and the detector may pick the build, which then leaves an INVALID
// index behind (the migration's own first statements drop it; retrying only the build,
// IF NOT EXISTS, would keep it). Such migrations are written to be run again.
func (m pgMigrationSession) execOutsideTx(ctx context.Context, stmts []string) error {
	run := func() error {
		for i, q := range stmts {
			if _, err := m.c.Exec(ctx, q); err != nil {
				return fmt.Errorf("statement %d: %w", i+1, err)
			}
		}
		return nil
	}
	var err error
	for try := range 3 {
		if err = run(); !isDeadlock(err) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(time.Duration(try+1) * 200 * time.Millisecond):
		}
	}
	return err
}

// isDeadlock reports whether err is PostgreSQL's deadlock_detected.
func isDeadlock(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "40P01"
}

func (d *pgDB) isNoRows(err error) bool { return errors.Is(err, pgx.ErrNoRows) }
func (d *pgDB) name() string            { return "postgres" }
func (d *pgDB) close() error            { d.pool.Close(); return nil }
