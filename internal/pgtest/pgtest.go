// Package pgtest starts a throwaway PostgreSQL server for tests, from Debian's binaries
// (apt package postgresql), listening on a unix socket only.
package pgtest

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// Required reports whether tests must fail rather than skip without PostgreSQL
// (SANDBOXD_REQUIRE_POSTGRES=1 or CI=true).
func Required() bool {
	return os.Getenv("SANDBOXD_REQUIRE_POSTGRES") == "1" || os.Getenv("CI") == "true"
}

// Start runs initdb and postgres from /usr/lib/postgresql/<newest>/bin in a
// temporary directory, as the postgres OS user when running as root (postgres refuses
// root). It listens on a unix socket in that directory and nowhere else.
func Start() (stop func(), dsn string, err error) {
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
	if err := onKeptThread(command("initdb", "-D", data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync").Run, nil); err != nil {
		log, _ := os.ReadFile(logPath)
		cleanup()
		return nil, "", fmt.Errorf("initdb: %w\n%s", err, log)
	}
	const port = "5432" // names the socket file only: no TCP listener
	srv := command("postgres", "-D", data, "-k", sock, "-h", "", "-p", port,
		"-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
		"-c", "max_connections=200")
	exited := make(chan struct{})
	if err := onKeptThread(srv.Start, exited); err != nil {
		cleanup()
		return nil, "", fmt.Errorf("start postgres: %w", err)
	}
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
	fmt.Fprintf(os.Stderr, "pgtest: started PostgreSQL from %s in %v\n", binDir, time.Since(t0).Round(time.Millisecond))
	return stop, dsn, nil
}

// onKeptThread runs f (which starts a child process with Pdeathsig) on an OS thread kept
// locked until until is closed (nil: until f returns). Pdeathsig fires when the thread
// that forked the child exits, not the process: on an unlocked thread, any locked
// goroutine ending there later (the network package ends every thread it moves into
// another namespace) would stop PostgreSQL in the middle of a test.
func onKeptThread(f func() error, until <-chan struct{}) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		err := f()
		errc <- err
		if err == nil && until != nil {
			<-until
		}
		runtime.UnlockOSThread()
	}()
	return <-errc
}

func pgMajor(bin string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(bin))))
	return n
}
