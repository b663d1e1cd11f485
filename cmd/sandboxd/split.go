package main

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"github.com/sandboxd/sandboxd/internal/audit"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/sandboxd/sandboxd/internal/controlplane"
	"github.com/sandboxd/sandboxd/internal/dataplane"
	"github.com/sandboxd/sandboxd/internal/enroll"
	"github.com/sandboxd/sandboxd/internal/gateway"
	"github.com/sandboxd/sandboxd/internal/metrics"
	"github.com/sandboxd/sandboxd/internal/pki"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runnerapi"
	"github.com/sandboxd/sandboxd/internal/runtime/local"
	"github.com/sandboxd/sandboxd/internal/secretbox"
	"github.com/sandboxd/sandboxd/internal/stack"
	"github.com/sandboxd/sandboxd/internal/store"
)

// platformCAName names the CA that --pki-dir holds when `runner` or `gateway` creates it.
const platformCAName = "sandboxd platform CA"

// DefaultBaseDomain is the endpoints' domain unless configured: *.localhost names resolve
// to loopback, so endpoints of a runner on this machine work without DNS.
const DefaultBaseDomain = controlplane.DefaultEndpointDomain

// runnerCmd runs the single-host stack and serves it to gateways over mTLS. Unlike
// `dev` it never serves the test images: docker.io is Docker Hub (internal/archtest
// checks that no code path of it reaches internal/testimage).
//
// A version on trial after a self-update that refuses the runner's flags (a flag renamed
// or removed, stricter validation) rolls back before it exits: otherwise it would exit
// before the trial logic, and a supervisor would restart it forever.
func runnerCmd(args []string) error {
	var cfg runnerConfig
	if err := parseRunnerFlags(&cfg, args); err != nil {
		return refusedFlags(args, err, newLogger(slog.LevelInfo, false), syscall.Exec, runningBinaries)
	}
	cfg.args = args
	logger := newLogger(slog.LevelInfo, cfg.verbose)
	su, rolledBack, err := cfg.selfUpdateStart(logger)
	if err != nil {
		return err
	}
	if rolledBack {
		return su.exec("rollback: the new version did not confirm")
	}
	return su.afterRun(cfg.run(logger, su))
}

