// Package stack wires the single-host parts together: image store, sandbox network,
// local backend and runner. `sandboxd demo`, `sandboxd dev` and the end-to-end tests
// all build the same stack here.
package stack

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/sandboxd/sandboxd/internal/blob"
	"github.com/sandboxd/sandboxd/internal/blob/blobconfig"
	"github.com/sandboxd/sandboxd/internal/image"
	"github.com/sandboxd/sandboxd/internal/reserved"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime/local"
	"github.com/sandboxd/sandboxd/internal/runtime/local/network"
)

// Config configures a single-host stack.
type Config struct {
	DataDir     string // everything persistent lives below it
	AgentBinary string // static sandbox-agent on the host
	// InsecureRegistries may be reached over plain HTTP (e.g. "127.0.0.1:*").
	InsecureRegistries []string
	RegistryAuth       map[string]image.Credentials
	Mirrors            map[string][]image.Mirror
	Bridge             string       // default "sbx0"
	NetTable           string       // nftables table; default "sandboxd"
	Subnet             netip.Prefix // default 10.88.0.0/16
	CgroupParent       string       // default "sandboxd"
	NoEgress           bool
	// OpenReserved are reserved ranges explicit cidr egress rules may reach
	// (network.Config.OpenReserved).
	OpenReserved []netip.Prefix
	// Nameservers are the upstreams of the platform DNS that answers sandboxes on their
	// gateway ("ip" or "ip:port"); nil = the host's.
	Nameservers []string
	// EgressProxyPort is the gateway port of the SNI proxy enforcing dns_name egress
	// rules; 0 = network.DefaultProxyPort.
	EgressProxyPort int
	// EgressUpstreamCAFile: PEM roots the egress proxy verifies the hosts it injects
	// secrets for against ("": the system roots; network.Config.EgressUpstreamCAFile).
	EgressUpstreamCAFile string
	// EgressRootsFile: the host CA bundle sandboxes with egress secrets trust besides
	// their own CA ("": the system bundle; local.Config.EgressRootsFile).
	EgressRootsFile string
	// HostMark is the socket mark the host's connections into the sandbox bridge need
	// (the edge's carry it, see EdgeDialMark); 0 = network.DefaultHostMark. Nothing else
	// on the host reaches a sandbox port.
	HostMark    uint32
	Retention   time.Duration
	ExpiryGrace time.Duration
	// GCInterval is how often unused images are removed (default 10 min); GCGrace
	// spares images pulled less than this long ago (default 10 min).
	GCInterval time.Duration
	GCGrace    time.Duration
	// Pool keeps pre-started containers of recently used images so creates of them take
	// milliseconds (local.PoolConfig); the zero value disables it.
	Pool local.PoolConfig
	// DiskBytes limits each sandbox's writable layer (local.Config.DiskBytes; 0: none).
	DiskBytes int64
	// NoUserNS runs runc sandboxes without user namespaces (local.Config.NoUserNS).
	NoUserNS bool
	// ForkSentries bounds the forks' sandboxes not restored yet (local.Config.ForkSentries).
	ForkSentries int
	// CheckpointQuotaBytes and CheckpointMinFreeBytes bound the gVisor checkpoints in the
	// data dir (local.Config's).
	CheckpointQuotaBytes, CheckpointMinFreeBytes int64
	// OCIRuntime runs the runc class with runc ("", "runc") or crun
	// (local.Config.OCIRuntime).
	OCIRuntime string
	Logger     *slog.Logger
	// Blobs, BlobConfig and the snapshot limits: see runner.Config (nil: no file-system
	// snapshots).
	Blobs                                   blob.Store
	BlobConfig                              blobconfig.Config
	SnapshotsPerSandbox, SnapshotsPerRunner int
}

// Stack is a running single-host sandbox runtime.
type Stack struct {
	Images  *image.Store
	Network *network.Manager
	Backend *local.Backend
	Runner  *runner.Runner
	stopGC  context.CancelFunc
	gcDone  chan struct{}
}

