package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/controlplane"
	"github.com/sandboxd/sandboxd/internal/dataplane"
	"github.com/sandboxd/sandboxd/internal/gateway"
	"github.com/sandboxd/sandboxd/internal/image"
	"github.com/sandboxd/sandboxd/internal/pki"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime/local"
	"github.com/sandboxd/sandboxd/internal/stack"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/testimage"
)

// Files `sandboxd dev` keeps in its data dir; other tools rely on these names.
const (
	adminKeyFile = "admin-api-key"
	// shareTokenKeyFile (in the data dir of `dev`, the platform's PKI dir of gateways,
	// which their replicas share) derives endpoint share tokens: see gateway.Config.
	shareTokenKeyFile = "share-token.key"
	storeFile         = "sandboxd.db"
	defaultOrg        = "default"
)

// dev runs the gateway and one local runner in one process, on loopback by default.
func dev(args []string) error {
	fs := flag.NewFlagSet("dev", flag.ExitOnError)
	dataDir := fs.String("data-dir", "/var/lib/sandboxd", "state directory")
	listen := fs.String("listen", "127.0.0.1:8080", "address the API listens on (gRPC, Connect, gRPC-Web over h2c)")
	runnerID := fs.String("runner-id", "local", "ID of the local runner")
	storeDSN := fs.String("store", "", "store DSN: postgres://… or a SQLite file (default DATA-DIR/"+storeFile+")")
	mirror := fs.Bool("test-image-mirror", true, "serve the test images (make images) as docker.io's python:3.11 and busybox from a loopback registry (dev only; false: Docker Hub)")
	poolSize := fs.Int("warm-pool", 4, "pre-started containers kept per recently used image (0 disables the warm pool)")
	edgeListen := fs.String("edge-listen", "127.0.0.1:8443", "address of the edge that publishes sandbox endpoints (443 in production; empty: no edge)")
	baseDomain := fs.String("base-domain", DefaultBaseDomain, "endpoints are https://PORT-SANDBOX.RUNNER.BASE-DOMAIN (*.localhost resolves to loopback)")
	dataPlaneListen := fs.String("data-plane-listen", "127.0.0.1:8444", "address of the direct mTLS data plane clients run exec, logs and files on (empty: gateway only)")
	dataPlaneTTL := fs.Duration("data-plane-cert-ttl", dataplane.DefaultCertTTL, "lifetime of the client certificates ConnectSandbox issues")
	verbose := fs.Bool("v", false, "log at debug level")
	var hard hardeningFlags
	hard.register(fs)
	var capacity capacityFlags
	capacity.register(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := capacity.parse(); err != nil {
		return err
	}
	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	if err := os.MkdirAll(*dataDir, 0o700); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	ca, err := pki.LoadOrCreateCA(*dataDir, "sandboxd dev CA")
	if err != nil {
		return fmt.Errorf("platform CA: %w", err)
	}
	st, err := openStoreWithAdmin(ctx, *dataDir, *storeDSN)
	if err != nil {
		return err
	}
	defer func() { _ = st.Close() }()
	if err := registerRunner(ctx, st, *runnerID, "local", "local", logger); err != nil {
		return err
	}
	keys := auth.NewStoreAuthenticator(st, logger)

	cfg := stack.Config{DataDir: *dataDir, Logger: logger, Pool: local.PoolConfig{Size: *poolSize, Idle: 10 * time.Minute}}
	if err := hard.apply(&cfg); err != nil {
		return err
	}
	if *mirror {
		stopRegistry, err := mirrorTestImages(ctx, &cfg, logger)
		if err != nil {
			return err
		}
		defer stopRegistry()
	}
	stk, err := stack.NewLocal(ctx, cfg)
	if err != nil {
		return err
	}
	defer stk.Close()

	local := runner.NewLocal(*runnerID, stk.Runner)
	capacity.apply(local)
	if *edgeListen != "" {
		e, err := stack.StartEdge(stk.Runner, stack.EdgeConfig{Listen: *edgeListen, RunnerID: *runnerID, BaseDomain: *baseDomain,
			CA: ca, Authorize: stack.KeyAuthorizer(keys), KeyActive: stack.KeyActivity(keys), SessionKeyFile: filepath.Join(*dataDir, "edge-session.key"),
			DialMark: stk.EdgeDialMark(), Logger: logger})
		switch {
		case err == nil:
			defer e.Close()
			local.EdgeDomain, local.EdgePort = *baseDomain, e.Port()
			fmt.Printf("endpoints: https://PORT-SANDBOX.%s.%s:%d (trust %s)\n", *runnerID, *baseDomain, e.Port(), filepath.Join(*dataDir, "ca.pem"))
		case isFlagSet(fs, "edge-listen"):
			return err
		default:
			// The default port is taken: run without public endpoints rather than not at all.
			logger.Warn("no edge: sandboxes cannot publish endpoints (set --edge-listen to a free address)", "err", err)
		}
	}
	var dpIssuer gateway.DataPlaneIssuer
	if *dataPlaneListen != "" {
		dpCA, err := dataplane.LoadOrCreateCA(*dataDir)
		if err != nil {
			return err
		}
		l, uri, err := dataplane.Start(dataplane.ListenConfig{Listen: *dataPlaneListen, CA: dpCA, Sandboxes: local, Logger: logger})
		switch {
		case err == nil:
			defer l.Close()
			local.DataPlaneURI = uri
			dpIssuer = &dataplane.Issuer{CA: dpCA, TTL: *dataPlaneTTL}
			fmt.Printf("direct data plane: %s\n", uri)
		case isFlagSet(fs, "data-plane-listen"):
			return err
		default:
			// The default port is taken: clients use the gateway for data calls.
			logger.Warn("no direct data plane: exec, logs and files go through the gateway (set --data-plane-listen to a free address)", "err", err)
		}
	}
	shareKey, err := pki.LoadOrCreateSecret(filepath.Join(*dataDir, shareTokenKeyFile))
	if err != nil {
		return err
	}
	gw, err := gateway.New(gateway.Config{
		DataPlane:     dpIssuer,
		ShareTokenKey: shareKey,
		Auth:          keys,
		Runners:       []runner.Handle{local},
		Policies:      controlplane.NewPolicySource(st, defaultOrg),
		Index:         st.Sandboxes(),
		Orgs:          st.Orgs(),
		// Sandboxes no gateway knows (a crash between runner and store) are deleted.
		ReconcileInterval: gateway.DefaultReconcileInterval,
		Logger:            logger,
	})
	if err != nil {
		return err
	}
	go heartbeat(ctx, st, local, logger)
	cp, err := newControlPlane(st, keys, logger, func(ctx context.Context, org, runnerID string) (int, error) {
		n, err := controlplane.StoreLiveSandboxes(st)(ctx, org, runnerID)
		if err != nil || runnerID != local.ID() {
			return n, err
		}
		// The runner's own live sandboxes of org (those the store may not know yet), never
		// those of other organizations: neither their count nor their existence is org's.
		sbs, err := local.List(ctx)
		return max(n, runner.LiveOf(sbs, org)), err
	})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	srv := newAPIServer(controlplane.Route(cp.Handler(), gw.Handler()), keys, logger)
	fmt.Printf("CWSANDBOX_BASE_URL=http://%s\n", ln.Addr())
	fmt.Printf("CWSANDBOX_API_KEY is in %s\n", filepath.Join(*dataDir, adminKeyFile))
	return serveUntilDone(ctx, srv, ln, logger, "shutting down; sandboxes keep running and are re-adopted on the next start")
}

// openStore opens the store named by dsn, by default the SQLite file in dataDir.
func openStore(ctx context.Context, dataDir, dsn string) (store.Store, error) {
	if dsn == "" {
		if err := os.MkdirAll(dataDir, 0o700); err != nil {
			return nil, err
		}
		dsn = filepath.Join(dataDir, storeFile)
	}
	st, err := store.Open(ctx, dsn)
	if err != nil {
		return nil, fmt.Errorf("open store: %w", err)
	}
	return st, nil
}

// openStoreWithAdmin opens the store and, on first start, creates the default
// organization and its admin key, printed once and saved 0600 for tools.
func openStoreWithAdmin(ctx context.Context, dataDir, dsn string) (store.Store, error) {
	st, err := openStore(ctx, dataDir, dsn)
	if err != nil {
		return nil, err
	}
	key, err := func() (string, error) {
		if err := controlplane.EnsureOrg(ctx, st, defaultOrg); err != nil {
			return "", err
		}
		return controlplane.EnsureAdminKey(ctx, st, defaultOrg)
	}()
	if err != nil {
		_ = st.Close()
		return nil, err
	}
	if key == "" {
		return st, nil
	}
	path := filepath.Join(dataDir, adminKeyFile)
	if err := os.WriteFile(path, []byte(key+"\n"), 0o600); err != nil {
		_ = st.Close()
		return nil, fmt.Errorf("save admin API key: %w", err)
	}
	fmt.Printf("admin API key (shown once, saved to %s): %s\n", path, key)
	return st, nil
}

// registerRunner records a runner of the default organization with the empty policy
// unless it exists. A cluster already taken by another runner gets the runner's id as a
// suffix.
func registerRunner(ctx context.Context, st store.Store, runnerID, clusterID, zone string, log *slog.Logger) error {
	r := store.Runner{Org: defaultOrg, RunnerID: runnerID, ClusterID: clusterID, Zone: zone, DisplayName: runnerID}
	_, created, err := controlplane.EnsureRunner(ctx, st, r)
	var ae *store.AlreadyExistsError
	if errors.As(err, &ae) && ae.Key == store.KeyClusterID {
		r.ClusterID = clusterID + "-" + runnerID
		_, created, err = controlplane.EnsureRunner(ctx, st, r)
	}
	if err != nil {
		return err
	}
	if created {
		log.Info("runner registered with the empty policy", "runner", runnerID, "cluster", r.ClusterID)
	}
	return nil
}

// heartbeat records r's status in the store every few seconds until ctx ends.
func heartbeat(ctx context.Context, st store.Store, r runner.Handle, log *slog.Logger) {
	controlplane.Heartbeat(ctx, st, defaultOrg, r.ID(), controlplane.DefaultHeartbeatInterval,
		func(ctx context.Context) (controlplane.Status, error) {
			c, err := r.Capacity(ctx)
			if err != nil {
				return controlplane.Status{Version: version}, err
			}
			return controlplane.Status{
				Version:  version,
				Ready:    true,
				Capacity: controlplane.Resources{MilliCPU: c.MilliCPU, MemoryBytes: c.MemoryBytes},
				Usage:    controlplane.Resources{MilliCPU: c.UsedMilliCPU, MemoryBytes: c.UsedMemoryBytes, Sandboxes: int64(c.Running)},
			}, nil
		}, log)
}

// newControlPlane serves the control plane over st; both release channels offer this
// binary's version.
func newControlPlane(st store.Store, a auth.Authenticator, log *slog.Logger, live controlplane.LiveSandboxCounter) (*controlplane.Service, error) {
	return controlplane.New(controlplane.Config{
		Store:          st,
		Auth:           a,
		TargetVersions: map[string]string{store.ChannelStable: version, store.ChannelRapid: version},
		LiveSandboxes:  live,
		Logger:         log,
	})
}

// mirrorTestImages serves the test images from a loopback registry and makes it cfg's
// docker.io mirror. Without test images it only warns: docker.io is then Docker Hub.
// Only `dev` (the single-machine demo) calls it: internal/archtest fails if a code path
// of runner, gateway or controlplane reaches it.
func mirrorTestImages(ctx context.Context, cfg *stack.Config, log *slog.Logger) (stop func(), err error) {
	host, stop, err := testimage.ServeDockerHub(ctx, "")
	switch {
	case errors.Is(err, testimage.ErrNoTestImages):
		log.Warn("no test images to mirror; docker.io images are pulled from Docker Hub", "hint", "make images")
		return func() {}, nil
	case err != nil:
		return nil, err
	}
	cfg.InsecureRegistries = append(cfg.InsecureRegistries, host)
	cfg.Mirrors = map[string][]image.Mirror{"docker.io": {{Host: host, Insecure: true}}}
	log.Info("test images mirror docker.io", "registry", host)
	return stop, nil
}

// apikey manages API keys in the store: `sandboxd apikey create --org ORG [--role user]`.
// The organization is created when missing.
func apikey(args []string) error {
	if len(args) == 0 || args[0] != "create" {
		return errors.New("usage: sandboxd apikey create --data-dir DIR [--store DSN] --org ORG [--role user|admin] [--name NAME]")
	}
	fs := flag.NewFlagSet("apikey create", flag.ExitOnError)
	dataDir := fs.String("data-dir", "/var/lib/sandboxd", "state directory")
	storeDSN := fs.String("store", "", "store DSN: postgres://… or a SQLite file (default DATA-DIR/"+storeFile+")")
	org := fs.String("org", defaultOrg, "organization")
	role := fs.String("role", "user", "user or admin")
	name := fs.String("name", "", "a name to recognise the key by")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	r := auth.RoleUser
	switch *role {
	case "user":
	case "admin":
		r = auth.RoleAdmin
	default:
		return fmt.Errorf("unknown role %q (user or admin)", *role)
	}
	ctx := context.Background()
	st, err := openStore(ctx, *dataDir, *storeDSN)
	if err != nil {
		return err
	}
	defer func() { _ = st.Close() }()
	if err := controlplane.EnsureOrg(ctx, st, *org); err != nil {
		return err
	}
	key, _, err := auth.IssueKey(ctx, st, *org, r, *name)
	if err != nil {
		return err
	}
	fmt.Println(key)
	return nil
}

// isFlagSet reports whether name was given on the command line.
func isFlagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}
