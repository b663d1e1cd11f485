package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"github.com/sandboxd/sandboxd/internal/audit"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/controlplane"
	"github.com/sandboxd/sandboxd/internal/dataplane"
	"github.com/sandboxd/sandboxd/internal/gateway"
	"github.com/sandboxd/sandboxd/internal/image"
	"github.com/sandboxd/sandboxd/internal/metrics"
	"github.com/sandboxd/sandboxd/internal/pki"
	"github.com/sandboxd/sandboxd/internal/policy"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime/local"
	"github.com/sandboxd/sandboxd/internal/secretbox"
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
	// defaultOrg is the organization the store is bootstrapped with (its admin key is
	// adminKeyFile's), and the platform organization: only its admins may publish and
	// promote releases.
	defaultOrg = "default"
)

// dev runs the gateway and one local runner in one process, on loopback by default.
func dev(args []string) error {
	var cfg devConfig
	given, err := parseFlags("dev", &cfg, args)
	if err != nil {
		return err
	}
	cfg.edgeListenGiven, cfg.dataPlaneListenGiven = given["edge-listen"], given["data-plane-listen"]
	if err := cfg.validate(); err != nil {
		return err
	}
	return cfg.run()
}

func (c devConfig) run() error {
	logger := newLogger(slog.LevelInfo, c.verbose)
	if err := os.MkdirAll(c.dataDir, 0o700); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	ca, err := pki.LoadOrCreateCA(c.dataDir, "sandboxd dev CA")
	if err != nil {
		return fmt.Errorf("platform CA: %w", err)
	}
	st, err := openStoreWithAdmin(ctx, c.dataDir, c.storeDSN)
	if err != nil {
		return err
	}
	if err := c.metrics.startStore(ctx, st, true, true, logger); err != nil {
		return err
	}
	stopTracing, err := c.trace.start(ctx, logger)
	if err != nil {
		return err
	}
	defer stopTracing()
	defer func() { _ = st.Close() }()
	if err := registerRunner(ctx, st, c.runnerID, "local", "local", logger); err != nil {
		return err
	}
	keys := auth.NewStoreAuthenticator(st, logger)

	// One blob store, opened once, shared by the gateway and the runner (a dir root is
	// opened by one process): DATA-DIR/blobs unless --blob-* says otherwise.
	blobs, blobCfg, closeBlobs, err := c.blob.open(ctx, filepath.Join(c.dataDir, "blobs"))
	if err != nil {
		return err
	}
	defer closeBlobs()
	regHost, err := c.registry.hostFor(c.listen)
	if err != nil {
		return err
	}
	ownStorage := &orgStorageRef{}
	reg, err := c.registry.open(ctx, c.dataDir, c.dataDir, regHost, blobCfg, keys, ownStorage.get, logger)
	if err != nil {
		return err
	}
	var regCreds func(org, image string) (string, string, bool)
	if reg != nil {
		defer reg.Close()
		regCreds = reg.PullCredentials
	}
	c.registry.startGC(ctx, reg, st, logger)
	cfg := stack.Config{DataDir: c.dataDir, Logger: logger, Pool: local.PoolConfig{Size: c.warmPool, Idle: 10 * time.Minute},
		Bridge: c.bridge, CgroupParent: c.cgroupParent,
		Blobs: blobs, BlobConfig: blobCfg, SnapshotsPerSandbox: c.blob.snapshotsPerSandbox, SnapshotsPerRunner: c.blob.snapshotsPerRunner}
	if err := c.hard.apply(&cfg); err != nil {
		return err
	}
	if c.bridge != "" {
		cfg.NetTable = "sandboxd_" + c.bridge
	}
	cfg.Pool.MaxTargeted = c.warmTargets // templates' warm pools
	if err := c.warmDemand.apply(&cfg.Pool); err != nil {
		return err
	}
	if c.subnet != "" {
		if cfg.Subnet, err = netip.ParsePrefix(c.subnet); err != nil {
			return fmt.Errorf("--subnet: %w", err)
		}
	}
	if reg != nil {
		// The API port is plain HTTP (h2c) in dev: the runner pulls the registry's images
		// over it, with the tokens the gateway mints.
		cfg.InsecureRegistries = append(cfg.InsecureRegistries, regHost)
	}
	if c.testImageMirror {
		stopRegistry, mirrored, err := mirrorTestImages(ctx, &cfg, logger)
		if err != nil {
			return err
		}
		defer stopRegistry()
		if c.capacity.engineImage == "" {
			c.capacity.engineImage = mirrored.engine
		}
		if c.capacity.builderImage == "" {
			c.capacity.builderImage = mirrored.builder
		}
	}
	stk, err := stack.NewLocal(ctx, cfg)
	if err != nil {
		return err
	}
	defer stk.Close()
	registerWarmPool(stk.Backend, logger)

	local, err := newLocalRunner(c.runnerID, stk.Runner, c.capacity, stk.BaseArchiver())
	if err != nil {
		return err
	}
	policies := controlplane.NewPolicySource(st, defaultOrg)
	dpIssuer, stopListeners, err := c.startListeners(local, ca, keys, policies, stk.EdgeDialMark(), logger)
	if err != nil {
		return err
	}
	defer stopListeners()
	secretKeys, err := secretbox.LoadOrCreate(cmp.Or(c.secretKeyFile, filepath.Join(c.dataDir, secretbox.DefaultFile)))
	if err != nil {
		return err
	}
	shareKey, err := pki.LoadOrCreateSecret(filepath.Join(c.dataDir, shareTokenKeyFile))
	if err != nil {
		return err
	}
	fssOpts, err := c.fss.options(st)
	if err != nil {
		return err
	}
	if blobCfg.S3 != nil {
		fssOpts.ProbeBucket = blobCfg.BucketProber()
	}
	quotaOpts, err := c.quota.options(st, defaultOrg)
	if err != nil {
		return err
	}
	trusted, err := gateway.ParseTrustedProxies(c.trustedProxies)
	if err != nil {
		return fmt.Errorf("--trusted-proxies: %w", err)
	}
	builds, err := buildOptions(st, reg, regHost, c.builds)
	if err != nil {
		return err
	}
	gw, err := gateway.New(gateway.Config{
		Quota:         quotaOpts,
		FSS:           fssOpts,
		DataPlane:     dpIssuer,
		ShareTokenKey: shareKey,
		Auth:          keys,
		Runners:       []runner.Handle{local},
		PlatformOrg:   defaultOrg,
		Policies:      policies,
		Index:         metrics.Default.Index(st.Sandboxes()),
		Orgs:          st.Orgs(),
		Snapshots:     st.Snapshots(),
		Templates:     st.Templates(),
		Volumes:       st.Volumes(),
		// Sandboxes no gateway knows (a crash between runner and store) are deleted.
		ReconcileInterval: gateway.DefaultReconcileInterval,
		Logger:            logger,
		Blobs:             blobs,
		BlobConfig:        blobCfg,
		SnapshotBucket:    blobCfg.Bucket(),

		RegistryCredentials: regCreds, // pull tokens for images of the platform registry
		Builds:              builds,
		TrustedProxies:      trusted,
		Secrets:             gateway.SecretOptions{Store: st.SecretStores(), Keys: secretKeys},
		Audit:               gateway.AuditOptions{Store: st.Audit(), Config: audit.Config{Retention: c.auditRetention}, PlatformOrg: defaultOrg},
		Health:              c.health.cfg,
	})
	if err != nil {
		return err
	}
	ownStorage.gw.Store(gw) // the registry asks it where CUSTOMER_OWNED organizations' images go
	metrics.Default.SetReady("store", storeReady(st))
	metrics.Default.SetReady("runners", gw.Ready)
	go heartbeat(ctx, st, local, logger)
	clusterKey, err := pki.LoadOrCreateSecret(filepath.Join(c.dataDir, controlplane.ClusterKeyFile))
	if err != nil {
		return err
	}
	cp, err := newControlPlane(st, keys, logger, func(ctx context.Context, org, runnerID string) (int, error) {
		n, err := controlplane.StoreLiveSandboxes(st)(ctx, org, runnerID)
		if err != nil || runnerID != local.ID() {
			return n, err
		}
		// The runner's own live sandboxes of org (those the store may not know yet), never
		// those of other organizations: neither their count nor their existence is org's.
		sbs, err := local.List(ctx)
		return max(n, runner.LiveOf(sbs, org)), err
	}, clusterKey)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", c.listen)
	if err != nil {
		return err
	}
	srv := newAPIServer(controlplane.Route(cp.Handler(), gw.Handler()), keys, logger)
	srv.Handler = withRegistry(srv.Handler, reg)
	fmt.Printf("CWSANDBOX_BASE_URL=http://%s\n", ln.Addr())
	fmt.Printf("CWSANDBOX_API_KEY is in %s\n", filepath.Join(c.dataDir, adminKeyFile))
	return serveUntilDone(ctx, srv, ln, logger, "shutting down; sandboxes keep running and are re-adopted on the next start")
}

