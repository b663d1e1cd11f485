package local

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// Limits a sandbox can see. Programs size their thread pools and caches by what the
// system tells them, so a sandbox shows its own CPU and memory limits the usual ways:
//
//   - /sys/fs/cgroup is the sandbox's own cgroup (a cgroup namespace; read-only): the
//     v2 files (memory.max, cpu.max, pids.max) on a v2 host, the v1 ones on a v1 host.
//   - A CPU limit of m millicores gets a cpuset of ceil(m/1000) CPUs (at most the
//     runner's), so the affinity mask (nproc, Go's NumCPU, Python's sched_getaffinity)
//     matches; the CFS quota stays the limit. The CPUs are the least committed ones
//     (placeCPUs), so sandboxes spread over the host.
//   - Under runc, read-only files generated at create are bind-mounted over
//     /sys/devices/system/cpu/online (glibc's get_nprocs: sysconf(_SC_NPROCESSORS_ONLN),
//     Python's os.cpu_count), /proc/cpuinfo (the sandbox's CPUs, renumbered from 0) and
//     /proc/meminfo (MemTotal = the memory limit). gVisor does all three itself from the
//     cpuset, the quota and the cgroup's memory limit (runsc's --cpu-num-from-quota,
//     --total-memory), so runsc sandboxes only get the cpuset.
//
// The files are static: they live in the sandbox's dir (removed with it) and are mounted
// in the container's own mount namespace only, so nothing stays on the host, nothing
// needs supervising, and a runner restart or crash leaves every sandbox's files intact.
// The price: /proc/meminfo's MemFree and MemAvailable are the limit, not live usage (the
// cgroup's memory.current / memory.usage_in_bytes is). docs/hardening.md ("Limits
// visible inside") weighs this against LXCFS. A dimension without a limit is not
// generated: the sandbox sees the host's live file.

const dirLimits = "limits" // in shownDir: the generated files

// limitFile is a generated file and where it is mounted in the sandbox.
type limitFile struct {
	name, dest string
	data       []byte
}

// Where the generated files go in the sandbox.
const (
	destCPUOnline = "/sys/devices/system/cpu/online"
	destCPUInfo   = "/proc/cpuinfo"
	destMemInfo   = "/proc/meminfo"
)

// hostCPUs is the CPUs the runner may run on (its affinity, which its cpuset bounds),
// ascending; nil when it cannot be read.
func hostCPUs() []int {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return nil
	}
	var cpus []int
	for i := 0; len(cpus) < set.Count(); i++ {
		if set.IsSet(i) {
			cpus = append(cpus, i)
		}
	}
	return cpus
}

// cpuCount is how many CPUs a limit of milli millicores shows: rounded up (a 500m or
// 1500m sandbox can run on 1 or 2 CPUs at once), at most host.
func cpuCount(milli int64, host int) int {
	n := int((milli + 999) / 1000)
	return max(1, min(n, host))
}

// placeCPUs picks the cpuset of s (CPU limit milli; 0: none, nil) and records it in
// s.cpus: the cpuCount(milli) CPUs with the least CPU limit committed to them by the
// other live sandboxes (a container's limit counts evenly on each of its CPUs; every
// container of a group counts, see cpuLoad), lowest first on a tie.
func (b *Backend) placeCPUs(s *sandbox, milli int64) []int {
	b.mu.Lock()
	defer b.mu.Unlock()
	s.cpus = nil
	if milli <= 0 || len(b.hostCPUs) == 0 {
		return nil
	}
	n := cpuCount(milli, len(b.hostCPUs))
	load := map[int]int64{}
	for _, o := range b.sandboxes {
		select {
		case <-o.done:
			continue // ended: uses no CPU
		default:
		}
		cpuLoad(load, o, s)
	}
	cpus := slices.Clone(b.hostCPUs)
	slices.SortStableFunc(cpus, func(x, y int) int { return int(min(max(load[x]-load[y], -1), 1)) })
	cpus = cpus[:n]
	slices.Sort(cpus)
	s.cpus = cpus
	return cpus
}

// cpuLoad adds to load the CPU limit the live containers of sandbox o other than s have
// on each of their CPUs: o's own and, in a group, each member's on its own cpuset. A
// gVisor group's containers all run in the sentry, on the primary's cpuset, which was
// placed for the group's total (createGroup): the members have none of their own.
func cpuLoad(load map[int]int64, o, s *sandbox) {
	add := func(c *sandbox, milli int64) {
		if c == s || len(c.cpus) == 0 {
			return
		}
		for _, cpu := range c.cpus {
			load[cpu] += milli / int64(len(c.cpus))
		}
	}
	if o.inGVisorGroup() {
		add(o, o.spec.TotalResources().MilliCPU)
		return
	}
	add(o, o.spec.Resources.MilliCPU)
	for _, m := range o.members {
		select {
		case <-m.done:
			continue // ended
		default:
		}
		add(m, m.spec.Resources.MilliCPU)
	}
}

// cpuList formats CPUs (ascending) as the kernel's lists do: "0", "0-3", "0,2-3".
func cpuList(cpus []int) string {
	var sb strings.Builder
	for i := 0; i < len(cpus); {
		j := i
		for j+1 < len(cpus) && cpus[j+1] == cpus[j]+1 {
			j++
		}
		if sb.Len() > 0 {
			sb.WriteByte(',')
		}
		sb.WriteString(strconv.Itoa(cpus[i]))
		if j > i {
			sb.WriteString("-" + strconv.Itoa(cpus[j]))
		}
		i = j + 1
	}
	return sb.String()
}