// run runs the runner until a signal, or until su (nil: no self-update) asks it to
// re-execute; either way sandboxes keep running.
func (c runnerConfig) run(logger *slog.Logger, su *selfUpdate) error {
	pkiDir := pkiDirOf(c.dataDir, c.pkiDir)
	sigCtx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	defer func() {
		// Only a signal is a clean stop (a trial keeps its attempt). Not ctx below: it is
		// also cancelled when run returns, start-up errors included, which must roll a
		// trial back.
		if sigCtx.Err() != nil {
			su.signalled()
		}
	}()
	ctx, cancel := su.serveCtx(sigCtx)
	defer cancel()
	if err := c.metrics.start(ctx, logger); err != nil {
		return err
	}
	stopTracing, err := c.trace.start(ctx, logger)
	if err != nil {
		return err
	}
	defer stopTracing()
	if c.backend == "kubernetes" {
		// Before anything acts (registration, re-adoption, serving): one replica at a time.
		release, err := holdLease(ctx, c.kube, logger)
		if err != nil {
			return err
		}
		defer release()
	}
	creds, err := c.credentials(ctx, pkiDir, logger)
	if err != nil {
		return err
	}
	runnerID := creds.runnerID
	blobs, blobCfg, closeBlobs, err := c.blob.open(ctx, "")
	if err != nil {
		return err
	}
	defer closeBlobs()
	c.blobStore = blobStore{store: blobs, cfg: blobCfg, perSandbox: c.blob.snapshotsPerSandbox, perRunner: c.blob.snapshotsPerRunner}
	rn, kst, archiver, dialMark, closeBackend, err := c.startBackend(ctx, runnerID, logger)
	if err != nil {
		return err
	}
	defer closeBackend()

	ln, err := net.Listen("tcp", c.listen)
	if err != nil {
		return err
	}
	local, err := newLocalRunner(runnerID, rn, c.capacity, archiver)
	if err != nil {
		return err
	}
	if c.edgeListen != "" {
		stopEdge, err := c.runEdge(ctx, local, creds, dialMark, logger)
		if err != nil {
			return err
		}
		defer stopEdge()
	}
	if c.dataPlaneListen != "" {
		dc := dataplane.ListenConfig{Listen: c.dataPlaneListen, Host: c.dataPlaneHost, Logger: logger}
		if creds.ident != nil {
			// Its policy's source-IP allowlist applies to direct calls too (an
			// unregistered runner has no policy: only the gateway checks).
			dc.Policies, dc.RunnerID = creds.cache, runnerID
			// Registered: the control plane holds the data-plane CA and signs for us.
			host, err := dataplane.HostOf(c.dataPlaneListen, c.dataPlaneHost)
			if err != nil {
				return err
			}
			if dc.Issue, dc.ClientCAs, err = enroll.DataPlaneCredentials(ctx, creds.ident, host); err != nil {
				return fmt.Errorf("--data-plane-listen: %w", err)
			}
		} else if dc.CA, err = dataplane.LoadOrCreateCA(pkiDir); err != nil {
			return err
		}
		l, err := startDataPlane(local, dc)
		if err != nil {
			return err
		}
		defer l.Close()
	}
	rs := runnerapi.NewServerFor(local, logger)
	if creds.ident != nil {
		if err := c.startHeartbeat(ctx, creds, local, kst, su, logger); err != nil {
			return err
		}
		rs.WithPolicy(runnerID, creds.cache)
	}
	srv := rs.HTTPServer(creds.tls)
	// Ready from here on: the backend is up, the sandboxes re-adopted, the API listening.
	// The check is that start-up got here (before it /readyz says "starting"); the
	// backend's later health shows in its creates (gateway runner health), not here.
	metrics.Default.SetReady("started", func(context.Context) error { return nil })
	fmt.Printf("runner %s listening on %s\n", runnerID, ln.Addr())
	return serveUntilDone(ctx, srv, ln, logger, "shutting down; sandboxes keep running and are re-adopted on the next start")
}

// runEdge starts the edge (--edge-listen) until stop. Its certificate comes from the
// ACME CA (--acme-directory), else from the control plane (registered), else from the
// platform CA.
func (c runnerConfig) runEdge(ctx context.Context, local *runner.Local, creds runnerCredentials, dialMark uint32, logger *slog.Logger) (stop func(), err error) {
	ec := stack.EdgeConfig{Listen: c.edgeListen, RunnerID: local.ID(), BaseDomain: c.baseDomain, CA: creds.edgeCA, Logger: logger, DialMark: dialMark}
	stopACME := func() {}
	switch {
	case c.acme.enabled():
		// A public domain: the wildcard comes from the ACME CA.
		if ec.GetCertificate, stopACME, err = c.acme.certificate(ctx, c.dataDir, local.ID(), c.baseDomain, logger); err != nil {
			return nil, fmt.Errorf("--acme-directory: %w", err)
		}
	case creds.ident != nil:
		// Registered: the control plane signs the edge's certificate.
		if ec.GetCertificate, err = enroll.EdgeCertificate(ctx, creds.ident, c.baseDomain); err != nil {
			return nil, fmt.Errorf("--edge-listen: %w", err)
		}
	}
	if creds.ident != nil {
		// The control plane vouches for the API keys of TOKEN endpoints. Unregistered
		// runners have no key store: their TOKEN endpoints refuse every request.
		ec.Authorize = enroll.KeyVerifier(creds.ident)
		// And a login session lasts only while the key that made it is active.
		ec.KeyActive = enroll.KeyActivity(creds.ident)
	}
	e, err := startEdge(local, ec, c.dataDir)
	if err != nil {
		stopACME()
		return nil, err
	}
	if c.edgePublicPort > 0 {
		local.EdgePort = c.edgePublicPort
	}
	fmt.Printf("edge listening on %s for *.%s.%s\n", e.Addr, local.ID(), c.baseDomain)
	return func() { e.Close(); stopACME() }, nil
}

