package main

import (
	"errors"
	"flag"
	"fmt"
	"github.com/sandboxd/sandboxd/internal/audit"
	"log/slog"
	"math"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/controlplane"
	"github.com/sandboxd/sandboxd/internal/dataplane"
	"github.com/sandboxd/sandboxd/internal/gateway"
	"github.com/sandboxd/sandboxd/internal/install"
	"github.com/sandboxd/sandboxd/internal/rollout"
	"github.com/sandboxd/sandboxd/internal/runtime/local"
	"github.com/sandboxd/sandboxd/internal/secretbox"
)

// Each subcommand has a configuration: bind declares its flags (names, defaults and help
// are the command line's contract), validate checks it without I/O before anything
// starts, and run does the work. A check that needs the world (a file, the control
// plane, a port) stays in run.

// defaultDataDir is every subcommand's state directory unless --data-dir says otherwise.
const defaultDataDir = "/var/lib/sandboxd"

// defaultRunnerID is the ID of a runner that is given none (and is not registered).
const defaultRunnerID = "local"

// flagBinder is a subcommand's configuration.
type flagBinder interface{ bind(fs *flag.FlagSet) }

// parseFlags parses args into cfg's flags (in a flag set named name: -h prints them and
// exits 0, a bad flag exits 2) and returns the names of the flags given.
func parseFlags(name string, cfg flagBinder, args []string) (given map[string]bool, err error) {
	fs := flag.NewFlagSet(name, flag.ExitOnError)
	cfg.bind(fs)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	given = map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	return given, nil
}

// parseRunnerFlags parses and validates `sandboxd runner`'s flags. Unlike parseFlags it
// returns a bad flag as an error (after printing it and the usage, as flag does) instead
// of exiting, so that a new version on trial can roll back first (refusedFlags); -h
// still prints the flags and exits 0.
func parseRunnerFlags(cfg *runnerConfig, args []string) error {
	fs := flag.NewFlagSet("runner", flag.ContinueOnError)
	cfg.bind(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		return err
	}
	return cfg.validate()
}

