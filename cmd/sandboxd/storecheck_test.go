package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/controlplane"
	"github.com/sandboxd/sandboxd/internal/pgtest"
	"github.com/sandboxd/sandboxd/internal/pki"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/testenv"
)

// startControlPlane serves a control plane on store dsn at addr ("": a free port), with
// the platform CA of pkiDir, until the returned stop (also at the end of t).
func startControlPlane(t *testing.T, pkiDir, dsn, addr string) (string, func()) {
	t.Helper()
	ca, err := pki.LoadOrCreateCA(pkiDir, platformCAName)
	if err != nil {
		t.Fatal(err)
	}
	st, err := openStoreWithAdmin(t.Context(), t.TempDir(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	cp, err := controlplane.New(controlplane.Config{Store: st, Auth: auth.NewStoreAuthenticator(st, nil), PlatformOrg: defaultOrg, CA: ca,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	tlsCfg, err := controlplane.TLSConfig(ca, []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: cp.TLSHandler(), TLSConfig: tlsCfg}
	go func() { _ = srv.ServeTLS(ln, "", "") }()
	stop := func() { _ = srv.Close(); _ = st.Close() }
	t.Cleanup(stop)
	return ln.Addr().String(), stop
}

// storeDSNs are, per backend, two stores: SQLite files, and (when PostgreSQL is there)
// two schemas of one server.
func storeDSNs(t *testing.T) map[string][2]string {
	dir := t.TempDir()
	out := map[string][2]string{"sqlite": {filepath.Join(dir, "a.db"), "sqlite://" + filepath.Join(dir, "b.db")}}
	stop, admin, err := pgtest.Start()
	if err != nil {
		if pgtest.Required() {
			t.Fatalf("PostgreSQL required: %v", err)
		}
		t.Logf("no PostgreSQL (%v): SQLite only", err)
		return out
	}
	t.Cleanup(stop)
	var pg [2]string
	for i := range pg {
		dsn, drop, err := pgtest.NewSchema(t.Context(), admin, "gwcheck")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(drop)
		pg[i] = dsn
	}
	out["postgres"] = pg
	return out
}

// `sandboxd gateway --control-plane` starts when the control plane uses its store, and
// refuses to start, naming both --store flags, when it uses another one.
func TestGatewayControlPlaneStore(t *testing.T) {
	for backend, dsns := range storeDSNs(t) {
		t.Run(backend, func(t *testing.T) {
			pkiDir := filepath.Join(t.TempDir(), "pki")
			cpAddr, _ := startControlPlane(t, pkiDir, dsns[0], "")
			gateway := func(dsn, listen string) gatewayConfig {
				var cfg gatewayConfig
				if _, err := parseFlags("gateway", &cfg, []string{"--data-dir", t.TempDir(), "--pki-dir", pkiDir, "--store", dsn,
					"--control-plane", cpAddr, "--runner", "r1=127.0.0.1:1", "--listen", listen, "--metrics-listen", ""}); err != nil {
					t.Fatal(err)
				}
				if err := cfg.validate(); err != nil {
					t.Fatal(err)
				}
				return cfg
			}

			// Two stores: refused before serving.
			refused := make(chan error, 1)
			go func() { refused <- gateway(dsns[1], "127.0.0.1:0").run() }()
			var err error
			select {
			case err = <-refused:
			case <-time.After(20 * time.Second):
				_ = syscall.Kill(syscall.Getpid(), syscall.SIGTERM) // caught by run's signal context
				t.Fatalf("two stores: the gateway started (stopped: %v)", <-refused)
			}
			if !errors.Is(err, controlplane.ErrStoreMismatch) {
				t.Fatalf("two stores: %v, want the refusal", err)
			}
			for _, want := range []string{"--control-plane " + cpAddr, "gateway --store", "controlplane --store", "audit log"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("refusal %q does not say %q", err, want)
				}
			}
			if strings.Contains(err.Error(), "password") || backend == "postgres" && !strings.Contains(err.Error(), "search_path=") {
				t.Errorf("refusal %q: the store named without secrets, by schema", err)
			}

			// One store: it serves, and its readiness does not wait on the check.
			addr, err := testenv.FreeAddr()
			if err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- gateway(dsns[0], addr).run() }()
			deadline := time.Now().Add(30 * time.Second)
			for {
				select {
				case err := <-done:
					t.Fatalf("one store: run: %v", err)
				default:
				}
				res, err := http.Get("http://" + addr + "/readyz")
				if err == nil {
					b, _ := io.ReadAll(res.Body)
					res.Body.Close()
					if strings.Contains(string(b), "control_plane_store") {
						t.Errorf("one store: /readyz %q", b)
					}
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("one store: not serving: %v", err)
				}
				time.Sleep(50 * time.Millisecond)
			}
			// Its signal context ends it (caught while run runs, so the test goes on).
			if err := syscall.Kill(syscall.Getpid(), syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			if err := <-done; err != nil {
				t.Fatalf("one store: run: %v", err)
			}
		})
	}
}

// A control plane unreachable at start: the gateway starts unready, becomes ready once
// the control plane answers for its store, and is stopped when a control plane of
// another store takes over that address (a reconnect).
func TestGatewayStoreCheckUnreachableThenAnother(t *testing.T) {
	dir := t.TempDir()
	pkiDir := filepath.Join(dir, "pki")
	ca, err := pki.LoadOrCreateCA(pkiDir, platformCAName)
	if err != nil {
		t.Fatal(err)
	}
	mine, other := filepath.Join(dir, "mine.db"), filepath.Join(dir, "other.db")
	st, err := store.Open(t.Context(), mine)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	id, err := st.Identity(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	addr, err := testenv.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	tr, err := controlPlaneTransport(addr, ca)
	if err != nil {
		t.Fatal(err)
	}
	chk := &storeCheck{addr: addr, hc: &http.Client{Transport: tr}, identity: id, storeDesc: describeStore(dir, mine),
		log: slog.New(slog.DiscardHandler), wait: 300 * time.Millisecond, interval: 2 * time.Second}
	if err := chk.start(t.Context()); err != nil {
		t.Fatalf("unreachable at start: %v, want a start", err)
	}
	if err := chk.ready(t.Context()); err == nil {
		t.Fatal("ready before any check passed")
	}
	ctx, cancel := context.WithCancelCause(t.Context())
	defer cancel(nil)
	go chk.run(ctx, cancel)

	_, stop := startControlPlane(t, pkiDir, mine, addr)
	waitFor(t, "ready", func() bool { return chk.ready(t.Context()) == nil })
	stop()
	startControlPlane(t, pkiDir, other, addr)
	select {
	case <-ctx.Done():
		if cause := context.Cause(ctx); !errors.Is(cause, controlplane.ErrStoreMismatch) {
			t.Fatalf("stopped by %v", cause)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("a control plane of another store went unnoticed")
	}
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting: %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestDescribeStore(t *testing.T) {
	for dsn, want := range map[string]string{
		"":                 "unset: SQLite /d/sandboxd.db",
		"/x/s.db":          "SQLite /x/s.db",
		"sqlite:///x/s.db": "SQLite /x/s.db",
		"postgres://u:secret@db:5432/sbx?password=p2&sslmode=require": "postgres://db:5432/sbx",
	} {
		if got := describeStore("/d", dsn); got != want {
			t.Errorf("describeStore(%q) = %q, want %q", dsn, got, want)
		}
	}
}
