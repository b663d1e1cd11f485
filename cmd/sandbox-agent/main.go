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
	flag.Parse()
	os.Exit(agent.Main(o))
}
