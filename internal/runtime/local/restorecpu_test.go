package local

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// TestPauseRestoreCPULimits: a gVisor sandbox with a CPU limit (a cpuset and a quota) is
// restored without them (restorecpu.go), and after Resume and in a Fork its cgroup has
// them again and it sees as many CPUs as before.
func TestPauseRestoreCPULimits(t *testing.T) {
	e := volPoolEnv(t)
	if e.b.runtimes[GVisorClass] == nil {
		t.Skip("runsc not found")
	}
	if _, err := os.Stat(filepath.Join(cgroupRoot, "cpu")); err != nil {
		t.Skip("not a cgroup v1 host: restores keep their CPU limits")
	}
	e.withNetwork(t, 14)
	ctx := context.Background()
	const id = "rcpu"
	sp := volSpec(id, GVisorClass, []runtime.Volume{{Name: "data", SizeBytes: 64 << 20}}, "sleep 100000")
	sp.Image = "busybox"
	sp.Container.Resources.MilliCPU = 500
	e.create(sp)
	s, err := e.b.get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	wantCPUs := cpuList(s.info.CPUs)
	if wantCPUs == "" {
		t.Fatal("the sandbox has no cpuset")
	}
	nproc := sh(t, e.b, id, "nproc")
	limits := func(what, cid string) {
		t.Helper()
		rel := filepath.Join(testCgroupParent, cid)
		read := func(p string) string {
			b, err := os.ReadFile(p)
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			return strings.TrimSpace(string(b))
		}
		if got := read(filepath.Join(cgroupRoot, "cpuset", rel, "cpuset.cpus")); got != wantCPUs {
			t.Errorf("%s: cpuset.cpus = %q, want %q", what, got, wantCPUs)
		}
		if got := read(filepath.Join(cgroupRoot, "cpu", rel, "cpu.cfs_quota_us")); got != "50000" {
			t.Errorf("%s: cpu.cfs_quota_us = %q, want 50000", what, got)
		}
		if got := read(filepath.Join(cgroupRoot, "cpu", rel, "cpu.cfs_period_us")); got != "100000" {
			t.Errorf("%s: cpu.cfs_period_us = %q, want 100000", what, got)
		}
	}
	limits("created", id)
	for cycle := range 2 {
		if _, err := e.b.Pause(ctx, id, true); err != nil {
			t.Fatalf("cycle %d: pause: %v", cycle, err)
		}
		if _, err := e.b.Resume(ctx, id); err != nil {
			t.Fatalf("cycle %d: resume: %v", cycle, err)
		}
		limits("resumed", id)
		if got := sh(t, e.b, id, "nproc"); got != nproc {
			t.Errorf("nproc after resume = %q, before %q", got, nproc)
		}
	}
	f := sp.Clone()
	f.ID = "rcpu-f"
	_, errs := e.b.Fork(ctx, id, []*runtime.Spec{&f})
	if errs[0] != nil {
		t.Fatal(errs[0])
	}
	fs, err := e.b.get(ctx, f.ID)
	if err != nil {
		t.Fatal(err)
	}
	wantCPUs = cpuList(fs.info.CPUs)
	limits("fork", f.ID)
	if got := sh(t, e.b, f.ID, "nproc"); got != nproc {
		t.Errorf("nproc in the fork = %q, in its source %q", got, nproc)
	}
	for _, x := range []string{f.ID, id} {
		if err := e.b.Destroy(ctx, x); err != nil {
			t.Fatal(err)
		}
		checkNoLeaks(t, e.state, x)
	}
}
