package local

import (
	"os"
	"strings"
)

// Cgroup migrations on a v1 (or hybrid) host. runsc can clone its sandbox straight into
// the sandbox's cgroups only on a pure cgroup v2 host (CLONE_INTO_CGROUP); elsewhere its
// CLI joins them itself and moves back afterwards, two writes to cgroup.procs on the path
// of every gVisor create, resume and fork. Each such write takes the kernel's global
// cgroup_threadgroup_rwsem for writing, which by default waits for an RCU grace period:
// 4-20 ms each on this 2-core VM, 0.1 ms with the cgroup2 mount option favordynmods
// (Linux ≥ 6.0), which makes that lock an ordinary one (fork and exit take it for reading
// a little more slowly). It is the host's choice (it lasts until reboot, and no remount
// turns it off again), so the backend only says so, once, at start.

// favordynmodsHint is the hint for a host whose cgroup mounts (mounts, /proc/mounts'
// format) are cgroup v1 controllers beside a cgroup2 mount without favordynmods, or "".
func favordynmodsHint(mounts string) string {
	v1, v2 := false, ""
	for line := range strings.SplitSeq(mounts, "\n") {
		f := strings.Fields(line)
		if len(f) < 4 {
			continue
		}
		switch f[2] {
		case "cgroup":
			v1 = true
		case "cgroup2":
			if !strings.Contains(","+f[3]+",", ",favordynmods,") && v2 == "" {
				v2 = f[1]
			}
		}
	}
	if !v1 || v2 == "" {
		return ""
	}
	return "cgroup v1 host: each gVisor create, resume and fork moves runsc between cgroups twice, and each move waits for an RCU grace period (~5-20 ms); `mount -o remount,favordynmods " + v2 + "` (Linux >= 6.0, until reboot) makes them ~0.1 ms"
}

// logCgroupHint logs favordynmodsHint of this host once (when the gvisor class is there).
func (b *Backend) logCgroupHint() {
	if b.log == nil || b.runtimes[GVisorClass] == nil {
		return
	}
	data, err := os.ReadFile("/proc/mounts")
	if err != nil {
		return
	}
	if h := favordynmodsHint(string(data)); h != "" {
		b.log.Info("host setting: " + h)
	}
}
