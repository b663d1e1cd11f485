package local

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/sandboxd/sandboxd/internal/failpoint"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/local/network"
	"github.com/sandboxd/sandboxd/internal/testenv"
)

// A crashCase is one way of creating (and maybe destroying) a sandbox in a child
// process that is killed with SIGKILL at a failpoint, as a runner killed mid-create.
type crashCase struct {
	Name     string
	Spec     runtime.Spec
	Network  bool
	Pool     bool // create a first sandbox, wait for the warm pool, then claim
	Destroy  bool // create, then destroy: the crash lands in the teardown
	Disk     int64
	State    string // the Backend's state dir
	NetState string // the network Manager's
	Points   string // SANDBOXD_FAILPOINT_LOG: the points the run passes

	nftBaseline map[string]bool // lines of the nftables table with no sandbox
}

const (
	crashEnv       = "SBXL_CRASH_CASE"
	fixtureEnv     = "SBXL_FIXTURE" // agent binary and busybox rootfs of the parent
	cgroupEnv      = "SBXL_CGROUP_PARENT"
	crashBridge    = "sbxcrash0"
	crashTable     = "sbxcrashtest"
	crashNetSubnet = "10.233.90.0/24"
)

func (c *crashCase) netConfig() network.Config {
	return network.Config{Bridge: crashBridge, Subnet: netip.MustParsePrefix(crashNetSubnet),
		StateDir: c.NetState, Nameservers: []string{}, Table: crashTable}
}

// backend is what a runner makes at start: a network Manager on the persisted network
// state, a Backend on the state dir.
func (c *crashCase) backend(tb testing.TB) (*Backend, *network.Manager) {
	tb.Helper()
	cfg := Config{StateDir: c.State, AgentBinary: agentBin, CgroupParent: testCgroupParent, OCIRuntime: testOCIRuntime,
		Images: testImages{layers: []string{busyboxDir}}, DiskBytes: c.Disk}
	if c.Pool {
		cfg.Pool = PoolConfig{Size: 1, Idle: time.Minute}
	}
	var m *network.Manager
	if c.Network {
		var err error
		if m, err = network.New(c.netConfig()); err != nil {
			tb.Fatal(err)
		}
		cfg.Network = netAdapter{m}
	}
	b, err := New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	return b, m
}

// TestCrashHelper is the child of TestCrashRecovery: it runs its case and exits 0 when
// the case ran to its end (no failpoint killed it).
func TestCrashHelper(t *testing.T) {
	raw := os.Getenv(crashEnv)
	if raw == "" {
		t.Skip("the child process of TestCrashRecovery")
	}
	var c crashCase
	if err := json.Unmarshal([]byte(raw), &c); err != nil {
		t.Fatal(err)
	}
	b, _ := c.backend(t)
	ctx := context.Background()
	if c.Pool {
		first := c.Spec
		first.ID = "warm-first"
		if _, err := b.Create(ctx, &first); err != nil {
			fmt.Println("create:", err)
			os.Exit(3)
		}
		waitPoolReady(t, b, 1)
	}
	if _, err := b.Create(ctx, &c.Spec); err != nil {
		fmt.Println("create:", err)
		os.Exit(3)
	}
	if c.Destroy {
		if err := b.Destroy(ctx, c.Spec.ID); err != nil {
			fmt.Println("destroy:", err)
			os.Exit(3)
		}
	}
	os.Exit(0)
}

// runCrashChild runs c in a child killed at point ("" for none); it reports whether the
// failpoint killed it.
func runCrashChild(t *testing.T, c crashCase, point string) bool {
	t.Helper()
	raw, _ := json.Marshal(c)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestCrashHelper$", "-test.count=1")
	cmd.Env = append(os.Environ(), crashEnv+"="+string(raw), fixtureEnv+"="+filepath.Dir(agentBin),
		cgroupEnv+"="+testCgroupParent, failpoint.Env+"="+point, failpoint.LogEnv+"="+c.Points)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if errors.As(err, &ee) && ee.Sys().(syscall.WaitStatus).Signal() == syscall.SIGKILL && ctx.Err() == nil {
		return true
	}
	if err != nil {
		t.Fatalf("child (crash at %q): %v\n%s", point, err, out)
	}
	return false
}

