package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/sandboxd/sandboxd/internal/nodeagent"
	"github.com/sandboxd/sandboxd/internal/nodeagent/cri"
	"github.com/sandboxd/sandboxd/internal/nodeagent/store"
)

// nodeAgentConfig is `sandboxd node-agent`'s flags (docs/nodeagent.md).
type nodeAgentConfig struct {
	node, runnerID                              string
	namespaces                                  listFlag
	shimRoot, checkpointRoot, stateDir          string
	criEndpoint, runtimeHandler, listen, tlsDir string
	quotaBytes, minFreeBytes                    int64
	gcInterval                                  time.Duration
	verbose                                     bool
}

func (c *nodeAgentConfig) bind(fs *flag.FlagSet) {
	fs.StringVar(&c.node, "node", os.Getenv("NODE_NAME"), "this node's name (default $NODE_NAME; the runner pins restore Pods to it)")
	fs.StringVar(&c.runnerID, "runner-id", "", "the runner this agent serves: its client certificate must name it (spiffe://sandboxd/node-agent-client/<id>), and only its Pods (label sandboxd.io/runner-id) are checkpointed")
	fs.Var(&c.namespaces, "namespace", "a namespace whose Pods may be checkpointed (the runner's sandbox namespace); repeatable, or comma-separated")
	fs.StringVar(&c.shimRoot, "shim-root", "/run/containerd/runsc", "the gVisor shim's `root` (its hibernate sockets are <root>/<sandbox>_sandbox.sock)")
	fs.StringVar(&c.checkpointRoot, "checkpoint-root", "/var/lib/sandboxd/checkpoints", "the shim's sandboxd_checkpoint_root: images are <root>/<id> (a directory owned by root, mode 0700)")
	fs.StringVar(&c.stateDir, "state-dir", "/var/lib/sandboxd/node-agent", "the agents' state: each runner's index is <state-dir>/<runner-id> (made 0700, held under an exclusive lock: one agent per runner)")
	fs.StringVar(&c.criEndpoint, "cri-endpoint", "unix:///run/containerd/containerd.sock", "the CRI socket Pods are resolved through")
	fs.StringVar(&c.runtimeHandler, "runtime-handler", "runsc", "the CRI runtime handler of gVisor Pods (others are refused)")
	fs.StringVar(&c.listen, "listen", ":7445", "address of the TLS (gRPC) port")
	fs.StringVar(&c.tlsDir, "tls-dir", "/etc/sandboxd/node-agent-tls", "directory of tls.crt, tls.key (the agent's server certificate) and ca.crt (the runner's node-agent CA); re-read when they change")
	fs.Int64Var(&c.quotaBytes, "quota-bytes", 20<<30, "this agent's (its runner's) checkpoint images on this node at most this many bytes; another runner's agent has its own")
	fs.Int64Var(&c.minFreeBytes, "min-free-bytes", 2<<30, "refuse a checkpoint that would leave less than this free on the checkpoint root's file system")
	fs.DurationVar(&c.gcInterval, "gc-interval", 10*time.Minute, "how often orphan and incomplete images (older than 10m) are removed")
	fs.BoolVar(&c.verbose, "v", false, "debug logging")
}

func (c *nodeAgentConfig) validate() error {
	var errs []error
	if c.node == "" {
		errs = append(errs, errors.New("--node (or $NODE_NAME) is required"))
	}
	if err := cri.ValidRunnerID(c.runnerID); err != nil {
		errs = append(errs, fmt.Errorf("--runner-id: %w", err))
	}
	if len(c.namespaceList()) == 0 {
		errs = append(errs, errors.New("--namespace is required"))
	}
	for name, p := range map[string]string{"--shim-root": c.shimRoot, "--checkpoint-root": c.checkpointRoot, "--state-dir": c.stateDir, "--tls-dir": c.tlsDir} {
		if !filepath.IsAbs(p) || filepath.Clean(p) != p {
			errs = append(errs, fmt.Errorf("%s %q: want an absolute, clean path", name, p))
		}
	}
	if c.quotaBytes <= 0 || c.minFreeBytes < 0 {
		errs = append(errs, errors.New("--quota-bytes must be positive, --min-free-bytes not negative"))
	}
	if c.gcInterval < time.Minute {
		errs = append(errs, errors.New("--gc-interval must be at least 1m"))
	}
	return errors.Join(errs...)
}

func (c *nodeAgentConfig) namespaceList() []string {
	var out []string
	for _, v := range c.namespaces {
		for _, ns := range strings.Split(v, ",") {
			if ns = strings.TrimSpace(ns); ns != "" {
				out = append(out, ns)
			}
		}
	}
	return out
}

func nodeAgentCmd(args []string) error {
	var c nodeAgentConfig
	if _, err := parseFlags("node-agent", &c, args); err != nil {
		return err
	}
	if err := c.validate(); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return c.run(ctx, newLogger(slog.LevelInfo, c.verbose))
}

func (c *nodeAgentConfig) run(ctx context.Context, log *slog.Logger) error {
	resolver, err := cri.New(cri.Config{Endpoint: c.criEndpoint, Namespaces: c.namespaceList(), RuntimeHandler: c.runtimeHandler})
	if err != nil {
		return err
	}
	defer func() { _ = resolver.Close() }()
	// One state directory per runner (under --state-dir), held under a flock: a second
	// agent of the same runner (a surge Pod) refuses to start.
	if err := os.MkdirAll(c.stateDir, 0o700); err != nil {
		return err
	}
	st, err := store.Open(store.Config{
		Root: c.checkpointRoot, StateDir: filepath.Join(c.stateDir, c.runnerID), Owner: c.runnerID, Log: log,
		QuotaBytes: c.quotaBytes, MinFreeBytes: c.minFreeBytes,
		RequireRoot: true,
	})
	if err != nil {
		return err
	}
	defer func() { _ = st.Close() }()
	srv, err := nodeagent.NewServer(nodeagent.Config{
		Node: c.node, RunnerID: c.runnerID, Resolver: resolver,
		Checkpointer: nodeagent.ShimCheckpointer{ShimRoot: c.shimRoot}, Store: st, Log: log,
	})
	if err != nil {
		return err
	}
	// The TLS files come from a Secret the runner writes once it has started: wait for them.
	tlsCfg, err := waitTLS(ctx, c.tlsDir, c.runnerID, log)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", c.listen)
	if err != nil {
		return err
	}
	go srv.RunGC(ctx, c.gcInterval)
	hs := srv.HTTPServer(tlsCfg)
	errc := make(chan error, 1)
	go func() { errc <- hs.ServeTLS(ln, "", "") }()
	log.Info("node agent serving", "addr", ln.Addr().String(), "node", c.node, "runner", c.runnerID, "namespaces", c.namespaceList())
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

func waitTLS(ctx context.Context, dir, runnerID string, log *slog.Logger) (*tls.Config, error) {
	for logged := false; ; {
		cfg, err := nodeagent.ServerTLSConfig(dir, runnerID)
		if err == nil {
			return cfg, nil
		}
		if !logged {
			log.Info("node agent: waiting for the TLS files (the runner writes them)", "dir", dir, "err", err)
			logged = true
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(2 * time.Second):
		}
	}
}
