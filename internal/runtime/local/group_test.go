package local

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/agentconfig"
	"github.com/sandboxd/sandboxd/internal/logstore"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// groupSpec is a group of two busybox containers, "app" (the primary) and "side",
// sharing a volume at /data.
func groupSpec(id string) runtime.Spec {
	vm := []runtime.VolumeMount{{Volume: "shared", Path: "/data"}}
	return runtime.Spec{ID: id,
		Container: runtime.Container{Name: "app", Image: "busybox", Command: "sleep", Args: []string{"3600"},
			VolumeMounts: vm, Resources: runtime.Resources{MemoryBytes: 128 << 20}},
		Sidecars: []runtime.Container{{Name: "side", Image: "busybox", Command: "httpd", Args: []string{"-f", "-p", "80", "-h", "/data"},
			VolumeMounts: vm, Resources: runtime.Resources{MemoryBytes: 64 << 20}, Tmpfs: []string{"/scratch"}}},
		Volumes: []runtime.Volume{{Name: "shared"}},
	}
}

// TestGroupCgroups: one cgroup per sandbox holding one per container, each with its
// container's own limits and its processes, none in the sandbox's own; Destroy removes them.
func TestGroupCgroups(t *testing.T) {
	e := newEnv(t)
	spec := groupSpec("grp-cg")
	e.create(spec)
	base := filepath.Join(cgroupRoot, "memory", testCgroupParent, spec.ID)
	if _, err := os.Stat(base); err != nil {
		t.Skipf("no cgroup v1 memory hierarchy here: %v", err)
	}
	for name, want := range map[string]string{"app": "134217728", "side": "67108864"} {
		got, err := os.ReadFile(filepath.Join(base, name, "memory.limit_in_bytes"))
		if err != nil || strings.TrimSpace(string(got)) != want {
			t.Errorf("%s memory limit: %q (%v), want %s", name, got, err, want)
		}
		procs, _ := os.ReadFile(filepath.Join(base, name, "cgroup.procs"))
		if len(strings.Fields(string(procs))) == 0 {
			t.Errorf("%s's cgroup has no processes", name)
		}
	}
	if procs, _ := os.ReadFile(filepath.Join(base, "cgroup.procs")); len(strings.TrimSpace(string(procs))) > 0 {
		t.Errorf("processes in the sandbox's own cgroup: %q", procs)
	}
	if err := e.b.Destroy(context.Background(), spec.ID); err != nil {
		t.Fatal(err)
	}
	checkNoLeaks(t, e.state, spec.ID)
}

// TestGroupSharedNamespaces: the sidecar's server on port 80 (below 1024, in the
// primary's user and network namespaces) answers the primary on localhost; a file the
// sidecar's root writes in the shared volume is root's in the primary; each container
// has its own tmpfs.
func TestGroupSharedNamespaces(t *testing.T) {
	e := newEnv(t)
	spec := groupSpec("grp-ns")
	e.create(spec)
	app := agentClient(e.b, spec.ID)
	side := agentClientOf(e.b, spec.ID, "side")
	if _, errOut, c := execIn(t, side, "sh", "-c", "echo hello > /data/index.html"); c != 0 {
		t.Fatalf("write in side: %s", errOut)
	}
	waitWget(t, app, "http://127.0.0.1:80/index.html", "hello\n") // side's port 80
	if out, _, _ := execIn(t, app, "stat", "-c", "%u:%g", "/data/index.html"); out != "0:0\n" {
		t.Errorf("owner of side's file in app: %q, want 0:0", out)
	}
	if _, _, c := execIn(t, side, "sh", "-c", "mount | grep -q ' /scratch type tmpfs'"); c != 0 {
		t.Errorf("side has no tmpfs at /scratch")
	}
	if _, _, c := execIn(t, app, "test", "-d", "/scratch"); c == 0 {
		t.Errorf("app has side's tmpfs /scratch")
	}
}

