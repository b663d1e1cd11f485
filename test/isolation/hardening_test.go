package isolation

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// hostUIDs describes the distinct host uids of the processes in a sandbox's cgroup (and
// for root, whether in a user namespace of its own and with which capabilities).
func hostUIDs(t *testing.T, id string) []string {
	t.Helper()
	procs, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/pids", env.CgroupParent, id, "cgroup.procs"))
	if err != nil {
		t.Fatalf("cgroup of %s: %v", id, err)
	}
	seen := map[string]bool{}
	var out []string
	for _, f := range strings.Fields(string(procs)) {
		b, err := os.ReadFile("/proc/" + f + "/status")
		if err != nil {
			continue // exited meanwhile
		}
		var uid, capEff string
		for _, l := range strings.Split(string(b), "\n") {
			if fs := strings.Fields(l); len(fs) > 1 && fs[0] == "Uid:" {
				uid = fs[1]
			} else if len(fs) > 1 && fs[0] == "CapEff:" {
				capEff = fs[1]
			}
		}
		ns, _ := os.Readlink("/proc/" + f + "/ns/user")
		self, _ := os.Readlink("/proc/self/ns/user")
		if ns != self {
			uid += " in a user namespace"
		}
		if uid == "0" || strings.HasPrefix(uid, "0 ") {
			uid += " with CapEff " + capEff
		}
		if !seen[uid] {
			seen[uid] = true
			out = append(out, uid)
		}
	}
	return out
}

// TestHardening: what the sandbox's root is on the host, a read-only root filesystem,
// under every runtime class. Root on the host is tolerated only where another kernel
// stands in between (gVisor: the sentry's own user namespace and seccomp filter).
func TestHardening(t *testing.T) {
	su := newSuite(t)
	rows := map[string]map[string]string{}
	for _, class := range classes() {
		sb := su.create(runtime.Spec{Container: runtime.Container{Image: env.Busybox(), Command: "sleep", Args: []string{"infinity"}}, RuntimeClass: class})
		c := su.agent(sb.ID)
		res, err := exec1(c, 10*time.Second, "sh", "-c", "id -u; stat -c %u:%g /etc/passwd; touch /made-inside; stat -c %u /made-inside")
		if err != nil {
			t.Fatal(err)
		}
		inside := strings.Fields(string(res.Stdout))
		if len(inside) != 3 || inside[0] != "0" || inside[1] != "0:0" || inside[2] != "0" {
			t.Errorf("%s: inside, id -u / owner of /etc/passwd / owner of a new file = %q, want 0, 0:0, 0", class, inside)
		}
		uids := hostUIDs(t, sb.ID)
		root := false
		for _, u := range uids {
			root = root || strings.HasPrefix(u, "0 ")
		}
		switch {
		case !root && len(uids) > 0:
			row(rows, "sandbox root is root on the host", class, fmt.Sprintf("blocked (root inside runs as host uid %s)", strings.Join(uids, ", ")))
		case class == "runc":
			row(rows, "sandbox root is root on the host", class, "ALLOWED (host uids "+strings.Join(uids, ", ")+")")
			t.Errorf("%s: sandbox processes run as host uids %v", class, uids)
		default:
			row(rows, "sandbox root is root on the host", class, "root on the host, behind gVisor's kernel (host uids "+strings.Join(uids, ", ")+")")
		}
		if class != "runc" {
			row(rows, "a file made inside is root's on the host", class, "n/a: runsc keeps the root filesystem's writes in its own overlay file")
		} else {
			// The overlay's upper dir: on the sandbox's disk filesystem when it has one.
			made := filepath.Join(su.s.Backend.SandboxDir(sb.ID), "upper", "made-inside")
			if _, err := os.Lstat(filepath.Join(su.s.Backend.SandboxDir(sb.ID), "disk", "upper")); err == nil {
				made = filepath.Join(su.s.Backend.SandboxDir(sb.ID), "disk", "upper", "made-inside")
			}
			var st syscall.Stat_t
			if err := syscall.Stat(made, &st); err != nil || st.Uid == 0 {
				t.Errorf("a file made inside is owned by host uid %d (%v), want the mapped uid", st.Uid, err)
			} else {
				row(rows, "a file made inside is root's on the host", class, "blocked (owned by host uid "+strconv.Itoa(int(st.Uid))+")")
			}
		}

		ro := su.create(runtime.Spec{Container: runtime.Container{Image: env.Busybox(), Command: "sleep", Args: []string{"infinity"}, Security: &runtime.Security{ReadOnlyRootFS: true}}, RuntimeClass: class})
		res, err = exec1(su.agent(ro.ID), 10*time.Second, "sh", "-c", "echo x > /etc/owned 2>&1; echo rc=$?; echo y > /tmp/ok && cat /tmp/ok")
		if err != nil {
			t.Fatal(err)
		}
		out := string(res.Stdout) + string(res.Stderr) // the shell reports a failed redirection on its stderr
		switch {
		case strings.Contains(out, "rc=0") || !strings.Contains(out, "y\n"):
			row(rows, "write the read-only root filesystem", class, "ALLOWED: "+out)
			t.Errorf("%s: read-only root: %q", class, out)
		case strings.Contains(out, "Read-only file system"):
			row(rows, "write the read-only root filesystem", class, "blocked (EROFS; /tmp stays writable)")
		default:
			row(rows, "write the read-only root filesystem", class, "blocked ("+strings.TrimSpace(out)+")")
		}
		_, _ = su.s.Runner.Delete(ro.ID, 0)
		_, _ = su.s.Runner.Delete(sb.ID, 0)
	}
	printTable(t, rows)
}

