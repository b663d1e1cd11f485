package main

import (
	"flag"
	"fmt"
	"math"
	"strings"
	"unicode"

	"github.com/sandboxd/sandboxd/internal/placement"
	"github.com/sandboxd/sandboxd/internal/quantity"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// capacityFlags are what a runner offers and how it admits sandboxes, shared by the
// runner and dev commands.
type capacityFlags struct {
	cpu, memory  string
	maxSandboxes int
	overcommit   float64
	// The default requests and limits of a sandbox that asks for none.
	cpuRequest, memoryRequest, cpuLimit, memoryLimit string
	// What container-engine sandboxes run with (none without an image).
	engineImage, engineRuntimeClass string
	// The image image builders run (none: the runner builds no images), their egress
	// and their layer caches.
	builderImage   string
	buildEgress    listFlag
	buildCacheSize string
	buildCaches    int

	// What parse made of them.
	milliCPU, memoryBytes int64
	defaults              runtime.Resources
	buildEgressRules      []runtime.EgressRule
	buildCacheBytes       int64
}

func (c *capacityFlags) register(fs *flag.FlagSet) {
	d := runner.DefaultResources
	fs.StringVar(&c.cpu, "cpu", "", "CPU offered to sandboxes, e.g. 4 or 3500m (default: the host's CPUs)")
	fs.StringVar(&c.memory, "memory", "", "memory offered to sandboxes, e.g. 8Gi (default: the host's memory)")
	fs.IntVar(&c.maxSandboxes, "max-sandboxes", runner.DefaultMaxSandboxes, "most live sandboxes on this runner")
	fs.Float64Var(&c.overcommit, "cpu-overcommit", runner.DefaultCPUOvercommit, "sandboxes are admitted by their requests: their CPU requests may add up to this many times --cpu (memory is never overcommitted; 1: none)")
	fs.StringVar(&c.cpuRequest, "default-cpu-request", quantity.FormatCPU(d.RequestMilliCPU), "CPU request of a sandbox that asks for none (what it is admitted by); a policy's base.resources wins")
	fs.StringVar(&c.memoryRequest, "default-memory-request", quantity.FormatMemory(d.RequestMemoryBytes), "memory request of a sandbox that asks for none; a policy's base.resources wins")
	fs.StringVar(&c.cpuLimit, "default-cpu-limit", quantity.FormatCPU(d.MilliCPU), "CPU limit of a sandbox that sets none (never below its request); a policy's base.resources wins")
	fs.StringVar(&c.memoryLimit, "default-memory-limit", quantity.FormatMemory(d.MemoryBytes), "memory limit of a sandbox that sets none (never below its request); a policy's base.resources wins")
	fs.StringVar(&c.engineImage, "engine-image", "", "image holding Docker Engine that container-engine sandboxes (control CONTROL_CONTAINER_ENGINE) run; empty: this runner runs none")
	fs.StringVar(&c.engineRuntimeClass, "engine-runtime-class", runner.DefaultEngineRuntimeClass, "runtime class container-engine sandboxes run under (one that hosts Docker Engine safely)")
	fs.StringVar(&c.builderImage, "builder-image", "", "image holding Buildah that image builds run in, under the gvisor runtime class (docs/builds.md); empty: this runner builds no images")
	fs.Var(&c.buildEgress, "build-egress", "where image builds' RUN steps may connect: any, cidr=PREFIX or dns=NAME, then ,port=P[-Q][/udp|/sctp] (repeatable; e.g. cidr=203.0.113.80/32,port=80 for an apt mirror); default none. The host's addresses, the sandbox subnet and the reserved ranges stay unreachable whatever it says")
	fs.StringVar(&c.buildCacheSize, "build-cache-size", quantity.FormatMemory(runner.DefaultBuildCacheBytes), "quota of each organization's layer cache on this runner (a btrfs subvolume of the volume pool); 0: builds keep no cache")
	fs.IntVar(&c.buildCaches, "build-caches", runner.DefaultBuildCaches, "most organizations' layer caches this runner keeps (the least recently used idle ones go first)")
}

// parse checks the flags (before anything starts).
func (c *capacityFlags) parse() error {
	var err error
	positive := func(name, v string, parse func(string) (int64, error), example string) int64 {
		n, perr := parse(v)
		if err == nil && (perr != nil || n <= 0) {
			err = fmt.Errorf("--%s %q: want a positive quantity such as %s", name, v, example)
		}
		return n
	}
	if c.cpu != "" {
		c.milliCPU = positive("cpu", c.cpu, quantity.ParseCPU, "4 or 500m")
	}
	if c.memory != "" {
		c.memoryBytes = positive("memory", c.memory, quantity.ParseMemory, "8Gi")
	}
	d := runtime.Resources{
		RequestMilliCPU:    positive("default-cpu-request", c.cpuRequest, quantity.ParseCPU, "100m"),
		RequestMemoryBytes: positive("default-memory-request", c.memoryRequest, quantity.ParseMemory, "128Mi"),
		MilliCPU:           positive("default-cpu-limit", c.cpuLimit, quantity.ParseCPU, "1"),
		MemoryBytes:        positive("default-memory-limit", c.memoryLimit, quantity.ParseMemory, "1Gi"),
	}
	switch {
	case err != nil:
		return err
	case c.maxSandboxes < 1:
		return fmt.Errorf("--max-sandboxes %d: want at least 1", c.maxSandboxes)
	case math.IsNaN(c.overcommit) || c.overcommit < 1 || c.overcommit > placement.MaxCPUOvercommit:
		return fmt.Errorf("--cpu-overcommit %v: want a factor from 1 (none) to %d", c.overcommit, placement.MaxCPUOvercommit)
	case d.RequestMilliCPU > d.MilliCPU:
		return fmt.Errorf("--default-cpu-request %s is above --default-cpu-limit %s", c.cpuRequest, c.cpuLimit)
	case d.RequestMemoryBytes > d.MemoryBytes:
		return fmt.Errorf("--default-memory-request %s is above --default-memory-limit %s", c.memoryRequest, c.memoryLimit)
	case strings.ContainsFunc(c.engineImage, unicode.IsSpace) || len(c.engineImage) > 1024:
		return fmt.Errorf("--engine-image %q: want an image reference (no spaces, at most 1024 bytes)", c.engineImage)
	case strings.ContainsFunc(c.builderImage, unicode.IsSpace) || len(c.builderImage) > 1024:
		return fmt.Errorf("--builder-image %q: want an image reference (no spaces, at most 1024 bytes)", c.builderImage)
	case c.engineRuntimeClass == "":
		return fmt.Errorf("--engine-runtime-class: want a runtime class (default %s)", runner.DefaultEngineRuntimeClass)
	case c.buildCaches < 1:
		return fmt.Errorf("--build-caches %d: want at least 1", c.buildCaches)
	case len(c.buildEgress) > runner.MaxNetworkRules:
		return fmt.Errorf("--build-egress: at most %d rules, got %d", runner.MaxNetworkRules, len(c.buildEgress))
	}
	if c.buildCacheBytes, err = quantity.ParseMemory(c.buildCacheSize); err != nil || c.buildCacheBytes < 0 {
		return fmt.Errorf("--build-cache-size %q: want a quantity such as 10Gi, or 0 for no cache", c.buildCacheSize)
	}
	if c.buildCacheBytes == 0 {
		c.buildCacheBytes = -1 // runner.Local: negative is none
	}
	c.buildEgressRules = nil
	for _, s := range c.buildEgress {
		r, err := runner.ParseBuildEgress(s)
		if err != nil {
			return fmt.Errorf("--build-egress: %w", err)
		}
		c.buildEgressRules = append(c.buildEgressRules, r)
	}
	c.defaults = d
	return nil
}

// apply configures l with the parsed flags.
func (c *capacityFlags) apply(l *runner.Local) {
	l.MilliCPU, l.MemoryBytes, l.MaxSandboxes = c.milliCPU, c.memoryBytes, c.maxSandboxes
	l.CPUOvercommit, l.Defaults = c.overcommit, c.defaults
	l.EngineImage, l.EngineRuntimeClass = c.engineImage, c.engineRuntimeClass
	l.BuilderImage = c.builderImage
	l.BuildEgress, l.BuildCacheBytes, l.BuildCaches = c.buildEgressRules, c.buildCacheBytes, c.buildCaches
}