// TestGroupSharesTheDefaultDisk: a group's containers without a disk limit of their own
// share the backend's default evenly (never below the minimum), so the group's writable
// layers stay within one sandbox's default however many containers it has.
func TestGroupSharesTheDefaultDisk(t *testing.T) {
	b := &Backend{cfg: Config{DiskBytes: 1 << 30}}
	spec := runtime.Spec{
		Container:      runtime.Container{Name: "a"},
		Sidecars:       []runtime.Container{{Name: "b", Resources: runtime.Resources{DiskBytes: 64 << 20}}, {Name: "c"}},
		InitContainers: []runtime.Container{{Name: "i"}},
	}
	b.shareDisk(&spec)
	for _, c := range spec.AllContainers() {
		want := int64(1<<30) / 3
		if c.Name == "b" {
			want = 64 << 20
		}
		if c.Resources.DiskBytes != want {
			t.Errorf("container %s: disk %d, want %d", c.Name, c.Resources.DiskBytes, want)
		}
	}
	small := &Backend{cfg: Config{DiskBytes: 20 << 20}}
	spec = runtime.Spec{Container: runtime.Container{Name: "a"}, Sidecars: []runtime.Container{{Name: "b"}, {Name: "c"}}}
	small.shareDisk(&spec)
	if spec.Resources.DiskBytes != minDiskBytes {
		t.Errorf("share below the minimum: %d, want %d", spec.Resources.DiskBytes, minDiskBytes)
	}
}

// nsFDs counts this process's open namespace descriptors (the groups' holders).
func nsFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		l, _ := os.Readlink(filepath.Join("/proc/self/fd", e.Name()))
		for _, kind := range []string{"user:[", "uts:[", "net:["} {
			if strings.HasPrefix(l, kind) {
				n++
			}
		}
	}
	return n
}

// TestGroupNamespacesMadeUpFront: the group's namespaces (groupns.go) are joined by
// every container (the same network, UTS and user namespaces, the sandbox's hostname,
// lo up) and held by the backend only while Create runs: none of their descriptors
// stays open after a Create that succeeded or failed (a primary or a member that
// could not be created), and a failed Create leaves nothing behind. With and without
// user namespaces.
func TestGroupNamespacesMadeUpFront(t *testing.T) {
	t.Run("userns", func(t *testing.T) { groupNamespacesMadeUpFront(t, false) })
	t.Run("nouserns", func(t *testing.T) { groupNamespacesMadeUpFront(t, true) })
}

func groupNamespacesMadeUpFront(t *testing.T, noUserNS bool) {
	e := newEnv(t)
	if noUserNS {
		e.b.cfg.NoUserNS, e.b.ids = true, nil
	}
	before := nsFDs(t)
	spec := groupSpec("grp-held")
	spec.Sidecars = append(spec.Sidecars, runtime.Container{Name: "third", Image: "busybox", Command: "sleep", Args: []string{"3600"}})
	e.create(spec)
	if n := nsFDs(t); n != before {
		t.Errorf("namespace descriptors open after Create: %d, before: %d", n, before)
	}
	var first string
	for _, name := range []string{"", "side", "third"} {
		c := agentClientOf(e.b, spec.ID, name)
		out, errOut, code := execIn(t, c, "sh", "-c", "for n in net uts user; do readlink /proc/self/ns/$n; done; hostname; cat /sys/class/net/lo/operstate /sys/class/net/lo/flags")
		if code != 0 {
			t.Fatalf("container %q: %s", name, errOut)
		}
		if first == "" {
			first = out
			if !strings.HasPrefix(out, "net:[") || !strings.Contains(out, "\nuser:[") {
				t.Errorf("namespaces in the primary: %q", out)
			}
			if !strings.Contains(out, runtime.Hostname(spec.ID)+"\n") {
				t.Errorf("hostname in the primary: %q, want %s", out, runtime.Hostname(spec.ID))
			}
			if !strings.HasSuffix(strings.TrimSpace(out), "0x9") {
				t.Errorf("lo is not up in the group's network namespace: %q", out)
			}
		} else if out != first {
			t.Errorf("container %q's namespaces and hostname:\n%s\nthe primary's:\n%s", name, out, first)
		}
	}
	if err := e.b.Destroy(context.Background(), spec.ID); err != nil {
		t.Fatal(err)
	}
	checkNoLeaks(t, e.state, spec.ID)

	for _, c := range []struct{ name, who string }{{"grp-held-p", "app"}, {"grp-held-m", "third"}} {
		spec := groupSpec(c.name)
		spec.Sidecars = append(spec.Sidecars, runtime.Container{Name: "third", Image: "busybox", Command: "sleep", Args: []string{"3600"}})
		if c.who == "app" {
			spec.Image = "nope"
		} else {
			spec.Sidecars[1].Image = "nope"
		}
		_, err := e.b.Create(context.Background(), &spec)
		if !errors.Is(err, runtime.ErrImageNotFound) || !strings.Contains(err.Error(), `container "`+c.who+`"`) {
			t.Errorf("create with %s's image missing: %v, want ErrImageNotFound naming it", c.who, err)
		}
		if n := nsFDs(t); n != before {
			t.Errorf("namespace descriptors open after a failed Create: %d, before: %d", n, before)
		}
		checkNoLeaks(t, e.state, spec.ID)
		if _, err := os.Stat(e.b.dir(spec.ID)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("failed create left its dir: %v", err)
		}
	}
}