// holdLease holds the runner's Lease (--leader-elect) until release, and exits the
// process if another replica takes it before.
func holdLease(ctx context.Context, kube kubernetesFlags, logger *slog.Logger) (release func(), err error) {
	lease, err := kube.acquireLease(ctx, logger)
	if err != nil || lease == nil {
		return func() {}, err
	}
	leaving := make(chan struct{})
	go func() {
		select {
		case <-lease.Lost:
			select {
			case <-leaving: // released on the way out
			default:
				// Another replica may act from now on: stop at once rather than race it.
				logger.Error("lost the runner lease; exiting")
				os.Exit(1)
			}
		case <-leaving:
		}
	}()
	return func() { close(leaving); lease.Release() }, nil
}

// runnerCredentials are how a runner proves itself: registered with a control plane
// (ident, with the policies it sent in cache) or by the platform CA in --pki-dir (edgeCA,
// which also issues the edge's certificate).
type runnerCredentials struct {
	tls      *tls.Config
	runnerID string // the registered ID, else --runner-id
	ident    *enroll.Identity
	cache    *enroll.PolicyCache
	edgeCA   *pki.CA
}

// credentials registers with the control plane (first start) or loads the credentials
// it issued, or else loads or creates the platform CA in pkiDir.
func (c runnerConfig) credentials(ctx context.Context, pkiDir string, logger *slog.Logger) (runnerCredentials, error) {
	if _, loadErr := enroll.Load(c.dataDir); c.controlPlane == "" && c.bootstrapToken == "" && loadErr != nil {
		ca, err := pki.LoadOrCreateCA(pkiDir, platformCAName)
		if err != nil {
			return runnerCredentials{}, fmt.Errorf("platform CA: %w", err)
		}
		host, _, err := net.SplitHostPort(c.listen)
		if err != nil {
			return runnerCredentials{}, fmt.Errorf("--listen: %w", err)
		}
		tlsCfg, err := runnerapi.ServerTLSConfig(ca, c.runnerID, []string{host})
		if err != nil {
			return runnerCredentials{}, err
		}
		return runnerCredentials{tls: tlsCfg, runnerID: c.runnerID, edgeCA: ca}, nil
	}
	var caPEM []byte
	if c.controlPlaneCA != "" {
		b, err := os.ReadFile(c.controlPlaneCA)
		if err != nil {
			return runnerCredentials{}, fmt.Errorf("--control-plane-ca: %w", err)
		}
		caPEM = b
	}
	id, registered, err := enroll.LoadOrRegister(ctx, c.dataDir, c.controlPlane, c.bootstrapToken, caPEM)
	if err != nil {
		return runnerCredentials{}, err
	}
	if registered {
		logger.Info("runner registered", "org", id.Org, "runner", id.RunnerID, "credentials", enroll.Dir(c.dataDir))
	} else {
		logger.Info("using saved runner credentials", "org", id.Org, "runner", id.RunnerID, "not_after", id.Cert.Leaf.NotAfter)
	}
	if c.runnerID != defaultRunnerID && c.runnerID != id.RunnerID {
		return runnerCredentials{}, fmt.Errorf("--runner-id %s, but this data dir is registered as runner %s", c.runnerID, id.RunnerID)
	}
	cache, err := enroll.OpenPolicyCache(c.dataDir)
	if err != nil {
		return runnerCredentials{}, err
	}
	return runnerCredentials{tls: runnerapi.ServerTLSConfigFromCert(id.Cert, id.CAs), runnerID: id.RunnerID, ident: id, cache: cache}, nil
}

