package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/internal/runtime/local"
)

// cpuClock is the CPU time spent so far by this process (the runner: the bench runs
// the stack in-process), by its waited-for children (runc and the other helpers the
// local backend runs), and in the sandboxes' cgroups (their processes, which the host
// starts and stops: runc init, the agent), each from the kernel's accounting. Unlike a
// latency it does not depend on what else runs on the machine.
type cpuClock struct {
	self, children, sandboxes time.Duration
}

func readCPU(b *testing.B, cgroupParent string) cpuClock {
	b.Helper()
	var self, kids unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &self); err != nil {
		b.Fatal(err)
	}
	if err := unix.Getrusage(unix.RUSAGE_CHILDREN, &kids); err != nil {
		b.Fatal(err)
	}
	tv := func(t unix.Timeval) time.Duration { return time.Duration(t.Nano()) }
	c := cpuClock{self: tv(self.Utime) + tv(self.Stime), children: tv(kids.Utime) + tv(kids.Stime)}
	// cgroup v2: a parent's usage_usec includes its removed children's.
	dirs, _ := filepath.Glob("/sys/fs/cgroup/" + cgroupParent)
	more, _ := filepath.Glob("/sys/fs/cgroup/*/" + cgroupParent)
	for _, d := range append(dirs, more...) {
		raw, err := os.ReadFile(filepath.Join(d, "cpu.stat"))
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(raw), "\n") {
			if v, ok := strings.CutPrefix(l, "usage_usec "); ok {
				us, _ := strconv.ParseInt(v, 10, 64)
				c.sandboxes += time.Duration(us) * time.Microsecond
			}
		}
	}
	return c
}

func (c cpuClock) sub(o cpuClock) cpuClock {
	return cpuClock{c.self - o.self, c.children - o.children, c.sandboxes - o.sandboxes}
}

func (c cpuClock) total() time.Duration { return c.self + c.children + c.sandboxes }

func (c cpuClock) per(n int) string {
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) / float64(n) }
	return fmt.Sprintf("%.1f ms (runner %.1f, runc and helpers %.1f, in the sandbox %.1f)", ms(c.total()), ms(c.self), ms(c.children), ms(c.sandboxes))
}

// BenchmarkCreateCPU: the CPU one cold create costs (no warm pool; image cached), from
// Create to the first exec's answer, and apart from it the CPU of its teardown (Delete
// until the sandbox is gone), both summed over the runner process, its children and the
// sandbox's cgroup. Issue 25's target is 25 ms per create; the floor printed beside it
// is the CPU of one `runc state` (the runc binary's own start-up, which each of a
// create's runc invocations pays at least once), measured in the same run.
func BenchmarkCreateCPU(b *testing.B) {
	s := newStack(b, 0)
	ctx := context.Background()
	parent := env.CgroupParent
	createOne := func() string { return createFirstExecOnce(b, s) }
	destroy := func(id string) {
		_, _ = s.Runner.Delete(id, 0)
		if _, err := s.Runner.WaitTerminal(ctx, id); err != nil {
			b.Fatal(err)
		}
	}
	destroy(createOne()) // the image and page caches
	n := max(b.N, 1)
	var create, teardown cpuClock
	b.ResetTimer()
	for range n {
		t0 := readCPU(b, parent)
		id := createOne()
		t1 := readCPU(b, parent)
		destroy(id)
		// Teardown finishes in the background after the state is terminal: let it.
		time.Sleep(200 * time.Millisecond)
		t2 := readCPU(b, parent)
		create = create.add(t1.sub(t0))
		teardown = teardown.add(t2.sub(t1))
	}
	b.StopTimer()
	// The floor: one runc invocation's CPU.
	id := createOne()
	defer destroy(id)
	floor := runcInvocationCPU(b, s.Backend, id, 5)
	fmt.Printf("CPU per cold create (create → first exec), %d creates: %s; target ≤ 25 ms; %.1fx the floor (one runc invocation: %.1f ms)\n",
		n, create.per(n), float64(create.total())/float64(n)/float64(floor), float64(floor)/float64(time.Millisecond))
	if run, err := runcRunCPU(b, 5); err != nil {
		fmt.Printf("no runc run floor: %v\n", err)
	} else {
		fmt.Printf("floor of a create: `runc run` of busybox /bin/true alone (runc's default spec: no user namespace, network or agent), all its processes: %.1f ms; the create is %.1fx it\n",
			float64(run)/float64(time.Millisecond), float64(create.total())/float64(n)/float64(run))
	}
	fmt.Printf("CPU per teardown (delete → gone, +200 ms settle), %d sandboxes: %s\n", n, teardown.per(n))
}

