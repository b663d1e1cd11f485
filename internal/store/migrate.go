package store

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strconv"
	"strings"
)

// Migrations are numbered SQL files, NNNN_name.sql, one directory per dialect. Each
// version is applied once, recorded in schema_migrations, under a lock that serializes
// concurrent openers. Consecutive pending migrations are applied in one transaction, so a
// failure leaves the database as it was before them.
//
// A PostgreSQL migration whose first line is NoTransactionMarker runs outside any
// transaction instead (CREATE INDEX CONCURRENTLY cannot run inside one): its statements one
// at a time, each committed on its own, then its version is recorded. Its statements end
// with ";" at the end of a line (no dollar-quoted bodies: they are split there), and each
// must be idempotent (IF NOT EXISTS …), since a crash between two of them applies the whole
// migration again at the next open. SQLite migrations never carry the marker (its DDL
// locks nothing the database does not lock anyway); the SQLite store refuses one.

// NoTransactionMarker, as the first line of a PostgreSQL migration, applies it outside a
// transaction.
const NoTransactionMarker = "-- sandboxd:no-transaction"

//go:embed migrations/sqlite/*.sql
var sqliteMigrations embed.FS

//go:embed migrations/postgres/*.sql
var postgresMigrations embed.FS

type migration struct {
	version int64
	name    string
	sql     string
	noTx    bool // first line NoTransactionMarker
}

// statements splits a no-transaction migration into its statements: each ends with ";"
// at the end of a line; comment-only lines are dropped.
func (m migration) statements() []string {
	var out []string
	var cur strings.Builder
	for line := range strings.Lines(m.sql) {
		t := strings.TrimSpace(line)
		if t == "" || strings.HasPrefix(t, "--") {
			continue
		}
		cur.WriteString(line)
		if strings.HasSuffix(t, ";") {
			out = append(out, strings.TrimSpace(cur.String()))
			cur.Reset()
		}
	}
	if rest := strings.TrimSpace(cur.String()); rest != "" {
		out = append(out, rest)
	}
	return out
}

func loadMigrations(fsys fs.FS, dir string) ([]migration, error) {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil, err
	}
	var out []migration
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !strings.HasSuffix(name, ".sql") {
			continue
		}
		num, _, ok := strings.Cut(name, "_")
		v, err := strconv.ParseInt(num, 10, 64)
		if !ok || err != nil || v <= 0 {
			return nil, fmt.Errorf("migration %s: name must be NNNN_name.sql", name)
		}
		b, err := fs.ReadFile(fsys, path.Join(dir, name))
		if err != nil {
			return nil, err
		}
		first, _, _ := strings.Cut(string(b), "\n")
		m := migration{version: v, name: strings.TrimSuffix(name, ".sql"), sql: string(b),
			noTx: strings.TrimSpace(first) == NoTransactionMarker}
		if m.noTx && len(m.statements()) == 0 {
			return nil, fmt.Errorf("migration %s: no statement", name)
		}
		if m.noTx {
			// Statements are split at a ";" ending a line: one followed by more (a
			// comment, another statement) would join two into one implicit transaction.
			for line := range strings.Lines(m.sql) {
				if t := strings.TrimSpace(line); !strings.HasPrefix(t, "--") && (strings.Count(t, ";") > 1 || strings.Contains(t, ";") && !strings.HasSuffix(t, ";")) {
					return nil, fmt.Errorf("migration %s: %q: in a no-transaction migration a line holds at most one \";\", at its end", name, t)
				}
			}
		}
		out = append(out, m)
	}
	slices.SortFunc(out, func(a, b migration) int { return int(a.version - b.version) })
	for i := range out {
		if out[i].version != int64(i+1) {
			return nil, fmt.Errorf("migrations %s: version %d missing or repeated", dir, i+1)
		}
	}
	return out, nil
}

// SchemaVersion is the schema version this binary migrates databases to.
func SchemaVersion() int64 {
	ms, err := loadMigrations(sqliteMigrations, "migrations/sqlite")
	if err != nil {
		panic(err)
	}
	return int64(len(ms))
}

// migrate brings d up to the newest embedded version and refuses a newer database.
func migrate(ctx context.Context, d db, fsys fs.FS, dir string) error {
	ms, err := loadMigrations(fsys, dir)
	if err != nil {
		return err
	}
	latest := int64(len(ms))
	return d.migrationLock(ctx, func(s migrationSession) error {
		var current int64
		if err := s.tx(ctx, func(q querier) error {
			if _, err := q.exec(ctx, d.migrationsDDL()); err != nil {
				return fmt.Errorf("create schema_migrations: %w", err)
			}
			if err := q.queryRow(ctx, `SELECT COALESCE(MAX(version), 0) FROM schema_migrations`).Scan(&current); err != nil {
				return fmt.Errorf("read schema version: %w", err)
			}
			return nil
		}); err != nil {
			return err
		}
		if current > latest {
			return fmt.Errorf("%w: database at version %d, this binary knows up to %d", ErrSchemaTooNew, current, latest)
		}
		record := func(q querier, m migration) error {
			if _, err := q.exec(ctx, `INSERT INTO schema_migrations (version, name, applied_at) VALUES ($1, $2, $3)`,
				m.version, m.name, now()); err != nil {
				return fmt.Errorf("record migration %s: %w", m.name, err)
			}
			return nil
		}
		for pending := ms[current:]; len(pending) > 0; {
			if m := pending[0]; m.noTx {
				if err := s.execOutsideTx(ctx, m.statements()); err != nil {
					return fmt.Errorf("migration %s (outside a transaction): %w", m.name, err)
				}
				if err := s.tx(ctx, func(q querier) error { return record(q, m) }); err != nil {
					return err
				}
				pending = pending[1:]
				continue
			}
			n := 1
			for n < len(pending) && !pending[n].noTx {
				n++
			}
			if err := s.tx(ctx, func(q querier) error {
				for _, m := range pending[:n] {
					if _, err := q.exec(ctx, m.sql); err != nil {
						return fmt.Errorf("migration %s: %w", m.name, err)
					}
					if err := record(q, m); err != nil {
						return err
					}
				}
				return nil
			}); err != nil {
				return err
			}
			pending = pending[n:]
		}
		return nil
	})
}