// TestGroupOpenContainerLog: the log of an init container, and of a sidecar that exited,
// is read where its agent left it while the sandbox runs; one whose container replaced
// its log dir with a symlink (to a host dir holding a log) is an error, never that log.
func TestGroupOpenContainerLog(t *testing.T) {
	e := newEnv(t)
	host := t.TempDir()
	w, err := logstore.Open(host, agentconfig.MainLog)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(logstore.Stdout, []byte("host secret\n")); err != nil {
		t.Fatal(err)
	}
	w.Close()
	logs := agentconfig.StateDir + "/" + agentconfig.LogsDir
	spec := groupSpec("grp-log")
	spec.InitContainers = []runtime.Container{{Name: "setup", Image: "busybox", Command: "sh", Args: []string{"-c", "echo init said this"}}}
	spec.Sidecars = []runtime.Container{{Name: "side", Image: "busybox", Command: "sh",
		Args: []string{"-c", "echo side said this; mv " + logs + " " + logs + ".old && ln -s " + host + " " + logs}}}
	e.create(spec)
	read := func(name string) (string, error) {
		r, err := e.b.OpenContainerLog(spec.ID, name)
		if err != nil {
			return "", err
		}
		defer r.Close()
		var got []byte
		_, err = r.Read(logstore.ReadOptions{}, func(c logstore.Chunk) error { got = append(got, c.Data...); return nil })
		return string(got), err
	}
	if got, err := read("setup"); err != nil || got != "init said this\n" {
		t.Errorf("log of the init container: %q %v", got, err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, err := read("side")
		if strings.Contains(got, "host secret") {
			t.Fatalf("the swapped log dir was followed: %q", got)
		}
		if err != nil {
			break // swapped: refused
		}
		if time.Now().After(deadline) {
			t.Fatalf("the sidecar's log dir was never swapped: %q", got)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := e.b.Destroy(context.Background(), spec.ID); err != nil {
		t.Fatal(err)
	}
	checkNoLeaks(t, e.state, spec.ID)
}

// TestGroupMemberStartsAfterPrimary: a runc group's sysfs is shared by all its
// containers. A member that starts after the primary has started (a slower image, a
// cold-start slot) still gets it: the primary's launch does not drop the group's sysfs
// from the host as a lone sandbox's does.
func TestGroupMemberStartsAfterPrimary(t *testing.T) {
	e := newEnv(t)
	e.withNetwork(t, 0) // the group's own sysfs is mounted for its network namespace
	primaryStarted := make(chan struct{})
	var once sync.Once
	testHookStarted = func(s *sandbox) {
		if !s.member {
			once.Do(func() { close(primaryStarted) })
		}
	}
	testHookBeforeStart = func(s *sandbox) {
		if s.member {
			select {
			case <-primaryStarted:
			case <-time.After(30 * time.Second):
				t.Error("the primary did not start within 30 s")
			}
		}
	}
	t.Cleanup(func() { testHookStarted, testHookBeforeStart = nil, nil })
	spec := groupSpec("grp-late")
	e.create(spec)
	select {
	case <-primaryStarted:
	default:
		t.Fatal("the hooks did not run: nothing was tested")
	}
	for _, name := range []string{"", "side"} {
		out, errOut, code := execIn(t, agentClientOf(e.b, spec.ID, name), "cat", "/sys/class/net/eth0/operstate")
		if code != 0 || strings.TrimSpace(out) == "" {
			t.Errorf("container %q: /sys/class/net/eth0/operstate: %q %s (exit %d)", name, out, errOut, code)
		}
	}
	if err := e.b.Destroy(context.Background(), spec.ID); err != nil {
		t.Fatal(err)
	}
	checkNoLeaks(t, e.state, spec.ID)
}