// TestCrashRecovery kills a child "runner" with SIGKILL at every failpoint that a create
// (and, in the destroy cases, a destroy) of a sandbox passes, then recovers the state dir
// as a restarted runner does (Recover, then Destroy for every sandbox reported ended)
// and checks that the host has nothing left of the sandboxes that did not survive: no
// mount, loop device, cgroup, runtime state, netns, veth, nftables element or dir.
func TestCrashRecovery(t *testing.T) {
	testenv.RequireRoot(t, "runc, mounts, cgroups")
	if skipReason != "" {
		t.Skip(skipReason)
	}
	vols := []runtime.Volume{
		{Name: "mem", Medium: runtime.MediumMemory, SizeBytes: 8 << 20},
		{Name: "sized", Medium: runtime.MediumDisk, SizeBytes: 32 << 20},
		{Name: "plain", Medium: runtime.MediumDisk},
	}
	mounts := []runtime.VolumeMount{{Volume: "mem", Path: "/mem"}, {Volume: "sized", Path: "/sized"},
		{Volume: "plain", Path: "/plain", SubPath: "a/b"}}
	base := runtime.Spec{ID: "crash-1", Container: runtime.Container{Image: "busybox", Command: "sleep", Args: []string{"600"}},
		Meta: map[string]string{runtime.MetaOrg: "org-a"}}
	withVols := base
	withVols.Volumes, withVols.VolumeMounts = vols, mounts
	// A group (group.go): an init container and a sidecar, sharing the volumes.
	group := withVols.Clone()
	group.Name = "app"
	group.InitContainers = []runtime.Container{{Name: "init", Image: "busybox", Command: "true", VolumeMounts: mounts[:1]}}
	group.Sidecars = []runtime.Container{{Name: "side", Image: "busybox", Command: "sleep", Args: []string{"600"}, VolumeMounts: mounts}}
	cases := []crashCase{
		{Name: "create", Spec: withVols, Network: true, Disk: 64 << 20},
		{Name: "create-nodisk", Spec: base},
		{Name: "claim", Spec: base, Network: true, Disk: 64 << 20, Pool: true},
		{Name: "destroy", Spec: withVols, Network: true, Disk: 64 << 20, Destroy: true},
		{Name: "group", Spec: group, Network: true, Disk: 64 << 20},
		{Name: "group-destroy", Spec: group, Network: true, Disk: 64 << 20, Destroy: true},
	}
	if FindRunsc() != "" {
		g := base
		g.RuntimeClass = GVisorClass
		cases = append(cases, crashCase{Name: "gvisor", Spec: g, Network: true, Disk: 64 << 20})
		// A group in one sentry (gvisor_group.go).
		gg := group.Clone()
		gg.RuntimeClass = GVisorClass
		cases = append(cases, crashCase{Name: "gvisor-group", Spec: gg, Network: true, Disk: 64 << 20},
			crashCase{Name: "gvisor-group-destroy", Spec: gg, Network: true, Disk: 64 << 20, Destroy: true})
	}
	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) { crashEveryPoint(t, c) })
	}
}

func crashEveryPoint(t *testing.T, c crashCase) {
	state, err := os.MkdirTemp("", "sbxc-")
	if err != nil {
		t.Fatal(err)
	}
	c.State = state
	c.NetState = t.TempDir()
	c.Points = filepath.Join(t.TempDir(), "points")
	if c.Network {
		m, err := network.New(c.netConfig())
		if err != nil {
			t.Fatal(err)
		}
		_ = m.Close()
		c.nftBaseline = map[string]bool{}
		for _, l := range nftLines(t) {
			c.nftBaseline[l] = true
		}
		t.Cleanup(func() {
			m, err := network.New(c.netConfig())
			if err == nil {
				err = m.Cleanup()
			}
			if err != nil {
				t.Errorf("network cleanup: %v", err)
			}
		})
	}
	// A run to the end names the points, in order.
	if runCrashChild(t, c, "") {
		t.Fatal("the child was killed without a failpoint")
	}
	points := crashPoints(t, c.Points)
	if len(points) < 5 {
		t.Fatalf("only %d failpoints passed: %v", len(points), points)
	}
	recoverAndCheck(t, c, "(no crash)", true)
	t.Logf("%d failpoints: %s", len(points), strings.Join(points, " "))
	for _, p := range points {
		_ = os.Remove(c.Points)
		if !runCrashChild(t, c, p) {
			// A point of the pool's background work may come later in this run.
			recoverAndCheck(t, c, p+" (not reached)", true)
			continue
		}
		recoverAndCheck(t, c, p, false)
		if t.Failed() {
			return // the first point that leaks is the one to look at
		}
	}
	_ = os.RemoveAll(state)
}

// crashPoints reads a failpoint log as name#N, one per hit.
func crashPoints(t *testing.T, path string) []string {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	var out []string
	for _, name := range strings.Fields(string(data)) {
		seen[name]++
		out = append(out, name+"#"+strconv.Itoa(seen[name]))
	}
	return out
}

