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
// version is applied once, recorded in schema_migrations; pending ones are applied in one
// transaction, so a failure leaves the database as it was.

//go:embed migrations/sqlite/*.sql
var sqliteMigrations embed.FS

//go:embed migrations/postgres/*.sql
var postgresMigrations embed.FS

type migration struct {
	version int64
	name    string
	sql     string
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
		out = append(out, migration{version: v, name: strings.TrimSuffix(name, ".sql"), sql: string(b)})
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
	return d.tx(ctx, func(q querier) error {
		if err := d.lockMigrations(ctx, q); err != nil {
			return fmt.Errorf("lock migrations: %w", err)
		}
		if _, err := q.exec(ctx, d.migrationsDDL()); err != nil {
			return fmt.Errorf("create schema_migrations: %w", err)
		}
		var current int64
		if err := q.queryRow(ctx, `SELECT COALESCE(MAX(version), 0) FROM schema_migrations`).Scan(&current); err != nil {
			return fmt.Errorf("read schema version: %w", err)
		}
		if current > latest {
			return fmt.Errorf("%w: database at version %d, this binary knows up to %d", ErrSchemaTooNew, current, latest)
		}
		for _, m := range ms[current:] {
			if _, err := q.exec(ctx, m.sql); err != nil {
				return fmt.Errorf("migration %s: %w", m.name, err)
			}
			if _, err := q.exec(ctx, `INSERT INTO schema_migrations (version, name, applied_at) VALUES ($1, $2, $3)`,
				m.version, m.name, now()); err != nil {
				return fmt.Errorf("record migration %s: %w", m.name, err)
			}
		}
		return nil
	})
}
