package local

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// Which OCI runtime CLI runs the runc class (Config.OCIRuntime): runc (the default) or
// crun, a C implementation of the same CLI and OCI spec. The backend hands both the
// same config.json (namespaces, the kept idmap user namespace's mappings, cgroup v2
// path, seccomp, capabilities, rlimits) and the same commands (run --detach
// --pid-file --preserve-fds, state, kill, delete --force, list --format json, pause,
// resume, exec); what differs:
//
//   - Both are run from a sealed in-memory copy (runcsealed.go). Each guards the
//     host's binary against a container reaching it through /proc/<pid>/exe
//     (CVE-2019-5736) the same way: anything but a memfd sealed with exactly
//     F_SEAL_SEAL|SHRINK|GROW|WRITE is bind-mounted read-only or copied into such a
//     memfd and re-executed from there. runc does it in every `runc init`, crun (a
//     constructor in libcrun, ensure_cloned_binary) in every command, `crun state`
//     and `crun delete` too; from the sealed copy neither has anything left to do.
//   - crun 1.8 takes a config.json of ociVersion 1.0.x or 1.1.x only: the backend
//     writes crunSpecVersion for it.
//   - /sys/fs/cgroup read-only on a cgroup v1 host: crun mounts each controller
//     read-only under a tmpfs, but its readonlyPaths entry for /sys/fs/cgroup (which the
//     backend sets: runc leaves that tmpfs writable) bind-mounts the tree recursively
//     and remounts only its top read-only, so the controllers come out writable: root
//     in a sandbox without a user namespace could raise its own memory limit. Every
//     controller dir is listed in readonlyPaths too for crun (crunSpec; missing ones
//     are skipped by crun), which makes them read-only again.
//   - crun refuses a hybrid cgroup host whose cgroup2 mount has a controller
//     (checkCrunCgroups); runc takes it.
//   - Each keeps its own state format under the class's root (<StateDir>/.oci/<class>):
//     runc a <id>/state.json, crun a <id>/status. A backend refuses a root holding
//     the other runtime's containers (ociStateOf): switch runtimes only on a runner
//     with no runc-class sandboxes left.
//   - checkpoint/restore is used under gVisor only, so crun's lack of CRIU here
//     changes nothing.

// crunSpecVersion is the ociVersion of a config.json for crun: crun 1.8 (Debian 12)
// refuses any but 1.0.x and 1.1.x ("unknown version specified"), and the spec uses
// nothing newer than 1.1 (runtime-spec 1.2 added fields, changed none of ours).
const crunSpecVersion = "1.1.0"

// cgroupV1Names are the cgroup v1 hierarchies' dir names under /sys/fs/cgroup that crun
// may mount (the kernel's v1 controllers, usual co-mounts and named hierarchies), besides
// those the runner's own /proc/self/cgroup names (crunCgroupDirs).
var cgroupV1Names = []string{
	"blkio", "cpu", "cpuacct", "cpu,cpuacct", "cpuacct,cpu", "cpuset", "devices", "freezer", "hugetlb",
	"memory", "net_cls", "net_prio", "net_cls,net_prio", "net_prio,net_cls", "perf_event", "pids", "rdma",
	"misc", "systemd", "elogind", "unified",
}

// crunCgroupDirs is every /sys/fs/cgroup/<hierarchy> path crun may mount in a container:
// cgroupV1Names and the hierarchies of selfCgroup (a /proc/self/cgroup's content).
func crunCgroupDirs(selfCgroup string) []string {
	names := slices.Clone(cgroupV1Names)
	for _, l := range strings.Split(selfCgroup, "\n") {
		parts := strings.SplitN(l, ":", 3)
		if len(parts) != 3 || parts[1] == "" {
			continue // cgroup v2's 0::/path
		}
		names = append(names, strings.TrimPrefix(parts[1], "name="))
		for _, c := range strings.Split(parts[1], ",") {
			names = append(names, strings.TrimPrefix(c, "name="))
		}
	}
	slices.Sort(names)
	names = slices.Compact(names)
	out := make([]string, 0, len(names))
	for _, n := range names {
		if n == "" || n == "." || n == ".." || strings.ContainsAny(n, "/\x00") {
			continue
		}
		out = append(out, "/sys/fs/cgroup/"+n)
	}
	return out
}

