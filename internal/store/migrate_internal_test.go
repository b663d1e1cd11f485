package store

import (
	"slices"
	"testing"
	"testing/fstest"
)

func TestNoTransactionMigrations(t *testing.T) {
	fsys := fstest.MapFS{
		"m/0001_a.sql": {Data: []byte("CREATE TABLE a (x int);\nCREATE TABLE b (y int);\n")},
		"m/0002_b.sql": {Data: []byte(NoTransactionMarker + "\n-- a comment; with a semicolon;\nALTER TABLE a\n    ADD COLUMN IF NOT EXISTS z int;\n\n" +
			"CREATE INDEX CONCURRENTLY IF NOT EXISTS a_z ON a (z);\nSELECT 1")},
		"m/0003_c.sql": {Data: []byte("-- not the marker\n" + NoTransactionMarker + "\nSELECT 1;\n")},
	}
	ms, err := loadMigrations(fsys, "m")
	if err != nil {
		t.Fatal(err)
	}
	if ms[0].noTx || !ms[1].noTx || ms[2].noTx {
		t.Fatalf("no-transaction: %v %v %v; want only the one whose first line is the marker", ms[0].noTx, ms[1].noTx, ms[2].noTx)
	}
	want := []string{"ALTER TABLE a\n    ADD COLUMN IF NOT EXISTS z int;", "CREATE INDEX CONCURRENTLY IF NOT EXISTS a_z ON a (z);", "SELECT 1"}
	if got := ms[1].statements(); !slices.Equal(got, want) {
		t.Fatalf("statements %q, want %q", got, want)
	}
	// A no-transaction migration of nothing is refused.
	fsys["m/0004_d.sql"] = &fstest.MapFile{Data: []byte(NoTransactionMarker + "\n-- nothing\n")}
	if _, err := loadMigrations(fsys, "m"); err == nil {
		t.Fatal("an empty no-transaction migration loaded")
	}
	// A ";" that does not end its line would join two statements: refused.
	for _, body := range []string{"SELECT 1; -- trailing comment\n", "SELECT 1; SELECT 2;\n"} {
		fsys["m/0004_d.sql"] = &fstest.MapFile{Data: []byte(NoTransactionMarker + "\n" + body)}
		if _, err := loadMigrations(fsys, "m"); err == nil {
			t.Errorf("no-transaction migration %q loaded", body)
		}
	}
}

// SQLite's migrations run in one transaction, and PostgreSQL's 0023 (its concurrent
// index) outside one.
func TestEmbeddedNoTransactionMigrations(t *testing.T) {
	lite, err := loadMigrations(sqliteMigrations, "migrations/sqlite")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range lite {
		if m.noTx {
			t.Errorf("SQLite migration %s is marked no-transaction", m.name)
		}
	}
	pg, err := loadMigrations(postgresMigrations, "migrations/postgres")
	if err != nil {
		t.Fatal(err)
	}
	if len(pg) != len(lite) {
		t.Fatalf("%d PostgreSQL migrations, %d SQLite ones", len(pg), len(lite))
	}
	for _, m := range pg {
		if m.noTx != (m.version == 23) {
			t.Errorf("PostgreSQL migration %s: no-transaction %v", m.name, m.noTx)
		}
	}
}
