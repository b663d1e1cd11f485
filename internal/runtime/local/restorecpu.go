package local

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// A gVisor restore (Resume, Fork) runs without the sandbox's CPU limits, which are
// applied once `runsc restore` has returned. runsc restore puts its gofer and sentry in
// the sandbox's cgroup, so with a CPU limit the sentry's boot and the restore of its
// kernel ran on the sandbox's cpuset (one CPU for the default 1000m on a 2-core host)
// under its CPU quota: ~20 ms of a resume's ~150 (BenchmarkPauseResume/
// resident-0MiB-cpu1000m). The restore reads its OCI spec from restoreBundleDir, a copy
// of the bundle's config.json without the cpuset and the quota (runsc only warns when a
// restore's resources differ from the checkpoint's); applyCPULimits then writes the
// bundle's own limits into the sandbox's cgroup, before the restored sentry is recorded
// (info.json) and before the call returns: a crash in between leaves a sentry that
// Recover deletes (the sandbox stays checkpointed, or the fork is undone). Memory and
// pids limits apply throughout; the sandbox's own processes run without the CPU limit
// only between the restored kernel's start and applyCPULimits (well under a
// millisecond's CPU). cgroup v1 hosts only (what was measured): on v2 a restore runs
// under its limits as before.

// restoreWithoutCPULimits turns this on (a variable for benchmarks to compare).
var restoreWithoutCPULimits = true

// restoreBundleDir is, in a sandbox's dir, the bundle its restores read (config.json only).
const restoreBundleDir = "bundle-restore"

// cpuLimits are the CPU limits of a sandbox's cgroup (v1), below the cgroup root.
type cpuLimits struct {
	cgroup string
	cpus   string // cpuset ("" none)
	quota  int64  // CFS quota (0 none) per period µs
	period uint64
}

// restoreBundle returns the bundle dir a restore of bundle reads and the CPU limits of
// bundle's spec (nil: none, or not a cgroup v1 host; the dir is then bundle itself).
// dir receives the copy.
func restoreBundle(bundle, dir string) (string, *cpuLimits, error) {
	if !restoreWithoutCPULimits {
		return bundle, nil, nil
	}
	if _, err := os.Stat(filepath.Join(cgroupRoot, "cpu")); err != nil {
		return bundle, nil, nil // not cgroup v1
	}
	raw, err := os.ReadFile(filepath.Join(bundle, "config.json"))
	if err != nil {
		return "", nil, err
	}
	var sp specs.Spec
	if err := json.Unmarshal(raw, &sp); err != nil {
		return "", nil, fmt.Errorf("the sandbox's OCI spec: %w", err)
	}
	if sp.Linux == nil || sp.Linux.Resources == nil || sp.Linux.Resources.CPU == nil || sp.Linux.CgroupsPath == "" {
		return bundle, nil, nil
	}
	cpu := sp.Linux.Resources.CPU
	lim := &cpuLimits{cgroup: sp.Linux.CgroupsPath, cpus: cpu.Cpus, period: cpuPeriod}
	if cpu.Quota != nil && *cpu.Quota > 0 {
		lim.quota = *cpu.Quota
		if cpu.Period != nil && *cpu.Period > 0 {
			lim.period = *cpu.Period
		}
	}
	if lim.cpus == "" && lim.quota == 0 {
		return bundle, nil, nil
	}
	relaxed := *cpu
	relaxed.Cpus, relaxed.Quota, relaxed.Period = "", nil, nil
	sp.Linux.Resources.CPU = &relaxed
	if sp.Root != nil && !filepath.IsAbs(sp.Root.Path) {
		sp.Root.Path = filepath.Join(bundle, sp.Root.Path)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", nil, err
	}
	if err := writeJSONAtomic(filepath.Join(dir, "config.json"), &sp); err != nil {
		return "", nil, err
	}
	return dir, lim, nil
}

// applyCPULimits writes lim (from restoreBundle; nil: nothing) into its cgroup.
func applyCPULimits(lim *cpuLimits) error {
	if lim == nil {
		return nil
	}
	write := func(path, v string) error {
		if err := os.WriteFile(path, []byte(v), 0o644); err != nil {
			return fmt.Errorf("the restored sandbox's CPU limits: %w", err)
		}
		return nil
	}
	if lim.cpus != "" {
		if err := write(filepath.Join(cgroupRoot, "cpuset", lim.cgroup, "cpuset.cpus"), lim.cpus); err != nil {
			return err
		}
	}
	if lim.quota > 0 {
		dir := filepath.Join(cgroupRoot, "cpu", lim.cgroup)
		if err := write(filepath.Join(dir, "cpu.cfs_period_us"), strconv.FormatUint(lim.period, 10)); err != nil {
			return err
		}
		return write(filepath.Join(dir, "cpu.cfs_quota_us"), strconv.FormatInt(lim.quota, 10))
	}
	return nil
}