// limitFiles generates what a runc sandbox with cpuset cpus (nil: no CPU limit) and
// memory limit memBytes (0: none) sees. Only the limited dimensions get files, unless
// all is set (a pooled container, whose files a claim rewrites in place): the others
// are then the host's, as read now.
func limitFiles(cpus []int, memBytes int64, all bool) ([]limitFile, error) {
	var out []limitFile
	if len(cpus) > 0 || all {
		cpuinfo, err := os.ReadFile("/proc/cpuinfo")
		if err != nil {
			return nil, err
		}
		online, err := os.ReadFile(destCPUOnline)
		if err != nil {
			return nil, err
		}
		if len(cpus) > 0 {
			online = []byte(cpuList(seq(len(cpus))) + "\n")
			cpuinfo = cpuinfoFor(cpuinfo, cpus)
		}
		out = append(out, limitFile{"cpu-online", destCPUOnline, online}, limitFile{"cpuinfo", destCPUInfo, cpuinfo})
	}
	if memBytes > 0 || all {
		meminfo, err := os.ReadFile(destMemInfo)
		if err != nil {
			return nil, err
		}
		out = append(out, limitFile{"meminfo", destMemInfo, meminfoFor(meminfo, memBytes)})
	}
	return out, nil
}

// seq is 0..n-1.
func seq(n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = i
	}
	return s
}

// writeLimitFiles writes files into dir (made here) and returns their read-only bind
// mounts.
func writeLimitFiles(dir string, files []limitFile) ([]specs.Mount, error) {
	if len(files) == 0 {
		return nil, nil
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, err
	}
	var mounts []specs.Mount
	for _, f := range files {
		p := filepath.Join(dir, f.name)
		if err := os.WriteFile(p, f.data, 0o444); err != nil {
			return nil, err
		}
		mounts = append(mounts, specs.Mount{Destination: f.dest, Type: "bind", Source: p,
			Options: []string{"bind", "ro", "nosuid", "nodev", "noexec"}})
	}
	return mounts, nil
}

// rewriteLimitFiles replaces the content of the files a pooled container has mounted
// (same inodes: the bind mounts see the new content).
func rewriteLimitFiles(dir string, files []limitFile) error {
	for _, f := range files {
		if err := writeInPlace(filepath.Join(dir, f.name), f.data); err != nil {
			return fmt.Errorf("%s: %w", f.dest, err)
		}
	}
	return nil
}

// cpuinfoFor keeps the entries of host's /proc/cpuinfo for cpus, renumbered from 0 as
// the sandbox sees them. A format without "processor : N" entries is returned as is.
func cpuinfoFor(host []byte, cpus []int) []byte {
	var out bytes.Buffer
	n := 0
	for _, block := range bytes.Split(host, []byte("\n\n")) {
		if len(bytes.TrimSpace(block)) == 0 {
			continue
		}
		lines := bytes.Split(block, []byte("\n"))
		cpu, idx := -1, -1
		for i, l := range lines {
			k, v, ok := bytes.Cut(l, []byte(":"))
			if ok && string(bytes.TrimSpace(k)) == "processor" {
				if c, err := strconv.Atoi(string(bytes.TrimSpace(v))); err == nil {
					cpu, idx = c, i
				}
				break
			}
		}
		if idx < 0 {
			return host
		}
		if !slices.Contains(cpus, cpu) {
			continue
		}
		lines[idx] = []byte("processor\t: " + strconv.Itoa(n))
		n++
		out.Write(bytes.Join(lines, []byte("\n")))
		out.WriteString("\n\n")
	}
	if n == 0 {
		return host
	}
	return out.Bytes()
}

// meminfoFor is host's /proc/meminfo for a sandbox with memory limit memBytes (0: the
// host's, unchanged): MemTotal, MemFree and MemAvailable are the limit (at most the
// host's total), and every other amount is 0 except the kernel's constants (page and
// address space sizes), so nothing of the host's usage shows. The format (names, column
// widths) stays the kernel's.
func meminfoFor(host []byte, memBytes int64) []byte {
	if memBytes <= 0 {
		return host
	}
	lines := strings.SplitAfter(string(host), "\n")
	value := func(l string) (name, rest string, v int64, ok bool) {
		name, rest, ok = strings.Cut(l, ":")
		if f := strings.Fields(rest); ok && len(f) > 0 {
			v, err := strconv.ParseInt(f[0], 10, 64)
			return name, rest, v, err == nil
		}
		return "", "", 0, false
	}
	kb := memBytes >> 10
	for _, l := range lines {
		if name, _, v, ok := value(l); ok && name == "MemTotal" {
			kb = min(kb, v)
		}
	}
	var out bytes.Buffer
	for _, l := range lines {
		name, rest, v, ok := value(l)
		if !ok {
			out.WriteString(l)
			continue
		}
		num := strings.Fields(rest)[0]
		switch name {
		case "MemTotal", "MemFree", "MemAvailable":
			v = kb
		case "Hugepagesize", "VmallocTotal":
		default:
			v = 0
		}
		// Keep the kernel's layout: the value right-aligned where it was.
		width := len(rest) - len(strings.TrimLeft(rest, " ")) + len(num)
		out.WriteString(name + ":" + fmt.Sprintf("%*d", width, v) + strings.TrimPrefix(strings.TrimLeft(rest, " "), num))
	}
	return out.Bytes()
}
