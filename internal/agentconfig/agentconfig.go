// Package agentconfig is the contract between a backend and sandbox-agent: where the
// agent finds its binary, configuration and state inside the sandbox, and what the
// configuration holds.
package agentconfig

import (
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"
)

// Paths inside the sandbox. The backend mounts them; the agent relies on them.
const (
	Dir        = "/.sandboxd"
	BinaryPath = Dir + "/bin/sandbox-agent" // read-only
	ConfigPath = Dir + "/config.json"       // read-only
	// SeccompPath is the sandbox's seccomp filter (a classic BPF program, read-only),
	// when the backend hands it to the agent to install (--seccomp-filter) instead of
	// the OCI runtime compiling the profile (local backend, seccompcache.go).
	SeccompPath = Dir + "/seccomp.bpf"
	// StateDir is writable and shared with the host: the agent keeps the main command's
	// logs (logs/main.log + logs/main.idx, see internal/logstore) and status.json there,
	// so the runner can read both after the sandbox has exited.
	StateDir = Dir + "/run"
	// ListenFD is the inherited listening socket the agent serves on (local backend).
	// Without it the agent listens on Config.Listen.
	ListenFD = 3
	// StatusFile (in StateDir) is the last StatusResponse, as protojson, rewritten
	// atomically on every change from the main command's first RUNNING (or the first
	// other state) on; a new agent removes one left there and writes none while STARTING.
	StatusFile = "status.json"
	LogsDir    = "logs"
	MainLog    = "main"
)

// Config tells the agent what to run.
type Config struct {
	// Argv is the resolved main command: image entrypoint/cmd merged with the spec.
	Argv       []string `json:"argv"`
	Env        []string `json:"env"`         // KEY=VALUE, image env overridden by spec env
	WorkingDir string   `json:"working_dir"` // "" = /
	// User is the image's user: "", "name", "uid", "uid:gid", "name:group"; resolved by
	// the agent against the sandbox's /etc/passwd and /etc/group.
	User         string `json:"user,omitempty"`
	Files        []File `json:"files,omitempty"`
	RestartLimit int    `json:"restart_limit"`
	// Listen is "unix:/path" or "tcp:host:port" when no socket is inherited.
	Listen string `json:"listen,omitempty"`
	// Hostname is informational; the runtime sets the UTS hostname.
	Hostname string `json:"hostname,omitempty"`
	// Standby makes the agent serve without a main command (Argv is empty) until the
	// backend sends the real Config with the Start call: a pooled, pre-started sandbox.
	Standby bool `json:"standby,omitempty"`
	// HoldExit keeps the agent from exiting when the main command has ended for good:
	// it reports the end as always (status file, Watch) and stops serving, then stays
	// until the backend kills it. The local backend sets it on the primary of a
	// multi-container gVisor sandbox, whose agent is PID 1 of the sentry's root PID
	// namespace: its exit would kill the other containers at once, before the backend
	// has given them their grace period.
	HoldExit bool `json:"hold_exit,omitempty"`
	// Identity is what the agent proves on every connection before serving it (see
	// agent.VerifyIdentity): the backend checks it reached this sandbox's agent and no
	// other. Set at creation; a Start call cannot change it.
	Identity *Identity `json:"identity,omitempty"`
	// EnvFromProcess names variables the agent takes from its own process environment
	// when it loads the config (TakeEnvFromProcess), overriding Env: values a backend
	// must keep out of every file it writes, e.g. secrets the container runtime injects
	// (the kubernetes backend's secretKeyRef variables). Only the names are in the file.
	EnvFromProcess []string `json:"env_from_process,omitempty"`
}

// TakeEnvFromProcess sets, in c.Env, each EnvFromProcess variable that lookup finds
// (the agent passes os.LookupEnv); one it does not find is left out.
func (c *Config) TakeEnvFromProcess(lookup func(string) (string, bool)) {
	if len(c.EnvFromProcess) == 0 {
		return
	}
	overlay := make(map[string]string, len(c.EnvFromProcess))
	for _, k := range c.EnvFromProcess {
		if v, ok := lookup(k); ok {
			overlay[k] = v
		}
	}
	c.Env = MergeEnv(c.Env, overlay)
}

// Identity is an agent's sandbox (container) ID and the per-sandbox secret, hex, that
// the backend generated for it.
type Identity struct {
	ID     string `json:"id"`
	Secret string `json:"secret"`
}

// File is written before the main command first starts.
type File struct {
	Path    string `json:"path"`
	Content []byte `json:"content"`
	Mode    uint32 `json:"mode,omitempty"`
}

// Load reads a Config from path.
func Load(path string) (*Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read agent config: %w", err)
	}
	var c Config
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, fmt.Errorf("parse agent config %s: %w", path, err)
	}
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("agent config %s: %w", path, err)
	}
	return &c, nil
}

// Validate checks what the agent needs: a main command, unless in standby.
func (c *Config) Validate() error {
	switch {
	case c.Standby && len(c.Argv) > 0:
		return fmt.Errorf("a standby config has no argv")
	case !c.Standby && len(c.Argv) == 0:
		return fmt.Errorf("empty argv")
	}
	return nil
}

// MergeEnv returns base (KEY=VALUE) with overlay's variables overriding it: base order
// first, overridden in place, then overlay's new keys sorted. The backend uses it for
// image env + spec env, the agent for sandbox env + exec env.
func MergeEnv(base []string, overlay map[string]string) []string {
	out := make([]string, 0, len(base)+len(overlay))
	seen := make(map[string]bool, len(overlay))
	for _, kv := range base {
		k, _, _ := strings.Cut(kv, "=")
		v, ok := overlay[k]
		switch {
		case !ok:
			out = append(out, kv)
		case !seen[k]:
			seen[k] = true
			out = append(out, k+"="+v)
		}
	}
	keys := make([]string, 0, len(overlay))
	for k := range overlay {
		if !seen[k] {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		out = append(out, k+"="+overlay[k])
	}
	return out
}
