// Package testbed runs a multi-cluster sandboxd on one machine, as separate processes
// of the real binaries: a control plane, gateway replicas sharing one PostgreSQL, and
// runners that each live in a network namespace of their own with their own address and
// policy — three "clusters" on one host. End-to-end tests, the fault test and
// scripts/testbed.sh use it.
//
// Runners register with the control plane through bootstrap tokens and heartbeat it;
// gateways read policies from the shared store, reach runners over mTLS at their
// namespace addresses, and forward admin calls to the control plane. Every process can be
// killed (kill -9) and started again with the same command line.
package testbed

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/structpb"

	controlplanev1 "github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1/controlplanev1connect"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/connecttest"
	"github.com/sandboxd/sandboxd/internal/pki"
	"github.com/sandboxd/sandboxd/internal/testenv"
	"github.com/sandboxd/sandboxd/internal/testimage"
)

// RunnerPort is where every runner listens in its namespace.
const RunnerPort = 7443

// Runner describes one runner ("cluster") of the bed.
type Runner struct {
	ID string
	// Policy is its policy document (JSON); "" is the permissive empty policy.
	Policy string
	// Args are extra `sandboxd runner` flags, e.g. --max-sandboxes 2.
	Args []string
	// DataPlane: the runner serves the direct data plane on DataPlanePort of its address.
	DataPlane bool
	// Bin, when set, holds this runner's own sandboxd and sandbox-agent (instead of
	// Config.RunnerBin or Config.Bin): runners that update themselves each replace theirs.
	Bin string
	// Channel is the release channel it follows (unset: STABLE).
	Channel controlplanev1.ReleaseChannel
}

// DataPlanePort is where runners with a direct data plane serve it.
const DataPlanePort = 8444

// Config describes a bed.
type Config struct {
	// Dir holds every process's data dir and log; Bin the sandboxd and sandbox-agent
	// binaries (Build makes them).
	Dir, Bin string
	// DSN is the PostgreSQL database the control plane and gateways share.
	DSN      string
	Runners  []Runner
	Gateways int // default 2
	// HeartbeatInterval of the runners (default 1 s).
	HeartbeatInterval time.Duration
	// GatewayArgs are extra `sandboxd gateway` flags, e.g. --orphan-grace 5s.
	GatewayArgs []string
	// ControlPlaneArgs are extra `sandboxd controlplane` flags, e.g. --release-dir D.
	ControlPlaneArgs []string
	// RunnerBin, when set, holds the runners' sandboxd and sandbox-agent instead of Bin
	// (a runner that updates itself replaces them there).
	RunnerBin string
}

// Bed is a running bed.
type Bed struct {
	cfg      Config
	net      *network
	CP       *Proc
	Gateways []*Proc
	Runners  []*Proc
	// AdminKey and UserKey belong to the default organization; CAFile is the platform CA.
	AdminKey, UserKey, CAFile string
	// Org is the organization of the keys.
	Org string
	// mirror is the runners' docker.io mirror serving the test images ("" without them).
	mirror     string
	stopMirror func()
}

// Build compiles sandboxd into dir and puts the static sandbox-agent (testenv.Agent)
// beside it, where sandboxd finds it.
func Build(dir string) error {
	cmd := exec.Command("go", "build", "-trimpath", "-o", filepath.Join(dir, "sandboxd"), "github.com/sandboxd/sandboxd/cmd/sandboxd")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("build sandboxd: %w\n%s", err, out)
	}
	_, err := testenv.Agent(dir)
	return err
}

// beds counts the beds this process started: each gets names of its own (a bed's links
// are deleted with its namespaces, by the kernel, after Close returns: the next bed of
// the same process must not need the same names).
var beds atomic.Int64

