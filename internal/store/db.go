package store

import (
	"context"
	"fmt"
	"time"
)

// The two backends share their queries (sql.go). A dialect adapts the differences that
// matter: placeholders, how times are stored, transactions, and how a unique violation
// names its key. Queries are written with PostgreSQL's $n placeholders.

// querier runs statements, inside or outside a transaction.
type querier interface {
	exec(ctx context.Context, q string, args ...any) (rowsAffected int64, err error)
	query(ctx context.Context, q string, args ...any) (rows, error)
	queryRow(ctx context.Context, q string, args ...any) row
}

type rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
	Close()
}

type row interface {
	Scan(dest ...any) error
}

// db is a backend's connection pool.
type db interface {
	querier
	// tx runs fn in a write transaction, committing when fn returns nil.
	tx(ctx context.Context, fn func(q querier) error) error
	// lockName serializes, until the transaction q runs in ends, the transactions that
	// lock the same name of the same class (a check-then-insert that no unique key
	// covers). q must be a transaction's (db.tx).
	lockName(ctx context.Context, q querier, class int32, name string) error
	// uniqueViolation reports the "table.key" a unique constraint failure is about.
	uniqueViolation(err error) (table, key string, ok bool)
	// foreignKeyViolation reports a reference to a missing row.
	foreignKeyViolation(err error) bool
	// migrationsDDL creates schema_migrations if missing.
	migrationsDDL() string
	// migrationLock runs fn holding the lock that serializes the migrations of concurrent
	// openers.
	migrationLock(ctx context.Context, fn func(s migrationSession) error) error
	isNoRows(err error) bool
	name() string
	close() error
}

// migrationSession is where migrations run, under the migration lock.
type migrationSession interface {
	// tx runs fn in a transaction, committing when fn returns nil.
	tx(ctx context.Context, fn func(q querier) error) error
	// execOutsideTx runs a no-transaction migration's statements in order, each
	// outside any transaction; a backend without such migrations refuses it.
	execOutsideTx(ctx context.Context, stmts []string) error
}

// now is the store's clock: UTC, truncated to what both backends keep.
func now() time.Time { return utc(time.Now()) }

func utc(t time.Time) time.Time { return t.UTC().Truncate(time.Microsecond) }

// dbTime scans a time from either backend: time.Time (PostgreSQL timestamptz) or
// int64 microseconds since the epoch (SQLite). A NULL leaves valid false.
type dbTime struct {
	t     time.Time
	valid bool
}

func (d *dbTime) Scan(src any) error {
	switch v := src.(type) {
	case nil:
		d.t, d.valid = time.Time{}, false
	case time.Time:
		d.t, d.valid = v.UTC(), true
	case int64:
		d.t, d.valid = time.UnixMicro(v).UTC(), true
	default:
		return fmt.Errorf("store: cannot scan %T into a time", src)
	}
	return nil
}

func (d dbTime) ptr() *time.Time {
	if !d.valid {
		return nil
	}
	t := d.t
	return &t
}

// dbJSON scans a JSON document stored as text; NULL is nil.
type dbJSON []byte

func (j *dbJSON) Scan(src any) error {
	switch v := src.(type) {
	case nil:
		*j = nil
	case string:
		*j = dbJSON(v)
	case []byte:
		*j = append(dbJSON(nil), v...)
	default:
		return fmt.Errorf("store: cannot scan %T into JSON", src)
	}
	return nil
}

// jsonArg is a JSON document as a statement argument: its text, or NULL for nil.
func jsonArg(b []byte) any {
	if b == nil {
		return nil
	}
	return string(b)
}

// timeArg is a nullable time as a statement argument.
func timeArg(t *time.Time) any {
	if t == nil {
		return nil
	}
	return utc(*t)
}
