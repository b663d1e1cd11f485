// Package e2e runs the single-host stack for real: runc, overlayfs, bridge networking,
// images pulled from a registry on loopback, the agent as PID 1. It needs root
// (testenv.MainRequiresRoot: without it every test skips).
package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/local/network"
	"github.com/sandboxd/sandboxd/internal/stack"
	"github.com/sandboxd/sandboxd/internal/stack/stacktest"
	"github.com/sandboxd/sandboxd/internal/testenv"
)

var env *stacktest.Env

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if code, ok := testenv.MainRequiresRoot("e2e", "runc, namespaces, cgroups"); !ok {
		return code
	}
	var err error
	env, err = stacktest.Setup("e2e")
	if err != nil {
		fmt.Println("e2e:", err)
		return 1
	}
	defer env.Close()
	return m.Run()
}

// newStack starts a stack on dataDir; t.Cleanup closes it (sandboxes keep running).
func newStack(t *testing.T, dataDir string) *stack.Stack {
	t.Helper()
	s, err := env.Stack(dataDir)
	if err != nil {
		t.Fatalf("start stack: %v", err)
	}
	t.Cleanup(s.Close)
	return s
}

// startedStack is a stack whose sandboxes are all deleted, and checked for leaks, when
// the test ends.
func startedStack(t *testing.T) *stack.Stack {
	t.Helper()
	dir := t.TempDir()
	s := newStack(t, dir)
	t.Cleanup(func() { finish(t, s, dir) })
	return s
}

// finish deletes every sandbox, checks nothing of them is left, and removes the host
// network setup so the next test starts clean.
func finish(t *testing.T, s *stack.Stack, dir string) {
	t.Helper()
	var ids []string
	for _, sb := range s.Runner.List() {
		ids = append(ids, sb.ID)
	}
	deleteAll(t, s)
	// Idle warm-pool containers are no sandboxes: destroy them too, then check.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := s.Backend.DrainPool(ctx); err != nil {
		t.Errorf("drain warm pool: %v", err)
	}
	assertNoLeaks(t, dir, ids)
	if rd := s.Backend.RootfsDir(); rd != "" && !strings.HasPrefix(rd, dir+"/") {
		// Root filesystems of sandboxes in user namespaces, outside the private data dir.
		if ents, _ := os.ReadDir(rd); len(ents) > 0 {
			t.Errorf("leaked root filesystem mount points in %s: %d", rd, len(ents))
		}
		_ = os.Remove(rd)
	}
	if err := s.Network.Cleanup(); err != nil {
		t.Errorf("network cleanup: %v", err)
	}
}

func busybox() string { return env.Busybox() }
func python() string  { return env.Python() }

// sleeper is a main command that keeps the sandbox up until it is stopped.
func sleeper(img string) runtime.Spec {
	return runtime.Spec{Container: runtime.Container{Image: img, Command: "/bin/sh", Args: []string{"-c", `trap "exit 0" TERM INT; sleep infinity & wait`}}}
}

func create(t *testing.T, s *stack.Stack, req runner.CreateRequest) runner.Sandbox {
	t.Helper()
	sb, err := s.Runner.Create(context.Background(), req)
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	return sb
}

// waitState waits until the sandbox reaches want or a terminal state.
func waitState(t *testing.T, s *stack.Stack, id string, want runner.State, within time.Duration) runner.Sandbox {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		sb, err := s.Runner.Get(id)
		if err != nil {
			t.Fatalf("get %s: %v", id, err)
		}
		if sb.State == want {
			return sb
		}
		if sb.State.Terminal() || time.Now().After(deadline) {
			t.Fatalf("sandbox %s: state %s (%s: %s), want %s", id, sb.State, sb.Reason, sb.Message, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func deleteAll(t *testing.T, s *stack.Stack) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, sb := range s.Runner.List() {
		if _, err := s.Runner.Delete(sb.ID, 0); err != nil {
			t.Errorf("delete %s: %v", sb.ID, err)
			continue
		}
		if _, err := s.Runner.WaitTerminal(ctx, sb.ID); err != nil {
			t.Errorf("wait %s: %v", sb.ID, err)
		}
	}
}

// assertNoLeaks checks that no mount, cgroup, veth or runtime state of the given
// sandboxes (and nothing under dataDir) is left. It looks only at this test's sandboxes,
// so test binaries running at the same time on this host do not disturb it.
func assertNoLeaks(t *testing.T, dataDir string, ids []string) {
	t.Helper()
	// The volume pool, once used (an organization's kept build cache, a sized scratch
	// volume), may stay mounted until the backend closes (volPool.close; an unmount the
	// kernel refuses while a teardown still holds it is not retried before): what must
	// be gone is every sandbox's volume, capture and extraction in it.
	pool := filepath.Join(dataDir, "sandboxes", ".volumes", "mnt")
	for _, d := range []string{"sbx", "captures", "tmp"} {
		ents, _ := os.ReadDir(filepath.Join(pool, d))
		for _, e := range ents {
			t.Errorf("leaked volume pool entry: %s/%s", d, e.Name())
		}
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	for _, line := range strings.Split(string(mounts), "\n") {
		// The holder of network namespaces stays mounted (network/holder.go).
		if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], dataDir) &&
			f[4] != filepath.Join(dataDir, "network", "mntns") && f[4] != pool {
			t.Errorf("leaked mount: %s", line)
		}
	}
	for _, id := range ids {
		cgroups, _ := filepath.Glob("/sys/fs/cgroup/*/" + env.CgroupParent + "/" + id)
		for _, c := range cgroups {
			t.Errorf("leaked cgroup: %s", c)
		}
		veth := network.HostVethName(env.Bridge, id)
		if out, err := exec.Command("ip", "link", "show", veth).CombinedOutput(); err == nil {
			t.Errorf("leaked veth %s: %s", veth, out)
		}
	}
	// Warm-pool containers (claimed or not) are named pool_*, not by sandbox id.
	pooled, _ := filepath.Glob("/sys/fs/cgroup/*/" + env.CgroupParent + "/pool_*")
	for _, c := range pooled {
		t.Errorf("leaked pooled container cgroup: %s", c)
	}
	bundles, _ := filepath.Glob(filepath.Join(dataDir, "sandboxes", ".pool", "*"))
	for _, b := range bundles {
		t.Errorf("leaked pooled container bundle: %s", b)
	}
	records, _ := filepath.Glob(filepath.Join(dataDir, "network", "sandboxes", "pool_*"))
	for _, r := range records {
		t.Errorf("leaked pooled container network: %s", r)
	}
	entries, _ := os.ReadDir(filepath.Join(dataDir, "sandboxes"))
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), ".") {
			t.Errorf("leaked sandbox dir: %s", e.Name())
		}
	}
	states, _ := filepath.Glob(filepath.Join(dataDir, "sandboxes", ".oci", "*", "*"))
	for _, st := range states {
		if strings.HasPrefix(filepath.Base(filepath.Dir(st)), ".exe-") {
			continue // the link to the runner's sealed runc (runcsealed.go): no sandbox's
		}
		t.Errorf("leaked OCI runtime state: %s", st)
	}
}
