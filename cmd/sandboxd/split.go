package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	controlplanev1 "github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1"
	"github.com/sandboxd/sandboxd/internal/controlplane"
	"github.com/sandboxd/sandboxd/internal/dataplane"
	"github.com/sandboxd/sandboxd/internal/enroll"
	"github.com/sandboxd/sandboxd/internal/gateway"
	"github.com/sandboxd/sandboxd/internal/pki"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runnerapi"
	"github.com/sandboxd/sandboxd/internal/stack"
)

// platformCAName names the CA that --pki-dir holds when `runner` or `gateway` creates it.
const platformCAName = "sandboxd platform CA"

// DefaultBaseDomain is the endpoints' domain unless configured: *.localhost names resolve
// to loopback, so endpoints of a runner on this machine work without DNS.
const DefaultBaseDomain = controlplane.DefaultEndpointDomain

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

// runnerCmd runs the single-host stack and serves it to gateways over mTLS. Unlike
// `dev` it never serves the test images: docker.io is Docker Hub (internal/archtest
// checks that no code path of it reaches internal/testimage).
func runnerCmd(args []string) error {
	fs := flag.NewFlagSet("runner", flag.ExitOnError)
	dataDir := fs.String("data-dir", "/var/lib/sandboxd", "state directory")
	pkiDir := fs.String("pki-dir", "", "directory of the platform CA (ca.pem, ca-key.pem), shared with the gateways; default DATA-DIR/pki")
	listen := fs.String("listen", "127.0.0.1:7443", "address gateways reach the runner at (gRPC over mTLS)")
	runnerID := fs.String("runner-id", "local", "ID of this runner; its certificate carries it as a DNS name")
	var insecure listFlag
	fs.Var(&insecure, "insecure-registry", "registry host[:port] reached over plain HTTP (repeatable)")
	var mirrors mirrorFlags
	mirrors.register(fs)
	bridge := fs.String("bridge", "", "sandbox bridge (default sbx0)")
	subnet := fs.String("subnet", "", "sandbox subnet (default 10.88.0.0/16)")
	cgroupParent := fs.String("cgroup-parent", "", "cgroup of the sandboxes (default sandboxd)")
	noEgress := fs.Bool("no-egress", false, "sandboxes reach nothing beyond this host")
	hostMark := fs.Uint("host-mark", 0, "socket mark that lets the edge's connections into the sandbox bridge; nothing else on the host gets in (default 0x5bd00000)")
	controlPlane := fs.String("control-plane", "", "HOST:PORT of the control plane (`sandboxd controlplane`): register with --bootstrap-token on first start, then heartbeat; without it the runner uses --pki-dir")
	bootstrapToken := fs.String("bootstrap-token", "", "one-time token from :createBootstrapToken (first start only; later starts use the credentials in DATA-DIR/identity)")
	controlPlaneCA := fs.String("control-plane-ca", "", "PEM file of the CA to trust the control plane by (default: the CA pinned in the bootstrap token)")
	hbInterval := fs.Duration("heartbeat-interval", controlplane.DefaultHeartbeatInterval, "how often to heartbeat the control plane")
	edgeListen := fs.String("edge-listen", "", "address of the edge that publishes sandbox endpoints, e.g. :443 (empty: no edge); its certificate comes from the control plane, or from the CA in --pki-dir")
	edgePublicPort := fs.Int("edge-public-port", 0, "port clients reach the edge at, in endpoint URLs, when it differs from --edge-listen's (e.g. a Kubernetes Service's 443 in front of the Pod's 8443); 0: --edge-listen's")
	baseDomain := fs.String("base-domain", DefaultBaseDomain, "endpoints are PORT-SANDBOX.RUNNER-ID.BASE-DOMAIN")
	var capacity capacityFlags
	capacity.register(fs)
	backend := fs.String("backend", "local", "where sandboxes run: local (runc/gVisor on this host) or kubernetes (one Pod each)")
	var kube kubernetesFlags
	kube.register(fs)
	var hard hardeningFlags
	hard.register(fs)
	var acmeCfg acmeFlags
	acmeCfg.register(fs)
	dataPlaneListen := fs.String("data-plane-listen", "", "address of the direct mTLS data plane clients run exec, logs and files on, e.g. :8444 (empty: gateway only); its certificate comes from the data-plane CA in --pki-dir")
	dataPlaneHost := fs.String("data-plane-host", "", "host clients reach the data plane by (default: the --data-plane-listen host)")
	verbose := fs.Bool("v", false, "log at debug level")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *backend != "local" && *backend != "kubernetes" {
		return fmt.Errorf("--backend %q: want local or kubernetes", *backend)
	}
	logger := newLogger(*verbose)
	if *pkiDir == "" {
		*pkiDir = filepath.Join(*dataDir, "pki")
	}
	if err := capacity.parse(); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *backend == "kubernetes" {
		// Before anything acts (registration, re-adoption, serving): one replica at a time.
		lease, err := kube.acquireLease(ctx, logger)
		if err != nil {
			return err
		}
		if lease != nil {
			leaving := make(chan struct{})
			defer func() { close(leaving); lease.Release() }()
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
		}
	} else if kube.leaderElect {
		return errors.New("--leader-elect needs --backend kubernetes")
	}

	var (
		tlsCfg *tls.Config
		ident  *enroll.Identity
		cache  *enroll.PolicyCache
		edgeCA *pki.CA // issues the edge's wildcard certificate
	)
	_, loadErr := enroll.Load(*dataDir)
	if *controlPlane != "" || *bootstrapToken != "" || loadErr == nil {
		var caPEM []byte
		if *controlPlaneCA != "" {
			b, err := os.ReadFile(*controlPlaneCA)
			if err != nil {
				return fmt.Errorf("--control-plane-ca: %w", err)
			}
			caPEM = b
		}
		id, registered, err := enroll.LoadOrRegister(ctx, *dataDir, *controlPlane, *bootstrapToken, caPEM)
		if err != nil {
			return err
		}
		if registered {
			logger.Info("runner registered", "org", id.Org, "runner", id.RunnerID, "credentials", enroll.Dir(*dataDir))
		} else {
			logger.Info("using saved runner credentials", "org", id.Org, "runner", id.RunnerID, "not_after", id.Cert.Leaf.NotAfter)
		}
		if fs.Lookup("runner-id").Value.String() != "local" && *runnerID != id.RunnerID {
			return fmt.Errorf("--runner-id %s, but this data dir is registered as runner %s", *runnerID, id.RunnerID)
		}
		*runnerID = id.RunnerID
		tlsCfg = runnerapi.ServerTLSConfigFromCert(id.Cert, id.CAs)
		if cache, err = enroll.OpenPolicyCache(*dataDir); err != nil {
			return err
		}
		ident = id
	} else {
		ca, err := pki.LoadOrCreateCA(*pkiDir, platformCAName)
		if err != nil {
			return fmt.Errorf("platform CA: %w", err)
		}
		host, _, err := net.SplitHostPort(*listen)
		if err != nil {
			return fmt.Errorf("--listen: %w", err)
		}
		if tlsCfg, err = runnerapi.ServerTLSConfig(ca, *runnerID, []string{host}); err != nil {
			return err
		}
		edgeCA = ca
	}

	var (
		rn  *runner.Runner
		kst *stack.KubernetesStack
		// dialMark lets the edge past the local network's host guard (0: Kubernetes).
		dialMark uint32
	)
	if *backend == "kubernetes" {
		var err error
		if kube.diskBytes, err = hard.diskBytes(); err != nil {
			return err
		}
		if kube.openReserved, err = hard.reservedOpen(); err != nil {
			return err
		}
		kst, err = kube.start(ctx, *runnerID, *dataDir, logger)
		if err != nil {
			return err
		}
		defer kst.Close()
		rn = kst.Runner
	} else {
		cfg := stack.Config{DataDir: *dataDir, Logger: logger, InsecureRegistries: insecure, Bridge: *bridge, CgroupParent: *cgroupParent, NoEgress: *noEgress}
		mirrors.apply(&cfg)
		if err := hard.apply(&cfg); err != nil {
			return err
		}
		if *hostMark > math.MaxUint32 {
			return fmt.Errorf("--host-mark %#x: more than 32 bits", *hostMark)
		}
		cfg.HostMark = uint32(*hostMark)
		if *bridge != "" {
			cfg.NetTable = "sandboxd_" + *bridge
		}
		if *subnet != "" {
			var err error
			if cfg.Subnet, err = netip.ParsePrefix(*subnet); err != nil {
				return fmt.Errorf("--subnet: %w", err)
			}
		}
		st, err := stack.NewLocal(ctx, cfg)
		if err != nil {
			return err
		}
		defer st.Close()
		rn = st.Runner
		dialMark = st.EdgeDialMark()
	}

	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	local := runner.NewLocal(*runnerID, rn)
	capacity.apply(local)
	if *edgeListen != "" {
		ec := stack.EdgeConfig{Listen: *edgeListen, RunnerID: *runnerID, BaseDomain: *baseDomain, CA: edgeCA, Logger: logger,
			SessionKeyFile: filepath.Join(*dataDir, "edge-session.key"), DialMark: dialMark}
		switch {
		case acmeCfg.enabled():
			// A public domain: the wildcard comes from the ACME CA.
			get, stop, err := acmeCfg.certificate(ctx, *dataDir, *runnerID, *baseDomain, logger)
			if err != nil {
				return fmt.Errorf("--acme-directory: %w", err)
			}
			defer stop()
			ec.GetCertificate = get
		case ident != nil:
			// Registered: the control plane signs the edge's certificate.
			if ec.GetCertificate, err = enroll.EdgeCertificate(ctx, ident, *baseDomain); err != nil {
				return fmt.Errorf("--edge-listen: %w", err)
			}
		}
		if ident != nil {
			// The control plane vouches for the API keys of TOKEN endpoints. Unregistered
			// runners have no key store: their TOKEN endpoints refuse every request.
			ec.Authorize = enroll.KeyVerifier(ident)
			// And a login session lasts only while the key that made it is active.
			ec.KeyActive = enroll.KeyActivity(ident)
		}
		e, err := stack.StartEdge(rn, ec)
		if err != nil {
			return err
		}
		defer e.Close()
		local.EdgeDomain, local.EdgePort = *baseDomain, e.Port()
		if *edgePublicPort > 0 {
			local.EdgePort = *edgePublicPort
		}
		fmt.Printf("edge listening on %s for *.%s.%s\n", e.Addr, *runnerID, *baseDomain)
	}
	if *dataPlaneListen != "" {
		dc := dataplane.ListenConfig{Listen: *dataPlaneListen, Host: *dataPlaneHost, Sandboxes: local, Logger: logger}
		if ident != nil {
			// Registered: the control plane holds the data-plane CA and signs for us.
			if dc.Issue, dc.ClientCAs, err = enroll.DataPlaneCredentials(ctx, ident); err != nil {
				return fmt.Errorf("--data-plane-listen: %w", err)
			}
		} else if dc.CA, err = dataplane.LoadOrCreateCA(*pkiDir); err != nil {
			return err
		}
		l, uri, err := dataplane.Start(dc)
		if err != nil {
			return err
		}
		defer l.Close()
		local.DataPlaneURI = uri
		fmt.Printf("direct data plane: %s\n", uri)
	}
	rs := runnerapi.NewServerFor(local, logger)
	if ident != nil {
		hb, err := enroll.NewHeartbeater(enroll.HeartbeatConfig{
			Identity: ident, Cache: cache, Interval: *hbInterval, Logger: logger,
			Status: func(ctx context.Context) (*enroll.Status, error) { return runnerStatus(ctx, local) },
		})
		if err != nil {
			return err
		}
		if _, _, err := cache.Policy(ctx, ""); errors.Is(err, enroll.ErrNoPolicy) {
			// Never heard from the control plane: ask for the policy before serving, so
			// the first creates are not refused for the want of one.
			bctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			if err := hb.Beat(bctx); err != nil {
				logger.Warn("no policy from the control plane yet; creates are refused until one arrives", "err", err)
			}
			cancel()
		}
		go hb.Run(ctx)
		rs.WithPolicy(*runnerID, cache)
		if kst != nil && kube.selfDeployment != "" {
			// :applyAvailableUpdate: the heartbeat reply's desired version becomes this
			// runner's Deployment image tag.
			u := &stack.SelfUpdater{Client: kst.Client, Namespace: firstNonEmpty(os.Getenv("POD_NAMESPACE"), kube.namespace),
				Deployment: kube.selfDeployment, Container: kube.selfContainer, Logger: logger}
			go u.Run(ctx, version, hb.DesiredVersion, *hbInterval)
		}
	}
	srv := rs.HTTPServer(tlsCfg)
	fmt.Printf("runner %s listening on %s\n", *runnerID, ln.Addr())
	return serveUntilDone(ctx, srv, ln, logger, "shutting down; sandboxes keep running and are re-adopted on the next start")
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
	reconcile := fs.Duration("reconcile-interval", gateway.DefaultReconcileInterval, "how often to compare the runners' sandboxes with the index")
	orphanGrace := fs.Duration("orphan-grace", gateway.DefaultOrphanGrace, "age at which a sandbox that no gateway recorded (its create was interrupted) is deleted")
	controlPlane := fs.String("control-plane", "", "HOST:PORT of `sandboxd controlplane`: admin calls are forwarded there (UNAVAILABLE while it is down) and runners heartbeat it themselves; without it the gateway serves the admin API and heartbeats its runners")
	dataPlaneTTL := fs.Duration("data-plane-cert-ttl", dataplane.DefaultCertTTL, "lifetime of the client certificates ConnectSandbox issues for runners' direct data planes")
	verbose := fs.Bool("v", false, "log at debug level")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if len(runners) == 0 {
		return errors.New("at least one --runner ID=HOST:PORT is required")
	}
	logger := newLogger(*verbose)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ca, st, keys, err := openPlatform(ctx, *dataDir, pkiDir, *storeDSN, logger)
	if err != nil {
		return err
	}
	defer func() { _ = st.Close() }()
	var rs []runner.Handle
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
	// Runners that serve a direct data plane (--data-plane-listen) trust the data-plane CA
	// kept next to the platform CA.
	dpCA, err := dataplane.LoadOrCreateCA(*pkiDir)
	if err != nil {
		return err
	}
	// Replicas given the same --pki-dir derive the same share tokens.
	shareKey, err := pki.LoadOrCreateSecret(filepath.Join(*pkiDir, shareTokenKeyFile))
	if err != nil {
		return err
	}
	gw, err := gateway.New(gateway.Config{
		DataPlane: &dataplane.Issuer{CA: dpCA, TTL: *dataPlaneTTL}, ShareTokenKey: shareKey,
		Auth: keys, Runners: rs, Policies: controlplane.NewPolicySource(st, defaultOrg),
		Index: st.Sandboxes(), Orgs: st.Orgs(), Logger: logger,
		ReconcileInterval: *reconcile, OrphanGrace: *orphanGrace,
	})
	if err != nil {
		return err
	}
	// Until runners register themselves, the gateway records the runners it is given (the
	// runner ID doubles as cluster ID) and heartbeats what it sees of them.
	var admin http.Handler
	if *controlPlane != "" {
		if admin, err = controlPlaneProxy(*controlPlane, ca, logger); err != nil {
			return err
		}
	} else {
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
		admin = cp.Handler()
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	srv := newAPIServer(controlplane.Route(admin, gw.Handler()), keys, logger)
	fmt.Printf("CWSANDBOX_BASE_URL=http://%s\n", ln.Addr())
	fmt.Printf("CWSANDBOX_API_KEY is in %s\n", filepath.Join(*dataDir, adminKeyFile))
	return serveUntilDone(ctx, srv, ln, logger, "")
}

// runnerStatus is what a heartbeat reports of r.
func runnerStatus(ctx context.Context, r *runner.Local) (*enroll.Status, error) {
	c, err := r.Capacity(ctx)
	if err != nil {
		return nil, err
	}
	return &enroll.Status{
		Version:        version,
		Ready:          true,
		Capacity:       &controlplanev1.RunnerResources{MilliCpu: c.MilliCPU, MemoryBytes: c.MemoryBytes},
		Usage:          &controlplanev1.RunnerResources{MilliCpu: c.UsedMilliCPU, MemoryBytes: c.UsedMemoryBytes, Sandboxes: int64(c.Running)},
		SandboxesTotal: int64(len(r.R.List())),
	}, nil
}
