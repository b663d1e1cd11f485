package bench

import (
	"bufio"
	"bytes"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"time"
)

// Memory accounting shared by the density and Docker peer benchmarks, the same on both
// sides of a comparison:
//   - cgroup: the memory charged to the containers' cgroups (cgroup v2 memory.current of
//     their common parent, or cgroup v1 memory.usage_in_bytes: anonymous memory, page
//     cache and kernel memory the containers caused), plus
//   - host processes each container keeps outside its cgroup (Docker's
//     containerd-shim-runc-v2, one per container; sandboxd keeps none: `runc run -d`
//     exits and the agent runs inside the sandbox), plus
//   - the daemons' growth (dockerd + containerd; the sandboxd runner's, here the
//     benchmark process's, after a GC),
//
// processes counted by their proportional set size (PSS: a page shared by k processes
// counts 1/k to each, so the shims' common binary is counted once, not per shim),
// falling back to RSS where smaps_rollup is missing;
//
// and, independently, the drop of the host's MemAvailable (everything, kernel objects
// such as network namespaces and veths included, but also whatever else the machine
// did meanwhile).

// memAvailable is /proc/meminfo's MemAvailable in bytes (0 if unreadable).
func memAvailable() int64 {
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	return meminfoField(data, "MemAvailable:")
}

func meminfoField(data []byte, key string) int64 {
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), key); ok {
			f := strings.Fields(v)
			if len(f) == 0 {
				return 0
			}
			n, _ := strconv.ParseInt(f[0], 10, 64)
			return n << 10 // kB
		}
	}
	return 0
}

// cgroupMemory is the memory charged to cgroup parent (a path below the hierarchy's
// root) and everything below it: cgroup v2 memory.current, else cgroup v1's memory
// controller's memory.usage_in_bytes. 0 when neither exists.
func cgroupMemory(parent string) int64 {
	for _, p := range []string{
		filepath.Join("/sys/fs/cgroup", parent, "memory.current"),
		filepath.Join("/sys/fs/cgroup/memory", parent, "memory.usage_in_bytes"),
	} {
		if data, err := os.ReadFile(p); err == nil {
			n, _ := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
			return n
		}
	}
	return 0
}

// pssOf is process pid's proportional set size in bytes (its RSS without
// smaps_rollup; 0 if gone).
func pssOf(pid int) int64 {
	dir := filepath.Join("/proc", strconv.Itoa(pid))
	if data, err := os.ReadFile(filepath.Join(dir, "smaps_rollup")); err == nil {
		return meminfoField(data, "Pss:")
	}
	data, err := os.ReadFile(filepath.Join(dir, "status"))
	if err != nil {
		return 0
	}
	return meminfoField(data, "VmRSS:")
}

// selfPSS is this process's PSS after a GC that returns freed memory to the OS, so
// that its growth is what the runner holds, not garbage.
func selfPSS() int64 {
	runtime.GC()
	debug.FreeOSMemory()
	return pssOf(os.Getpid())
}

// idleSettle lets fresh containers go idle (their start-up page faults and the
// daemons' buffers settle) before their memory is read.
func idleSettle() { time.Sleep(2 * time.Second) }

// pidsWhoseCmdline holds every one of subs (host processes such as shims).
func pidsWhoseCmdline(subs ...string) []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		data, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		cmd := string(bytes.ReplaceAll(data, []byte{0}, []byte{' '}))
		all := true
		for _, s := range subs {
			all = all && strings.Contains(cmd, s)
		}
		if all {
			pids = append(pids, pid)
		}
	}
	return pids
}

func mib(n int64) float64 { return float64(n) / (1 << 20) }
