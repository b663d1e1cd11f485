package stacktest

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// cgroupRoot is where the cgroup hierarchies are mounted: a pure cgroup v2 host's one
// hierarchy, or a v1 (hybrid) host's one per controller below it (v2's at unified/).
const cgroupRoot = "/sys/fs/cgroup"

// parents are this process's cgroup parents: CgroupParent (StackConfig's) and those of
// StackConfigN's stacks 1-9.
func (e *Env) parents() []string {
	out := []string{e.CgroupParent}
	for n := 1; n <= 9; n++ {
		out = append(out, fmt.Sprintf("%s-%d", e.CgroupParent, n))
	}
	return out
}

// cgroupDirs lists the directories of cgroup parent (a name below the hierarchies'
// root) in every hierarchy (hierarchies), a pure v2 host's and a v1 host's alike.
func cgroupDirs(parent string) []string {
	var out []string
	for _, h := range hierarchies() {
		d := filepath.Join(h, parent)
		if st, err := os.Stat(d); err == nil && st.IsDir() {
			out = append(out, d)
		}
	}
	return out
}

// hierarchies lists the roots of the cgroup hierarchies: a pure cgroup v2 host's one,
// /sys/fs/cgroup itself (it has cgroup.controllers), or a v1 (hybrid) host's mounts
// below it, one per controller (v2's at unified/). Never a cgroup below a root: on a
// pure v2 host /sys/fs/cgroup/*/ are cgroups — a runner's own, /sys/fs/cgroup/sandboxd,
// holds sandboxes whose IDs a tenant chooses, and a name of ours must not match there.
func hierarchies() []string {
	if _, err := os.Stat(filepath.Join(cgroupRoot, "cgroup.controllers")); err == nil {
		return []string{cgroupRoot}
	}
	b, _ := os.ReadFile("/proc/self/mounts")
	return cgroupMounts(string(b))
}

// cgroupMounts lists the cgroup (v1 and v2) mount points right below cgroupRoot in
// mounts (/proc/self/mounts' text), each once.
func cgroupMounts(mounts string) []string {
	var out []string
	for l := range strings.SplitSeq(mounts, "\n") {
		// "source mountpoint fstype options dump pass"
		f := strings.Fields(l)
		if len(f) >= 3 && (f[2] == "cgroup" || f[2] == "cgroup2") && filepath.Dir(f[1]) == cgroupRoot &&
			!slices.Contains(out, f[1]) {
			out = append(out, f[1])
		}
	}
	return out
}

// RemoveCgroupParent removes cgroup parent (a name below the hierarchies' root, by now
// empty) in every hierarchy, a pure v2 host's and a v1 host's alike, and returns the
// directories it could not remove (a cgroup still inside: something still runs).
func RemoveCgroupParent(parent string) (left []string) {
	for _, d := range cgroupDirs(parent) {
		if err := os.Remove(d); err != nil && !os.IsNotExist(err) {
			left = append(left, d)
		}
	}
	return left
}