// startListeners starts the local runner's edge and direct data plane (unless their
// flags are empty) until stop, and returns the issuer of data-plane client certificates
// (nil without a data plane). A listener whose flag was not given is left out, with a
// warning, when its default address is taken.
func (c devConfig) startListeners(local *runner.Local, ca *pki.CA, keys *auth.StoreAuthenticator, policies policy.Source, dialMark uint32, logger *slog.Logger) (dpIssuer gateway.DataPlaneIssuer, stop func(), err error) {
	var stops []func()
	stop = func() {
		for _, s := range slices.Backward(stops) {
			s()
		}
	}
	if c.edgeListen != "" {
		e, err := startEdge(local, stack.EdgeConfig{Listen: c.edgeListen, RunnerID: c.runnerID, BaseDomain: c.baseDomain,
			CA: ca, Authorize: stack.KeyAuthorizer(keys), KeyActive: stack.KeyActivity(keys), DialMark: dialMark, Logger: logger}, c.dataDir)
		switch {
		case err == nil:
			stops = append(stops, e.Close)
			fmt.Printf("endpoints: https://PORT-SANDBOX.%s.%s:%d (trust %s)\n", c.runnerID, c.baseDomain, e.Port(), filepath.Join(c.dataDir, "ca.pem"))
		case c.edgeListenGiven:
			return nil, nil, err
		default:
			// The default port is taken: run without public endpoints rather than not at all.
			logger.Warn("no edge: sandboxes cannot publish endpoints (set --edge-listen to a free address)", "err", err)
		}
	}
	if c.dataPlaneListen != "" {
		dpCA, err := dataplane.LoadOrCreateCA(c.dataDir)
		if err != nil {
			stop()
			return nil, nil, err
		}
		l, err := startDataPlane(local, dataplane.ListenConfig{Listen: c.dataPlaneListen, CA: dpCA, Logger: logger, Policies: policies, RunnerID: c.runnerID})
		switch {
		case err == nil:
			stops = append(stops, l.Close)
			dpIssuer = &dataplane.Issuer{CA: dpCA, TTL: c.dataPlaneTTL}
		case c.dataPlaneListenGiven:
			stop()
			return nil, nil, err
		default:
			// The default port is taken: clients use the gateway for data calls.
			logger.Warn("no direct data plane: exec, logs and files go through the gateway (set --data-plane-listen to a free address)", "err", err)
		}
	}
	return dpIssuer, stop, nil
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
			s := runnerStatus(c)
			s.Prepull = prepullStatus(r)
			return s, nil
		}, log)
}