// startBackend starts the stack sandboxes run on (--backend) until closeBackend. kst is
// the Kubernetes one, nil for local; dialMark lets the edge past the local network's
// host guard (0: Kubernetes); archiver hands base images to image builds (nil:
// Kubernetes, which builds none).
func (c runnerConfig) startBackend(ctx context.Context, runnerID string, logger *slog.Logger) (rn *runner.Runner, kst *stack.KubernetesStack, archiver runner.BaseArchiver, dialMark uint32, closeBackend func(), err error) {
	if c.backend == "kubernetes" {
		kube := c.kube
		if kube.diskBytes, err = c.hard.diskBytes(); err != nil {
			return nil, nil, nil, 0, nil, err
		}
		if kube.openReserved, err = c.hard.reservedOpen(); err != nil {
			return nil, nil, nil, 0, nil, err
		}
		kube.blobs = c.blobStore
		kube.insecure = c.insecure
		kube.egressUpstreamCA, kube.egressRoots = c.hard.egressUpstreamCA, c.hard.egressRoots
		if kst, err = kube.start(ctx, runnerID, c.dataDir, logger); err != nil {
			return nil, nil, nil, 0, nil, err
		}
		return kst.Runner, kst, nil, 0, kst.Close, nil
	}
	cfg := stack.Config{DataDir: c.dataDir, Logger: logger, InsecureRegistries: c.insecure, Bridge: c.bridge, CgroupParent: c.cgroupParent, NoEgress: c.noEgress,
		Pool:  local.PoolConfig{MaxTargeted: c.warmTargets}, // templates' warm pools only
		Blobs: c.blobStore.store, BlobConfig: c.blobStore.cfg, SnapshotsPerSandbox: c.blobStore.perSandbox, SnapshotsPerRunner: c.blobStore.perRunner}
	c.mirrors.apply(&cfg)
	if err := c.hard.apply(&cfg); err != nil {
		return nil, nil, nil, 0, nil, err
	}
	cfg.HostMark = uint32(c.hostMark) // validated: at most 32 bits
	if c.bridge != "" {
		cfg.NetTable = "sandboxd_" + c.bridge
	}
	if c.subnet != "" {
		if cfg.Subnet, err = netip.ParsePrefix(c.subnet); err != nil {
			return nil, nil, nil, 0, nil, fmt.Errorf("--subnet: %w", err)
		}
	}
	st, err := stack.NewLocal(ctx, cfg)
	if err != nil {
		return nil, nil, nil, 0, nil, err
	}
	registerWarmPool(st.Backend, logger)
	return st.Runner, nil, st.BaseArchiver(), st.EdgeDialMark(), st.Close, nil
}

// startHeartbeat heartbeats the control plane (with local's status) until ctx ends,
// after one first beat if no policy came yet, and follows the version it asks for: on
// Kubernetes (--self-deployment) through its Deployment, on the local backend
// (--self-update) by replacing its binaries and re-executing.
func (c runnerConfig) startHeartbeat(ctx context.Context, creds runnerCredentials, local *runner.Local, kst *stack.KubernetesStack, su *selfUpdate, logger *slog.Logger) error {
	// Either updater below follows the desired version, so the control plane's automatic
	// rollout may move this runner (heartbeat self_update).
	kubeUpdate := kst != nil && c.kube.selfDeployment != ""
	hostUpdate := su != nil && kst == nil
	hb, err := enroll.NewHeartbeater(enroll.HeartbeatConfig{
		Identity: creds.ident, Cache: creds.cache, Interval: c.heartbeatInterval, Logger: logger,
		Status: func(ctx context.Context) (*enroll.Status, error) {
			st, err := enrollStatus(ctx, local)
			if st != nil {
				st.SelfUpdate = kubeUpdate || hostUpdate
			}
			if err == nil && hostUpdate {
				su.report(st)
			}
			return st, err
		},
	})
	if err != nil {
		return err
	}
	if _, _, err := creds.cache.Policy(ctx, ""); errors.Is(err, enroll.ErrNoPolicy) {
		// Never heard from the control plane: ask for the policy before serving, so
		// the first creates are not refused for the want of one.
		bctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if err := hb.Beat(bctx); err != nil {
			logger.Warn("no policy from the control plane yet; creates are refused until one arrives", "err", err)
		}
		cancel()
	}
	go hb.Run(ctx)
	if kubeUpdate {
		// :applyAvailableUpdate or the automatic rollout: the heartbeat reply's desired version becomes this
		// runner's Deployment image tag.
		u := &stack.SelfUpdater{Client: kst.Client, Namespace: firstNonEmpty(os.Getenv("POD_NAMESPACE"), c.kube.namespace),
			Deployment: c.kube.selfDeployment, Container: c.kube.selfContainer, Logger: logger}
		go u.Run(ctx, version, hb.DesiredVersion, c.heartbeatInterval)
	}
	if hostUpdate {
		// A single-host runner installs the version it is asked for itself.
		return su.start(ctx, c, creds, hb, local, logger)
	}
	return nil
}