// SandboxCgroups lists the cgroups left below cgroup parent (a stack's CgroupParent), in
// any hierarchy, with the processes in each: once every sandbox of the stack was deleted
// there is none. It waits (up to 10 s) for cgroups that are going: a sandbox's teardown
// ends after its state is terminal.
func SandboxCgroups(parent string) []string {
	deadline := time.Now().Add(10 * time.Second)
	for {
		out := cgroupsUnder(parent, false)
		if len(out) == 0 || time.Now().After(deadline) {
			return out
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// cgroupsUnder describes the cgroups below parent (and parent itself if self), one line
// each whatever the hierarchies it is in: "cgroup REL (HIERARCHIES)", and the processes
// in it.
func cgroupsUnder(parent string, self bool) []string {
	var rels []string
	where := map[string][]string{} // relative path → hierarchies ("" for a pure v2 host's)
	procs := map[string][]int{}
	for _, d := range cgroupDirs(parent) {
		h, _ := filepath.Rel(cgroupRoot, filepath.Dir(d))
		_ = filepath.WalkDir(d, func(p string, de os.DirEntry, err error) error {
			if err != nil || !de.IsDir() || (p == d && !self) {
				return nil
			}
			rel, _ := filepath.Rel(filepath.Dir(d), p)
			if _, ok := where[rel]; !ok {
				rels = append(rels, rel)
			}
			where[rel] = append(where[rel], h)
			for _, pid := range cgroupProcs(p) {
				if !slices.Contains(procs[rel], pid) {
					procs[rel] = append(procs[rel], pid)
				}
			}
			return nil
		})
	}
	slices.Sort(rels)
	var out []string
	for _, rel := range rels {
		l := "cgroup " + rel
		if hs := where[rel]; !slices.Equal(hs, []string{"."}) {
			l += " (" + strings.Join(hs, ", ") + ")"
		}
		if len(procs[rel]) > 0 {
			var ps []string
			for _, pid := range procs[rel] {
				ps = append(ps, describeProc(pid))
			}
			l += " holding " + strings.Join(ps, ", ")
		}
		out = append(out, l)
	}
	return out
}

func cgroupProcs(dir string) []int {
	b, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	var out []int
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil {
			out = append(out, pid)
		}
	}
	return out
}

func describeProc(pid int) string {
	comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	return fmt.Sprintf("pid %d (%s)", pid, strings.TrimSpace(string(comm)))
}

// HostLeftovers lists what this environment's stacks left on the host once Close ran:
// its cgroup parents (in any hierarchy; with any cgroup below them), processes still in
// a cgroup of theirs (a sandbox's agent, say, found by /proc/<pid>/cgroup, so one in a
// cgroup already removed counts too), and its bridges. Every stack deleted its
// sandboxes, closed and cleaned up its network, so there is nothing. A process that
// exited and waits to be reaped is given 10 s to go.
func (e *Env) HostLeftovers() []string {
	deadline := time.Now().Add(10 * time.Second)
	for {
		out := e.hostLeftovers()
		if len(out) == 0 || time.Now().After(deadline) {
			return out
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (e *Env) hostLeftovers() []string {
	out := e.cgroupLeftovers()
	for _, br := range e.bridges() {
		if _, err := net.InterfaceByName(br); err == nil {
			out = append(out, "bridge "+br)
		}
		for _, family := range []string{"inet", "bridge"} {
			if exec.Command("nft", "list", "table", family, "sandboxd_"+br).Run() == nil {
				out = append(out, "nftables table "+family+" sandboxd_"+br)
			}
		}
	}
	return out
}

// cgroupLeftovers lists the cgroups of this environment's parents and the processes in
// them.
func (e *Env) cgroupLeftovers() []string {
	var out []string
	for _, p := range e.parents() {
		out = append(out, cgroupsUnder(p, true)...)
	}
	for _, pid := range e.procs() {
		out = append(out, "process "+describeProc(pid))
	}
	return out
}

// bridges are this process's bridges, StackConfig's and StackConfigN's, each with its
// nftables tables (inet and bridge) named sandboxd_<bridge>.
func (e *Env) bridges() []string {
	out := []string{e.Bridge}
	for n := 1; n <= 9; n++ {
		out = append(out, fmt.Sprintf("%s%d", e.Bridge, n))
	}
	return out
}

// procs lists the processes in a cgroup below one of this environment's parents, in
// any hierarchy.
func (e *Env) procs() []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, ent := range ents {
		pid, err := strconv.Atoi(ent.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", ent.Name(), "cgroup"))
		if err != nil {
			continue
		}
		for l := range strings.SplitSeq(string(b), "\n") {
			// "hierarchy-ID:controllers:/path", v2's hierarchy 0
			f := strings.SplitN(l, ":", 3)
			if len(f) == 3 && slices.ContainsFunc(e.parents(), func(p string) bool {
				return f[2] == "/"+p || strings.HasPrefix(f[2], "/"+p+"/")
			}) {
				out = append(out, pid)
				break
			}
		}
	}
	return out
}

// RemoveHostLeftovers kills what HostLeftovers found (the processes in this
// environment's cgroups) and removes its cgroups, deepest first, its bridges and their
// nftables tables, so that a leak of one run does not stay on the host.
func (e *Env) RemoveHostLeftovers() {
	for _, br := range e.bridges() {
		_ = exec.Command("nft", "delete", "table", "inet", "sandboxd_"+br).Run()
		_ = exec.Command("nft", "delete", "table", "bridge", "sandboxd_"+br).Run()
		if _, err := net.InterfaceByName(br); err == nil {
			_ = exec.Command("ip", "link", "del", br).Run()
		}
	}
	e.removeCgroups()
}

// removeCgroups kills the processes in this environment's cgroups and removes the
// cgroups, deepest first.
func (e *Env) removeCgroups() {
	for _, pid := range e.procs() {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	for _, p := range e.parents() {
		for _, d := range cgroupDirs(p) {
			var dirs []string
			_ = filepath.WalkDir(d, func(p string, de os.DirEntry, err error) error {
				if err == nil && de.IsDir() {
					dirs = append(dirs, p)
				}
				return nil
			})
			deadline := time.Now().Add(5 * time.Second)
			for i := len(dirs) - 1; i >= 0; i-- {
				for {
					err := os.Remove(dirs[i])
					if err == nil || errors.Is(err, fs.ErrNotExist) || time.Now().After(deadline) {
						break // removed, already gone, or given up
					}
					time.Sleep(50 * time.Millisecond) // the killed processes are going
				}
			}
		}
	}
}

// removeStale removes what a test process of name that is gone left on the host — its
// cgroups (killing the processes still in them: a sandbox's agent) and its bridges with
// their nftables tables — and says what it removed. Cleanups do not run when a test
// binary dies (a -timeout panic, a kill), and nothing else would ever remove them.
//
// A run's cgroup parent names its PID namespace and its process ID (cgroupParent):
// process IDs are per PID namespace while cgroups and bridges may be shared (containers
// on one host running the suite), so only a run of this PID namespace is judged, by
// /proc/<pid> of this namespace. A bridge names only the low 16 bits of the ID: it goes
// only when the cgroup parent of its run was just cleaned (and no live process here
// matches those bits); a run that died before its first sandbox leaves its bridge.
func removeStale(name string) []string {
	var out []string
	ns := pidNS()
	cleaned := map[int]bool{}
	for _, h := range hierarchies() {
		ds, _ := filepath.Glob(filepath.Join(h, cgroupParent(name, ns, 0)+"*"))
		for _, d := range ds {
			pid, ok := staleRun(filepath.Base(d), name, ns)
			if !ok || cleaned[pid] || pid == os.Getpid() || alive(pid) {
				continue
			}
			cleaned[pid] = true
			stale := &Env{CgroupParent: cgroupParent(name, ns, pid)}
			out = append(out, stale.cgroupLeftovers()...)
			stale.removeCgroups()
		}
	}
	for pid := range cleaned {
		if liveLow16(pid & 0xffff) {
			continue
		}
		for _, br := range (&Env{Bridge: bridgeName(name, pid)}).bridges() {
			if _, err := os.Stat(filepath.Join("/sys/class/net", br, "bridge")); err != nil {
				continue // none, or not a bridge (a veth's name, say)
			}
			_ = exec.Command("nft", "delete", "table", "inet", "sandboxd_"+br).Run()
			_ = exec.Command("nft", "delete", "table", "bridge", "sandboxd_"+br).Run()
			if exec.Command("ip", "link", "del", br).Run() == nil {
				out = append(out, "bridge "+br+" and its nftables tables")
			}
		}
	}
	return out
}

// cgroupParent is the cgroup parent of name's run pid in PID namespace ns (pid 0: the
// prefix every run of name in ns shares); StackConfigN appends -<n>.
func cgroupParent(name string, ns uint64, pid int) string {
	p := fmt.Sprintf("sandboxd-%s-%d-", name, ns)
	if pid != 0 {
		p += strconv.Itoa(pid)
	}
	return p
}

// bridgeName is the bridge of name's run pid (IFNAMSIZ: no room for the PID namespace).
func bridgeName(name string, pid int) string {
	return fmt.Sprintf("sbx%.5s%04x", name, pid&0xffff)
}

// staleRun parses base, a cgroup's name, as the cgroup parent of a run of name in PID
// namespace ns (sandboxd-<name>-<ns>-<pid>, or StackConfigN's ...-<pid>-<n>) and returns
// the run's process ID.
func staleRun(base, name string, ns uint64) (int, bool) {
	rest, ok := strings.CutPrefix(base, cgroupParent(name, ns, 0))
	if !ok {
		return 0, false
	}
	id, n, hasN := strings.Cut(rest, "-")
	pid, err := strconv.Atoi(id)
	if err != nil || pid <= 0 || strconv.Itoa(pid) != id {
		return 0, false
	}
	if hasN && (len(n) != 1 || n[0] < '1' || n[0] > '9') {
		return 0, false
	}
	return pid, true
}

// pidNS is the inode of this process's PID namespace (0 if unknown).
func pidNS() uint64 {
	var st syscall.Stat_t
	if syscall.Stat("/proc/self/ns/pid", &st) != nil {
		return 0
	}
	return st.Ino
}

func alive(pid int) bool {
	_, err := os.Stat(fmt.Sprintf("/proc/%d", pid))
	return err == nil
}

// liveLow16 reports whether a live process's ID has low as its low 16 bits.
func liveLow16(low int) bool {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if pid, err := strconv.Atoi(e.Name()); err == nil && pid&0xffff == low {
			return true
		}
	}
	return false
}
