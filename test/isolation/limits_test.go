package isolation

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// TestLimitsView attacks what a sandbox sees of its limits (its cgroup at
// /sys/fs/cgroup, the generated /proc/meminfo, /proc/cpuinfo and
// /sys/devices/system/cpu/online under runc) under every runtime class: it cannot raise
// its limits or make cgroups on the host, cannot see a sibling sandbox's cgroup, and
// cannot write, unmount or look behind the generated files.
func TestLimitsView(t *testing.T) {
	su := newSuite(t)
	limits := runtime.Resources{MilliCPU: 500, MemoryBytes: 256 << 20}
	neighbour := su.create(runtime.Spec{Container: runtime.Container{Image: env.Busybox(), Command: "sleep", Args: []string{"infinity"}, Resources: limits}})
	v2 := false
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		v2 = true
	}
	// hostCgroup is a file of sandbox id's memory cgroup on the host.
	hostCgroup := func(id, v1, v2name string) string {
		if v2 {
			return filepath.Join("/sys/fs/cgroup", env.CgroupParent, id, v2name)
		}
		return filepath.Join("/sys/fs/cgroup/memory", env.CgroupParent, id, v1)
	}
	rows := map[string]map[string]string{}
	for _, class := range classes() {
		sb := su.create(runtime.Spec{Container: runtime.Container{Image: env.Busybox(), Command: "sleep", Args: []string{"infinity"}, Resources: limits}, RuntimeClass: class})
		c := su.agent(sb.ID)
		sh := func(script string) (string, int32) {
			t.Helper()
			res, err := exec1(c, 20*time.Second, "sh", "-c", script)
			if err != nil {
				t.Fatalf("%s: %s: %v", class, script, err)
			}
			return strings.TrimSpace(string(res.Stdout) + string(res.Stderr)), res.ExitCode
		}
		// Inside, gVisor shows its own cgroup v1 files; runc the host's version.
		memDir := "/sys/fs/cgroup/memory"
		memFile := memDir + "/memory.limit_in_bytes"
		if v2 && class == "runc" {
			memDir, memFile = "/sys/fs/cgroup", "/sys/fs/cgroup/memory.max"
		}
		hostLimit := hostCgroup(sb.ID, "memory.limit_in_bytes", "memory.max")
		unchanged := func() bool {
			b, err := os.ReadFile(hostLimit)
			return err == nil && strings.TrimSpace(string(b)) == "268435456"
		}

		// Raise the memory limit. gVisor's cgroupfs is the sentry's own and takes the
		// write; only the host's limit counts.
		out, code := sh("echo 9999999999 > " + memFile + " && cat " + memFile)
		switch {
		case !unchanged():
			row(rows, "raise its own memory limit", class, "ALLOWED: the host's limit changed")
			t.Errorf("%s: the sandbox changed its host memory limit", class)
		case code != 0:
			row(rows, "raise its own memory limit", class, "blocked ("+lastLine(out)+")")
		case class == "runc":
			row(rows, "raise its own memory limit", class, "ALLOWED: "+out)
			t.Errorf("%s: writing %s succeeded: %q", class, memFile, out)
		default:
			row(rows, "raise its own memory limit", class, "blocked (gVisor's own cgroupfs shows "+out+"; the host's limit stays 256 MiB)")
		}

		// Make a cgroup (to move itself out of its limits).
		out, code = sh("mkdir " + memDir + "/escape")
		hostDir := filepath.Join(filepath.Dir(hostLimit), "escape")
		_, statErr := os.Stat(hostDir)
		switch {
		case statErr == nil:
			row(rows, "make a cgroup", class, "ALLOWED: "+hostDir+" exists on the host")
			t.Errorf("%s: the sandbox made %s", class, hostDir)
		case code != 0:
			row(rows, "make a cgroup", class, "blocked ("+lastLine(out)+")")
		case class == "runc":
			row(rows, "make a cgroup", class, "ALLOWED: mkdir succeeded")
			t.Errorf("%s: mkdir in its cgroup succeeded", class)
		default:
			row(rows, "make a cgroup", class, "blocked (only in gVisor's own cgroupfs, nothing on the host)")
		}

		// Plant a limit file of its own choosing where programs look (on a v1 host
		// /sys/fs/cgroup is a tmpfs holding the controllers' mounts).
		if out, code := sh("echo 99999999999 > /sys/fs/cgroup/memory.max && cat /sys/fs/cgroup/memory.max"); code == 0 {
			row(rows, "plant a file in /sys/fs/cgroup", class, "ALLOWED: "+out)
			t.Errorf("%s: wrote /sys/fs/cgroup/memory.max: %q", class, out)
		} else {
			row(rows, "plant a file in /sys/fs/cgroup", class, "blocked ("+lastLine(out)+")")
		}

		// See another sandbox's cgroup, or where its own sits on the host.
		out, _ = sh("cat /proc/self/cgroup; find /sys/fs/cgroup -maxdepth 3 -type d")
		if strings.Contains(out, neighbour.ID) || strings.Contains(out, env.CgroupParent) {
			row(rows, "see a sibling sandbox's cgroup", class, "ALLOWED")
			t.Errorf("%s: the sandbox sees host cgroup names:\n%s", class, out)
		} else {
			row(rows, "see a sibling sandbox's cgroup", class, "blocked (only its own cgroup, at the root)")
		}

		// The limit files: write them, unmount them (to see the host's), look behind them.
		for _, f := range []string{"/proc/meminfo", "/proc/cpuinfo", "/sys/devices/system/cpu/online"} {
			if out, code := sh("echo 0 > " + f); code == 0 {
				row(rows, "write "+f, class, "ALLOWED")
				t.Errorf("%s: writing %s succeeded: %q", class, f, out)
			} else {
				row(rows, "write "+f, class, "blocked ("+lastLine(out)+")")
			}
		}
		out, code = sh("umount /proc/meminfo 2>&1 || umount -l /proc/meminfo; grep MemTotal /proc/meminfo")
		if !strings.Contains(out, "MemTotal:         262144 kB") {
			row(rows, "unmount /proc/meminfo to see the host's", class, "ALLOWED: "+lastLine(out))
			t.Errorf("%s: after umount, %q (exit %d)", class, out, code)
		} else {
			row(rows, "unmount /proc/meminfo to see the host's", class, "blocked ("+firstLine(out)+")")
		}
		// mountinfo names the host path of a bind mount's source: nothing is there.
		out, _ = sh(`src=$(awk '$5 == "/proc/meminfo" {print $4}' /proc/self/mountinfo); ` +
			`if [ -n "$src" ]; then cat "$(dirname "$src")/../spec.json" "$(dirname "$src")/../info.json" 2>&1; else echo "no bind mount: the runtime's own /proc"; fi`)
		if strings.Contains(out, `"id"`) || strings.Contains(out, "runtime_class") {
			row(rows, "read host files next to the limit files", class, "ALLOWED")
			t.Errorf("%s: read the sandbox's host files: %s", class, out)
		} else {
			row(rows, "read host files next to the limit files", class, fmt.Sprintf("blocked (%s)", lastLine(out)))
		}
	}
	printTable(t, rows)
}

func lastLine(s string) string {
	l := strings.Split(strings.TrimSpace(s), "\n")
	return l[len(l)-1]
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(strings.TrimSpace(s), "\n")
	return l
}