func (c cpuClock) add(o cpuClock) cpuClock {
	return cpuClock{c.self + o.self, c.children + o.children, c.sandboxes + o.sandboxes}
}

// runcInvocationCPU is the least CPU of n `runc state` invocations on sandbox id: what
// starting the runc binary costs (each of a create's runc invocations pays at least it).
func runcInvocationCPU(b *testing.B, be *local.Backend, id string, n int) time.Duration {
	b.Helper()
	best := time.Duration(-1)
	for range n {
		cmd, err := be.RuntimeCommand(context.Background(), id, "state", id)
		if err != nil {
			b.Fatal(err)
		}
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("runc state: %v: %s", err, out)
		}
		d := cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
		if best < 0 || d < best {
			best = d
		}
	}
	return best
}

// runcRunCPU is the least CPU of n foreground `runc run`s of /bin/true in a busybox
// root (the host's static /bin/busybox) with runc's default spec (`runc spec`): runc,
// its init and /bin/true (runc waits for them, so wait4 counts them), what any runc
// create costs before a user namespace, a network, the agent and the backend's own work.
func runcRunCPU(b *testing.B, n int) (time.Duration, error) {
	b.Helper()
	bb, err := exec.LookPath("busybox")
	if err != nil {
		return 0, err
	}
	dir := b.TempDir()
	bundle := filepath.Join(dir, "bundle")
	if err := os.MkdirAll(filepath.Join(bundle, "rootfs", "bin"), 0o755); err != nil {
		return 0, err
	}
	bin, err := os.ReadFile(bb)
	if err != nil {
		return 0, err
	}
	if err := os.WriteFile(filepath.Join(bundle, "rootfs", "bin", "busybox"), bin, 0o755); err != nil {
		return 0, err
	}
	if err := os.Symlink("busybox", filepath.Join(bundle, "rootfs", "bin", "true")); err != nil {
		return 0, err
	}
	if out, err := exec.Command("runc", "spec", "--bundle", bundle).CombinedOutput(); err != nil {
		return 0, fmt.Errorf("runc spec: %w: %s", err, out)
	}
	cfgPath := filepath.Join(bundle, "config.json")
	raw, err := os.ReadFile(cfgPath)
	if err != nil {
		return 0, err
	}
	var spec map[string]any
	if err := json.Unmarshal(raw, &spec); err != nil {
		return 0, err
	}
	proc, ok := spec["process"].(map[string]any)
	if !ok {
		return 0, fmt.Errorf("runc spec: no process")
	}
	proc["terminal"], proc["args"] = false, []string{"/bin/true"}
	if raw, err = json.Marshal(spec); err != nil {
		return 0, err
	}
	if err := os.WriteFile(cfgPath, raw, 0o644); err != nil {
		return 0, err
	}
	best := time.Duration(-1)
	for i := range n {
		cmd := exec.Command("runc", "--root", filepath.Join(dir, "root"), "run", "--bundle", bundle, fmt.Sprintf("sandboxd-bench-floor-%d-%d", os.Getpid(), i))
		if out, err := cmd.CombinedOutput(); err != nil {
			return 0, fmt.Errorf("runc run: %w: %s", err, out)
		}
		d := cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
		if best < 0 || d < best {
			best = d
		}
	}
	return best, nil
}
