// Command sandbox-agent is PID 1 of every sandbox; see internal/agent.
package main

import (
	"flag"
	"os"

	"github.com/sandboxd/sandboxd/internal/agent"
	"github.com/sandboxd/sandboxd/internal/agentconfig"
)

func main() {
	var o agent.MainOptions
	flag.StringVar(&o.ConfigPath, "config", agentconfig.ConfigPath, "agent configuration (JSON)")
	flag.StringVar(&o.StateDir, "state-dir", agentconfig.StateDir, "writable state dir shared with the host (logs, status.json)")
	flag.IntVar(&o.ListenFD, "listen-fd", agentconfig.ListenFD, "inherited listening socket; -1 = listen on the config's listen address")
	flag.StringVar(&o.SeccompFilter, "seccomp-filter", "", "seccomp filter (classic BPF) to install before anything else; failing to is fatal")
	flag.StringVar(&o.SeccompSHA256, "seccomp-filter-sha256", "", "the hex SHA-256 the seccomp filter's bytes must have (required with --seccomp-filter)")
	flag.StringVar(&o.TerminationLog, "termination-log", "", "an existing file the final status is written into as the agent ends (Kubernetes: /dev/termination-log)")
	flag.Parse()
	os.Exit(agent.Main(o))
}
