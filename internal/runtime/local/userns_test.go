package local

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/testenv"
)

// hostIDs returns the sandbox's recorded host ID range.
func hostIDs(t testing.TB, e *env, id string) idRange {
	t.Helper()
	r, ok, err := readIDRange(e.b.dir(id))
	if err != nil || !ok {
		t.Fatalf("idmap of %s: %v (recorded: %v)", id, err, ok)
	}
	return r
}

// procUID returns the real uid of a host process, from /proc/<pid>/status.
func procUID(t testing.TB, pid int) string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 1 && f[0] == "Uid:" {
			return f[1]
		}
	}
	t.Fatalf("no Uid line in /proc/%d/status", pid)
	return ""
}

func TestUserNamespace(t *testing.T) {
	e := newEnv(t)
	const id = "userns-1"
	e.create(runtime.Spec{ID: id, Container: runtime.Container{Command: "sh", Args: []string{"-c", "echo started; exec sleep 3600"}}})
	r := hostIDs(t, e, id)
	if r.HostID < idRangeBase || r.Size != idRangeSize {
		t.Fatalf("range %+v: want %d IDs at or above %d", r, idRangeSize, idRangeBase)
	}
	host := strconv.Itoa(int(r.HostID))
	c := agentClient(e.b, id)

	inside := []struct {
		name string
		argv []string
		want string // stdout, trimmed
	}{
		{"uid 0 inside", []string{"id", "-u"}, "0"},
		{"gid 0 inside", []string{"id", "-g"}, "0"},
		{"image files root-owned", []string{"stat", "-c", "%u:%g", "/etc/passwd", "/bin/busybox"}, "0:0\n0:0"},
		{"root dir root-owned", []string{"stat", "-c", "%u:%g", "/"}, "0:0"},
		{"user 1000's home keeps its owner", []string{"stat", "-c", "%u:%g", "/home/user"}, "1000:1000"},
		{"uid map", []string{"sh", "-c", "cat /proc/self/uid_map | tr -s ' '"}, " 0 " + host + " 65536"},
		{"root can chown image files", []string{"sh", "-c", "chown 1000 /etc/group && stat -c %u /etc/group"}, "1000"},
		{"no host root capabilities: mount denied", []string{"sh", "-c", "mount -t tmpfs none /mnt 2>/dev/null; echo rc=$?"}, "rc=1"},
		{"ICMP datagram sockets for the mapped groups", []string{"cat", "/proc/sys/net/ipv4/ping_group_range"}, "0\t65535"},
	}
	for _, tc := range inside {
		t.Run(tc.name, func(t *testing.T) {
			out, errOut, code := execIn(t, c, tc.argv...)
			if strings.TrimRight(out, "\n") != tc.want {
				t.Errorf("%q: %q (stderr %q, exit %d), want %q", tc.argv, out, errOut, code, tc.want)
			}
		})
	}

	t.Run("host sees the mapped uid", func(t *testing.T) {
		e.b.mu.Lock()
		pid := e.b.sandboxes[id].info.Pid
		e.b.mu.Unlock()
		if got := procUID(t, pid); got != host {
			t.Errorf("agent (host pid %d) runs as uid %s on the host, want %s", pid, got, host)
		}
		procs, _ := os.ReadFile(filepath.Join(cgroupRoot, "pids", testCgroupParent, id, "cgroup.procs"))
		n := 0
		for _, f := range strings.Fields(string(procs)) {
			p, _ := strconv.Atoi(f)
			if got := procUID(t, p); got != host {
				t.Errorf("sandbox process %d runs as host uid %s, want %s", p, got, host)
			}
			n++
		}
		if n < 2 { // agent + main
			t.Errorf("cgroup.procs lists %d processes", n)
		}
	})
	t.Run("files made inside are the mapped uid's on the host", func(t *testing.T) {
		ctx := context.Background()
		if _, err := c.WriteFile(ctx, connect.NewRequest(&agentv1.WriteFileRequest{Path: "/work/out.txt", Content: []byte("x")})); err != nil {
			t.Fatal(err)
		}
		got, err := c.ReadFile(ctx, connect.NewRequest(&agentv1.ReadFileRequest{Path: "/work/out.txt"}))
		if err != nil || string(got.Msg.Content) != "x" {
			t.Fatalf("read back: %v %q", err, got)
		}
		execIn(t, c, "touch", "/etc/passwd") // a copy-up of a root-owned image file
		for _, p := range []string{"work/out.txt", "etc/passwd"} {
			st, err := os.Stat(filepath.Join(e.state, id, dirUpper, p))
			if err != nil {
				t.Fatal(err)
			}
			if uid := st.Sys().(*syscall.Stat_t).Uid; strconv.Itoa(int(uid)) != host {
				t.Errorf("upper/%s is owned by host uid %d, want %s", p, uid, host)
			}
		}
		if st, _ := os.Stat(filepath.Join(busyboxDir, "etc/passwd")); st.Sys().(*syscall.Stat_t).Uid != 0 {
			t.Error("the shared layer's /etc/passwd changed owner")
		}
	})
	t.Run("logs", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		st, err := c.Logs(ctx, connect.NewRequest(&agentv1.LogsRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		var logs strings.Builder
		for st.Receive() {
			logs.Write(st.Msg().Data)
		}
		if !strings.Contains(logs.String(), "started") {
			t.Errorf("logs = %q, %v", logs.String(), st.Err())
		}
	})

	t.Run("ranges are unique, survive a restart and are freed on destroy", func(t *testing.T) {
		e.b = e.backend() // a restarted runner learns the taken ranges from disk
		if _, err := e.b.Recover(context.Background()); err != nil {
			t.Fatal(err)
		}
		e.create(runtime.Spec{ID: "userns-2", Container: runtime.Container{Command: "sleep", Args: []string{"3600"}}})
		r2 := hostIDs(t, e, "userns-2")
		if r2 == r {
			t.Fatalf("two sandboxes share the range %+v", r)
		}
		if err := e.b.Destroy(context.Background(), id); err != nil {
			t.Fatal(err)
		}
		e.create(runtime.Spec{ID: "userns-3", Container: runtime.Container{Command: "sleep", Args: []string{"3600"}}})
		if r3 := hostIDs(t, e, "userns-3"); r3 != r {
			t.Errorf("after destroying %s, the next sandbox got %+v, want its freed range %+v", id, r3, r)
		}
		// The reused range's idmapped root (through the range's kept namespace) still
		// shows the image's files root-owned and the range's mapping.
		c3 := agentClient(e.b, "userns-3")
		for _, tc := range inside[2:4] {
			if out, errOut, code := execIn(t, c3, tc.argv...); strings.TrimRight(out, "\n") != tc.want {
				t.Errorf("userns-3: %q: %q (stderr %q, exit %d), want %q", tc.argv, out, errOut, code, tc.want)
			}
		}
	})
}

func TestUserNamespaceOff(t *testing.T) {
	e := newEnv(t)
	b, err := New(Config{OCIRuntime: testOCIRuntime, StateDir: e.state, AgentBinary: agentBin, CgroupParent: testCgroupParent,
		Images: testImages{layers: []string{busyboxDir}}, NoUserNS: true})
	if err != nil {
		t.Fatal(err)
	}
	e.b = b
	e.create(runtime.Spec{ID: "nouserns", Container: runtime.Container{Command: "sleep", Args: []string{"3600"}}})
	if _, ok, _ := readIDRange(b.dir("nouserns")); ok {
		t.Error("a range was allocated with NoUserNS")
	}
	b.mu.Lock()
	pid := b.sandboxes["nouserns"].info.Pid
	b.mu.Unlock()
	if got := procUID(t, pid); got != "0" {
		t.Errorf("without a user namespace the agent runs as host uid %s, want 0", got)
	}
}

func TestIDRangeSlots(t *testing.T) {
	for _, tc := range []struct {
		r    idRange
		slot int
		ok   bool
	}{
		{idRange{HostID: idRangeBase, Size: idRangeSize}, 0, true},
		{idRange{HostID: idRangeBase + 3*idRangeSize, Size: idRangeSize}, 3, true},
		{idRange{HostID: idRangeBase + 1, Size: idRangeSize}, 0, false},
		{idRange{HostID: 0, Size: idRangeSize}, 0, false},
		{idRange{HostID: idRangeBase, Size: 10}, 0, false},
		{idRange{HostID: idRangeBase + idRangeSlots*idRangeSize, Size: idRangeSize}, idRangeSlots, false},
	} {
		t.Run(fmt.Sprintf("%+v", tc.r), func(t *testing.T) {
			n, ok := tc.r.slot()
			if ok != tc.ok || (ok && n != tc.slot) {
				t.Errorf("slot() = %d, %v; want %d, %v", n, ok, tc.slot, tc.ok)
			}
		})
	}
}

// TestKeptUserNamespace: a range's idmap user namespace is made once and kept; it maps
// the range (a root-owned file seen through an idmapped mount made with it belongs to
// the range's first host ID); other ranges get their own; close closes them.
func TestKeptUserNamespace(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	a := &idAllocator{stateDir: t.TempDir()}
	r0 := idRange{HostID: idRangeBase, Size: idRangeSize}
	r1 := idRange{HostID: idRangeBase + idRangeSize, Size: idRangeSize}
	fd0, ok, err := a.userns(r0)
	if err != nil || !ok {
		t.Fatalf("userns(%+v) = %d, %v, %v", r0, fd0, ok, err)
	}
	defer unix.Close(fd0)
	nsIno := func(fd int) uint64 {
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			t.Fatal(err)
		}
		return st.Ino
	}
	kept := len(a.ns)
	again, _, _ := a.userns(r0)
	defer unix.Close(again)
	if again == fd0 || nsIno(again) != nsIno(fd0) || len(a.ns) != kept {
		t.Errorf("second userns(%+v) = fd %d of namespace %d, want a duplicate of the kept %d's (%d)", r0, again, nsIno(again), fd0, nsIno(fd0))
	}
	// The caller's duplicate outlives the backend's close.
	fd1, ok, err := a.userns(r1)
	if err != nil || !ok || nsIno(fd1) == nsIno(fd0) {
		t.Fatalf("userns(%+v) = %d, %v, %v (range 0's is %d)", r1, fd1, ok, err, fd0)
	}
	defer unix.Close(fd1)
	if _, ok, err := a.userns(idRange{HostID: 5, Size: 1}); ok || err != nil {
		t.Errorf("a range outside the slots got a kept namespace (%v, %v)", ok, err)
	}
	for _, tc := range []struct {
		fd   int
		want uint32
	}{{fd0, r0.HostID}, {fd1, r1.HostID}} {
		src, dst := t.TempDir(), t.TempDir()
		if err := os.WriteFile(filepath.Join(src, "f"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := idmappedMount(src, dst, tc.fd); err != nil {
			t.Fatal(err)
		}
		st, err := os.Stat(filepath.Join(dst, "f"))
		_ = syscall.Unmount(dst, syscall.MNT_DETACH)
		if err != nil {
			t.Fatal(err)
		}
		if uid := st.Sys().(*syscall.Stat_t).Uid; uid != tc.want {
			t.Errorf("root's file through the idmapped mount belongs to %d, want %d", uid, tc.want)
		}
	}
	a.close()
	if len(a.ns) != 0 {
		t.Errorf("%d kept namespaces after close", len(a.ns))
	}
	if err := unix.Fstat(fd1, new(unix.Stat_t)); err != nil {
		t.Errorf("the caller's descriptor went with the backend's close: %v", err)
	}
	if _, ok, err := a.userns(r0); ok || err == nil {
		t.Errorf("userns after close = %v, %v; want an error", ok, err)
	}
}

// TestUsernsFD: both ways of making a sandbox's user namespace (unshare(1) by a vfork,
// the fallback by a fork of this process) give a namespace of its own that maps the
// sandbox's range: a root-owned file seen through a mount idmapped with it belongs to
// the range's first host ID. No helper process is left behind.
func TestUsernsFD(t *testing.T) {
	testenv.RequireRoot(t, "user namespaces, mounts")
	ways := map[string]func(idRange) (int, error){"fork": usernsByFork}
	if p := unshareBinary(); p != "" {
		ways["unshare"] = func(r idRange) (int, error) { return usernsByUnshare(p, r) }
	} else {
		t.Log("no unshare(1) on this host: only the fallback is tested")
	}
	r := idRange{HostID: idRangeBase + 7*idRangeSize, Size: idRangeSize}
	for name, mk := range ways {
		t.Run(name, func(t *testing.T) {
			kids := childPIDs(t)
			fd, err := mk(r)
			if err != nil {
				t.Fatal(err)
			}
			defer unix.Close(fd)
			var st, self unix.Stat_t
			if err := unix.Fstat(fd, &st); err != nil {
				t.Fatal(err)
			}
			if err := unix.Stat("/proc/self/ns/user", &self); err != nil {
				t.Fatal(err)
			}
			if st.Ino == self.Ino {
				t.Fatal("the fd is this process's own user namespace")
			}
			src, dst := t.TempDir(), t.TempDir()
			if err := os.WriteFile(filepath.Join(src, "f"), nil, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := idmappedMount(src, dst, fd); err != nil {
				t.Fatal(err)
			}
			defer func() { _ = unix.Unmount(dst, unix.MNT_DETACH) }()
			var fst unix.Stat_t
			if err := unix.Stat(filepath.Join(dst, "f"), &fst); err != nil {
				t.Fatal(err)
			}
			if fst.Uid != r.HostID || fst.Gid != r.HostID {
				t.Errorf("a root-owned file through the idmapped mount is %d:%d, want %d:%d", fst.Uid, fst.Gid, r.HostID, r.HostID)
			}
			if left := childPIDs(t); len(left) > len(kids) {
				t.Errorf("children of this process after: %v, before: %v", left, kids)
			}
		})
	}
}

// childPIDs lists the live children of this process (any thread's).
func childPIDs(t testing.TB) []string {
	t.Helper()
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, task := range tasks {
		b, _ := os.ReadFile("/proc/self/task/" + task.Name() + "/children")
		out = append(out, strings.Fields(string(b))...)
	}
	return out
}

// TestRootfsBaseGoesAtClose: a backend whose state dir sits below a private dir mounts
// root filesystems in a dir of its own under /run/sandboxd (rootfsBase); Close removes
// it (it is named by the state dir, so each test's temporary dir would leave one).
func TestRootfsBaseGoesAtClose(t *testing.T) {
	testenv.RequireRoot(t, "a backend with user namespaces")
	state := filepath.Join(t.TempDir(), "state") // t.TempDir's parent is 0700
	b, err := New(Config{StateDir: state, AgentBinary: agentBin, CgroupParent: testCgroupParent,
		Images: testImages{layers: []string{busyboxDir}}})
	if err != nil {
		t.Fatal(err)
	}
	rd := b.RootfsDir()
	if !strings.HasPrefix(rd, "/run/sandboxd/rootfs-") {
		t.Fatalf("RootfsDir %q: want a dir under /run/sandboxd", rd)
	}
	if _, err := os.Stat(rd); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(rd); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s left after Close: %v", rd, err)
	}
}
