package agent

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/sandboxd/sandboxd/internal/agentconfig"
)

// MainOptions are the sandbox-agent command line.
type MainOptions struct {
	ConfigPath string
	StateDir   string
	ListenFD   int // < 0: listen on Config.Listen
	// SeccompFilter, when set, is a seccomp filter (classic BPF) Main installs on
	// every thread first of all; without it Main returns 1 (seccomp.go).
	SeccompFilter string
	// SeccompSHA256 is the hex SHA-256 the filter's bytes must have (from the OCI
	// config, which the sandbox's filesystem cannot change); required with it.
	SeccompSHA256 string
	// TerminationLog: see Options.TerminationLog.
	TerminationLog string
}

// Main runs sandbox-agent as a process and returns its exit code. SIGTERM and SIGINT stop
// the main command.
func Main(o MainOptions) int {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})).With("component", "sandbox-agent")
	if o.SeccompFilter != "" {
		if err := InstallSeccompFilter(o.SeccompFilter, o.SeccompSHA256); err != nil {
			log.Error("seccomp filter", "err", err)
			return 1
		}
	}
	cfg, err := agentconfig.Load(o.ConfigPath)
	if err != nil {
		log.Error("load config", "err", err)
		return 1
	}
	// Values kept out of the config file (secrets): from this process's environment.
	cfg.TakeEnvFromProcess(os.LookupEnv)
	var rl *relistener
	var ln net.Listener
	if a, ok := strings.CutPrefix(cfg.Listen, "unix:"); ok && o.ListenFD < 0 && a != "" {
		// Listening itself (gVisor): suspended for checkpoints (relisten.go).
		if rl, err = newRelistener(a, o.StateDir, o.ConfigPath); err == nil {
			ln = rl
		}
	} else {
		ln, err = listen(o.ListenFD, cfg.Listen)
	}
	if err != nil {
		log.Error("listen", "err", err)
		return 1
	}
	if ln, err = WithIdentity(ln, cfg.Identity); err != nil {
		log.Error("listen", "err", err)
		return 1
	}
	if rl != nil {
		rl.handleSignals(log.Warn)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	code, err := Run(ctx, Options{Config: cfg, StateDir: o.StateDir, Listener: ln, Logger: log, TerminationLog: o.TerminationLog})
	if err != nil {
		log.Error("run", "err", err)
	}
	return code
}

func listen(fd int, addr string) (net.Listener, error) {
	if fd >= 0 {
		f := os.NewFile(uintptr(fd), "listener")
		ln, err := net.FileListener(f)
		f.Close()
		if err == nil {
			return ln, nil
		}
		if addr == "" {
			return nil, fmt.Errorf("inherited listener fd %d: %w", fd, err)
		}
	}
	network, a, ok := strings.Cut(addr, ":")
	switch {
	case !ok || a == "":
		return nil, fmt.Errorf("listen address %q: want unix:/path or tcp:host:port", addr)
	case network == "unix":
		_ = os.Remove(a)
		return net.Listen("unix", a)
	case network == "tcp":
		return net.Listen("tcp", a)
	}
	return nil, fmt.Errorf("listen address %q: unknown network %q", addr, network)
}
