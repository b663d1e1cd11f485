package stacktest

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
)

// A run is judged stale only by the cgroup parent of a run of the same name in this PID
// namespace: a process ID of another namespace says nothing about /proc here.
func TestStaleRun(t *testing.T) {
	const ns = 4026531836
	for base, want := range map[string]int{
		"sandboxd-e2e-4026531836-4242":   4242,
		"sandboxd-e2e-4026531836-4242-3": 4242, // StackConfigN's
		"sandboxd-e2e-4026532999-4242":   0,    // another PID namespace's run
		"sandboxd-e2e-4242":              0,    // no namespace in it
		"sandboxd-e2e-4026531836-":       0,
		"sandboxd-e2e-4026531836-0042":   0,
		"sandboxd-e2e-4026531836-42x":    0,
		"sandboxd-e2e-4026531836-42-10":  0,
		"sandboxd-e2e-4026531836-42-0":   0,
		"sandboxd-e2ex-4026531836-42":    0, // another name
	} {
		pid, ok := staleRun(base, "e2e", ns)
		if ok != (want != 0) || pid != want {
			t.Errorf("staleRun(%q) = %d, %v; want %d", base, pid, ok, want)
		}
	}
	if got := cgroupParent("e2e", ns, 4242); got != "sandboxd-e2e-4026531836-4242" {
		t.Errorf("cgroupParent = %q", got)
	}
	if pid, ok := staleRun(cgroupParent("bench", pidNS(), 77)+"-9", "bench", pidNS()); !ok || pid != 77 {
		t.Errorf("staleRun of cgroupParent's own name = %d, %v", pid, ok)
	}
}

// A v1 (hybrid) host's hierarchies are its cgroup mounts right below /sys/fs/cgroup,
// never a directory (a cgroup) below one of them.
func TestCgroupMounts(t *testing.T) {
	mounts := `tmpfs /sys/fs/cgroup tmpfs rw,relatime,mode=755 0 0
cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,relatime,cpu,cpuacct 0 0
cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0
cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0
cgroup /sys/fs/cgroup/memory/sandboxd cgroup rw,relatime,memory 0 0
cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0
tmpfs /sys/fs/cgroup/sandboxd tmpfs rw 0 0
proc /proc proc rw 0 0
`
	want := []string{"/sys/fs/cgroup/cpu,cpuacct", "/sys/fs/cgroup/memory", "/sys/fs/cgroup/unified"}
	if got := cgroupMounts(mounts); !slices.Equal(got, want) {
		t.Errorf("cgroupMounts = %q, want %q", got, want)
	}
}

// removeStale removes a dead run's cgroups and bridge, and nothing of a run of another
// PID namespace, nothing outside a hierarchy's root (a cgroup of a runner's, on a pure
// v2 host) and no interface that is not a bridge.
func TestRemoveStale(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (cgroups, links)")
	}
	const name = "sttest"
	// Above any pid_max (2^22): never a live process; low 16 bits 0xfff0.
	const dead = 1<<22 + 0xfff0
	if liveLow16(dead & 0xffff) {
		t.Skip("a live process has the low 16 bits of the dead run's ID")
	}
	ns := pidNS()
	hs := hierarchies()
	if len(hs) == 0 {
		t.Skip("no cgroup hierarchy")
	}
	h := hs[0]
	mk := func(d string) string {
		t.Helper()
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		return d
	}
	stale := mk(filepath.Join(h, cgroupParent(name, ns, dead), "sbx1"))
	staleN := mk(filepath.Join(h, cgroupParent(name, ns, dead)+"-2"))
	other := mk(filepath.Join(h, cgroupParent(name, ns+1, dead)))
	// Below a directory of the hierarchies' root that is no hierarchy on a v1 host (the
	// tmpfs), a cgroup of its own on a pure v2 host (as /sys/fs/cgroup/sandboxd is).
	decoyRoot := filepath.Join(cgroupRoot, "sandboxd-"+name+"-decoy")
	decoy := mk(filepath.Join(decoyRoot, cgroupParent(name, ns, dead)))
	t.Cleanup(func() {
		for _, d := range []string{stale, filepath.Dir(stale), staleN, other, decoy, decoyRoot} {
			_ = os.Remove(d)
		}
	})
	br := bridgeName(name, dead)
	notBridge := br + "2" // a name of StackConfigN's bridges, but a veth
	if out, err := exec.Command("ip", "link", "add", br, "type", "bridge").CombinedOutput(); err != nil {
		t.Fatalf("ip link add: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", br).Run() })
	if out, err := exec.Command("ip", "link", "add", notBridge, "type", "veth", "peer", "name", br+"p").CombinedOutput(); err != nil {
		t.Fatalf("ip link add: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", notBridge).Run() })

	got := removeStale(name)
	t.Logf("removed: %q", got)
	for _, d := range []string{stale, filepath.Dir(stale), staleN} {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("%s (a dead run's) stays: %v", d, err)
		}
	}
	for _, d := range []string{other, decoy} {
		if _, err := os.Stat(d); err != nil {
			t.Errorf("%s (not this PID namespace's run's, or not in a hierarchy) was removed: %v", d, err)
		}
	}
	if _, err := net.InterfaceByName(br); err == nil {
		t.Errorf("bridge %s of the dead run stays", br)
	}
	if _, err := net.InterfaceByName(notBridge); err != nil {
		t.Errorf("veth %s was removed: %v", notBridge, err)
	}
}
