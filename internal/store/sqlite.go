package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

// OpenSQLite opens (creating it if missing) the SQLite database at path and migrates it.
// Connections use WAL, a busy timeout, foreign keys, and BEGIN IMMEDIATE for
// transactions, so concurrent writers queue instead of failing.
func OpenSQLite(ctx context.Context, path string) (Store, error) {
	if path == "" || strings.Contains(path, "?") {
		return nil, fmt.Errorf("%w: sqlite path %q", ErrInvalid, path)
	}
	if dir := filepath.Dir(path); dir != "" {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("open sqlite store: %w", err)
		}
	}
	dsn := path + "?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)" +
		"&_pragma=foreign_keys(1)&_pragma=synchronous(NORMAL)&_txlock=immediate"
	sdb, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("open sqlite store %s: %w", path, err)
	}
	sdb.SetMaxOpenConns(8)
	sdb.SetMaxIdleConns(8)
	sdb.SetConnMaxIdleTime(5 * time.Minute)
	d := &sqliteDB{db: sdb}
	// Processes opening a new database at once race to switch it to WAL, which SQLite
	// refuses at once (SQLITE_BUSY, no busy handler) rather than waiting: try again.
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := sdb.PingContext(ctx)
		if err == nil {
			err = migrate(ctx, d, sqliteMigrations, "migrations/sqlite")
		}
		if err == nil {
			return newSQLStore(d), nil
		}
		if !sqliteBusy(err) || time.Now().After(deadline) || ctx.Err() != nil {
			_ = sdb.Close()
			return nil, fmt.Errorf("open sqlite store %s: %w", path, err)
		}
		time.Sleep(time.Duration(10+rand.IntN(40)) * time.Millisecond)
	}
}

func sqliteBusy(err error) bool {
	s := err.Error()
	return strings.Contains(s, "SQLITE_BUSY") || strings.Contains(s, "database is locked")
}

type sqliteDB struct {
	db *sql.DB
	// stmts caches prepared statements by query text: SQLite's parse and prepare of a
	// statement (modernc.org/sqlite has no cache of its own) cost as much as running it
	// (~0.1 ms each on the create path). The queries are the store's own constants;
	// nstmts bounds the cache all the same (past maxCachedStmts, statements are prepared
	// per call as before).
	stmts  sync.Map // SQLite query -> *sql.Stmt
	nstmts atomic.Int32
}

// maxCachedStmts bounds sqliteDB.stmts.
const maxCachedStmts = 512

// stmt is the cached prepared statement of SQLite query q, or nil (the cache is full, or
// q does not prepare: the caller runs it unprepared and reports the error).
func (d *sqliteDB) stmt(ctx context.Context, q string) *sql.Stmt {
	if st, ok := d.stmts.Load(q); ok {
		return st.(*sql.Stmt)
	}
	if d.nstmts.Load() >= maxCachedStmts {
		return nil
	}
	st, err := d.db.PrepareContext(ctx, q)
	if err != nil {
		return nil
	}
	if prev, loaded := d.stmts.LoadOrStore(q, st); loaded {
		_ = st.Close()
		return prev.(*sql.Stmt)
	}
	d.nstmts.Add(1)
	return st
}

// sqliteConn is what *sql.DB and *sql.Tx have in common.
type sqliteConn interface {
	ExecContext(ctx context.Context, q string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, q string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, q string, args ...any) *sql.Row
}

// sqliteQuerier runs queries on d's pool, or in tx when not nil.
type sqliteQuerier struct {
	d  *sqliteDB
	tx *sql.Tx
}

// conn is what runs q: its cached prepared statement (in tx when there is one), or
// the pool or tx itself.
//
// In a transaction a statement not cached yet runs unprepared: preparing it takes a
// connection of the pool, and when every other connection waits in BEGIN IMMEDIATE for
// the write lock this transaction holds, none frees up until the busy timeout (a
// deadlock of ten seconds, then SQLITE_BUSY). It is prepared outside a transaction.
func (s sqliteQuerier) conn(ctx context.Context, q string) sqliteConn {
	var st *sql.Stmt
	if s.tx == nil {
		st = s.d.stmt(ctx, q)
	} else if c, ok := s.d.stmts.Load(q); ok {
		st = c.(*sql.Stmt)
	}
	switch {
	case st != nil && s.tx != nil:
		return stmtConn{s.tx.StmtContext(ctx, st)}
	case st != nil:
		return stmtConn{st}
	case s.tx != nil:
		return s.tx
	}
	return s.d.db
}

// stmtConn runs a prepared statement as a sqliteConn (the query text is its own).
type stmtConn struct{ st *sql.Stmt }

func (c stmtConn) ExecContext(ctx context.Context, _ string, args ...any) (sql.Result, error) {
	return c.st.ExecContext(ctx, args...)
}

func (c stmtConn) QueryContext(ctx context.Context, _ string, args ...any) (*sql.Rows, error) {
	return c.st.QueryContext(ctx, args...)
}

func (c stmtConn) QueryRowContext(ctx context.Context, _ string, args ...any) *sql.Row {
	return c.st.QueryRowContext(ctx, args...)
}

var (
	placeholder = regexp.MustCompile(`\$(\d+)`)
	rewritten   sync.Map // PostgreSQL-style query -> SQLite query
)

