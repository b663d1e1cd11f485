package store_test

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	_ "modernc.org/sqlite"

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
	schemaSeq  atomic.Int64
)

func pgRequired() bool {
	return os.Getenv("SANDBOXD_REQUIRE_POSTGRES") == "1" || os.Getenv("CI") == "true"
}

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if dsn := os.Getenv("SANDBOXD_TEST_POSTGRES_DSN"); dsn != "" {
		pgAdminDSN = dsn
	} else {
		stop, dsn, err := startPostgres()
		switch {
		case err != nil:
			pgMissing = err.Error()
		default:
			pgAdminDSN = dsn
			defer stop()
		}
	}
	if pgAdminDSN == "" && pgRequired() {
		fmt.Fprintf(os.Stderr, "store tests: PostgreSQL is required (CI=true or SANDBOXD_REQUIRE_POSTGRES=1) but unavailable: %s\n", pgMissing)
		return 1
	}
	return m.Run()
}

// startPostgres runs initdb and postgres from /usr/lib/postgresql/<newest>/bin in a
// temporary directory, as the postgres OS user when running as root (postgres refuses
// root). It listens on a unix socket in that directory and nowhere else.
func startPostgres() (stop func(), dsn string, err error) {
	bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin/postgres")
	if len(bins) == 0 {
		return nil, "", fmt.Errorf("no /usr/lib/postgresql/*/bin/postgres (apt-get install postgresql, or set SANDBOXD_TEST_POSTGRES_DSN)")
	}
	sort.Slice(bins, func(i, j int) bool { return pgMajor(bins[i]) < pgMajor(bins[j]) })
	binDir := filepath.Dir(bins[len(bins)-1])

	dir, err := os.MkdirTemp("", "sandboxd-pg-")
	if err != nil {
		return nil, "", err
	}
	cleanup := func() { os.RemoveAll(dir) }
	data, sock := filepath.Join(dir, "data"), filepath.Join(dir, "sock")
	if err := os.Mkdir(sock, 0o700); err != nil {
		cleanup()
		return nil, "", err
	}
	var cred *syscall.Credential
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			cleanup()
			return nil, "", fmt.Errorf("running as root and no postgres user to run PostgreSQL as: %w", err)
		}
		uid, _ := strconv.ParseUint(u.Uid, 10, 32)
		gid, _ := strconv.ParseUint(u.Gid, 10, 32)
		cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		for _, p := range []string{dir, sock} {
			if err := os.Chown(p, int(uid), int(gid)); err != nil {
				cleanup()
				return nil, "", err
			}
		}
	}
	logPath := filepath.Join(dir, "postgres.log")
	logf, err := os.Create(logPath)
	if err != nil {
		cleanup()
		return nil, "", err
	}
	defer logf.Close()
	command := func(name string, args ...string) *exec.Cmd {
		c := exec.Command(filepath.Join(binDir, name), args...)
		c.Dir, c.Stdout, c.Stderr = dir, logf, logf
		c.Env = []string{"LANG=C.UTF-8", "LC_ALL=C.UTF-8", "PATH=/usr/bin:/bin"}
		c.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGINT}
		return c
	}
	t0 := time.Now()
	if err := command("initdb", "-D", data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync").Run(); err != nil {
		log, _ := os.ReadFile(logPath)
		cleanup()
		return nil, "", fmt.Errorf("initdb: %w\n%s", err, log)
	}
	const port = "5432" // names the socket file only: no TCP listener
	srv := command("postgres", "-D", data, "-k", sock, "-h", "", "-p", port,
		"-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
		"-c", "max_connections=200")
	if err := srv.Start(); err != nil {
		cleanup()
		return nil, "", fmt.Errorf("start postgres: %w", err)
	}
	exited := make(chan struct{})
	go func() { _ = srv.Wait(); close(exited) }()
	stop = func() {
		_ = srv.Process.Signal(syscall.SIGINT) // fast shutdown
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = srv.Process.Kill()
			<-exited
		}
		cleanup()
	}
	dsn = (&url.URL{Scheme: "postgres", User: url.User("postgres"), Path: "/postgres",
		RawQuery: url.Values{"host": {sock}, "port": {port}, "sslmode": {"disable"}}.Encode()}).String()
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		c, err := pgx.Connect(ctx, dsn)
		cancel()
		if err == nil {
			_ = c.Close(context.Background())
			break
		}
		select {
		case <-exited:
			log, _ := os.ReadFile(logPath)
			cleanup()
			return nil, "", fmt.Errorf("postgres exited during start-up:\n%s", log)
		default:
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(logPath)
			stop()
			return nil, "", fmt.Errorf("postgres not ready after 60s: %w\n%s", err, log)
		}
		time.Sleep(50 * time.Millisecond)
	}
	fmt.Fprintf(os.Stderr, "store tests: started PostgreSQL from %s in %v\n", binDir, time.Since(t0).Round(time.Millisecond))
	return stop, dsn, nil
}

func pgMajor(bin string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(bin))))
	return n
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
	ctx := context.Background()
	c, err := pgx.Connect(ctx, pgAdminDSN)
	if err != nil {
		t.Fatalf("connect to test PostgreSQL: %v", err)
	}
	defer c.Close(ctx)
	schema := fmt.Sprintf("t%d_%d", os.Getpid(), schemaSeq.Add(1))
	if _, err := c.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		t.Fatalf("create schema: %v", err)
	}
	t.Cleanup(func() {
		c, err := pgx.Connect(ctx, pgAdminDSN)
		if err != nil {
			return
		}
		defer c.Close(ctx)
		_, _ = c.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE")
	})
	u, err := url.Parse(pgAdminDSN)
	if err != nil {
		t.Fatalf("SANDBOXD_TEST_POSTGRES_DSN must be a postgres:// URL: %v", err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String()
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