// gatewayCmd serves the public API and places sandboxes on runners in other processes.
func gatewayCmd(args []string) error {
	var cfg gatewayConfig
	if _, err := parseFlags("gateway", &cfg, args); err != nil {
		return err
	}
	if err := cfg.validate(); err != nil {
		return err
	}
	return cfg.run()
}

func (c gatewayConfig) run() error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return c.runCtx(ctx)
}

// runCtx runs the gateway until ctx ends (run: a signal).
func (c gatewayConfig) runCtx(ctx context.Context) error {
	logger := newLogger(slog.LevelInfo, c.verbose)
	pkiDir := pkiDirOf(c.dataDir, c.pkiDir)
	ca, st, keys, err := openPlatform(ctx, c.dataDir, pkiDir, c.storeDSN, logger)
	if err != nil {
		return err
	}
	// Runner series here only without a control plane (it exports them otherwise).
	if err := c.metrics.startStore(ctx, st, true, c.controlPlane == "", logger); err != nil {
		return err
	}
	stopTracing, err := c.trace.start(ctx, logger)
	if err != nil {
		return err
	}
	defer stopTracing()
	defer func() { _ = st.Close() }()
	// With a control plane: one store for both (storecheck.go), checked once before
	// anything but the metrics listener starts (another store refuses the start; an
	// unreachable control plane does not delay it), then while serving.
	var cpTransport *http.Transport
	var chk *storeCheck
	if c.controlPlane != "" {
		if cpTransport, err = controlPlaneTransport(c.controlPlane, ca); err != nil {
			return err
		}
		if chk, err = c.checkStore(ctx, st, cpTransport, logger); err != nil {
			return err
		}
	}
	blobs, blobCfg, closeBlobs, err := c.blob.open(ctx, "")
	if err != nil {
		return err
	}
	defer closeBlobs()
	addrs, err := c.runnerAddrs()
	if err != nil {
		return err
	}
	var rs []runner.Handle
	for _, r := range addrs {
		tlsCfg, err := runnerapi.ClientTLSConfig(ca, c.name, r.id)
		if err != nil {
			return err
		}
		rc, err := runnerapi.NewClient(runnerapi.ClientConfig{ID: r.id, Addr: r.addr, TLS: tlsCfg})
		if err != nil {
			return err
		}
		defer rc.Close()
		rs = append(rs, rc)
	}
	// Runners that serve a direct data plane (--data-plane-listen) trust the data-plane CA
	// kept next to the platform CA.
	dpCA, err := dataplane.LoadOrCreateCA(pkiDir)
	if err != nil {
		return err
	}
	// Replicas given the same --pki-dir derive the same share tokens.
	shareKey, err := pki.LoadOrCreateSecret(filepath.Join(pkiDir, shareTokenKeyFile))
	if err != nil {
		return err
	}
	// Replicas given the same key file (by default the one in --pki-dir) open each
	// other's secrets.
	secretKeys, err := secretbox.LoadOrCreate(cmp.Or(c.secretKeyFile, filepath.Join(pkiDir, secretbox.DefaultFile)))
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
	// The registry's key is shared like the share-token key; its storage is the shared
	// S3 bucket (a directory serves one replica only). Runners reach the API port over
	// plain HTTP: give them --insecure-registry with the registry host.
	regHost, err := c.registry.hostFor(c.listen)
	if err != nil {
		return err
	}
	ownStorage := &orgStorageRef{}
	reg, err := c.registry.open(ctx, c.dataDir, pkiDir, regHost, blobCfg, keys, ownStorage.get, logger)
	if err != nil {
		return err
	}
	var regCreds func(org, image string) (string, string, bool)
	if reg != nil {
		defer reg.Close()
		regCreds = reg.PullCredentials
	}
	c.registry.startGC(ctx, reg, st, logger)
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
		Quota:     quotaOpts,
		FSS:       fssOpts,
		DataPlane: &dataplane.Issuer{CA: dpCA, TTL: c.dataPlaneTTL}, BaseDomain: c.baseDomain, ShareTokenKey: shareKey,
		// PlatformOrg: a runner registered to another organization serves only that one.
		Auth: keys, Runners: rs, Policies: controlplane.NewPolicySource(st, defaultOrg), PlatformOrg: defaultOrg,
		Index: metrics.Default.Index(st.Sandboxes()), Orgs: st.Orgs(), Snapshots: st.Snapshots(), Templates: st.Templates(), Volumes: st.Volumes(), Logger: logger,
		ReconcileInterval: c.reconcileInterval, OrphanGrace: c.orphanGrace,
		Blobs: blobs, BlobConfig: blobCfg, SnapshotBucket: blobCfg.Bucket(),
		RegistryCredentials: regCreds,
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
	// Until runners register themselves, the gateway records the runners it is given (the
	// runner ID doubles as cluster ID) and heartbeats what it sees of them.
	var admin http.Handler
	if c.controlPlane != "" {
		admin = chk.gate(controlPlaneProxy(c.controlPlane, cpTransport, logger))
		go chk.run(ctx)
	} else {
		for _, r := range rs {
			if err := registerRunner(ctx, st, r.ID(), r.ID(), "local", logger); err != nil {
				return err
			}
			go heartbeat(ctx, st, r, logger)
		}
		cp, err := newControlPlane(st, keys, logger, nil, nil)
		if err != nil {
			return err
		}
		admin = cp.Handler()
	}
	ln, err := net.Listen("tcp", c.listen)
	if err != nil {
		return err
	}
	srv := newAPIServer(controlplane.Route(admin, gw.Handler()), keys, logger)
	srv.Handler = withRegistry(srv.Handler, reg)
	fmt.Printf("CWSANDBOX_BASE_URL=http://%s\n", ln.Addr())
	fmt.Printf("CWSANDBOX_API_KEY is in %s\n", filepath.Join(c.dataDir, adminKeyFile))
	return serveUntilDone(ctx, srv, ln, logger, "")
}

// checkStore checks once that the control plane uses st (storecheck.go): the refusal
// when it proves another store; otherwise the check, whose gate the admin proxy goes
// through and whose run keeps checking.
func (c gatewayConfig) checkStore(ctx context.Context, st store.Store, tr http.RoundTripper, logger *slog.Logger) (*storeCheck, error) {
	id, err := st.Identity(ctx)
	if err != nil {
		return nil, err
	}
	chk := newStoreCheck(c.controlPlane, tr, id, describeStore(c.dataDir, c.storeDSN), logger)
	if err := chk.start(ctx); err != nil {
		return nil, err
	}
	return chk, nil
}