// sqliteQuery turns $n placeholders into SQLite's numbered ?n.
func sqliteQuery(q string) string {
	if s, ok := rewritten.Load(q); ok {
		return s.(string)
	}
	s := placeholder.ReplaceAllString(q, "?$1")
	rewritten.Store(q, s)
	return s
}

// sqliteArgs stores times as microseconds since the epoch, which sort and compare as
// integers.
func sqliteArgs(args []any) []any {
	out := make([]any, len(args))
	for i, a := range args {
		if t, ok := a.(time.Time); ok {
			a = t.UnixMicro()
		}
		out[i] = a
	}
	return out
}

func (s sqliteQuerier) exec(ctx context.Context, q string, args ...any) (int64, error) {
	q = sqliteQuery(q)
	res, err := s.conn(ctx, q).ExecContext(ctx, q, sqliteArgs(args)...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

func (s sqliteQuerier) query(ctx context.Context, q string, args ...any) (rows, error) {
	q = sqliteQuery(q)
	r, err := s.conn(ctx, q).QueryContext(ctx, q, sqliteArgs(args)...)
	if err != nil {
		return nil, err
	}
	return sqlRows{r}, nil
}

func (s sqliteQuerier) queryRow(ctx context.Context, q string, args ...any) row {
	q = sqliteQuery(q)
	return s.conn(ctx, q).QueryRowContext(ctx, q, sqliteArgs(args)...)
}

type sqlRows struct{ *sql.Rows }

func (r sqlRows) Close() { _ = r.Rows.Close() }

func (d *sqliteDB) exec(ctx context.Context, q string, args ...any) (int64, error) {
	return sqliteQuerier{d: d}.exec(ctx, q, args...)
}

func (d *sqliteDB) query(ctx context.Context, q string, args ...any) (rows, error) {
	return sqliteQuerier{d: d}.query(ctx, q, args...)
}

func (d *sqliteDB) queryRow(ctx context.Context, q string, args ...any) row {
	return sqliteQuerier{d: d}.queryRow(ctx, q, args...)
}

func (d *sqliteDB) tx(ctx context.Context, fn func(q querier) error) error {
	tx, err := d.db.BeginTx(ctx, nil) // BEGIN IMMEDIATE (_txlock)
	if err != nil {
		return err
	}
	if err := fn(sqliteQuerier{d: d, tx: tx}); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}

// lockName is nothing to do: every transaction is BEGIN IMMEDIATE (_txlock), which
// takes the database's one write lock before its first statement, so write
// transactions run one at a time.
func (d *sqliteDB) lockName(context.Context, querier, int32, string) error { return nil }

// uniqueViolation parses "UNIQUE constraint failed: runners.org_id, runners.cluster_id";
// the key is the last column (organization-scoped keys lead with org_id).
func (d *sqliteDB) uniqueViolation(err error) (string, string, bool) {
	var se *sqlite.Error
	if !errors.As(err, &se) {
		return "", "", false
	}
	if se.Code() != sqlite3.SQLITE_CONSTRAINT_UNIQUE && se.Code() != sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY {
		return "", "", false
	}
	msg := se.Error()
	i := strings.LastIndex(msg, "failed: ")
	if i < 0 {
		return "", "", true
	}
	cols := msg[i+len("failed: "):]
	if j := strings.Index(cols, " ("); j >= 0 {
		cols = cols[:j]
	}
	parts := strings.Split(cols, ", ")
	table, key, _ := strings.Cut(strings.TrimSpace(parts[len(parts)-1]), ".")
	return table, key, true
}

func (d *sqliteDB) foreignKeyViolation(err error) bool {
	var se *sqlite.Error
	return errors.As(err, &se) && se.Code() == sqlite3.SQLITE_CONSTRAINT_FOREIGNKEY
}

func (d *sqliteDB) migrationsDDL() string {
	return `CREATE TABLE IF NOT EXISTS schema_migrations (
    version    INTEGER NOT NULL PRIMARY KEY,
    name       TEXT    NOT NULL,
    applied_at INTEGER NOT NULL
) STRICT`
}

// migrationLock runs all of fn in one transaction: it began IMMEDIATE, so it holds the
// write lock throughout, and a failure anywhere leaves the database as it was.
func (d *sqliteDB) migrationLock(ctx context.Context, fn func(s migrationSession) error) error {
	return d.tx(ctx, func(q querier) error { return fn(sqliteMigrationSession{q}) })
}

// sqliteMigrationSession runs every migration in migrationLock's one transaction.
type sqliteMigrationSession struct{ q querier }

func (m sqliteMigrationSession) tx(_ context.Context, fn func(q querier) error) error { return fn(m.q) }

func (m sqliteMigrationSession) execOutsideTx(context.Context, []string) error {
	return errors.New("SQLite migrations run in a transaction: " + NoTransactionMarker + " is PostgreSQL's only")
}

func (d *sqliteDB) isNoRows(err error) bool { return errors.Is(err, sql.ErrNoRows) }
func (d *sqliteDB) name() string            { return "sqlite" }
func (d *sqliteDB) close() error {
	d.stmts.Range(func(_, st any) bool {
		_ = st.(*sql.Stmt).Close()
		return true
	})
	return d.db.Close()
}
