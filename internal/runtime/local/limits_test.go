package local

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/testimage"
)

var (
	pythonOnce  sync.Once
	pythonLayer string // the python test image's rootfs, unpacked
	pythonErr   error
)

// needPython skips t when the python test image's tarball is missing
// (scripts/build-test-images.sh), else unpacks it once for "python" (testImages).
func needPython(t *testing.T) {
	t.Helper()
	tarball := filepath.Join(testimage.Dir(), "python.tar")
	if _, err := os.Stat(tarball); err != nil {
		t.Skipf("no python test image (%v): run %s", err, testimage.Script)
	}
	pythonOnce.Do(func() {
		dir, err := os.MkdirTemp("", "sbxl-python-")
		if err != nil {
			pythonErr = err
			return
		}
		pythonLayer = dir
		if out, err := exec.Command("tar", "-xf", tarball, "-C", dir, "--numeric-owner").CombinedOutput(); err != nil {
			pythonErr = fmt.Errorf("unpack %s: %w: %s", tarball, err, out)
		}
	})
	if pythonErr != nil {
		t.Fatal(pythonErr)
	}
}

func pythonImage() (*Image, error) {
	if pythonLayer == "" {
		return nil, fmt.Errorf("python layer not unpacked: call needPython")
	}
	return &Image{Ref: "python", Digest: "sha256:9e7a0", Layers: []string{pythonLayer},
		Config: ImageConfig{Cmd: []string{"python3"}, Env: []string{testimage.DefaultPath}}}, nil
}

// hostMemTotalKB is the host's MemTotal.
func hostMemTotalKB(t *testing.T) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		t.Fatal(err)
	}
	return memTotalKB(t, string(b))
}

func memTotalKB(t *testing.T, meminfo string) int64 {
	t.Helper()
	for _, l := range strings.Split(meminfo, "\n") {
		if v, ok := strings.CutPrefix(l, "MemTotal:"); ok {
			n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatalf("MemTotal line %q: %v", l, err)
			}
			return n
		}
	}
	t.Fatalf("no MemTotal in %q", meminfo)
	return 0
}

func hostCgroupV2() bool {
	_, err := os.Stat("/sys/fs/cgroup/cgroup.controllers")
	return err == nil
}

// hostCgroupFile is a controller's file of sandbox cid's cgroup on the host (v1: the
// controller's hierarchy; v2: the one tree).
func hostCgroupFile(cid, controller, v1, v2 string) string {
	if hostCgroupV2() {
		return filepath.Join(cgroupRoot, testCgroupParent, cid, v2)
	}
	return filepath.Join(cgroupRoot, controller, testCgroupParent, cid, v1)
}

