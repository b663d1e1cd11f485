// Package multicluster tests sandboxd across clusters on the test bed (package testbed):
// a control plane, two gateway replicas on one PostgreSQL and three runners, each in a
// network namespace of its own with its own policy, all real processes.
package multicluster

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/sandboxd/sandboxd/internal/pgtest"
	"github.com/sandboxd/sandboxd/internal/testbed"
	"github.com/sandboxd/sandboxd/internal/testenv"
)

var (
	bin     string // sandboxd and sandbox-agent
	pgDSN   string // a database beds may create databases in; "" without PostgreSQL
	skipWhy string
	dbSeq   atomic.Int64
)

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	if !testenv.HaveRoot() {
		return m.Run() // every test skips, or fails where root is required (startBed)
	}
	stop, dsn, err := pgtest.Start()
	if err != nil {
		if pgtest.Required() {
			fmt.Fprintln(os.Stderr, "multicluster: PostgreSQL is required:", err)
			return 1
		}
		skipWhy = "no PostgreSQL: " + err.Error()
		return m.Run()
	}
	defer stop()
	pgDSN = dsn
	dir, err := os.MkdirTemp("", "sandboxd-multicluster-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	bin = filepath.Join(dir, "bin")
	if err := testbed.Build(bin); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

// startBed starts the standard bed on a fresh database; it is torn down with the test.
func startBed(t *testing.T, gatewayArgs ...string) *testbed.Bed {
	t.Helper()
	testenv.RequireRoot(t, "network namespaces, runc")
	if skipWhy != "" {
		t.Skip(skipWhy)
	}
	ctx := context.Background()
	dsn := newDatabase(t)
	dir := t.TempDir()
	b, err := testbed.Start(ctx, testbed.Config{Dir: dir, Bin: bin, DSN: dsn, Runners: testbed.Standard(), GatewayArgs: gatewayArgs})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Runs before TempDir's removal (registered earlier), so a leak is reported as
		// what leaked, not as an unlinkat error.
		for _, l := range b.Close() {
			t.Errorf("left behind: %s", l)
		}
		if t.Failed() {
			for _, p := range append(append([]*testbed.Proc{b.CP}, b.Gateways...), b.Runners...) {
				if log, err := os.ReadFile(p.Log()); err == nil {
					t.Logf("---- %s\n%s", p.Name, tail(log, 4000))
				}
			}
		}
	})
	return b
}

// newDatabase creates a database of its own for one bed and returns its DSN.
func newDatabase(t *testing.T) string {
	t.Helper()
	ctx := context.Background()
	name := fmt.Sprintf("bed_%d_%d", os.Getpid(), dbSeq.Add(1))
	conn, err := pgx.Connect(ctx, pgDSN)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	_ = conn.Close(ctx)
	u, err := url.Parse(pgDSN)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	return u.String()
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// needOfficialClient skips without the official Python client, except in CI.
func needOfficialClient(t *testing.T) {
	t.Helper()
	if _, err := exec.Command("python3", "-c", "import cwsandbox").CombinedOutput(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("the official client (pip install cwsandbox) is required in CI: %v", err)
		}
		t.Skip("the official client is not installed (pip install cwsandbox)")
	}
}