// recoverAndCheck is a restarted runner on c's state: Recover, Destroy every sandbox
// reported ended, check that those left nothing; then the test destroys the survivors
// and checks the host is clean. completed says the child ran to its end.
func recoverAndCheck(t *testing.T, c crashCase, point string, completed bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	b, m := c.backend(t)
	defer func() {
		if m != nil {
			_ = m.Close()
		}
	}()
	found, err := b.Recover(ctx)
	if err != nil {
		t.Fatalf("crash at %s: recover: %v", point, err)
	}
	var alive []string
	for _, r := range found {
		if r.Alive {
			alive = append(alive, r.Spec.ID)
			// A sandbox reported running must be one: its agent answers.
			if _, _, code := execIn(t, agentClient(b, r.Spec.ID), "true"); code != 0 {
				t.Errorf("crash at %s: %s reported alive, exec exit %d", point, r.Spec.ID, code)
			}
			continue
		}
		if r.Exit == nil || r.Exit.Reason == "" {
			t.Errorf("crash at %s: %s reported ended without a reason: %+v", point, r.Spec.ID, r.Exit)
		}
		if err := b.Destroy(ctx, r.Spec.ID); err != nil {
			t.Errorf("crash at %s: destroy ended %s: %v", point, r.Spec.ID, err)
		}
	}
	if completed && !c.Destroy && len(alive) == 0 {
		t.Errorf("%s: the sandbox of a finished create was not recovered alive: %+v", point, found)
	}
	// What the recovery alone must have removed: everything of the sandboxes not alive.
	for _, id := range []string{c.Spec.ID, "warm-first"} {
		if !contains(alive, id) {
			checkHostClean(t, c, id, len(alive) > 0, "crash at "+point+", after recovery")
		}
	}
	if b.pool != nil {
		if err := b.Close(ctx); err != nil {
			t.Errorf("crash at %s: close pool: %v", point, err)
		}
	}
	for _, id := range alive {
		if err := b.Destroy(ctx, id); err != nil {
			t.Errorf("crash at %s: destroy %s: %v", point, id, err)
		}
	}
	checkHostClean(t, c, "", false, "crash at "+point+", after destroying the survivors")
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// checkHostClean fails t with what is left on the host of sandbox id ("" any sandbox):
// checkNoLeaks' mounts, cgroups, runtime state and dirs, plus loop devices backed by
// files in the state dir, network namespaces, veths on the bridge (when no sandbox is
// alive), addresses taken and nftables elements.
func checkHostClean(t *testing.T, c crashCase, id string, anyAlive bool, when string) {
	t.Helper()
	sub := &leakRecorder{TB: t, prefix: when + ": "}
	checkNoLeaks(sub, c.State, id)
	under := c.State
	if id != "" {
		under = filepath.Join(c.State, id)
	}
	for _, l := range lingeringLoops(under) {
		sub.Errorf("leaked loop device %s", l)
	}
	if !c.Network {
		return
	}
	// Held in the network's holder (network/holder.go), whether a runner is up or not.
	held, err := network.HeldNetNS(c.NetState)
	if err != nil {
		sub.Errorf("network namespaces: %v", err)
	}
	for _, name := range held {
		if id == "" || name == id {
			sub.Errorf("leaked network namespace %s", name)
		}
	}
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	for _, l := range strings.Split(string(mi), "\n") {
		if f := strings.Fields(l); len(f) > 4 && strings.HasPrefix(f[4], c.NetState+"/") && f[4] != filepath.Join(c.NetState, "mntns") {
			sub.Errorf("leaked mount in the network state dir: %s", l)
		}
	}
	if br, err := netlink.LinkByName(crashBridge); err == nil && !anyAlive {
		links, _ := netlink.LinkList()
		for _, l := range links {
			if l.Attrs().MasterIndex == br.Attrs().Index {
				sub.Errorf("leaked veth %s on the bridge", l.Attrs().Name)
			}
		}
	}
	if id == "" {
		ips, _ := os.ReadDir(filepath.Join(c.NetState, "ips"))
		for _, e := range ips {
			sub.Errorf("leaked address %s", e.Name())
		}
		for _, l := range nftLines(t) {
			if !c.nftBaseline[l] {
				sub.Errorf("leaked nftables line: %s", l)
			}
		}
		for _, d := range []string{"sandboxes", "rules"} {
			recs, _ := os.ReadDir(filepath.Join(c.NetState, d))
			for _, e := range recs {
				sub.Errorf("leaked network %s record %s", d, e.Name())
			}
		}
	}
}

// nftLines lists the crash test's nftables table, a line each, without handles.
func nftLines(t *testing.T) []string {
	out, err := exec.Command("nft", "list", "table", "inet", crashTable).CombinedOutput()
	if err != nil {
		t.Errorf("nft list table: %v: %s", err, out)
		return nil
	}
	var lines []string
	for _, l := range strings.Split(string(out), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			lines = append(lines, l)
		}
	}
	return lines
}

// leakRecorder prefixes a check's errors with when they were found.
type leakRecorder struct {
	testing.TB
	prefix string
}

func (r *leakRecorder) Errorf(format string, args ...any) {
	r.TB.Helper()
	r.TB.Errorf(r.prefix+format, args...)
}