// NewLocal builds the stack and re-adopts sandboxes left by an earlier run.
func NewLocal(ctx context.Context, cfg Config) (*Stack, error) {
	if cfg.DataDir == "" {
		return nil, fmt.Errorf("stack: no data dir")
	}
	if cfg.Bridge == "" {
		cfg.Bridge = "sbx0"
	}
	if !cfg.Subnet.IsValid() {
		cfg.Subnet = netip.MustParsePrefix("10.88.0.0/16")
	}
	if cfg.CgroupParent == "" {
		cfg.CgroupParent = "sandboxd"
	}
	if cfg.EgressProxyPort == 0 {
		cfg.EgressProxyPort = network.DefaultProxyPort
	}
	if cfg.GCInterval <= 0 {
		cfg.GCInterval = 10 * time.Minute
	}
	if cfg.GCGrace <= 0 {
		cfg.GCGrace = 10 * time.Minute
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.AgentBinary == "" {
		p, err := FindAgent()
		if err != nil {
			return nil, err
		}
		cfg.AgentBinary = p
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("stack: %w", err)
	}
	store, err := image.Open(image.Options{
		Root:     filepath.Join(cfg.DataDir, "images"),
		Insecure: cfg.InsecureRegistries,
		Auth:     cfg.RegistryAuth,
		Mirrors:  cfg.Mirrors,
		GCGrace:  cfg.GCGrace,
		// Never a probe of the host or its sandboxes: loopback, link-local, the host's
		// addresses (the image package's own) and the sandbox subnet.
		Forbidden: func(a netip.Addr) bool { return cfg.Subnet.Contains(a) || reserved.IsHostAddr(a) },
	})
	if err != nil {
		return nil, fmt.Errorf("stack: image store: %w", err)
	}
	nw, err := network.New(network.Config{
		Bridge:      cfg.Bridge,
		Subnet:      cfg.Subnet,
		StateDir:    filepath.Join(cfg.DataDir, "network"),
		Table:       cfg.NetTable,
		Egress:      !cfg.NoEgress,
		Nameservers: cfg.Nameservers,
		ProxyPort:   cfg.EgressProxyPort,

		EgressUpstreamCAFile: cfg.EgressUpstreamCAFile,
		HostMark:             cfg.HostMark,

		OpenReserved: cfg.OpenReserved,
	})
	if err != nil {
		return nil, fmt.Errorf("stack: network: %w", err)
	}
	// The platform DNS and the egress proxy live as long as the stack (Close).
	if err := nw.StartEgress(cfg.Logger); err != nil {
		_ = nw.Close()
		return nil, fmt.Errorf("stack: %w", err)
	}
	backend, err := local.New(local.Config{
		StateDir:     filepath.Join(cfg.DataDir, "sandboxes"),
		AgentBinary:  cfg.AgentBinary,
		CgroupParent: cfg.CgroupParent,
		Images:       images{store},
		Network:      netAdapter{nw},
		Logger:       cfg.Logger,
		Pool:         cfg.Pool,
		DiskBytes:    cfg.DiskBytes,
		NoUserNS:     cfg.NoUserNS,
		ForkSentries: cfg.ForkSentries,
		OCIRuntime:   cfg.OCIRuntime,

		CheckpointQuotaBytes:   cfg.CheckpointQuotaBytes,
		CheckpointMinFreeBytes: cfg.CheckpointMinFreeBytes,

		EgressRootsFile: cfg.EgressRootsFile,
	})
	if err != nil {
		_ = nw.Close()
		return nil, fmt.Errorf("stack: local backend: %w", err)
	}
	r, err := runner.New(ctx, runner.Config{
		Backend:     backend,
		DataDir:     filepath.Join(cfg.DataDir, "runner"),
		Retention:   cfg.Retention,
		ExpiryGrace: cfg.ExpiryGrace,
		Logger:      cfg.Logger,
		Blobs:       cfg.Blobs,
		BlobConfig:  cfg.BlobConfig,

		SnapshotsPerSandbox: cfg.SnapshotsPerSandbox,
		SnapshotsPerRunner:  cfg.SnapshotsPerRunner,
	})
	if err != nil {
		_ = backend.Close(context.Background())
		_ = nw.Close()
		return nil, fmt.Errorf("stack: runner: %w", err)
	}
	s := &Stack{Images: store, Network: nw, Backend: backend, Runner: r, gcDone: make(chan struct{})}
	gcCtx, stop := context.WithCancel(context.Background())
	s.stopGC = stop
	go s.collectGarbage(gcCtx, cfg.GCInterval, cfg.Logger)
	return s, nil
}

// Close stops following sandboxes; they keep running for the next stack to re-adopt.
// The warm pool's idle containers are destroyed; sandboxes get no DNS answers until the
// next stack.
func (s *Stack) Close() {
	s.stopGC()
	<-s.gcDone
	s.Runner.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := s.Backend.Close(ctx); err != nil {
		slog.Default().Warn("stack: close warm pool", "err", err)
	}
	// The platform DNS and egress proxy stop (a new stack starts them again); the network
	// itself, rules included, stays for the next stack, and for Network.Cleanup.
	s.Network.StopServices()
}

// EdgeDialMark is the mark for EdgeConfig.DialMark: the one the stack's network lets
// into the sandbox bridge.
func (s *Stack) EdgeDialMark() uint32 { return s.Network.HostMark() }

// GC removes cached images that no live sandbox uses. Images of sandboxes still being
// created are spared by the store's grace period.
func (s *Stack) GC(ctx context.Context) (images, layers int, err error) {
	// Warm-pool containers have their image mounted too; pre-pulled images of the
	// templates the runner may place are kept (at most local.Config.MaxPrepull).
	inUse := append(s.Backend.PoolImages(), s.Backend.PrepulledImages()...)
	for _, sb := range s.Runner.List() {
		if !sb.State.Terminal() && sb.ImageDigest != "" {
			inUse = append(inUse, sb.ImageDigest)
		}
	}
	return s.Images.GC(ctx, inUse)
}

func (s *Stack) collectGarbage(ctx context.Context, every time.Duration, log *slog.Logger) {
	defer close(s.gcDone)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			imgs, layers, err := s.GC(ctx)
			switch {
			case err != nil:
				log.Warn("image garbage collection", "err", err)
			case imgs+layers > 0:
				log.Info("image garbage collection", "images", imgs, "layers", layers)
			}
		}
	}
}

// FindAgent locates the static sandbox-agent: $SANDBOXD_AGENT, next to the running
// binary, or bin/sandbox-agent below the working directory.
func FindAgent() (string, error) {
	if p := os.Getenv("SANDBOXD_AGENT"); p != "" {
		return p, nil
	}
	var candidates []string
	if exe, err := os.Executable(); err == nil {
		candidates = append(candidates, filepath.Join(filepath.Dir(exe), "sandbox-agent"))
	}
	candidates = append(candidates, filepath.Join("bin", "sandbox-agent"))
	for _, c := range candidates {
		if st, err := os.Stat(c); err == nil && st.Mode().IsRegular() {
			return filepath.Abs(c)
		}
	}
	return "", fmt.Errorf("sandbox-agent not found (looked at %v; build it with `make agent` or set SANDBOXD_AGENT)", candidates)
}