// crunSpec adapts a runc-class spec to crun: crunSpecVersion, and every cgroup
// hierarchy dir read-only after /sys/fs/cgroup (see above), when the spec has it so.
func crunSpec(oci *specs.Spec, cgroupDirs []string) {
	oci.Version = crunSpecVersion
	if oci.Linux != nil && slices.Contains(oci.Linux.ReadonlyPaths, "/sys/fs/cgroup") {
		oci.Linux.ReadonlyPaths = append(slices.Clone(oci.Linux.ReadonlyPaths), cgroupDirs...)
	}
}

// OCI runtime names of Config.OCIRuntime.
const (
	OCIRunc = "runc"
	OCICrun = "crun"
)

// CrunPath is where FindCrun looks first (Debian's crun package).
const CrunPath = "/usr/bin/crun"

// ValidateOCIRuntime checks a Config.OCIRuntime value ("" is runc).
func ValidateOCIRuntime(name string) error {
	switch name {
	case "", OCIRunc, OCICrun:
		return nil
	}
	return fmt.Errorf("OCI runtime %q: want %q or %q", name, OCIRunc, OCICrun)
}

// FindCrun returns the crun binary: CrunPath, else crun on PATH; "" when neither.
func FindCrun() string {
	if isExecutable(CrunPath) {
		return CrunPath
	}
	if p, err := exec.LookPath("crun"); err == nil {
		if abs, err := filepath.Abs(p); err == nil {
			return abs
		}
	}
	return ""
}

// isCrun says whether binary (a runtime class's) is crun.
func isCrun(binary string) bool { return filepath.Base(binary) == OCICrun }

// applyOCIRuntime returns runtimes (class -> binary) with the runc class run by the
// OCI runtime name: crun replaces the class's binary, runc (or "") leaves it.
func applyOCIRuntime(runtimes map[string]string, name string) (map[string]string, error) {
	if err := ValidateOCIRuntime(name); err != nil {
		return nil, fmt.Errorf("local backend: %w", err)
	}
	if name != OCICrun {
		return runtimes, nil
	}
	bin := FindCrun()
	if bin == "" {
		return nil, errors.New("local backend: OCI runtime crun: no crun binary (/usr/bin/crun or on PATH; apt install crun)")
	}
	if err := checkCrunCgroups(cgroupRoot); err != nil {
		return nil, err
	}
	out := maps.Clone(runtimes)
	out["runc"] = bin
	return out, nil
}

// ociStateOf says which runtime's container states a class's state root holds:
// OCIRunc (a <id>/state.json), OCICrun (a <id>/status) or "" (none, or no root).
func ociStateOf(root string) string {
	ents, err := os.ReadDir(root)
	if err != nil {
		return ""
	}
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		if _, err := os.Lstat(filepath.Join(root, e.Name(), "state.json")); err == nil {
			return OCIRunc
		}
		if _, err := os.Lstat(filepath.Join(root, e.Name(), "status")); err == nil {
			return OCICrun
		}
	}
	return ""
}

// CheckCrunCgroups is checkCrunCgroups on this host's /sys/fs/cgroup: nil when crun
// can put containers into cgroups here.
func CheckCrunCgroups() error { return checkCrunCgroups(cgroupRoot) }

// checkCrunCgroups fails when crun cannot put containers into cgroups on this host: a
// cgroup v1 host ("hybrid") with a cgroup2 mount at root+"/unified" that holds a
// controller (crun 1.8: "cgroups in hybrid mode not supported, drop all controllers
// from cgroupv2"). root is /sys/fs/cgroup but for tests. A pure v1 or v2 host passes.
func checkCrunCgroups(root string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(root, &st); err != nil || st.Type == unix.CGROUP2_SUPER_MAGIC {
		return nil // cgroup v2 only (or nothing crun will find either)
	}
	unified := filepath.Join(root, "unified")
	if err := unix.Statfs(unified, &st); err != nil || st.Type != unix.CGROUP2_SUPER_MAGIC {
		return nil // cgroup v1 only
	}
	b, err := os.ReadFile(filepath.Join(unified, "cgroup.controllers"))
	if err != nil || len(bytes.TrimSpace(b)) == 0 {
		return nil
	}
	return fmt.Errorf("local backend: OCI runtime crun: this host mounts cgroup v1 with a cgroup2 at %s holding controllers (%s), which crun refuses: use runc, a host with cgroup v1 or v2 only, or run the runner in a mount namespace without %s (scripts/cgroup-v1-ns.sh)", unified, strings.TrimSpace(string(b)), unified)
}