// Start brings the bed up: network, control plane, runners (registered with their
// policies), gateways. On error what started is torn down.
func Start(ctx context.Context, cfg Config) (*Bed, error) {
	if cfg.Gateways == 0 {
		cfg.Gateways = 2
	}
	if cfg.HeartbeatInterval == 0 {
		cfg.HeartbeatInterval = time.Second
	}
	if cfg.DSN == "" || len(cfg.Runners) == 0 || cfg.Dir == "" || cfg.Bin == "" {
		return nil, errors.New("testbed: Dir, Bin, DSN and at least one runner are required")
	}
	b := &Bed{cfg: cfg, net: newNetwork(os.Getpid() + 7919*int(beds.Add(1)-1))}
	if err := b.start(ctx); err != nil {
		_ = b.Close()
		return nil, err
	}
	return b, nil
}

func (b *Bed) start(ctx context.Context) error {
	cfg := b.cfg
	if err := os.MkdirAll(filepath.Join(cfg.Dir, "logs"), 0o755); err != nil {
		return err
	}
	b.net.down() // leftovers of a bed with the same names
	if err := b.net.up(len(cfg.Runners)); err != nil {
		return fmt.Errorf("testbed network: %w", err)
	}
	// Runners have no test images of their own (only `sandboxd dev` has): they get them
	// as docker.io's from a mirror on the bridge; without them, from Docker Hub.
	host, stop, err := testimage.ServeDockerHub(ctx, net.JoinHostPort(b.net.host.String(), "0"))
	switch {
	case err == nil:
		b.mirror, b.stopMirror = host, stop
	case !errors.Is(err, testimage.ErrNoTestImages):
		return fmt.Errorf("testbed: test images: %w", err)
	}
	if err := b.startControlPlane(ctx); err != nil {
		return err
	}
	admin, keys, err := b.adminClients()
	if err != nil {
		return err
	}
	key, err := keys.CreateApiKey(ctx, connect.NewRequest(&controlplanev1.CreateApiKeyRequest{DisplayName: "testbed user"}))
	if err != nil {
		return fmt.Errorf("testbed: user key: %w", err)
	}
	b.UserKey, b.Org = key.Msg.GetSecret(), "default" // `sandboxd controlplane` serves one organization
	for i, r := range cfg.Runners {
		if err := b.startRunner(ctx, admin, i, r); err != nil {
			return err
		}
	}
	for i := range cfg.Gateways {
		if err := b.startGateway(ctx, i); err != nil {
			return err
		}
	}
	return nil
}

func (b *Bed) proc(name string, argv []string, ready string) *Proc {
	return &Proc{Name: name, argv: argv, ready: ready, logPath: filepath.Join(b.cfg.Dir, "logs", name+".log")}
}

func (b *Bed) startControlPlane(ctx context.Context) error {
	dir := filepath.Join(b.cfg.Dir, "controlplane")
	b.CAFile = filepath.Join(dir, "pki", "ca.pem")
	b.CP = b.proc("controlplane", append([]string{filepath.Join(b.cfg.Bin, "sandboxd"), "controlplane",
		"--data-dir", dir, "--store", b.cfg.DSN, "--listen", net.JoinHostPort(b.net.host.String(), "0"),
		"--heartbeat-interval", b.cfg.HeartbeatInterval.String()}, b.cfg.ControlPlaneArgs...), "control plane listening on https://")
	if err := b.CP.start(ctx); err != nil {
		return err
	}
	// A restart listens on the same address, so runners find it again.
	b.CP.argv = replaceFlag(b.CP.argv, "--listen", b.CP.Addr)
	key, err := os.ReadFile(filepath.Join(dir, "admin-api-key"))
	if err != nil {
		return fmt.Errorf("testbed: admin key: %w", err)
	}
	b.AdminKey = strings.TrimSpace(string(key))
	return nil
}

// adminClients are clients of the control plane's admin API, trusting the platform CA.
func (b *Bed) adminClients() (controlplanev1connect.RunnerManagementServiceClient, controlplanev1connect.ApiKeyServiceClient, error) {
	hc, err := b.adminHTTP()
	if err != nil {
		return nil, nil, err
	}
	url := "https://" + b.CP.Addr
	auth := connect.WithInterceptors(connecttest.Bearer(b.AdminKey))
	return controlplanev1connect.NewRunnerManagementServiceClient(hc, url, auth),
		controlplanev1connect.NewApiKeyServiceClient(hc, url, auth), nil
}

