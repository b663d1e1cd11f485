package local

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
)

// Which OCI runtime CLI runs the runc class (Config.OCIRuntime): runc (the default) or
// crun, a C implementation of the same CLI and OCI spec. The backend hands both the
// same config.json (namespaces, the kept idmap user namespace's mappings, cgroup v2
// path, seccomp, capabilities, rlimits) and the same commands (run --detach
// --pid-file --preserve-fds, state, kill, delete --force, list --format json, pause,
// resume, exec); what differs:
//
//   - runc is run from a sealed in-memory copy (runcsealed.go) so that its per-init
//     CVE-2019-5736 protection has nothing left to do; crun needs none: it has no
//     `runc init` re-exec of its own binary into the container (its container init is
//     a clone of the crun process, which execs the workload), and it protects the
//     host's binary from /proc/self/exe by re-executing itself from a sealed memfd
//     copy when it is not one already (crun's ensure_cloned_binary, as runc did
//     before 1.2), so crun is executed from its path.
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
