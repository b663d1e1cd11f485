package main

import (
	"flag"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/controlplane"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime/local"
)

// validator is a subcommand's configuration that has checks.
type validator interface {
	flagBinder
	validate() error
}

// validateCase is a command line and what validate says of it: "" for valid, else a
// part of the error (the flag it names).
type validateCase struct {
	args []string
	err  string
}

// testValidate binds a new configuration (newCfg) to each case's arguments and checks
// what validate says.
func testValidate(t *testing.T, newCfg func() validator, cases []validateCase) {
	t.Helper()
	for _, tc := range cases {
		name := strings.Join(tc.args, " ")
		if name == "" {
			name = "defaults"
		}
		t.Run(name, func(t *testing.T) {
			cfg := newCfg()
			fs := flag.NewFlagSet("t", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			cfg.bind(fs)
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			err := cfg.validate()
			switch {
			case tc.err == "" && err != nil:
				t.Errorf("validate: %v, want nil", err)
			case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
				t.Errorf("validate: %v, want an error naming %s", err, tc.err)
			}
		})
	}
}

func TestRunnerConfigValidate(t *testing.T) {
	kube := []string{"--backend", "kubernetes", "--agent-image", "example.com/agent:1"}
	testValidate(t, func() validator { return new(runnerConfig) }, []validateCase{
		{args: nil},
		{args: []string{"--backend", "docker"}, err: "--backend"},
		{args: []string{"--cpu-overcommit", "0.5"}, err: "--cpu-overcommit"},
		{args: []string{"--cpu", "lots"}, err: "--cpu"},
		{args: []string{"--default-memory-request", "2Gi", "--default-memory-limit", "1Gi"}, err: "--default-memory-request"},
		{args: []string{"--leader-elect"}, err: "--leader-elect"},
		{args: []string{"--disk", "big"}, err: "--disk"},
		{args: []string{"--egress-allow-reserved", "10.20.0.1/16"}, err: "--egress-allow-reserved"},
		{args: []string{"--egress-allow-reserved", "10.20.0.0/16", "--host-mark", "0x5bd00000", "--subnet", "10.77.0.0/16"}},
		{args: []string{"--host-mark", "0x100000000"}, err: "--host-mark"},
		{args: []string{"--subnet", "10.77.0.0"}, err: "--subnet"},
		{args: []string{"--listen", "7443"}, err: "--listen"},
		// The ACME flags matter only with an edge.
		{args: []string{"--acme-directory", "https://acme.example/dir"}},
		{args: []string{"--edge-listen", ":443", "--acme-directory", "https://acme.example/dir"}, err: "--acme-dns-server"},
		{args: []string{"--edge-listen", ":443", "--acme-directory", "https://acme.example/dir", "--acme-dns-server", "ns:53", "--acme-tsig-key", "k"}, err: "--acme-tsig-secret-file"},
		{args: []string{"--edge-listen", ":443", "--acme-directory", "https://acme.example/dir", "--acme-dns-server", "ns:53", "--acme-tsig-key", "k", "--acme-tsig-secret-file", "/s"}},
		{args: kube},
		{args: append(kube, "--leader-elect", "--runner-peer-cidrs", "10.1.0.0/16", "--runner-peer-pods", "app=runner", "--dns-cidrs", "10.96.0.10/32")},
		// The local backend's network flags mean nothing to the kubernetes one.
		{args: append(kube, "--subnet", "nope", "--host-mark", "0x100000000")},
		{args: []string{"--backend", "kubernetes"}, err: "--agent-image"},
		{args: append(kube, "--image-pull-policy", "Sometimes"), err: "--image-pull-policy"},
		{args: append(kube, "--runner-peer-cidrs", "10.0.0.1"), err: "--runner-peer-cidrs"},
		{args: append(kube, "--runner-peer-pods", "a=b=c"), err: "--runner-peer-pods"},
		{args: append(kube, "--dns-cidrs", "kube-dns"), err: "--dns-cidrs"},
		{args: append(kube, "--disk", "-1"), err: "--disk"},
	})
}

func TestDevConfigValidate(t *testing.T) {
	testValidate(t, func() validator { return new(devConfig) }, []validateCase{
		{args: nil},
		{args: []string{"--cpu", "2", "--memory", "4Gi", "--disk", "0", "--edge-listen", "", "--test-image-mirror=false"}},
		{args: []string{"--max-sandboxes", "0"}, err: "--max-sandboxes"},
		{args: []string{"--default-cpu-request", "2", "--default-cpu-limit", "1"}, err: "--default-cpu-request"},
		{args: []string{"--disk", "10Gb"}, err: "--disk"},
		{args: []string{"--egress-allow-reserved", "203.0.113.0/24"}, err: "--egress-allow-reserved"},
		{args: []string{"--build-retention", "0", "--build-keep", "0"}},
		{args: []string{"--build-retention", "-1h"}, err: "--build-retention"},
		{args: []string{"--build-retention", "5m"}, err: "--build-retention"},
		{args: []string{"--build-keep", "-1"}, err: "--build-keep"},
		{args: []string{"--audit-retention", "720h"}},
		{args: []string{"--audit-retention", "30m"}, err: "--audit-retention"},
		{args: []string{"--audit-retention", "0"}, err: "--audit-retention"},
	})
}

func TestGatewayConfigValidate(t *testing.T) {
	testValidate(t, func() validator { return new(gatewayConfig) }, []validateCase{
		{args: nil, err: "--runner"},
		{args: []string{"--runner", "r1=10.0.0.1:7443", "--runner", "r2=runner-2:7443"}},
		{args: []string{"--runner", "r1=10.0.0.1:7443", "--control-plane", "cp.example:8443"}},
		{args: []string{"--runner", "10.0.0.1:7443"}, err: "--runner"},
		{args: []string{"--runner", "=10.0.0.1:7443"}, err: "--runner"},
		{args: []string{"--runner", "r1="}, err: "--runner"},
		{args: []string{"--runner", "r1=10.0.0.1:7443", "--control-plane", "cp.example"}, err: "--control-plane"},
		{args: []string{"--runner", "r1=10.0.0.1:7443", "--build-retention", "168h", "--build-keep", "10"}},
		{args: []string{"--runner", "r1=10.0.0.1:7443", "--build-keep", "-2"}, err: "--build-keep"},
		{args: []string{"--runner", "r1=10.0.0.1:7443", "--audit-retention", "2160h"}},
		{args: []string{"--runner", "r1=10.0.0.1:7443", "--audit-retention", "-1h"}, err: "--audit-retention"},
		{args: []string{"--runner", "r1=10.0.0.1:7443", "--otlp-endpoint", "http://127.0.0.1:4317", "--trace-sample-ratio", "0.1"}},
		{args: []string{"--runner", "r1=10.0.0.1:7443", "--otlp-endpoint", "collector"}, err: "--otlp-endpoint"},
		{args: []string{"--runner", "r1=10.0.0.1:7443", "--trace-sample-ratio", "1.5"}, err: "--trace-sample-ratio"},
		{args: []string{"--runner", "r1=10.0.0.1:7443", "--otlp-protocol", "thrift"}, err: "--otlp-protocol"},
	})
}

func TestControlPlaneConfigValidate(t *testing.T) {
	testValidate(t, func() validator { return new(controlPlaneConfig) }, []validateCase{
		{args: nil},
		{args: []string{"--listen", ":8443", "--host", "cp.example"}},
		{args: []string{"--listen", "cp.example"}, err: "--listen"},
		{args: []string{"--install-prepull-images", "0"}},
		{args: []string{"--install-prepull-images", "-1"}, err: "--install-prepull-images"},
		{args: []string{"--install-runtime-classes", "runc=,gvisor=gvisor"}},
		{args: []string{"--install-runtime-classes", "gvisor=gvisor"}, err: "--install-runtime-classes: runtime classes: no entry for runc"},
		{args: []string{"--install-runtime-classes", "runc=,gVisor=gvisor"}, err: `--install-runtime-classes: runtime class "gVisor"`},
		{args: []string{"--install-runtime-classes", "runc=,gvisor=run_sc"}, err: `RuntimeClass name "run_sc"`},
		{args: []string{"--install-runtime-classes", "runc=,gvisor"}, err: `"gvisor": want class=RuntimeClass`},
		{args: []string{"--install-runtime-classes", "runc=,runc=x"}, err: `class "runc" given twice`},
		{args: []string{"--audit-retention", "8760h"}},
		{args: []string{"--audit-retention", "59m"}, err: "--audit-retention"},
		{args: []string{"--install-egress"}},
		{args: []string{"--install-egress", "--install-runner-arg", "--egress-forbid=100.64.0.0/10"}},
		{args: []string{"--install-runner-arg", "--egress-proxy-listen=:1"}}, // off: the operator's own
		{args: []string{"--install-egress", "--install-runner-arg", "--egress-proxy-listen=:1"}, err: `--install-egress with --install-runner-arg: runner argument "--egress-proxy-listen=:1": --egress-proxy-listen is set by the installer's egress`},
		{args: []string{"--install-egress", "--install-runner-arg", "-egress-dns-addr"}, err: "--egress-dns-addr is set by the installer's egress"},
	})
}

func TestAPIKeyConfigValidate(t *testing.T) {
	testValidate(t, func() validator { return new(apikeyConfig) }, []validateCase{
		{args: nil},
		{args: []string{"--role", "admin", "--org", "acme"}},
		// The message predates the config structs: it names the role, not the flag.
		{args: []string{"--role", "owner"}, err: `role "owner"`},
	})
}

// TestConfigDefaults: every subcommand's state directory is defaultDataDir, and what the
// flags default to reaches the configuration.
func TestConfigDefaults(t *testing.T) {
	for name, cfg := range map[string]flagBinder{
		"dev": new(devConfig), "runner": new(runnerConfig), "gateway": new(gatewayConfig),
		"controlplane": new(controlPlaneConfig), "apikey": new(apikeyConfig), "demo": new(demoConfig),
	} {
		fs := flag.NewFlagSet(name, flag.ContinueOnError)
		cfg.bind(fs)
		if f := fs.Lookup("data-dir"); f == nil || f.DefValue != defaultDataDir {
			t.Errorf("%s --data-dir: %+v, want default %s", name, f, defaultDataDir)
		}
	}
	var r runnerConfig
	r.bind(flag.NewFlagSet("runner", flag.ContinueOnError))
	if r.dataDir != defaultDataDir || r.runnerID != defaultRunnerID || r.backend != "local" || r.listen != "127.0.0.1:7443" ||
		r.baseDomain != DefaultBaseDomain || r.heartbeatInterval != controlplane.DefaultHeartbeatInterval || r.kube.namespace != "sandboxd" ||
		r.warmTargets != local.DefaultMaxTargeted {
		t.Errorf("runner defaults: %+v", r)
	}
	var d devConfig
	d.bind(flag.NewFlagSet("dev", flag.ContinueOnError))
	if !d.testImageMirror || d.warmPool != 4 || d.warmTargets != local.DefaultMaxTargeted || d.edgeListen != "127.0.0.1:8443" || d.dataPlaneListen != "127.0.0.1:8444" || d.edgeListenGiven {
		t.Errorf("dev defaults: %+v", d)
	}
	var g gatewayConfig
	g.bind(flag.NewFlagSet("gateway", flag.ContinueOnError))
	if d.builds.retention != 30*24*time.Hour || d.builds.keep != 1000 || g.builds.retention != d.builds.retention || g.builds.keep != d.builds.keep || g.builds.endpointsFlag != "" {
		t.Errorf("build retention defaults: dev %+v, gateway %+v", d.builds, g.builds)
	}
}

// TestPKIDirOf: --pki-dir defaults to DATA-DIR/pki.
func TestPKIDirOf(t *testing.T) {
	if got := pkiDirOf("/d", ""); got != "/d/pki" {
		t.Errorf("pkiDirOf(/d, \"\") = %s", got)
	}
	if got := pkiDirOf("/d", "/p"); got != "/p" {
		t.Errorf("pkiDirOf(/d, /p) = %s", got)
	}
}

// TestRunnerStatus: a heartbeat reports this binary's version, readiness, what the
// runner offers and what its live sandboxes request.
func TestRunnerStatus(t *testing.T) {
	s := runnerStatus(runner.Capacity{MilliCPU: 4000, MemoryBytes: 8 << 30, UsedMilliCPU: 1500, UsedMemoryBytes: 1 << 30, Running: 3, MaxSandboxes: 50})
	want := controlplane.Status{Version: version, Ready: true,
		Capacity: controlplane.Resources{MilliCPU: 4000, MemoryBytes: 8 << 30},
		Usage:    controlplane.Resources{MilliCPU: 1500, MemoryBytes: 1 << 30, Sandboxes: 3}}
	if s != want {
		t.Errorf("runnerStatus = %+v, want %+v", s, want)
	}
	if p := resourcesProto(s.Usage); p.GetMilliCpu() != 1500 || p.GetMemoryBytes() != 1<<30 || p.GetSandboxes() != 3 {
		t.Errorf("resourcesProto(%+v) = %v", s.Usage, p)
	}
}