func readTrim(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// TestLimitsVisible: a program in a sandbox finds its limits the usual ways, under runc
// and gVisor, for a fractional CPU limit, one above a whole CPU, and none: its own
// cgroup's files at /sys/fs/cgroup (read-only, and writing them changes nothing on the
// host), nproc, Python's os.cpu_count(), /sys/devices/system/cpu/online and
// /proc/cpuinfo showing ceil(CPU limit) CPUs (at most the host's), /proc/meminfo's
// MemTotal the memory limit; without limits, the host's values. runc also without a user
// namespace of its own (--no-userns).
func TestLimitsVisible(t *testing.T) {
	e := newEnv(t)
	needPython(t)
	host := len(hostCPUs())
	hostMem := hostMemTotalKB(t)
	for _, variant := range []string{"runc", "runc-nouserns", GVisorClass} {
		class := strings.TrimSuffix(variant, "-nouserns")
		for _, tc := range []struct {
			name     string
			res      runtime.Resources
			wantCPUs int
		}{
			{"500m-256Mi", runtime.Resources{MilliCPU: 500, MemoryBytes: 256 << 20}, 1},
			{"1500m-1Gi", runtime.Resources{MilliCPU: 1500, MemoryBytes: 1 << 30}, min(2, host)},
			{"none", runtime.Resources{}, host},
		} {
			t.Run(variant+"/"+tc.name, func(t *testing.T) {
				if e.b.runtimes[class] == nil {
					t.Skipf("no %s runtime (make runsc)", class)
				}
				if variant != class {
					ids := e.b.ids
					e.b.cfg.NoUserNS, e.b.ids = true, nil
					defer func() { e.b.cfg.NoUserNS, e.b.ids = false, ids }()
				}
				id := "lim-" + strings.ReplaceAll(strings.ToLower(variant+"-"+tc.name), "m-", "-")
				e.create(runtime.Spec{ID: id, Container: runtime.Container{Image: "python", Command: "sleep", Args: []string{"3600"}, Resources: tc.res}, RuntimeClass: class})
				defer func() {
					if err := e.b.Destroy(context.Background(), id); err != nil {
						t.Error(err)
					}
				}()
				c := agentClient(e.b, id)
				sh := func(script string) string {
					t.Helper()
					out, errOut, code := execIn(t, c, "sh", "-c", script)
					if code != 0 {
						t.Errorf("%s: exit %d, stderr %q", script, code, errOut)
					}
					return strings.TrimSpace(out)
				}
				want := strconv.Itoa(tc.wantCPUs)
				if got := sh("nproc"); got != want {
					t.Errorf("nproc = %s, want %s", got, want)
				}
				if got := sh(`python3 -c 'import os; print(os.cpu_count())'`); got != want {
					t.Errorf("os.cpu_count() = %s, want %s", got, want)
				}
				if got := sh("grep -c ^processor /proc/cpuinfo"); got != want {
					t.Errorf("/proc/cpuinfo lists %s CPUs, want %s", got, want)
				}
				wantOnline := "0"
				if tc.wantCPUs > 1 {
					wantOnline = fmt.Sprintf("0-%d", tc.wantCPUs-1)
				}
				if got := sh("cat /sys/devices/system/cpu/online"); got != wantOnline && !(class == GVisorClass && got == "0-0" && wantOnline == "0") {
					t.Errorf("/sys/devices/system/cpu/online = %q, want %q", got, wantOnline)
				}
				wantMem := hostMem
				if tc.res.MemoryBytes > 0 {
					wantMem = tc.res.MemoryBytes >> 10
				}
				if got := memTotalKB(t, sh("cat /proc/meminfo")); got != wantMem {
					t.Errorf("MemTotal = %d kB, want %d", got, wantMem)
				}

				// The sandbox's own cgroup: gVisor shows its own v1 files, runc the host's
				// version.
				memFile, cpuFile := "/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/cpu/cpu.cfs_quota_us"
				v2 := class == "runc" && hostCgroupV2()
				if v2 {
					memFile, cpuFile = "/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/cpu.max"
				}
				mem, cpu := sh("cat "+memFile), sh("cat "+cpuFile)
				if tc.res.MemoryBytes > 0 {
					if mem != strconv.FormatInt(tc.res.MemoryBytes, 10) {
						t.Errorf("%s = %q, want %d", memFile, mem, tc.res.MemoryBytes)
					}
				} else if n, err := strconv.ParseInt(mem, 10, 64); mem != "max" && (err != nil || n < hostMem<<10) {
					t.Errorf("%s = %q without a limit, want max or at least the host's memory", memFile, mem)
				}
				wantCPU := "-1"
				if v2 {
					wantCPU = "max 100000"
				}
				if tc.res.MilliCPU > 0 {
					wantCPU = strconv.FormatInt(tc.res.MilliCPU*100, 10)
					if v2 {
						wantCPU += " 100000"
					}
				}
				if cpu != wantCPU {
					t.Errorf("%s = %q, want %q", cpuFile, cpu, wantCPU)
				}
				if class == "runc" {
					// The cgroup namespace: no host path in /proc/self/cgroup.
					for _, l := range strings.Split(sh("cat /proc/self/cgroup"), "\n") {
						if !strings.HasSuffix(l, ":/") {
							t.Errorf("/proc/self/cgroup line %q: want the namespace's root", l)
						}
					}
					// Read-only: the limits cannot be raised, no cgroup can be made, no file
					// planted beside them (on v1 /sys/fs/cgroup is a tmpfs).
					for _, script := range []string{"echo 9999999999 > " + memFile, "mkdir " + filepath.Dir(memFile) + "/escape", "echo 1 > /sys/fs/cgroup/planted"} {
						if _, _, code := execIn(t, c, "sh", "-c", script); code == 0 {
							t.Errorf("%q succeeded in the sandbox", script)
						}
					}
				} else {
					// gVisor's cgroupfs is its own (writable inside); the host's is untouched.
					_, _, _ = execIn(t, c, "sh", "-c", "echo 9999999999 > "+memFile)
				}
				if tc.res.MemoryBytes > 0 {
					f := hostCgroupFile(id, "memory", "memory.limit_in_bytes", "memory.max")
					if got := readTrim(t, f); got != strconv.FormatInt(tc.res.MemoryBytes, 10) {
						t.Errorf("host %s = %s after the sandbox wrote its own, want %d", f, got, tc.res.MemoryBytes)
					}
				}
				// On the host, the cpuset holds as many CPUs as the sandbox shows.
				if tc.res.MilliCPU > 0 {
					f := hostCgroupFile(id, "cpuset", "cpuset.cpus", "cpuset.cpus")
					if got := readTrim(t, f); got != cpuList(e.b.cpusOf(id)) || len(e.b.cpusOf(id)) != tc.wantCPUs {
						t.Errorf("host %s = %q, backend placed %v, want %d CPUs", f, got, e.b.cpusOf(id), tc.wantCPUs)
					}
				}
			})
		}
	}
}

// cpusOf is the cpuset the backend placed sandbox id on.
func (b *Backend) cpusOf(id string) []int {
	b.mu.Lock()
	defer b.mu.Unlock()
	if s := b.sandboxes[id]; s != nil {
		return s.cpus
	}
	return nil
}

// TestLimitsPlacement: sandboxes with CPU limits are spread over the host's CPUs, also
// by a restarted backend, which learns the cpusets of the sandboxes it recovers (whose
// view of their limits the restart leaves as it was); a destroyed sandbox's CPUs are
// free again.
func TestLimitsPlacement(t *testing.T) {
	e := newEnv(t)
	if len(hostCPUs()) < 2 {
		t.Skip("needs 2 CPUs")
	}
	half := runtime.Resources{MilliCPU: 500, MemoryBytes: 256 << 20}
	e.create(runtime.Spec{ID: "place-a", Container: runtime.Container{Command: "sleep", Args: []string{"3600"}, Resources: half}})
	a := e.b.cpusOf("place-a")
	if len(a) != 1 {
		t.Fatalf("place-a on %v, want one CPU", a)
	}
	e.b = e.backend() // a restarted runner
	if _, err := e.b.Recover(context.Background()); err != nil {
		t.Fatal(err)
	}
	// What place-a sees is files of its own: a restart changes nothing of it.
	if out, _, _ := execIn(t, agentClient(e.b, "place-a"), "sh", "-c", "nproc; grep MemTotal /proc/meminfo"); out != "1\nMemTotal:         262144 kB\n" {
		t.Errorf("place-a after the restart sees %q", out)
	}
	e.create(runtime.Spec{ID: "place-b", Container: runtime.Container{Command: "sleep", Args: []string{"3600"}, Resources: half}})
	if b := e.b.cpusOf("place-b"); len(b) != 1 || b[0] == a[0] {
		t.Errorf("place-b on %v, place-a on %v: want another CPU", b, a)
	}
	if err := e.b.Destroy(context.Background(), "place-a"); err != nil {
		t.Fatal(err)
	}
	e.create(runtime.Spec{ID: "place-c", Container: runtime.Container{Command: "sleep", Args: []string{"3600"}, Resources: half}})
	if c := e.b.cpusOf("place-c"); len(c) != 1 || c[0] != a[0] {
		t.Errorf("place-c on %v: want the CPU place-a left (%v)", c, a)
	}
	out, _, _ := execIn(t, agentClient(e.b, "place-c"), "nproc")
	if strings.TrimSpace(out) != "1" {
		t.Errorf("nproc in place-c = %q", out)
	}
}

// TestLimitsVisiblePooled: a sandbox that claims a pooled container (started without
// limits) sees its own limits, as a cold one does.
func TestLimitsVisiblePooled(t *testing.T) {
	e := poolEnv(t, 1, time.Minute)
	e.create(runtime.Spec{ID: "prime", Container: runtime.Container{Command: "true"}})
	waitPoolReady(t, e.b, 1)
	const id = "pooled-lim"
	e.create(runtime.Spec{ID: id, Container: runtime.Container{Command: "sleep", Args: []string{"3600"}, Resources: runtime.Resources{MilliCPU: 500, MemoryBytes: 256 << 20}}})
	if st := e.b.PoolStats(); st.Claims != 1 {
		t.Fatalf("no claim: %+v", st)
	}
	c := agentClient(e.b, id)
	for _, tc := range []struct{ script, want string }{
		{"nproc", "1"},
		{"cat /sys/devices/system/cpu/online", "0"},
		{"grep -c ^processor /proc/cpuinfo", "1"},
		{"grep MemTotal /proc/meminfo", "MemTotal:         262144 kB"},
	} {
		if out, errOut, _ := execIn(t, c, "sh", "-c", tc.script); strings.TrimSpace(out) != tc.want {
			t.Errorf("%s = %q (stderr %q), want %q", tc.script, out, errOut, tc.want)
		}
	}
}

func TestCPUList(t *testing.T) {
	for _, tc := range []struct {
		cpus []int
		want string
	}{
		{nil, ""}, {[]int{0}, "0"}, {[]int{0, 1}, "0-1"}, {[]int{1}, "1"},
		{[]int{0, 2, 3, 4, 7}, "0,2-4,7"}, {[]int{3, 5}, "3,5"},
	} {
		if got := cpuList(tc.cpus); got != tc.want {
			t.Errorf("cpuList(%v) = %q, want %q", tc.cpus, got, tc.want)
		}
	}
}

func TestCPUCount(t *testing.T) {
	for _, tc := range []struct {
		milli    int64
		host     int
		wantCPUs int
	}{
		{1, 8, 1}, {500, 8, 1}, {1000, 8, 1}, {1001, 8, 2}, {1500, 8, 2}, {2000, 8, 2}, {1500, 1, 1}, {64000, 2, 2},
	} {
		if got := cpuCount(tc.milli, tc.host); got != tc.wantCPUs {
			t.Errorf("cpuCount(%d, %d) = %d, want %d", tc.milli, tc.host, got, tc.wantCPUs)
		}
	}
}

// TestPlaceCPUs: the least committed CPUs, ended sandboxes not counted.
func TestPlaceCPUs(t *testing.T) {
	b := &Backend{hostCPUs: []int{0, 1, 2, 3}, sandboxes: map[string]*sandbox{}}
	add := func(id string, milli int64) []int {
		s := &sandbox{id: id, spec: runtime.Spec{Container: runtime.Container{Resources: runtime.Resources{MilliCPU: milli}}}, done: make(chan struct{})}
		b.sandboxes[id] = s
		return b.placeCPUs(s, milli)
	}
	for _, tc := range []struct {
		id    string
		milli int64
		want  string
	}{
		{"a", 2000, "0-1"}, // 1000 on 0 and 1
		{"b", 500, "2"},
		{"c", 1000, "3"},
		{"d", 500, "2"},      // 0:1000 1:1000 2:500 3:1000
		{"e", 3500, "0-3"},   // all four
		{"f", 0, ""},         // no limit: no cpuset
		{"g", 9000, "0-3"},   // at most the host's
		{"h", 1500, "0-1"},   // all at 4125: lowest first
		{"i", 100, "2"},      // 0 and 1 at 4875, 2 and 3 at 4125
		{"j", 100000, "0-3"}, // keeps working with large limits
	} {
		if got := cpuList(add(tc.id, tc.milli)); got != tc.want {
			t.Errorf("%s (%dm) on %q, want %q", tc.id, tc.milli, got, tc.want)
		}
	}
	for _, s := range b.sandboxes {
		close(s.done)
	}
	if got := cpuList(add("k", 500)); got != "0" {
		t.Errorf("with every other sandbox ended: %q, want 0", got)
	}
}

// TestPlaceCPUsGroup: every live container of a group counts on its own cpuset (runc),
// a gVisor group with its total on the sentry's (the primary's) cpuset and its members'
// none, an ended member not at all.
func TestPlaceCPUsGroup(t *testing.T) {
	for _, gvisor := range []bool{false, true} {
		b := &Backend{hostCPUs: []int{0, 1, 2, 3}, sandboxes: map[string]*sandbox{}}
		place := func(s *sandbox, milli int64) string {
			if !s.member {
				b.sandboxes[s.id] = s
			}
			return cpuList(b.placeCPUs(s, milli))
		}
		single := func(id string, milli int64) string {
			return place(&sandbox{id: id, spec: runtime.Spec{Container: runtime.Container{Resources: runtime.Resources{MilliCPU: milli}}}, done: make(chan struct{})}, milli)
		}
		g := &sandbox{id: "g", rt: &ociRuntime{gvisor: gvisor}, done: make(chan struct{}), spec: runtime.Spec{
			Container: runtime.Container{Name: "app", Resources: runtime.Resources{MilliCPU: 500}},
			Sidecars:  []runtime.Container{{Name: "side", Resources: runtime.Resources{MilliCPU: 1500}}},
		}}
		g.members = []*sandbox{newMember(g, &g.spec.Sidecars[0])}
		side := g.members[0]
		if !gvisor {
			// runc: app 500m on 0, side 1500m on 1-2 (750m each).
			if got := place(g, 500); got != "0" {
				t.Fatalf("runc app on %q", got)
			}
			if got := place(side, 1500); got != "1-2" {
				t.Fatalf("runc side on %q, want 1-2", got)
			}
			for _, tc := range []struct{ id, want string }{
				{"x", "3"}, // 0:500 1:750 2:750 3:0
				{"y", "0"}, // 3:600
			} {
				if got := single(tc.id, 600); got != tc.want {
					t.Errorf("runc group: %s on %q, want %s", tc.id, got, tc.want)
				}
			}
			close(side.done) // the sidecar ended: 1 and 2 are free
			if got := single("z", 600); got != "1" {
				t.Errorf("runc group, side ended: z on %q, want 1", got)
			}
			continue
		}
		// gVisor: the sentry on 0-1 for the total (1000m each); the member's own cpuset
		// (2-3, never applied) counts nothing.
		if got := place(g, g.spec.TotalResources().MilliCPU); got != "0-1" {
			t.Fatalf("gVisor group on %q, want 0-1", got)
		}
		if got := place(side, 1500); got != "2-3" {
			t.Fatalf("gVisor side placed on %q", got)
		}
		for _, tc := range []struct{ id, want string }{
			{"w", "2"}, // 0:1000 1:1000 2:0 3:0
			{"v", "3"},
			{"u", "2"}, // 2:600 3:600, both below the sentry's 1000
		} {
			if got := single(tc.id, 600); got != tc.want {
				t.Errorf("gVisor group: %s on %q, want %s", tc.id, got, tc.want)
			}
		}
	}
}

func TestCPUInfoFor(t *testing.T) {
	host := "processor\t: 0\nmodel name\t: X\n\nprocessor\t: 1\nmodel name\t: Y\n\nprocessor\t: 2\nmodel name\t: Z\n\n"
	if got, want := string(cpuinfoFor([]byte(host), []int{1, 2})), "processor\t: 0\nmodel name\t: Y\n\nprocessor\t: 1\nmodel name\t: Z\n\n"; got != want {
		t.Errorf("cpuinfoFor = %q, want %q", got, want)
	}
	if got := string(cpuinfoFor([]byte("no entries here\n"), []int{0})); got != "no entries here\n" {
		t.Errorf("unknown format changed: %q", got)
	}
}

func TestMemInfoFor(t *testing.T) {
	host := "MemTotal:       24683584 kB\nMemFree:        18382684 kB\nMemAvailable:   23308140 kB\nCached:          4819656 kB\n" +
		"VmallocTotal:   34359738367 kB\nHugePages_Total:       3\nHugepagesize:       2048 kB\n"
	want := "MemTotal:         262144 kB\nMemFree:          262144 kB\nMemAvailable:     262144 kB\nCached:                0 kB\n" +
		"VmallocTotal:   34359738367 kB\nHugePages_Total:       0\nHugepagesize:       2048 kB\n"
	if got := string(meminfoFor([]byte(host), 256<<20)); got != want {
		t.Errorf("meminfoFor 256Mi =\n%s\nwant\n%s", got, want)
	}
	// A limit above the host's memory shows the host's.
	if got := string(meminfoFor([]byte(host), 1<<50)); !strings.HasPrefix(got, "MemTotal:       24683584 kB\nMemFree:        24683584 kB\n") {
		t.Errorf("meminfoFor 1 PiB =\n%s", got)
	}
	if got := string(meminfoFor([]byte(host), 0)); got != host {
		t.Errorf("meminfoFor without a limit changed the host's: %s", got)
	}
}