// diskLimit is the disk limit of TestAbuse's sandboxes.
const diskLimit = 128 << 20

// diskFiller writes until the disk is full (or 2 GiB), then prints the bytes written and
// the error.
const diskFiller = `import errno, os
n, chunk, err = 0, b"x" * (1 << 20), "no error"
try:
    with open("/fill", "wb") as f:
        while n < (2 << 30):
            n += f.write(chunk)
        f.flush(); os.fsync(f.fileno())
except OSError as e:
    err = errno.errorcode.get(e.errno, str(e.errno))
print(n, err)`

// dataSlack is how much the runner's data tree may grow beyond the limit while the
// filler runs: the sandboxes' logs and the file system's own directories.
const dataSlack = 64 << 20

// dataRoot is the runner's data dir above a sandbox's host dir (<root>/sandboxes/<id>).
func dataRoot(sandboxDir string) string { return filepath.Dir(filepath.Dir(sandboxDir)) }

// treeUsage is the host disk the files under root take (allocated blocks), counting only
// root's own file system: a mount below it (a sandbox's disk, its root file system) is
// skipped, and its image file is counted where it lies. Measuring the runner's own tree
// rather than the host's free space keeps other processes' writes out of the check.
func treeUsage(t *testing.T, root string) int64 {
	var top syscall.Stat_t
	if err := syscall.Lstat(root, &top); err != nil {
		t.Errorf("lstat %s: %v", root, err)
		return 0
	}
	var n int64
	_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil // a sandbox dir removed meanwhile
		}
		var st syscall.Stat_t
		if syscall.Lstat(p, &st) != nil {
			return nil
		}
		if st.Dev != top.Dev {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		n += st.Blocks * 512
		return nil
	})
	return n
}

// checkDisk checks the host after a disk filler in the sandbox whose host dir is dir:
// its disk image holds at most the limit, and the runner's data tree (where the image,
// the sandbox's logs and everything else it can make the host keep lie) grew by no more
// than the limit plus slack.
func checkDisk(t *testing.T, dir string, before int64) string {
	after := treeUsage(t, dataRoot(dir))
	grew := after - before
	var st syscall.Stat_t
	img := filepath.Join(dir, "disk.img")
	if err := syscall.Stat(img, &st); err != nil {
		t.Errorf("disk image: %v", err)
		return ""
	}
	used := st.Blocks * 512
	if used > diskLimit+(8<<20) {
		t.Errorf("the sandbox's disk image holds %d MiB of host disk, above its %d MiB limit", used>>20, diskLimit>>20)
	}
	if grew > diskLimit+dataSlack {
		t.Errorf("the runner's data dir grew by %d MiB during a fill limited to %d MiB", grew>>20, diskLimit>>20)
	}
	return fmt.Sprintf("; host disk: image %d MiB, runner data dir %+d MiB", used>>20, grew>>20)
}
