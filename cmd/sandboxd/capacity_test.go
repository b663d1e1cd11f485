package main

import (
	"flag"
	"reflect"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// TestCapacityFlags: the defaults are the documented ones, flags reach the runner, and
// inconsistent values are refused naming the flag.
func TestCapacityFlags(t *testing.T) {
	parse := func(args ...string) (*runner.Local, error) {
		var c capacityFlags
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		c.register(fs)
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		if err := c.parse(); err != nil {
			return nil, err
		}
		var l runner.Local
		c.apply(&l)
		return &l, nil
	}
	l, err := parse()
	if err != nil {
		t.Fatal(err)
	}
	if l.Defaults != runner.DefaultResources || l.CPUOvercommit != runner.DefaultCPUOvercommit || l.MaxSandboxes != runner.DefaultMaxSandboxes || l.MilliCPU != 0 ||
		l.EngineImage != "" || l.EngineRuntimeClass != runner.DefaultEngineRuntimeClass || l.BuilderImage != "" ||
		l.BuildEgress != nil || l.BuildCacheBytes != runner.DefaultBuildCacheBytes || l.BuildCaches != runner.DefaultBuildCaches {
		t.Errorf("defaults: %+v", l)
	}
	l, err = parse("--cpu", "2", "--cpu-overcommit", "1.5", "--default-cpu-request", "250m", "--default-memory-limit", "2Gi",
		"--engine-image", "localhost/engine:1", "--engine-runtime-class", "gvisor-engine", "--builder-image", "localhost/builder:1",
		"--build-egress", "cidr=203.0.113.80/32,port=80", "--build-egress", "dns=pypi.org", "--build-cache-size", "2Gi", "--build-caches", "3")
	if err != nil {
		t.Fatal(err)
	}
	want := runtime.Resources{RequestMilliCPU: 250, RequestMemoryBytes: 128 << 20, MilliCPU: 1000, MemoryBytes: 2 << 30}
	if l.MilliCPU != 2000 || l.CPUOvercommit != 1.5 || l.Defaults != want || l.EngineImage != "localhost/engine:1" || l.EngineRuntimeClass != "gvisor-engine" ||
		l.BuilderImage != "localhost/builder:1" || l.BuildCacheBytes != 2<<30 || l.BuildCaches != 3 ||
		!reflect.DeepEqual(l.BuildEgress, []runtime.EgressRule{{CIDR: "203.0.113.80/32", Ports: []runtime.PortRange{{Port: 80}}}, {DNSName: "pypi.org"}}) {
		t.Errorf("set: %+v", l)
	}
	if l, err := parse("--build-cache-size", "0"); err != nil || l.BuildCacheBytes >= 0 {
		t.Errorf("--build-cache-size 0: %v, cache bytes %d, want none (negative)", err, l.BuildCacheBytes)
	}
	for _, bad := range [][]string{
		{"--cpu-overcommit", "0.5"},
		{"--default-cpu-request", "2", "--default-cpu-limit", "1"},
		{"--default-memory-limit", "0"},
		{"--default-memory-request", "lots"},
		{"--max-sandboxes", "0"},
		{"--engine-image", "a b"},
		{"--builder-image", "a b"},
		{"--build-egress", "tenant=same_org"},
		{"--build-egress", "cidr=10.1.2.3/8"},
		{"--build-cache-size", "-1Gi"},
		{"--build-cache-size", "lots"},
		{"--build-caches", "0"},
		{"--engine-runtime-class", ""},
	} {
		if _, err := parse(bad...); err == nil || !strings.Contains(err.Error(), bad[0]) && !strings.Contains(err.Error(), bad[len(bad)-2]) {
			t.Errorf("%v: %v, want a refusal naming the flag", bad, err)
		}
	}
}
