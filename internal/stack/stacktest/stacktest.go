// Package stacktest prepares what end-to-end tests and benchmarks of the single-host
// stack need: the static agent (testenv.Agent) and a loopback registry holding the test
// images. It needs root: a TestMain asks testenv.MainRequiresRoot before Setup.
package stacktest

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/internal/stack"
	"github.com/sandboxd/sandboxd/internal/testenv"
	"github.com/sandboxd/sandboxd/internal/testimage"
)

// Env is a prepared test environment.
type Env struct {
	AgentBin string
	Registry string // host:port of the loopback registry
	// Bridge, Subnet and CgroupParent keep test sandboxes apart from a real runner's.
	Bridge       string
	Subnet       netip.Prefix
	CgroupParent string
	dir          string
	stopRegistry func()
}

// Setup removes what an earlier process of name that is gone left on the host (its
// cgroups and bridges: removeStale), links the agent (testenv.Agent) and starts the
// registry. Each test process gets its own
// bridge, /24 subnet, nftables table and cgroup parent (derived from name and the
// process ID; the cgroup parent's from its PID namespace too), so test binaries running at the same time on one host never share them.
func Setup(name string) (*Env, error) {
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("needs root (runc, namespaces, cgroups)")
	}
	dir, err := os.MkdirTemp("", "sandboxd-"+name+"-")
	if err != nil {
		return nil, err
	}
	// A run of name that died (a -timeout panic, a kill) ran no cleanup: what it left
	// goes before this one adds its own.
	if stale := removeStale(name); len(stale) > 0 {
		fmt.Printf("stacktest: removed what an earlier %s run, gone, left on the host:\n  %s\n", name, strings.Join(stale, "\n  "))
	}
	pid := os.Getpid()
	env := &Env{
		Bridge:       bridgeName(name, pid),
		Subnet:       netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(200 + pid%50), byte(pid / 50 % 256), 0}), 24),
		CgroupParent: cgroupParent(name, pidNS(), pid),
		dir:          dir,
	}
	if env.AgentBin, err = testenv.Agent(dir); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	host, stop, err := testimage.Standard(context.Background(), nil)
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("test images: %w", err)
	}
	env.Registry, env.stopRegistry = host, stop
	return env, nil
}

// Close stops the registry, removes the agent's link and this process's (by now empty)
// cgroup parents, StackConfigN's too, in every hierarchy (a pure cgroup v2 host's
// /sys/fs/cgroup/<parent> as well as a v1 host's /sys/fs/cgroup/<controller>/<parent>).
// HostLeftovers then says what stayed.
func (e *Env) Close() {
	e.stopRegistry()
	os.RemoveAll(e.dir)
	for _, p := range e.parents() {
		RemoveCgroupParent(p) // rmdir: fails, rightly, if a sandbox's cgroup is still inside
	}
}

// Busybox and Python are the references of the test images.
func (e *Env) Busybox() string { return e.Registry + "/sandboxd/busybox:latest" }
func (e *Env) Python() string  { return e.Registry + "/sandboxd/python:3.11" }

// Stack starts a single-host stack on dataDir.
func (e *Env) Stack(dataDir string) (*stack.Stack, error) {
	return stack.NewLocal(context.Background(), e.StackConfig(dataDir))
}

// StackConfig is the stack configuration Stack uses, for tests that change some of it
// (e.g. turn on the warm pool).
func (e *Env) StackConfig(dataDir string) stack.Config {
	return e.StackConfigN(dataDir, 0)
}

// StackConfigN is the configuration of this process's n-th independent stack (n ≤ 9),
// for tests that run several runners side by side: stack 0 is StackConfig's; stack n>0
// has its own bridge, /24 subnet, nftables table and cgroup parent.
func (e *Env) StackConfigN(dataDir string, n int) stack.Config {
	c := e.stackConfig(dataDir)
	if n == 0 {
		return c
	}
	c.Bridge = fmt.Sprintf("%s%d", e.Bridge, n%10)
	c.NetTable = "sandboxd_" + c.Bridge
	// 10.250-255.<pid mod 256>.0: beside stack 0's 10.200-249 range.
	c.Subnet = netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(250 + n%6), byte(os.Getpid()), 0}), 24)
	c.CgroupParent = fmt.Sprintf("%s-%d", e.CgroupParent, n)
	return c
}

func (e *Env) stackConfig(dataDir string) stack.Config {
	return stack.Config{
		DataDir:            dataDir,
		AgentBinary:        e.AgentBin,
		InsecureRegistries: []string{e.Registry},
		Bridge:             e.Bridge,
		NetTable:           "sandboxd_" + e.Bridge,
		Subnet:             e.Subnet,
		CgroupParent:       e.CgroupParent,
		ExpiryGrace:        time.Second,
		GCGrace:            time.Nanosecond,
		// Test sandboxes talk to nothing beyond this machine.
		NoEgress:    true,
		Nameservers: []string{},
		// SANDBOXD_TEST_OCI_RUNTIME=crun runs the runc class with crun (docs/oci-runtime.md).
		OCIRuntime: os.Getenv("SANDBOXD_TEST_OCI_RUNTIME"),
	}
}