// adminHTTP is an HTTP client of the control plane trusting the platform CA.
func (b *Bed) adminHTTP() (*http.Client, error) {
	pem, err := os.ReadFile(b.CAFile)
	if err != nil {
		return nil, err
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pem)
	return &http.Client{Transport: &http.Transport{TLSClientConfig: pki.ClientTLSConfig(nil, roots, b.net.host.String()), ForceAttemptHTTP2: true}}, nil
}

func (b *Bed) startRunner(ctx context.Context, admin controlplanev1connect.RunnerManagementServiceClient, i int, r Runner) error {
	doc := r.Policy
	if doc == "" {
		doc = "{}"
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(doc), &m); err != nil {
		return fmt.Errorf("testbed: policy of %s: %w", r.ID, err)
	}
	pol, err := structpb.NewStruct(m)
	if err != nil {
		return fmt.Errorf("testbed: policy of %s: %w", r.ID, err)
	}
	if _, err := admin.CreateManagedRunner(ctx, connect.NewRequest(&controlplanev1.CreateManagedRunnerRequest{
		ManagedRunner: &controlplanev1.ManagedRunner{RunnerId: r.ID, ClusterId: "cluster-" + r.ID, Zone: "zone-" + r.ID, Policy: pol,
			ReleaseChannel: r.Channel},
	})); err != nil {
		return fmt.Errorf("testbed: create runner %s: %w %v", r.ID, err, apierr.Violations(err))
	}
	tok, err := admin.CreateBootstrapToken(ctx, connect.NewRequest(&controlplanev1.CreateBootstrapTokenRequest{RunnerId: r.ID}))
	if err != nil {
		return fmt.Errorf("testbed: bootstrap token of %s: %w", r.ID, err)
	}
	runnerBin := b.cfg.Bin
	if b.cfg.RunnerBin != "" {
		runnerBin = b.cfg.RunnerBin
	}
	if r.Bin != "" {
		runnerBin = r.Bin
	}
	argv := b.net.nsExec(i, filepath.Join(runnerBin, "sandboxd"), "runner",
		"--data-dir", filepath.Join(b.cfg.Dir, "runner-"+r.ID),
		"--listen", net.JoinHostPort(b.net.runnerAddr(i).String(), strconv.Itoa(RunnerPort)),
		"--control-plane", b.CP.Addr, "--bootstrap-token", tok.Msg.GetBootstrapToken(),
		"--heartbeat-interval", b.cfg.HeartbeatInterval.String(),
		"--cgroup-parent", b.cgroupParent(i))
	if b.mirror != "" {
		argv = append(argv, "--registry-mirror", "docker.io="+b.mirror, "--insecure-registry", b.mirror)
	}
	argv = append(argv, r.Args...)
	if r.DataPlane {
		argv = append(argv, "--data-plane-listen", fmt.Sprintf(":%d", DataPlanePort), "--data-plane-host", b.net.runnerAddr(i).String())
	}
	p := b.proc("runner-"+r.ID, argv, "runner "+r.ID+" listening on ")
	// Later starts use the saved credentials; the token is spent.
	p.restart = func(argv []string) []string { return replaceFlag(argv, "--bootstrap-token", "") }
	b.Runners = append(b.Runners, p)
	return p.start(ctx)
}

func (b *Bed) cgroupParent(i int) string { return fmt.Sprintf("sandboxd-%s-r%d", b.net.tag, i) }