// newControlPlane serves the control plane over st; both release channels offer this
// binary's version, and defaultOrg is the platform organization.
// clusterKey (nil: none) seals registered clusters' credentials.
func newControlPlane(st store.Store, a auth.Authenticator, log *slog.Logger, live controlplane.LiveSandboxCounter, clusterKey []byte) (*controlplane.Service, error) {
	return controlplane.New(controlplane.Config{
		ClusterKey:     clusterKey,
		Store:          st,
		Auth:           a,
		PlatformOrg:    defaultOrg,
		TargetVersions: map[string]string{store.ChannelStable: version, store.ChannelRapid: version},
		LiveSandboxes:  live,
		Logger:         log,
	})
}

// mirrorTestImages serves the test images from a loopback registry and makes it cfg's
// docker.io mirror. Without test images it only warns: docker.io is then Docker Hub.
// Only `dev` (the single-machine demo) calls it: internal/archtest fails if a code path
// of runner, gateway or controlplane reaches it. When the engine test image is built
// (`scripts/build-test-images.sh engine`; never waited for: a build under way leaves
// this dev without engines) it is served too, as docker.io/sandboxd/engine:test, and
// engine is that reference: dev's default --engine-image. The builder test image
// (`scripts/build-test-images.sh builder`) likewise, as docker.io/sandboxd/builder:test:
// dev's default --builder-image, so dev builds images (templates, Compose build:) when
// it is built and the gvisor class is there.
func mirrorTestImages(ctx context.Context, cfg *stack.Config, log *slog.Logger) (stop func(), mirrored mirroredImages, err error) {
	host, stop, err := testimage.ServeDockerHub(ctx, "")
	switch {
	case errors.Is(err, testimage.ErrNoTestImages):
		log.Warn("no test images to mirror; docker.io images are pulled from Docker Hub", "hint", "make images")
		return func() {}, mirroredImages{}, nil
	case err != nil:
		return nil, mirroredImages{}, err
	}
	cfg.InsecureRegistries = append(cfg.InsecureRegistries, host)
	cfg.Mirrors = map[string][]image.Mirror{"docker.io": {{Host: host, Insecure: true}}}
	log.Info("test images mirror docker.io", "registry", host)
	switch img, err := testimage.EngineImageIfBuilt(); {
	case errors.Is(err, testimage.ErrNoTestImages):
		log.Info("no engine test image: this runner runs no container-engine sandboxes", "hint", "scripts/build-test-images.sh engine")
	case err != nil:
		stop()
		return nil, mirroredImages{}, err
	default:
		if _, err := testimage.Push(host, testimage.Engine, img); err != nil {
			stop()
			return nil, mirroredImages{}, fmt.Errorf("engine test image: %w", err)
		}
		mirrored.engine = "docker.io/" + testimage.Engine
		log.Info("engine test image mirrored: the runner runs container-engine sandboxes", "engine_image", mirrored.engine)
	}
	switch img, err := testimage.BuilderImageIfBuilt(); {
	case errors.Is(err, testimage.ErrNoTestImages):
		log.Info("no builder test image: this runner builds no images", "hint", "scripts/build-test-images.sh builder")
	case err != nil:
		stop()
		return nil, mirroredImages{}, err
	default:
		if _, err := testimage.Push(host, testimage.Builder, img); err != nil {
			stop()
			return nil, mirroredImages{}, fmt.Errorf("builder test image: %w", err)
		}
		mirrored.builder = "docker.io/" + testimage.Builder
		log.Info("builder test image mirrored: the runner builds images", "builder_image", mirrored.builder)
	}
	return stop, mirrored, nil
}

// mirroredImages are the optional test images mirrorTestImages served ("" when not built).
type mirroredImages struct{ engine, builder string }

// apikey manages API keys in the store: `sandboxd apikey create --org ORG [--role user]`.
// The organization is created when missing.
func apikey(args []string) error {
	if len(args) == 0 || args[0] != "create" {
		return errors.New("usage: sandboxd apikey create --data-dir DIR [--store DSN] --org ORG [--role user|admin] [--name NAME]")
	}
	var cfg apikeyConfig
	if _, err := parseFlags("apikey create", &cfg, args[1:]); err != nil {
		return err
	}
	if err := cfg.validate(); err != nil {
		return err
	}
	return cfg.run()
}

func (c apikeyConfig) run() error {
	role, err := c.authRole()
	if err != nil {
		return err
	}
	ctx := context.Background()
	st, err := openStore(ctx, c.dataDir, c.storeDSN)
	if err != nil {
		return err
	}
	defer func() { _ = st.Close() }()
	if err := controlplane.EnsureOrg(ctx, st, c.org); err != nil {
		return err
	}
	key, _, err := auth.IssueKey(ctx, st, c.org, role, c.name)
	if err != nil {
		return err
	}
	fmt.Println(key)
	return nil
}