// newLogger logs text to stderr from level on, or from the level below (Info → Debug,
// Warn → Info) when verbose (-v).
func newLogger(level slog.Level, verbose bool) *slog.Logger {
	if verbose {
		level -= 4
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
}

// pkiDirOf is --pki-dir, by default DATA-DIR/pki.
func pkiDirOf(dataDir, pkiDir string) string {
	if pkiDir == "" {
		return filepath.Join(dataDir, "pki")
	}
	return pkiDir
}

// listFlag is a repeatable string flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

// devConfig configures `sandboxd dev`.
type devConfig struct {
	metrics metricsFlags // --metrics-listen
	trace   tracingFlags // --otlp-endpoint, --otlp-protocol, --trace-sample-ratio

	dataDir, listen, runnerID, storeDSN string
	testImageMirror                     bool
	warmPool, warmTargets               int
	warmDemand                          warmPoolFlags // --warm-pool-max, --warm-pool-memory
	edgeListen, baseDomain              string
	dataPlaneListen                     string
	dataPlaneTTL                        time.Duration
	trustedProxies                      string
	auditRetention                      time.Duration
	verbose                             bool
	hard                                hardeningFlags
	capacity                            capacityFlags
	blob                                blobFlags
	fss                                 fssFlags
	quota                               quotaFlags
	registry                            registryFlags
	builds                              buildFlags
	health                              healthFlags
	// secretKeyFile: the secret stores' key ring (default DATA-DIR/secret-store.key).
	secretKeyFile string
	// bridge, subnet, cgroupParent: as the runner's flags, so that several `sandboxd
	// dev` (test suites of other checkouts) share no bridge, DNS address, nftables table
	// or cgroup parent on one host.
	bridge, subnet, cgroupParent string
	// edgeListenGiven and dataPlaneListenGiven: the flag was on the command line. If not,
	// a listener that cannot start on its default address is left out with a warning.
	edgeListenGiven, dataPlaneListenGiven bool
}

func (c *devConfig) bind(fs *flag.FlagSet) {
	c.metrics.bind(fs, defaultMetricsDev)
	c.trace.bind(fs, "sandboxd-dev", os.Getenv)
	fs.StringVar(&c.secretKeyFile, "secret-key-file", "", "key ring the built-in secret stores seal values with (made 0600 when missing); default DATA-DIR/"+secretbox.DefaultFile)
	fs.StringVar(&c.dataDir, "data-dir", defaultDataDir, "state directory")
	fs.StringVar(&c.listen, "listen", "127.0.0.1:8080", "address the API listens on (gRPC, Connect, gRPC-Web over h2c)")
	fs.StringVar(&c.runnerID, "runner-id", defaultRunnerID, "ID of the local runner")
	fs.StringVar(&c.storeDSN, "store", "", "store DSN: postgres://… or a SQLite file (default DATA-DIR/"+storeFile+")")
	fs.BoolVar(&c.testImageMirror, "test-image-mirror", true, "serve the test images (make images) as docker.io's python:3.11 and busybox from a loopback registry (dev only; false: Docker Hub)")
	fs.IntVar(&c.warmPool, "warm-pool", 4, "pre-started containers kept at least per recently used image, more after bursts of creates (--warm-pool-max, --warm-pool-memory); 0 disables the warm pool")
	c.warmDemand.bind(fs)
	fs.IntVar(&c.warmTargets, "warm-pool-templates", local.DefaultMaxTargeted, "pre-started containers kept in total for templates' warm pools (sandboxd.warmPool; 0: none)")
	fs.StringVar(&c.edgeListen, "edge-listen", "127.0.0.1:8443", "address of the edge that publishes sandbox endpoints (443 in production; empty: no edge)")
	fs.StringVar(&c.baseDomain, "base-domain", DefaultBaseDomain, "endpoints are https://PORT-SANDBOX.RUNNER.BASE-DOMAIN (*.localhost resolves to loopback)")
	fs.StringVar(&c.dataPlaneListen, "data-plane-listen", "127.0.0.1:8444", "address of the direct mTLS data plane clients run exec, logs and files on (empty: gateway only)")
	fs.DurationVar(&c.dataPlaneTTL, "data-plane-cert-ttl", dataplane.DefaultCertTTL, "lifetime of the client certificates ConnectSandbox issues")
	fs.StringVar(&c.trustedProxies, "trusted-proxies", "", trustedProxiesHelp)
	fs.DurationVar(&c.auditRetention, "audit-retention", audit.DefaultRetention, auditRetentionHelp)
	fs.BoolVar(&c.verbose, "v", false, "log at debug level")
	fs.StringVar(&c.bridge, "bridge", "", "sandbox bridge (default sbx0; another one also gets its own nftables table)")
	fs.StringVar(&c.subnet, "subnet", "", "sandbox subnet (default 10.88.0.0/16)")
	fs.StringVar(&c.cgroupParent, "cgroup-parent", "", "cgroup of the sandboxes (default sandboxd)")
	c.hard.register(fs)
	c.capacity.register(fs)
	c.blob.register(fs, "default DATA-DIR/blobs")
	c.blob.registerRunner(fs)
	c.fss.register(fs)
	c.quota.register(fs)
	c.registry.register(fs, true)
	c.builds.register(fs)
	c.health.register(fs)
}

func (c devConfig) validate() error {
	if err := c.metrics.validate(); err != nil {
		return err
	}
	if err := c.health.validate(); err != nil {
		return err
	}
	if err := c.trace.validate(); err != nil {
		return err
	}
	if _, err := gateway.ParseTrustedProxies(c.trustedProxies); err != nil {
		return fmt.Errorf("--trusted-proxies: %w", err)
	}
	if err := (audit.Config{Retention: c.auditRetention}).Validate(); err != nil {
		return fmt.Errorf("--audit-retention: %w", err)
	}
	if err := c.capacity.parse(); err != nil { // c is a copy: parse's results are dropped
		return err
	}
	if err := c.builds.validate(); err != nil {
		return err
	}
	if err := c.registry.validate(); err != nil {
		return err
	}
	if err := c.blob.validate(); err != nil {
		return err
	}
	if _, err := c.fss.options(nil); err != nil {
		return err
	}
	if _, err := c.quota.options(nil, ""); err != nil {
		return err
	}
	return c.hard.validate()
}

// runnerConfig configures `sandboxd runner`.
type runnerConfig struct {
	metrics metricsFlags // --metrics-listen
	trace   tracingFlags // --otlp-endpoint, --otlp-protocol, --trace-sample-ratio

	dataDir, pkiDir, listen, runnerID            string
	insecure                                     listFlag
	mirrors                                      mirrorFlags
	bridge, subnet, cgroupParent                 string
	noEgress                                     bool
	warmTargets                                  int
	hostMark                                     uint
	controlPlane, bootstrapToken, controlPlaneCA string
	heartbeatInterval                            time.Duration
	edgeListen                                   string
	edgePublicPort                               int
	baseDomain                                   string
	capacity                                     capacityFlags
	backend                                      string
	kube                                         kubernetesFlags
	hard                                         hardeningFlags
	acme                                         acmeFlags
	dataPlaneListen, dataPlaneHost               string
	verbose                                      bool
	blob                                         blobFlags
	blobStore                                    blobStore // opened from blob in run
	// Self-update of a local-backend runner (internal/selfupdate).
	selfUpdate         bool
	selfUpdateDeadline time.Duration
	releaseKeys        string
	// args are the flags as given (a self-update checks the new version accepts them).
	args []string
}

func (c *runnerConfig) bind(fs *flag.FlagSet) {
	c.metrics.bind(fs, defaultMetricsRunner)
	c.trace.bind(fs, "sandboxd-runner", os.Getenv)
	fs.StringVar(&c.dataDir, "data-dir", defaultDataDir, "state directory")
	fs.StringVar(&c.pkiDir, "pki-dir", "", "directory of the platform CA (ca.pem, ca-key.pem), shared with the gateways; default DATA-DIR/pki")
	fs.StringVar(&c.listen, "listen", "127.0.0.1:7443", "address gateways reach the runner at (gRPC over mTLS)")
	fs.StringVar(&c.runnerID, "runner-id", defaultRunnerID, "ID of this runner; its certificate carries it as a DNS name")
	fs.Var(&c.insecure, "insecure-registry", "registry host[:port] reached over plain HTTP (repeatable)")
	c.mirrors.register(fs)
	fs.StringVar(&c.bridge, "bridge", "", "sandbox bridge (default sbx0)")
	fs.StringVar(&c.subnet, "subnet", "", "sandbox subnet (default 10.88.0.0/16)")
	fs.StringVar(&c.cgroupParent, "cgroup-parent", "", "cgroup of the sandboxes (default sandboxd)")
	fs.BoolVar(&c.noEgress, "no-egress", false, "sandboxes reach nothing beyond this host")
	fs.IntVar(&c.warmTargets, "warm-pool-templates", local.DefaultMaxTargeted, "pre-started containers kept in total for templates' warm pools (sandboxd.warmPool; 0: none)")
	fs.UintVar(&c.hostMark, "host-mark", 0, "socket mark that lets the edge's connections into the sandbox bridge; nothing else on the host gets in (default 0x5bd00000)")
	fs.StringVar(&c.controlPlane, "control-plane", "", "HOST:PORT of the control plane (`sandboxd controlplane`): register with --bootstrap-token on first start, then heartbeat; without it the runner uses --pki-dir")
	fs.StringVar(&c.bootstrapToken, "bootstrap-token", "", "one-time token from :createBootstrapToken (first start only; later starts use the credentials in DATA-DIR/identity)")
	fs.StringVar(&c.controlPlaneCA, "control-plane-ca", "", "PEM file of the CA to trust the control plane by (default: the CA pinned in the bootstrap token)")
	fs.DurationVar(&c.heartbeatInterval, "heartbeat-interval", controlplane.DefaultHeartbeatInterval, "how often to heartbeat the control plane")
	fs.StringVar(&c.edgeListen, "edge-listen", "", "address of the edge that publishes sandbox endpoints, e.g. :443 (empty: no edge); its certificate comes from the control plane, or from the CA in --pki-dir")
	fs.IntVar(&c.edgePublicPort, "edge-public-port", 0, "port clients reach the edge at, in endpoint URLs, when it differs from --edge-listen's (e.g. a Kubernetes Service's 443 in front of the Pod's 8443); 0: --edge-listen's")
	fs.StringVar(&c.baseDomain, "base-domain", DefaultBaseDomain, "endpoints are PORT-SANDBOX.RUNNER-ID.BASE-DOMAIN")
	c.capacity.register(fs)
	fs.StringVar(&c.backend, "backend", "local", "where sandboxes run: local (runc/gVisor on this host) or kubernetes (one Pod each)")
	c.kube.register(fs)
	c.hard.register(fs)
	c.acme.register(fs)
	fs.StringVar(&c.dataPlaneListen, "data-plane-listen", "", "address of the direct mTLS data plane clients run exec, logs and files on, e.g. :8444 (empty: gateway only); its certificate comes from the data-plane CA in --pki-dir")
	fs.StringVar(&c.dataPlaneHost, "data-plane-host", "", "host clients reach the data plane by (default: the --data-plane-listen host)")
	fs.BoolVar(&c.verbose, "v", false, "log at debug level")
	fs.BoolVar(&c.selfUpdate, "self-update", true, "local backend, registered: install the version the control plane asks for (download, verify, swap the binaries, re-execute in place; sandboxes keep running)")
	fs.DurationVar(&c.selfUpdateDeadline, "self-update-deadline", 2*time.Minute, "how long a new version has to be ready with a heartbeat through before the previous one is restored")
	fs.StringVar(&c.releaseKeys, "release-keys", "", "PEM file of Ed25519 public keys: self-update installs only releases whose manifest one of them signed")
	c.blob.register(fs, "e.g. DATA-DIR/blobs (default: none, and the runner takes no snapshots)")
	c.blob.registerRunner(fs)
}

func (c runnerConfig) validate() error {
	if err := c.metrics.validate(); err != nil {
		return err
	}
	if err := c.trace.validate(); err != nil {
		return err
	}
	if err := c.blob.validate(); err != nil {
		return err
	}
	if c.backend != "local" && c.backend != "kubernetes" {
		return fmt.Errorf("--backend %q: want local or kubernetes", c.backend)
	}
	if err := c.capacity.parse(); err != nil { // c is a copy: parse's results are dropped
		return err
	}
	if c.backend != "kubernetes" && c.kube.leaderElect {
		return errors.New("--leader-elect needs --backend kubernetes")
	}
	if err := c.hard.validate(); err != nil {
		return err
	}
	if c.backend == "kubernetes" {
		if err := c.kube.validate(); err != nil {
			return err
		}
	} else {
		if c.hostMark > math.MaxUint32 {
			return fmt.Errorf("--host-mark %#x: more than 32 bits", c.hostMark)
		}
		if c.subnet != "" {
			if _, err := netip.ParsePrefix(c.subnet); err != nil {
				return fmt.Errorf("--subnet: %w", err)
			}
		}
	}
	if _, _, err := net.SplitHostPort(c.listen); err != nil {
		return fmt.Errorf("--listen: %w", err)
	}
	if c.selfUpdateDeadline < 10*time.Second {
		return fmt.Errorf("--self-update-deadline %s: at least 10s", c.selfUpdateDeadline)
	}
	if c.edgeListen != "" {
		// The ACME flags only matter to the edge.
		if err := c.acme.validate(); err != nil {
			return fmt.Errorf("--acme-directory: %w", err)
		}
	}
	return nil
}

// trustedProxiesHelp documents --trusted-proxies (gateway and dev).
const trustedProxiesHelp = "comma-separated CIDRs or addresses of reverse proxies in front of the API whose X-Forwarded-For names the caller, for runners' source-IP allowlists (the right-most address outside these is the caller); default none: the TCP peer is the caller"

// gatewayConfig configures `sandboxd gateway`.
type gatewayConfig struct {
	metrics metricsFlags // --metrics-listen
	trace   tracingFlags // --otlp-endpoint, --otlp-protocol, --trace-sample-ratio

	dataDir, storeDSN, pkiDir, listen, name string
	runners                                 listFlag
	reconcileInterval, orphanGrace          time.Duration
	controlPlane                            string
	dataPlaneTTL                            time.Duration
	baseDomain                              string
	trustedProxies                          string
	auditRetention                          time.Duration
	verbose                                 bool
	blob                                    blobFlags
	fss                                     fssFlags
	quota                                   quotaFlags
	registry                                registryFlags
	builds                                  buildFlags
	health                                  healthFlags
	// secretKeyFile: the secret stores' key ring (default PKI-DIR/secret-store.key).
	secretKeyFile string
}

func (c *gatewayConfig) bind(fs *flag.FlagSet) {
	c.metrics.bind(fs, defaultMetricsGateway)
	c.trace.bind(fs, "sandboxd-gateway", os.Getenv)
	fs.StringVar(&c.secretKeyFile, "secret-key-file", "", "key ring the built-in secret stores seal values with (\"<id> <base64 AES-256 key>\" lines, the last seals; made 0600 when missing; KMS-style: a mounted file); default PKI-DIR/"+secretbox.DefaultFile+", shared by replicas")
	fs.StringVar(&c.dataDir, "data-dir", defaultDataDir, "state directory (the SQLite store, admin-api-key)")
	fs.StringVar(&c.storeDSN, "store", "", "store DSN: postgres://… or a SQLite file (default DATA-DIR/"+storeFile+")")
	fs.StringVar(&c.pkiDir, "pki-dir", "", "directory of the platform CA shared with the runners; default DATA-DIR/pki")
	fs.StringVar(&c.listen, "listen", "127.0.0.1:8080", "address the API listens on (gRPC, Connect, gRPC-Web over h2c)")
	fs.StringVar(&c.name, "name", "gateway", "this gateway's name, in its client certificate (spiffe://sandboxd/gateway/NAME)")
	fs.Var(&c.runners, "runner", "a runner as ID=HOST:PORT (repeatable)")
	fs.DurationVar(&c.reconcileInterval, "reconcile-interval", gateway.DefaultReconcileInterval, "how often to compare the runners' sandboxes with the index")
	fs.DurationVar(&c.orphanGrace, "orphan-grace", gateway.DefaultOrphanGrace, "age at which a sandbox that no gateway recorded (its create was interrupted) is deleted")
	fs.StringVar(&c.controlPlane, "control-plane", "", "HOST:PORT of `sandboxd controlplane`: admin calls are forwarded there (UNAVAILABLE while it is down) and runners heartbeat it themselves; it must use this gateway's --store (checked at start: another store refuses the start; then every minute: admin calls wait for a passing check and are refused after another store, sandboxes are served); without it the gateway serves the admin API and heartbeats its runners")
	fs.DurationVar(&c.dataPlaneTTL, "data-plane-cert-ttl", dataplane.DefaultCertTTL, "lifetime of the client certificates ConnectSandbox issues for runners' direct data planes")
	fs.StringVar(&c.baseDomain, "base-domain", DefaultBaseDomain, "the control plane's --base-domain: a tenant organization's runner is reached directly only at RUNNER-ID.BASE-DOMAIN or a name under it")
	fs.StringVar(&c.trustedProxies, "trusted-proxies", "", trustedProxiesHelp)
	fs.DurationVar(&c.auditRetention, "audit-retention", audit.DefaultRetention, auditRetentionHelp)
	fs.BoolVar(&c.verbose, "v", false, "log at debug level")
	c.blob.register(fs, "shared with the runners (default: none, no snapshots)")
	c.fss.register(fs)
	c.quota.register(fs)
	c.registry.register(fs, false)
	c.builds.register(fs)
	c.health.register(fs)
}

func (c gatewayConfig) validate() error {
	if err := c.metrics.validate(); err != nil {
		return err
	}
	if err := c.health.validate(); err != nil {
		return err
	}
	if err := c.trace.validate(); err != nil {
		return err
	}
	if _, err := gateway.ParseTrustedProxies(c.trustedProxies); err != nil {
		return fmt.Errorf("--trusted-proxies: %w", err)
	}
	if err := (audit.Config{Retention: c.auditRetention}).Validate(); err != nil {
		return fmt.Errorf("--audit-retention: %w", err)
	}
	if err := c.blob.validate(); err != nil {
		return err
	}
	if err := c.builds.validate(); err != nil {
		return err
	}
	if err := c.registry.validate(); err != nil {
		return err
	}
	if _, err := c.runnerAddrs(); err != nil {
		return err
	}
	if _, err := c.fss.options(nil); err != nil {
		return err
	}
	if _, err := c.quota.options(nil, ""); err != nil {
		return err
	}
	if c.controlPlane != "" {
		if _, _, err := net.SplitHostPort(c.controlPlane); err != nil {
			return fmt.Errorf("--control-plane: %w", err)
		}
	}
	return nil
}

// runnerAddr is one --runner ID=HOST:PORT.
type runnerAddr struct{ id, addr string }

// runnerAddrs are the --runner flags.
func (c gatewayConfig) runnerAddrs() ([]runnerAddr, error) {
	if len(c.runners) == 0 {
		return nil, errors.New("at least one --runner ID=HOST:PORT is required")
	}
	var out []runnerAddr
	for _, r := range c.runners {
		id, addr, ok := strings.Cut(r, "=")
		if !ok || id == "" || addr == "" {
			return nil, fmt.Errorf("--runner %q: want ID=HOST:PORT", r)
		}
		out = append(out, runnerAddr{id, addr})
	}
	return out, nil
}

// controlPlaneConfig configures `sandboxd controlplane`.
type controlPlaneConfig struct {
	metrics metricsFlags // --metrics-listen
	trace   tracingFlags // --otlp-endpoint, --otlp-protocol, --trace-sample-ratio

	dataDir, storeDSN, pkiDir, listen string
	hosts                             listFlag
	auditRetention                    time.Duration
	heartbeatInterval                 time.Duration
	baseDomain                        string
	releaseKeys                       string
	verbose                           bool
	// The automatic rollout (internal/rollout).
	rolloutTick, rolloutDeadline time.Duration
	rolloutBatch                 int
	noRollout                    bool
	// releaseDir: binaries of published releases served to self-updating runners.
	releaseDir string
	// Runners installed into registered clusters (issue 18).
	install         controlplane.InstallConfig
	installArgs     listFlag
	installPrepull  int
	installClasses  string
	installTimeouts struct{ apply, heartbeat time.Duration }
	// secretKeyFile: the secret stores' key ring, made here at first start so that
	// gateways sharing the PKI dir find it (default PKI-DIR/secret-store.key).
	secretKeyFile string
}

func (c *controlPlaneConfig) bind(fs *flag.FlagSet) {
	c.metrics.bind(fs, defaultMetricsControlPlane)
	c.trace.bind(fs, "sandboxd-controlplane", os.Getenv)
	fs.StringVar(&c.dataDir, "data-dir", defaultDataDir, "state directory (the SQLite store, admin-api-key, pki/)")
	fs.StringVar(&c.storeDSN, "store", "", "store DSN: postgres://… or a SQLite file (default DATA-DIR/"+storeFile+")")
	fs.StringVar(&c.pkiDir, "pki-dir", "", "directory of the platform CA; default DATA-DIR/pki")
	fs.StringVar(&c.secretKeyFile, "secret-key-file", "", "key ring of the built-in secret stores, made 0600 when missing for the gateways that share the PKI dir; default PKI-DIR/"+secretbox.DefaultFile)
	fs.StringVar(&c.listen, "listen", "127.0.0.1:8443", "address of the TLS listener (admin API and runner registration)")
	fs.Var(&c.hosts, "host", "extra DNS name or IP in the listener's certificate (repeatable)")
	fs.DurationVar(&c.heartbeatInterval, "heartbeat-interval", controlplane.DefaultHeartbeatInterval, "how often runners heartbeat")
	fs.StringVar(&c.baseDomain, "base-domain", controlplane.DefaultEndpointDomain, "domain of public endpoints (PORT-SANDBOX.RUNNER.BASE-DOMAIN): runners' edge certificates are issued for it")
	fs.StringVar(&c.releaseKeys, "release-keys", "", "PEM file of the Ed25519 public keys release manifests are signed with (sandboxd release keygen): publish only releases they sign (default: none, unsigned release records)")
	fs.BoolVar(&c.verbose, "v", false, "log at debug level")
	fs.DurationVar(&c.rolloutTick, "rollout-tick", rollout.DefaultTick, "how often the automatic rollout moves runners to their channel's version")
	fs.IntVar(&c.rolloutBatch, "rollout-batch", rollout.DefaultBatch, "how many runners of one runner group may update at once")
	fs.DurationVar(&c.rolloutDeadline, "rollout-deadline", rollout.DefaultDeadline, "how long an updated runner has to report the new version and ready before it is rolled back and its channel's rollout halted")
	fs.DurationVar(&c.auditRetention, "audit-retention", audit.DefaultRetention, auditRetentionHelp+"; the control plane records its admin writes into its store")
	fs.BoolVar(&c.noRollout, "no-rollout", false, "do not run the automatic rollout here (ApplyAvailableUpdate still sets desired versions; nothing clears them or rolls back)")
	fs.StringVar(&c.releaseDir, "release-dir", "", "directory of release binaries, DIR/VERSION/GOARCH/{sandboxd,sandbox-agent}, served to single-host runners that update themselves (empty: none)")
	fs.StringVar(&c.install.RunnerImage, "install-runner-image", "", "runner image of the runners the control plane installs into registered clusters (repository:tag or @digest)")
	fs.StringVar(&c.install.AgentImage, "install-agent-image", "", "sandbox-agent image of installed runners")
	fs.StringVar(&c.install.ControlPlaneAddress, "install-control-plane-url", "", "HOST:PORT at which installed runners reach this control plane")
	fs.StringVar(&c.install.PullPolicy, "install-image-pull-policy", "IfNotPresent", "pull policy of the installed runner image")
	fs.StringVar(&c.install.SandboxPullPolicy, "install-sandbox-image-pull-policy", "IfNotPresent", "pull policy installed runners give sandbox and agent images")
	fs.StringVar(&c.install.StorageClass, "install-storage-class", "", "storage class of installed runners' data volumes (default: the cluster's)")
	fs.StringVar(&c.install.BaseDomain, "install-base-domain", "", "base domain of installed runners' edges (default: the runner's)")
	fs.Var(&c.installArgs, "install-runner-arg", "extra argument of installed runners (repeatable)")
	fs.IntVar(&c.installPrepull, "install-prepull-images", install.DefaultPrepullImages, "images installed runners pre-pull onto their cluster's nodes (their --prepull-images); 0: none, and no ClusterRole (list on nodes) is installed")
	fs.StringVar(&c.installClasses, "install-runtime-classes", "", "runtime classes installed runners offer (their --runtime-classes): comma-separated class=RuntimeClass pairs, runc among them, e.g. 'runc=,gvisor=gvisor' (an empty RuntimeClass: the cluster's default runtime); default: not passed, runc only")
	fs.BoolVar(&c.install.Egress, "install-egress", false, "installed runners serve the egress proxy and DNS (host-name egress rules, egress secrets; the chart's egress.enabled at its defaults): a Service and a NetworkPolicy "+install.EgressName+" and the runner's --egress-* args; off, each install deletes them. Applied at install and at an installed runner's next update (its objects re-applied; docs/admin.md)")
	fs.DurationVar(&c.installTimeouts.apply, "install-apply-timeout", 2*time.Minute, "how long an install may take to apply a runner's objects")
	fs.DurationVar(&c.installTimeouts.heartbeat, "install-heartbeat-timeout", 10*time.Minute, "how long an installed runner has to heartbeat before its install is FAILED")
}

func (c controlPlaneConfig) validate() error {
	if err := c.metrics.validate(); err != nil {
		return err
	}
	if err := c.trace.validate(); err != nil {
		return err
	}
	if _, _, err := net.SplitHostPort(c.listen); err != nil {
		return fmt.Errorf("--listen: %w", err)
	}
	if err := (audit.Config{Retention: c.auditRetention}).Validate(); err != nil {
		return fmt.Errorf("--audit-retention: %w", err)
	}
	if c.rolloutBatch < 1 {
		return fmt.Errorf("--rollout-batch must be at least 1 (got %d)", c.rolloutBatch)
	}
	if c.rolloutTick <= 0 || c.rolloutDeadline <= 0 {
		return fmt.Errorf("--rollout-tick and --rollout-deadline must be positive (got %s, %s)", c.rolloutTick, c.rolloutDeadline)
	}
	if err := c.rolloutConfig().Validate(); err != nil {
		return fmt.Errorf("--rollout-*: %w", err)
	}
	if c.releaseDir != "" {
		fi, err := os.Stat(c.releaseDir)
		if err != nil {
			return fmt.Errorf("--release-dir: %w", err)
		}
		if !fi.IsDir() {
			return fmt.Errorf("--release-dir %s: not a directory", c.releaseDir)
		}
	}
	if a := c.install.ControlPlaneAddress; a != "" {
		if _, _, err := net.SplitHostPort(a); err != nil {
			return fmt.Errorf("--install-control-plane-url: want HOST:PORT: %w", err)
		}
	}
	for _, p := range []struct{ flag, v string }{{"install-image-pull-policy", c.install.PullPolicy}, {"install-sandbox-image-pull-policy", c.install.SandboxPullPolicy}} {
		switch p.v {
		case "", "Always", "IfNotPresent", "Never":
		default:
			return fmt.Errorf("--%s: want Always, IfNotPresent or Never (got %q)", p.flag, p.v)
		}
	}
	if c.installPrepull < 0 {
		return fmt.Errorf("--install-prepull-images must be 0 or more (got %d)", c.installPrepull)
	}
	if _, err := install.ParseRuntimeClasses(c.installClasses); err != nil {
		return fmt.Errorf("--install-runtime-classes: %w", err)
	}
	if err := install.CheckExtraArgs(c.install.Egress, c.installArgs); err != nil {
		return fmt.Errorf("--install-egress with --install-runner-arg: %w", err)
	}
	if c.installTimeouts.apply <= 0 || c.installTimeouts.heartbeat <= 0 {
		return errors.New("--install-apply-timeout and --install-heartbeat-timeout must be positive")
	}
	return nil
}

// rolloutConfig is the automatic rollout's part of the flags (Store and Targets are the
// caller's).
func (c controlPlaneConfig) rolloutConfig() rollout.Config {
	return rollout.Config{Tick: c.rolloutTick, Batch: c.rolloutBatch, Deadline: c.rolloutDeadline, HeartbeatInterval: c.heartbeatInterval}
}

// installConfig is the install flags as the control plane takes them.
func (c controlPlaneConfig) installConfig() controlplane.InstallConfig {
	ic := c.install
	ic.ExtraArgs = c.installArgs
	n := c.installPrepull
	ic.PrepullImages = &n
	ic.RuntimeClasses, _ = install.ParseRuntimeClasses(c.installClasses) // validated
	ic.ApplyTimeout, ic.HeartbeatTimeout = c.installTimeouts.apply, c.installTimeouts.heartbeat
	return ic
}

// apikeyConfig configures `sandboxd apikey create`.
type apikeyConfig struct {
	dataDir, storeDSN, org, role, name string
}

func (c *apikeyConfig) bind(fs *flag.FlagSet) {
	fs.StringVar(&c.dataDir, "data-dir", defaultDataDir, "state directory")
	fs.StringVar(&c.storeDSN, "store", "", "store DSN: postgres://… or a SQLite file (default DATA-DIR/"+storeFile+")")
	fs.StringVar(&c.org, "org", defaultOrg, "organization")
	fs.StringVar(&c.role, "role", "user", "user or admin")
	fs.StringVar(&c.name, "name", "", "a name to recognise the key by")
}

func (c apikeyConfig) validate() error {
	_, err := c.authRole()
	return err
}

// authRole is --role.
func (c apikeyConfig) authRole() (auth.Role, error) {
	switch c.role {
	case "user":
		return auth.RoleUser, nil
	case "admin":
		return auth.RoleAdmin, nil
	}
	return "", fmt.Errorf("unknown role %q (user or admin)", c.role)
}

// demoConfig configures `sandboxd demo`. It has nothing to validate.
type demoConfig struct {
	dataDir, image, insecure string
	verbose                  bool
}

func (c *demoConfig) bind(fs *flag.FlagSet) {
	fs.StringVar(&c.dataDir, "data-dir", defaultDataDir, "state directory")
	fs.StringVar(&c.image, "image", "", "image to run (default: the busybox test image, served from a registry on loopback)")
	fs.StringVar(&c.insecure, "insecure-registries", "", "comma-separated registries that may be reached over plain HTTP")
	fs.BoolVar(&c.verbose, "v", false, "log runtime events")
}

const auditRetentionHelp = "how long the audit log keeps an event (at least 1h; pruned hourly)"
