package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/controlplane"
	"github.com/sandboxd/sandboxd/internal/gateway"
	"github.com/sandboxd/sandboxd/internal/image"
	"github.com/sandboxd/sandboxd/internal/pki"
	"github.com/sandboxd/sandboxd/internal/runnerapi"
	"github.com/sandboxd/sandboxd/internal/stack"
	"github.com/sandboxd/sandboxd/internal/testimage"
)

// platformCAName names the CA that --pki-dir holds when `runner` or `gateway` creates it.
const platformCAName = "sandboxd platform CA"

// listFlag is a repeatable string flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

func newLogger(verbose bool) *slog.Logger {
	level := slog.LevelInfo
	if verbose {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
}

// runnerCmd runs the single-host stack and serves it to gateways over mTLS.
func runnerCmd(args []string) error {
	fs := flag.NewFlagSet("runner", flag.ExitOnError)
	dataDir := fs.String("data-dir", "/var/lib/sandboxd", "state directory")
	pkiDir := fs.String("pki-dir", "", "directory of the platform CA (ca.pem, ca-key.pem), shared with the gateways; default DATA-DIR/pki")
	listen := fs.String("listen", "127.0.0.1:7443", "address gateways reach the runner at (gRPC over mTLS)")
	runnerID := fs.String("runner-id", "local", "ID of this runner; its certificate carries it as a DNS name")
	mirror := fs.Bool("test-image-mirror", true, "serve the test images (scripts/build-test-images.sh) from a loopback registry that mirrors docker.io")
	var insecure listFlag
	fs.Var(&insecure, "insecure-registry", "registry host[:port] reached over plain HTTP (repeatable)")
	bridge := fs.String("bridge", "", "sandbox bridge (default sbx0)")
	subnet := fs.String("subnet", "", "sandbox subnet (default 10.88.0.0/16)")
	cgroupParent := fs.String("cgroup-parent", "", "cgroup of the sandboxes (default sandboxd)")
	noEgress := fs.Bool("no-egress", false, "sandboxes reach nothing beyond this host")
	verbose := fs.Bool("v", false, "log at debug level")
	if err := fs.Parse(args); err != nil {
		return err
	}
	logger := newLogger(*verbose)
	if *pkiDir == "" {
		*pkiDir = filepath.Join(*dataDir, "pki")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	ca, err := pki.LoadOrCreateCA(*pkiDir, platformCAName)
	if err != nil {
		return fmt.Errorf("platform CA: %w", err)
	}
	host, _, err := net.SplitHostPort(*listen)
	if err != nil {
		return fmt.Errorf("--listen: %w", err)
	}
	tlsCfg, err := runnerapi.ServerTLSConfig(ca, *runnerID, []string{host})
	if err != nil {
		return err
	}

	cfg := stack.Config{DataDir: *dataDir, Logger: logger, InsecureRegistries: insecure, Bridge: *bridge, CgroupParent: *cgroupParent, NoEgress: *noEgress}
	if *bridge != "" {
		cfg.NetTable = "sandboxd_" + *bridge
	}
	if *subnet != "" {
		if cfg.Subnet, err = netip.ParsePrefix(*subnet); err != nil {
			return fmt.Errorf("--subnet: %w", err)
		}
	}
	if *mirror {
		host, stopRegistry, err := serveTestImages(ctx)
		switch {
		case errors.Is(err, testimage.ErrNoTestImages):
			logger.Warn("no test images to mirror; docker.io images are pulled from Docker Hub", "hint", "make images")
		case err != nil:
			return err
		default:
			defer stopRegistry()
			cfg.InsecureRegistries = append(cfg.InsecureRegistries, host)
			cfg.Mirrors = map[string][]image.Mirror{"docker.io": {{Host: host, Insecure: true}}}
			logger.Info("test images mirror docker.io", "registry", host)
		}
	}
	st, err := stack.NewLocal(ctx, cfg)
	if err != nil {
		return err
	}
	defer st.Close()

	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	srv := runnerapi.NewServer(*runnerID, st.Runner, logger).HTTPServer(tlsCfg)
	fmt.Printf("runner %s listening on %s\n", *runnerID, ln.Addr())
	errc := make(chan error, 1)
	go func() { errc <- srv.ServeTLS(ln, "", "") }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	logger.Info("shutting down; sandboxes keep running and are re-adopted on the next start")
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(shutdown)
	return nil
}

// gatewayCmd serves the public API and places sandboxes on runners in other processes.
func gatewayCmd(args []string) error {
	fs := flag.NewFlagSet("gateway", flag.ExitOnError)
	dataDir := fs.String("data-dir", "/var/lib/sandboxd", "state directory (the SQLite store, admin-api-key)")
	storeDSN := fs.String("store", "", "store DSN: postgres://… or a SQLite file (default DATA-DIR/"+storeFile+")")
	pkiDir := fs.String("pki-dir", "", "directory of the platform CA shared with the runners; default DATA-DIR/pki")
	listen := fs.String("listen", "127.0.0.1:8080", "address the API listens on (gRPC, Connect, gRPC-Web over h2c)")
	name := fs.String("name", "gateway", "this gateway's name, in its client certificate (spiffe://sandboxd/gateway/NAME)")
	var runners listFlag
	fs.Var(&runners, "runner", "a runner as ID=HOST:PORT (repeatable)")
	verbose := fs.Bool("v", false, "log at debug level")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if len(runners) == 0 {
		return errors.New("at least one --runner ID=HOST:PORT is required")
	}
	logger := newLogger(*verbose)
	if *pkiDir == "" {
		*pkiDir = filepath.Join(*dataDir, "pki")
	}
	if err := os.MkdirAll(*dataDir, 0o700); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	ca, err := pki.LoadOrCreateCA(*pkiDir, platformCAName)
	if err != nil {
		return fmt.Errorf("platform CA: %w", err)
	}
	st, err := openStoreWithAdmin(ctx, *dataDir, *storeDSN)
	if err != nil {
		return err
	}
	defer func() { _ = st.Close() }()
	keys := auth.NewStoreAuthenticator(st, logger)
	var rs []gateway.Runner
	for _, r := range runners {
		id, addr, ok := strings.Cut(r, "=")
		if !ok || id == "" || addr == "" {
			return fmt.Errorf("--runner %q: want ID=HOST:PORT", r)
		}
		tlsCfg, err := runnerapi.ClientTLSConfig(ca, *name, id)
		if err != nil {
			return err
		}
		c, err := runnerapi.NewClient(runnerapi.ClientConfig{ID: id, Addr: addr, TLS: tlsCfg})
		if err != nil {
			return err
		}
		defer c.Close()
		rs = append(rs, c)
	}
	gw, err := gateway.New(gateway.Config{Auth: keys, Runners: rs, Policies: controlplane.NewPolicySource(st, defaultOrg), Logger: logger})
	if err != nil {
		return err
	}
	// Until runners register themselves, the gateway records the runners it is given (the
	// runner ID doubles as cluster ID) and heartbeats what it sees of them.
	for _, r := range rs {
		if err := registerRunner(ctx, st, r.ID(), r.ID(), "local", logger); err != nil {
			return err
		}
		go heartbeat(ctx, st, r, logger)
	}
	cp, err := newControlPlane(st, keys, logger, nil)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: controlplane.Route(cp.Handler(), gw.Handler()), ReadHeaderTimeout: 10 * time.Second, Protocols: new(http.Protocols)}
	srv.Protocols.SetHTTP1(true)
	srv.Protocols.SetUnencryptedHTTP2(true)
	fmt.Printf("CWSANDBOX_BASE_URL=http://%s\n", ln.Addr())
	fmt.Printf("CWSANDBOX_API_KEY is in %s\n", filepath.Join(*dataDir, adminKeyFile))
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(shutdown)
	return nil
}
