package store

import (
	"context"
	"fmt"
	"strings"
)

// Open opens the store named by dsn and migrates it:
//
//	postgres://… or postgresql://…   PostgreSQL (pgx pool; libpq URL parameters apply)
//	sqlite:///abs/path/db            SQLite at /abs/path/db (sqlite://rel/db is relative)
//	/path/to/db, ./db                SQLite at that path
func Open(ctx context.Context, dsn string) (Store, error) {
	switch {
	case strings.HasPrefix(dsn, "postgres://"), strings.HasPrefix(dsn, "postgresql://"):
		return OpenPostgres(ctx, dsn)
	case strings.HasPrefix(dsn, "sqlite://"):
		return OpenSQLite(ctx, strings.TrimPrefix(dsn, "sqlite://"))
	case strings.Contains(dsn, "://"):
		return nil, fmt.Errorf("%w: store DSN %q: want postgres://…, sqlite://… or a file path", ErrInvalid, dsn)
	default:
		return OpenSQLite(ctx, dsn)
	}
}
