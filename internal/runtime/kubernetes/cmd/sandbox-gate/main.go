// Command sandbox-gate is the Kubernetes backend's in-Pod helper; see
// internal/runtime/kubernetes/gate. Usage:
//
//	sandbox-gate install          copy /sandbox-agent and /sandbox-gate into the bin emptyDir
//	sandbox-gate exec-agent       complete the agent config and exec sandbox-agent (PID 1)
//	sandbox-gate serve [--hold C] mTLS front of the agent's unix socket (sidecar); --hold: see gate.ServeOptions.HoldFor
//	sandbox-gate noop             exit 0 (the image container of a pre-pull Pod: its image is pulled)
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"syscall"

	"github.com/sandboxd/sandboxd/internal/agentconfig"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes/gate"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: sandbox-gate install|exec-agent|serve|noop")
		os.Exit(2)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil)).With("component", "sandbox-gate")
	var err error
	switch os.Args[1] {
	case "install":
		err = gate.Install("/", gate.BinDir, "sandbox-agent", "sandbox-gate")
		if err == nil {
			// A sandbox with egress secrets: its CA and bundle for the workload.
			err = gate.InstallEgressBundle(gate.EgressSrcDir, gate.EgressDir)
		}
	case "exec-agent":
		err = gate.ExecAgent(slices.Contains(os.Args[2:], gate.FlagTerminationLog))
	case "noop":
		return
	case "serve":
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
		defer stop()
		hold := ""
		if i := slices.Index(os.Args, gate.FlagHold); i >= 2 && i+1 < len(os.Args) {
			hold = os.Args[i+1]
		}
		containers := "" // a single-container Pod mounts no ContainersDir
		if st, serr := os.Stat(gate.ContainersDir); serr == nil && st.IsDir() {
			containers = gate.ContainersDir
		}
		err = gate.Serve(ctx, gate.ServeOptions{
			ContainersDir:  containers,
			CertFile:       filepath.Join(gate.TLSDir, gate.TLSCertFile),
			KeyFile:        filepath.Join(gate.TLSDir, gate.TLSKeyFile),
			ClientCertFile: filepath.Join(gate.TLSDir, gate.ClientCertFile),
			Upstream:       filepath.Join(gate.RunDir, gate.Socket),
			StatusFile:     filepath.Join(gate.RunDir, agentconfig.StatusFile),
			TerminationLog: gate.TerminationLogPath,
			HoldFor:        hold,
			HelloAddr:      os.Getenv(gate.HelloAddrEnv),
			HelloID:        os.Getenv(gate.HelloIDEnv),
			HelloKeyFile:   filepath.Join(gate.TLSDir, gate.HelloKeyFile),
			Logger:         log,
		})
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		log.Error(os.Args[1], "err", err)
		os.Exit(1)
	}
}
