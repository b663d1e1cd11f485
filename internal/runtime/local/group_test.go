package local

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
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
	deadline := time.Now().Add(10 * time.Second)
	for {
		out, errOut, c := execIn(t, app, "wget", "-q", "-O", "-", "http://127.0.0.1:80/index.html")
		if c == 0 && out == "hello\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("wget from app to side's port 80: %q %q exit %d", out, errOut, c)
		}
		time.Sleep(100 * time.Millisecond)
	}
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

// TestGroupGVisorRefused: the gvisor class refuses multi-container specs, naming why.
func TestGroupGVisorRefused(t *testing.T) {
	e := newEnv(t)
	e.b.runtimes[GVisorClass] = newOCIRuntime(GVisorClass, "/nonexistent/runsc", filepath.Join(e.state, ociRootDir, GVisorClass))
	spec := groupSpec("grp-gv")
	spec.RuntimeClass = GVisorClass
	_, err := e.b.Create(context.Background(), &spec)
	if !errors.Is(err, runtime.ErrInvalidSpec) || !strings.Contains(err.Error(), "single-container") {
		t.Fatalf("create a group under gVisor: %v, want ErrInvalidSpec saying why", err)
	}
	if _, err := os.Stat(e.b.dir(spec.ID)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("refused create left its dir: %v", err)
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
