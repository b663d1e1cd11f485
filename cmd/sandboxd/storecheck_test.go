package main

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus/testutil"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1/sandboxv1connect"
	controlplanev1 "github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1/controlplanev1connect"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/apifront"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/controlplane"
	"github.com/sandboxd/sandboxd/internal/pgtest"
	"github.com/sandboxd/sandboxd/internal/pki"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/testenv"
)

// startControlPlane serves a control plane on store dsn at addr ("": a free port), with
// the platform CA of pkiDir, until the returned stop (also at the end of t). The store's
// admin key, when this call created it, is in cpKeys[dsn].
func startControlPlane(t *testing.T, pkiDir, dsn, addr string) (string, func()) {
	t.Helper()
	ca, err := pki.LoadOrCreateCA(pkiDir, platformCAName)
	if err != nil {
		t.Fatal(err)
	}
	dataDir := t.TempDir()
	st, err := openStoreWithAdmin(t.Context(), dataDir, dsn)
	if err != nil {
		t.Fatal(err)
	}
	if key, err := os.ReadFile(filepath.Join(dataDir, adminKeyFile)); err == nil {
		cpKeys[dsn] = strings.TrimSpace(string(key))
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

// cpKeys are the admin keys startControlPlane created, by store.
var cpKeys = map[string]string{}

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

// gatewayWith is a `sandboxd gateway` on store dsn whose control plane is at cpAddr,
// with the platform CA of pkiDir, listening on listen.
func gatewayWith(t *testing.T, pkiDir, dsn, cpAddr, listen string) gatewayConfig {
	t.Helper()
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

// `sandboxd gateway --control-plane` refuses to start, naming both --store flags, when
// the control plane proves another store. It starts at once when the control plane is
// unreachable, serves sandboxes, and answers admin calls UNAVAILABLE until the control
// plane proves the gateway's store; then forwards them; and when a control plane of
// another store takes over (a reconnect), answers them FAILED_PRECONDITION from then on
// while it still serves sandboxes.
func TestGatewayControlPlaneStore(t *testing.T) {
	defer func(d time.Duration) { storeCheckInterval = d }(storeCheckInterval)
	storeCheckInterval = 2 * time.Second // retries every second while unverified
	for backend, dsns := range storeDSNs(t) {
		t.Run(backend, func(t *testing.T) {
			pkiDir := filepath.Join(t.TempDir(), "pki")
			cpAddr, stopCP := startControlPlane(t, pkiDir, dsns[0], "")

			// Two stores: refused before serving.
			cfg := gatewayWith(t, pkiDir, dsns[1], cpAddr, "127.0.0.1:0")
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
			err := cfg.runCtx(ctx)
			cancel()
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

			// One store, its control plane down at start: the gateway starts at once.
			stopCP()
			addr, err := testenv.FreeAddr()
			if err != nil {
				t.Fatal(err)
			}
			cfg = gatewayWith(t, pkiDir, dsns[0], cpAddr, addr)
			ctx, cancel = context.WithCancel(t.Context())
			defer cancel()
			done := make(chan error, 1)
			started := time.Now()
			go func() { done <- cfg.runCtx(ctx) }()
			bearer := "Bearer " + cpKeys[dsns[0]] // the control plane made the store's admin key
			base := "http://" + addr
			adminCall := func() error {
				req := connect.NewRequest(&controlplanev1.ListApiKeysRequest{})
				req.Header().Set("Authorization", bearer)
				_, err := controlplanev1connect.NewApiKeyServiceClient(http.DefaultClient, base).ListApiKeys(t.Context(), req)
				return err
			}
			sandboxCall := func() error {
				req := connect.NewRequest(&sandboxv1.ListSandboxesRequest{})
				req.Header().Set("Authorization", bearer)
				_, err := sandboxv1connect.NewSandboxServiceClient(http.DefaultClient, base).ListSandboxes(t.Context(), req)
				return err
			}
			waitFor(t, "the gateway serves sandboxes", func() bool {
				select {
				case err := <-done:
					t.Fatalf("one store: run: %v", err)
				default:
				}
				return sandboxCall() == nil
			})
			if d := time.Since(started); d > 15*time.Second {
				t.Errorf("the gateway took %v to serve with its control plane down", d)
			}
			err = adminCall()
			if connect.CodeOf(err) != connect.CodeUnavailable || apierr.Reason(err) != apierr.ControlPlaneStoreUnverified ||
				!strings.Contains(err.Error(), "the control plane's store is not verified yet") || apierr.RetryInfo(err) == nil {
				t.Fatalf("admin call, control plane down: %v, want UNAVAILABLE %s with RetryInfo", err, apierr.ControlPlaneStoreUnverified)
			}

			// The control plane comes up on the gateway's store: admin calls go through.
			_, stopCP = startControlPlane(t, pkiDir, dsns[0], cpAddr)
			waitFor(t, "admin calls forwarded", func() bool { return adminCall() == nil })

			// A control plane of another store takes over its address: admin calls are
			// refused from then on, sandboxes still served, the gateway keeps running.
			stopCP()
			startControlPlane(t, pkiDir, dsns[1], cpAddr)
			waitFor(t, "admin calls refused", func() bool { return connect.CodeOf(adminCall()) == connect.CodeFailedPrecondition })
			err = adminCall()
			if apierr.Reason(err) != apierr.ControlPlaneStoreMismatch || !strings.Contains(err.Error(), "another store") {
				t.Errorf("admin call, another store: %v", err)
			}
			if strings.Contains(err.Error(), dsns[0]) {
				t.Errorf("admin call, another store: %v names the gateway's --store", err)
			}
			if err := sandboxCall(); err != nil {
				t.Errorf("ListSandboxes after the mismatch: %v", err)
			}
			time.Sleep(2 * storeCheckInterval) // checks again: still refused, still running
			if err := adminCall(); connect.CodeOf(err) != connect.CodeFailedPrecondition {
				t.Errorf("admin call later: %v, want FAILED_PRECONDITION", err)
			}
			select {
			case err := <-done:
				t.Fatalf("the gateway stopped: %v", err)
			default:
			}
			cancel()
			if err := <-done; err != nil {
				t.Fatalf("one store: run: %v", err)
			}
		})
	}
}

// A control plane unreachable at start: the check starts unverified, verifies once the
// control plane answers for its store, and records the mismatch (final) when a control
// plane of another store takes over that address (a reconnect). A control plane too old
// to answer is accepted only until it has once proved the store.
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
	chk := newStoreCheck(addr, tr, id, describeStore(dir, mine), slog.New(slog.DiscardHandler))
	chk.interval = 2 * time.Second
	state := func() storeState { chk.mu.Lock(); defer chk.mu.Unlock(); return chk.state }
	if err := chk.start(t.Context()); err != nil || state() != storeUnverified {
		t.Fatalf("unreachable at start: %v, state %d, want a start, unverified", err, state())
	}
	if testutil.ToFloat64(storeVerifiedGauge) != 0 {
		t.Error("gauge 1 before any check passed")
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	ran := make(chan struct{})
	go func() { chk.run(ctx); close(ran) }()

	_, stop := startControlPlane(t, pkiDir, mine, addr)
	waitFor(t, "verified", func() bool { return state() == storeVerified })
	if testutil.ToFloat64(storeVerifiedGauge) != 1 {
		t.Error("gauge 0 once verified")
	}
	stop()
	startControlPlane(t, pkiDir, other, addr)
	select {
	case <-ran:
	case <-time.After(20 * time.Second):
		t.Fatal("a control plane of another store went unnoticed")
	}
	if state() != storeMismatch || !errors.Is(chk.once(t.Context()), controlplane.ErrStoreMismatch) || testutil.ToFloat64(storeVerifiedGauge) != 0 {
		t.Fatalf("after another store: state %d, want the mismatch (final), gauge 0", state())
	}
}

// "Too old to answer" counts only for the exact answer of an older control plane, and
// only until the control plane has once proved the store.
func TestGatewayStoreCheckOlderControlPlane(t *testing.T) {
	dir := t.TempDir()
	ca, err := pki.LoadOrCreateCA(filepath.Join(dir, "pki"), platformCAName)
	if err != nil {
		t.Fatal(err)
	}
	tlsCfg, err := controlplane.TLSConfig(ca, []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	older := func(w http.ResponseWriter, r *http.Request) {
		apifront.WriteRESTError(w, apierr.Newf(apierr.Unauthenticated, "missing API key: send `authorization: Bearer <key>` (CWSANDBOX_API_KEY)"))
	}
	var h http.HandlerFunc = older
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { h(w, r) }), TLSConfig: tlsCfg}
	go func() { _ = srv.ServeTLS(ln, "", "") }()
	defer srv.Close()
	addr := ln.Addr().String()
	tr, err := controlPlaneTransport(addr, ca)
	if err != nil {
		t.Fatal(err)
	}
	chk := newStoreCheck(addr, tr, "id", "test", slog.New(slog.DiscardHandler))
	if err := chk.start(t.Context()); err != nil || chk.state != storeOlder {
		t.Fatalf("older control plane: %v, state %d (%v), want storeOlder", err, chk.state, chk.last)
	}
	admin := chk.gate(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) }))
	rec := httptest.NewRecorder()
	admin.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/v1/anything", nil))
	if rec.Code != http.StatusNoContent {
		t.Errorf("admin call to an older control plane: HTTP %d, want it forwarded", rec.Code)
	}
	// Any other answer without the marker is a failure.
	h = func(w http.ResponseWriter, r *http.Request) { http.NotFound(w, r) }
	if _ = chk.once(t.Context()); chk.state != storeUnverified {
		t.Errorf("a 404: state %d, want unverified", chk.state)
	}
	// A redirect is not followed.
	h = func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "https://"+addr+"/elsewhere", http.StatusFound)
	}
	if _ = chk.once(t.Context()); chk.state != storeUnverified || !strings.Contains(chk.last.Error(), "HTTP 302") {
		t.Errorf("a redirect: state %d (%v), want unverified, HTTP 302", chk.state, chk.last)
	}
	rec = httptest.NewRecorder()
	admin.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/v1/anything", nil))
	if rec.Code != http.StatusServiceUnavailable {
		t.Errorf("admin call while unverified: HTTP %d, want 503", rec.Code)
	}
	// Once proved, the older answer no longer counts.
	chk.mu.Lock()
	chk.proved = true
	chk.mu.Unlock()
	h = older
	if _ = chk.once(t.Context()); chk.state != storeUnverified {
		t.Errorf("older answer after a proof: state %d, want unverified", chk.state)
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
