package stacktest

import (
	"fmt"
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
// root) in every hierarchy, a pure v2 host's and a v1 host's alike.
func cgroupDirs(parent string) []string {
	var out []string
	if st, err := os.Stat(filepath.Join(cgroupRoot, parent)); err == nil && st.IsDir() {
		out = append(out, filepath.Join(cgroupRoot, parent)) // pure v2
	}
	v1, _ := filepath.Glob(filepath.Join(cgroupRoot, "*", parent))
	return append(out, v1...)
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
				for os.Remove(dirs[i]) != nil && time.Now().Before(deadline) {
					time.Sleep(50 * time.Millisecond) // the killed processes are going
				}
			}
		}
	}
}

// removeStale removes what a test process of name that is gone left on the host — its
// cgroups (killing the processes still in them: a sandbox's agent) and its bridges with
// their nftables tables — and says what it removed. Cleanups do not run when a test
// binary dies (a -timeout panic, a kill), and nothing else would ever remove them. A
// process is gone when no process has its ID (a bridge names only its low 16 bits: when
// any live process matches them, the bridge stays).
func removeStale(name string) []string {
	var out []string
	prefix := "sandboxd-" + name + "-"
	seen := map[int]bool{}
	v1, _ := filepath.Glob(filepath.Join(cgroupRoot, "*", prefix+"*"))
	v2, _ := filepath.Glob(filepath.Join(cgroupRoot, prefix+"*"))
	for _, d := range append(v1, v2...) {
		// sandboxd-<name>-<pid>, or StackConfigN's sandboxd-<name>-<pid>-<n>
		id, _, _ := strings.Cut(strings.TrimPrefix(filepath.Base(d), prefix), "-")
		pid, err := strconv.Atoi(id)
		if err != nil || seen[pid] || pid == os.Getpid() || alive(pid) {
			continue
		}
		seen[pid] = true
		stale := &Env{CgroupParent: prefix + id}
		out = append(out, stale.cgroupLeftovers()...)
		stale.removeCgroups()
	}
	links, _ := net.Interfaces()
	brPrefix := fmt.Sprintf("sbx%.5s", name)
	for _, l := range links {
		hex, ok := strings.CutPrefix(l.Name, brPrefix)
		if !ok || len(hex) < 4 || len(hex) > 5 {
			continue
		}
		low, err := strconv.ParseUint(hex[:4], 16, 16)
		if err != nil || liveLow16(int(low)) {
			continue
		}
		_ = exec.Command("nft", "delete", "table", "inet", "sandboxd_"+l.Name).Run()
		_ = exec.Command("nft", "delete", "table", "bridge", "sandboxd_"+l.Name).Run()
		if exec.Command("ip", "link", "del", l.Name).Run() == nil {
			out = append(out, "bridge "+l.Name+" and its nftables tables")
		}
	}
	return out
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
