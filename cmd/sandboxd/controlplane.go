package main

import (
	"cmp"
	"context"
	"crypto/ed25519"
	"fmt"
	"github.com/sandboxd/sandboxd/internal/audit"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/sandboxd/sandboxd/internal/controlplane"
	"github.com/sandboxd/sandboxd/internal/dataplane"
	"github.com/sandboxd/sandboxd/internal/metrics"
	"github.com/sandboxd/sandboxd/internal/pki"
	"github.com/sandboxd/sandboxd/internal/rollout"
	"github.com/sandboxd/sandboxd/internal/secretbox"
	"github.com/sandboxd/sandboxd/internal/store"
)

// controlPlaneCmd serves the control plane on its own: the admin API (API keys) and the
// runner registration and heartbeat service, on one TLS listener whose certificate comes
// from the platform CA in DATA-DIR/pki.
func controlPlaneCmd(args []string) error {
	var cfg controlPlaneConfig
	if _, err := parseFlags("controlplane", &cfg, args); err != nil {
		return err
	}
	if err := cfg.validate(); err != nil {
		return err
	}
	return cfg.run()
}

func (c controlPlaneConfig) run() error {
	logger := newLogger(slog.LevelInfo, c.verbose)
	// The release keys first: a bad file stops the start before anything is opened.
	var releaseKeys []ed25519.PublicKey
	if c.releaseKeys != "" {
		var err error
		if releaseKeys, err = loadReleaseKeys(c.releaseKeys); err != nil {
			return fmt.Errorf("--release-keys: %w", err)
		}
		logger.Info("publishing only signed release manifests", "release_keys", len(releaseKeys))
	}
	pkiDir := pkiDirOf(c.dataDir, c.pkiDir)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ca, st, keys, err := openPlatform(ctx, c.dataDir, pkiDir, c.storeDSN, logger)
	if err != nil {
		return err
	}
	defer func() { _ = st.Close() }()
	metrics.Default.SetReady("store", storeReady(st))
	if err := c.metrics.startStore(ctx, st, false, true, logger); err != nil {
		return err
	}
	stopTracing, err := c.trace.start(ctx, logger)
	if err != nil {
		return err
	}
	defer stopTracing()
	dpCA, err := dataplane.LoadOrCreateCA(pkiDir)
	if err != nil {
		return err
	}
	// Registered clusters' credentials are sealed with a key kept next to the CA's.
	clusterKey, err := pki.LoadOrCreateSecret(filepath.Join(pkiDir, controlplane.ClusterKeyFile))
	if err != nil {
		return err
	}
	// The secret stores' key ring lives next to the CA too: gateways that share the PKI
	// dir seal and open secrets with it (docs/secrets.md).
	if _, err := secretbox.LoadOrCreate(cmp.Or(c.secretKeyFile, filepath.Join(pkiDir, secretbox.DefaultFile))); err != nil {
		return err
	}
	cp, err := controlplane.New(controlplane.Config{
		Store: st, Auth: keys, PlatformOrg: defaultOrg, CA: ca, HeartbeatInterval: c.heartbeatInterval, Logger: logger, EndpointDomain: c.baseDomain, DataPlaneCA: dpCA, ReleaseDir: c.releaseDir,
		TargetVersions: map[string]string{store.ChannelStable: version, store.ChannelRapid: version},
		ReleaseKeys:    releaseKeys,
		UpdateDeadline: c.rolloutDeadline,
		ClusterKey:     clusterKey, Install: c.installConfig(),
	})
	if err != nil {
		return err
	}
	// Installs a previous run left INSTALLING go on (they are idempotent).
	if err := cp.ResumeInstalls(ctx); err != nil {
		return err
	}
	if !c.noRollout {
		rc := c.rolloutConfig()
		// A step's start re-applies an installed runner's objects (after ResumeInstalls:
		// its re-apply runs under ctx); its install record goes INSTALLING before the step
		// is written.
		rc.Store, rc.Targets, rc.Starting, rc.Started, rc.Logger = rollout.FromStore(st), cp.ChannelTargets, cp.UpdateStarting, cp.UpdateStarted, logger
		ctl, err := rollout.New(rc)
		if err != nil {
			return err
		}
		go ctl.Run(ctx)
	}
	// The audit log of the admin writes (docs/audit.md) is pruned here too: a control plane
	// with a store of its own has no gateway to do it.
	go audit.NewRecorder(st.Audit(), audit.Options{Logger: logger}).Run(ctx, audit.Config{Retention: c.auditRetention})
	host, _, err := net.SplitHostPort(c.listen)
	if err != nil {
		return fmt.Errorf("--listen: %w", err)
	}
	tlsCfg, err := controlplane.TLSConfig(ca, append([]string{host, "127.0.0.1", "::1"}, c.hosts...))
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", c.listen)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: cp.TLSHandler(), TLSConfig: tlsCfg, ReadHeaderTimeout: 10 * time.Second,
		ErrorLog: slog.NewLogLogger(logger.Handler(), slog.LevelWarn)}
	fmt.Printf("control plane listening on https://%s (CA: %s)\n", ln.Addr(), filepath.Join(pkiDir, "ca.pem"))
	fmt.Printf("CWSANDBOX_API_KEY is in %s\n", filepath.Join(c.dataDir, adminKeyFile))
	return serveUntilDone(ctx, srv, ln, logger, "control plane shutting down; runners keep their last-known policy")
}

// controlPlaneTransport is how a gateway reaches the control plane at addr (--control-plane):
// over TLS, trusting ca. The admin API is forwarded on it and the store check
// (storecheck.go) asks on it, so both use the same connections.
func controlPlaneTransport(addr string, ca *pki.CA) (*http.Transport, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("--control-plane: %w", err)
	}
	tc := pki.ClientTLSConfig(nil, ca.Pool(), host)
	return &http.Transport{TLSClientConfig: tc, ForceAttemptHTTP2: true, IdleConnTimeout: time.Minute}, nil
}

// controlPlaneProxy forwards the admin API to the control plane at addr over tr. While it
// is unreachable the calls fail UNAVAILABLE (HTTP 503, which gRPC and Connect clients read
// as UNAVAILABLE) with a message that says so.
func controlPlaneProxy(addr string, tr http.RoundTripper, log *slog.Logger) http.Handler {
	return &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.Out.URL.Scheme, r.Out.URL.Host = "https", addr
			r.Out.Host = addr
		},
		Transport:     tr,
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			log.Warn("control plane unreachable", "path", r.URL.Path, "err", err)
			msg := "control plane unavailable: admin changes cannot be made now (running sandboxes are unaffected); retry later: " + err.Error()
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Retry-After", "5")
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = fmt.Fprintf(w, `{"code":"unavailable","message":%q}`, msg)
		},
	}
}