func (b *Bed) startGateway(ctx context.Context, i int) error {
	argv := []string{filepath.Join(b.cfg.Bin, "sandboxd"), "gateway",
		"--data-dir", filepath.Join(b.cfg.Dir, fmt.Sprintf("gateway-%d", i)),
		"--store", b.cfg.DSN, "--pki-dir", filepath.Join(b.cfg.Dir, "controlplane", "pki"),
		"--listen", "127.0.0.1:0", "--name", fmt.Sprintf("gw%d", i), "--control-plane", b.CP.Addr}
	for j, r := range b.cfg.Runners {
		argv = append(argv, "--runner", r.ID+"="+net.JoinHostPort(b.net.runnerAddr(j).String(), strconv.Itoa(RunnerPort)))
	}
	argv = append(argv, b.cfg.GatewayArgs...)
	p := b.proc(fmt.Sprintf("gateway-%d", i), argv, "CWSANDBOX_BASE_URL=http://")
	b.Gateways = append(b.Gateways, p)
	if err := p.start(ctx); err != nil {
		return err
	}
	p.argv = replaceFlag(p.argv, "--listen", p.Addr)
	return nil
}

// GatewayURL is gateway i's base URL.
func (b *Bed) GatewayURL(i int) string { return "http://" + b.Gateways[i].Addr }

// RunnerAddr is runner i's address (its namespace's).
func (b *Bed) RunnerAddr(i int) string {
	return net.JoinHostPort(b.net.runnerAddr(i).String(), strconv.Itoa(RunnerPort))
}

// RunnerDataDir is runner i's data dir.
func (b *Bed) RunnerDataDir(i int) string {
	return filepath.Join(b.cfg.Dir, "runner-"+b.cfg.Runners[i].ID)
}

// Close deletes every sandbox, stops every process (runners last), removes what runners
// left running anyway, and takes the network down.
//
// It returns what the runners left behind although every sandbox was deleted (each item
// says what and, from the runner's log, how), having removed it anyway; nil when nothing
// was. A test fails on a non-empty list: a leak is a bug, not a cleanup error.
func (b *Bed) Close() []string {
	var leaks []string
	if err := b.purge(); err != nil {
		leaks = append(leaks, err.Error())
	}
	for _, p := range b.Gateways {
		p.Stop()
	}
	if b.CP != nil {
		b.CP.Stop()
	}
	for i, p := range b.Runners {
		p.Stop()
		leaks = append(leaks, b.leftovers(i)...)
		b.removeLeftovers(i)
		b.forceClean(i)
	}
	if b.stopMirror != nil {
		b.stopMirror()
	}
	b.net.down()
	return leaks
}

// removeLeftovers deletes runner i's containers (a runner that stops leaves its
// sandboxes running, to re-adopt them) and its cgroup parents.
func (b *Bed) removeLeftovers(i int) {
	roots, _ := filepath.Glob(filepath.Join(b.RunnerDataDir(i), "sandboxes", ".oci", "*"))
	for _, root := range roots {
		out, _ := exec.Command("runc", "--root", root, "list", "-q").Output()
		for id := range strings.FieldsSeq(string(out)) {
			_ = exec.Command("runc", "--root", root, "delete", "--force", id).Run()
		}
	}
	mounts, _ := filepath.Glob(filepath.Join(b.RunnerDataDir(i), "sandboxes", "*", "bundle", "rootfs"))
	for _, m := range mounts {
		_ = exec.Command("umount", "-l", m).Run()
	}
	// The holder of network namespaces, and with it every one it holds.
	_ = exec.Command("umount", "-l", filepath.Join(b.RunnerDataDir(i), "network", "mntns")).Run()
	cgs, _ := filepath.Glob("/sys/fs/cgroup/*/" + b.cgroupParent(i))
	for _, cg := range cgs {
		subs, _ := filepath.Glob(filepath.Join(cg, "*", "cgroup.procs"))
		for _, s := range subs {
			_ = os.Remove(filepath.Dir(s))
		}
		_ = os.Remove(cg)
	}
}

// replaceFlag sets flag's value in argv ("" removes the flag).
func replaceFlag(argv []string, flag, value string) []string {
	out := make([]string, 0, len(argv))
	for i := 0; i < len(argv); i++ {
		if argv[i] == flag && i+1 < len(argv) {
			if value != "" {
				out = append(out, flag, value)
			}
			i++
			continue
		}
		out = append(out, argv[i])
	}
	return out
}
