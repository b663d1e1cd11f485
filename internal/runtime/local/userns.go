package local

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/internal/failpoint"
)

// User namespaces (runc class). Each sandbox's container runs in its own user namespace
// whose IDs 0..idRangeSize-1 map to a host range of its own, above idRangeBase: root in
// the sandbox is an unprivileged, unique uid on the host, so a process that escapes the
// container's other namespaces owns no host file and shares no uid with a neighbour.
//
// The image's layers are shared and owned by real host IDs (root files by uid 0). So
// that they still look right inside (root-owned, not nobody), every lower layer is
// mounted idmapped (open_tree + mount_setattr(MOUNT_ATTR_IDMAP) with a user namespace
// carrying the sandbox's mapping, then move_mount), and the overlay is stacked on those
// idmapped lowers. The overlay clones its layers privately at mount time, so the
// idmapped mounts are detached again right after: nothing extra stays mounted. The
// upper and work dirs belong to the mapped root; a file made inside is owned by the
// mapped uid on the host.
//
// A range is recorded in the sandbox's dir (idmap.json), so a restarted backend sees
// which ranges are taken, and freed when the dir is removed (Destroy). It travels with a
// pooled container's dir when a sandbox claims it.
//
// The user namespace an idmapped mount is made through only carries the mapping (no
// process ever runs in it), and a range's mapping never changes: the backend makes it
// once per range, on the range's first use, and keeps its descriptor (idAllocator.userns)
// until it closes. Making one forks the backend (a real fork: Go cannot vfork a child
// that gets a new user namespace), which copies the backend's page tables and cost
// ~6 ms of CPU per create; ranges are reused lowest-first, so a backend that has had n
// sandboxes at once makes at most n namespaces in its life (at most idRangeSlots).
//
// gVisor sandboxes are left alone: runsc runs its own kernel, and the sentry and gofer
// already run in user namespaces of their own with host root dropped (see gvisor.go).

const (
	fileIDMap   = "idmap.json"
	dirLowers   = "lower" // mount points of the idmapped lowers, only while mounting
	idRangeBase = 1 << 20
	idRangeSize = 65536
	// idRangeSlots bounds the ranges (sandboxes, pooled containers) one backend can have:
	// the highest host ID is then idRangeBase + idRangeSlots*idRangeSize - 1 (< 2^29).
	idRangeSlots = 8192
)

// idRange is a sandbox's host ID range: sandbox ID n is host ID HostID+n (uids and gids).
type idRange struct {
	HostID uint32 `json:"host_id"`
	Size   uint32 `json:"size"`
}

func (r idRange) slot() (int, bool) {
	if r.HostID < idRangeBase || (r.HostID-idRangeBase)%idRangeSize != 0 || r.Size != idRangeSize {
		return 0, false
	}
	n := int((r.HostID - idRangeBase) / idRangeSize)
	return n, n < idRangeSlots
}

// idAllocator hands out ID ranges. Which are taken is learnt once from the idmap.json
// files in the state dir, then kept in memory.
type idAllocator struct {
	stateDir string

	mu     sync.Mutex
	loaded bool
	used   map[int]bool
	// ns: per slot, a descriptor of a user namespace mapping that slot's range (see
	// userns), kept until close.
	ns     map[int]int
	closed bool
}

// userns returns a descriptor of a user namespace mapping r (0..r.Size-1 to r, uids and
// gids), for MOUNT_ATTR_IDMAP: made on the range's first use and kept. The caller gets
// its own duplicate of the kept descriptor, which it closes (so a close of the backend
// meanwhile cannot pull it away). A range outside the slots gets no kept namespace: ok
// is false and the caller makes its own (usernsFD).
func (a *idAllocator) userns(r idRange) (fd int, ok bool, err error) {
	n, ok := r.slot()
	if !ok {
		return -1, false, nil
	}
	a.mu.Lock()
	fd, have := a.ns[n]
	closed := a.closed
	if have {
		defer a.mu.Unlock()
		return dupFD(fd)
	}
	a.mu.Unlock()
	if closed {
		return -1, false, errors.New("backend closed")
	}
	// Made outside the lock: a fork is slow and other ranges' creates go on meanwhile.
	// A range belongs to one sandbox (or group) at a time, so two makers of one slot's
	// namespace race only in theory; the loser closes its own.
	made, err := usernsFD(r)
	if err != nil {
		return -1, false, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if fd, have := a.ns[n]; have || a.closed {
		unix.Close(made)
		if a.closed {
			return -1, false, errors.New("backend closed")
		}
		return dupFD(fd)
	}
	if a.ns == nil {
		a.ns = map[int]int{}
	}
	a.ns[n] = made
	return dupFD(made)
}

// dupFD is a close-on-exec duplicate of fd, for userns's caller.
func dupFD(fd int) (int, bool, error) {
	d, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return -1, false, fmt.Errorf("duplicate a kept user namespace: %w", err)
	}
	return d, true, nil
}

// close closes the kept user namespaces; userns makes no more.
func (a *idAllocator) close() {
	a.mu.Lock()
	defer a.mu.Unlock()
	for n, fd := range a.ns {
		unix.Close(fd)
		delete(a.ns, n)
	}
	a.closed = true
}

func (a *idAllocator) load() {
	if a.loaded {
		return
	}
	a.used = map[int]bool{}
	ents, _ := os.ReadDir(a.stateDir)
	for _, e := range ents {
		var r idRange
		if e.IsDir() && readJSON(filepath.Join(a.stateDir, e.Name(), fileIDMap), &r) == nil {
			if n, ok := r.slot(); ok {
				a.used[n] = true
			}
		}
	}
	a.loaded = true
}

// alloc takes a free range and records it in dir.
func (a *idAllocator) alloc(dir string) (idRange, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.load()
	for n := 0; n < idRangeSlots; n++ {
		if a.used[n] {
			continue
		}
		r := idRange{HostID: idRangeBase + uint32(n)*idRangeSize, Size: idRangeSize}
		if err := writeJSONAtomic(filepath.Join(dir, fileIDMap), &r); err != nil {
			return idRange{}, fmt.Errorf("record user namespace range: %w", err)
		}
		a.used[n] = true
		return r, nil
	}
	return idRange{}, fmt.Errorf("no free user namespace range: all %d are in use", idRangeSlots)
}

// release frees the range recorded in dir, once dir is gone.
func (a *idAllocator) release(r idRange) {
	n, ok := r.slot()
	if !ok {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.loaded {
		delete(a.used, n)
	}
}

// readIDRange returns the range recorded in dir; ok is false when there is none.
func readIDRange(dir string) (idRange, bool, error) {
	var r idRange
	err := readJSON(filepath.Join(dir, fileIDMap), &r)
	if errors.Is(err, fs.ErrNotExist) {
		return idRange{}, false, nil
	}
	if err != nil {
		return idRange{}, false, err
	}
	return r, true, nil
}

// usernsFD returns an fd of a new user namespace mapping 0..r.Size-1 to r (uids and
// gids), for MOUNT_ATTR_IDMAP. The namespace is made by a child that never runs its
// program: it is traced, stopped at an execve, and killed once its namespace is open.
//
// The child is util-linux's unshare(1) when there is one (usernsByUnshare): started by a
// vfork, it costs the same whatever this process's size. A child given CLONE_NEWUSER by
// this process itself (usernsByFork, the fallback) is a full fork: Go uses no vfork
// then, and copying and dropping the page tables of a runner holding hundreds of
// sandboxes cost more than any other step of a create of ours (issue 25).
func usernsFD(r idRange) (int, error) {
	if p := unshareBinary(); p != "" {
		return usernsByUnshare(p, r)
	}
	return usernsByFork(r)
}

var unshareBinary = sync.OnceValue(func() string {
	p, err := exec.LookPath("unshare")
	if err != nil {
		return ""
	}
	return p
})

// usernsByUnshare runs `unshare --user -- unshare` traced: the child stops at the
// execve of unshare, is let run to its second execve (by then unshare(CLONE_NEWUSER) is
// done), and, stopped there, gets its ID maps written and its namespace opened.
func usernsByUnshare(bin string, r idRange) (int, error) {
	// A ptrace tracer is a thread: keep this goroutine on one from the fork to the reap.
	goruntime.LockOSThread()
	defer goruntime.UnlockOSThread()
	pid, err := syscall.ForkExec(bin, []string{"unshare", "--user", "--", bin}, &syscall.ProcAttr{
		Env: []string{},
		Sys: &syscall.SysProcAttr{Ptrace: true, Pdeathsig: unix.SIGKILL},
	})
	if err != nil {
		return -1, fmt.Errorf("user namespace helper: %w", err)
	}
	defer func() {
		_ = unix.Kill(pid, unix.SIGKILL)
		var ws unix.WaitStatus
		for {
			if _, err := unix.Wait4(pid, &ws, unix.WALL, nil); err != unix.EINTR {
				break
			}
		}
	}()
	// stop waits for the child's next stop at an execve (SIGTRAP); other signals are
	// passed on.
	stop := func() error {
		for range 16 {
			var ws unix.WaitStatus
			if _, err := unix.Wait4(pid, &ws, unix.WALL, nil); err != nil {
				if err == unix.EINTR {
					continue
				}
				return err
			}
			switch {
			case ws.Stopped() && ws.StopSignal() == unix.SIGTRAP:
				return nil
			case ws.Stopped():
				if err := unix.PtraceCont(pid, int(ws.StopSignal())); err != nil {
					return err
				}
			default:
				return fmt.Errorf("%s ended (%v): are user namespaces allowed?", bin, ws)
			}
		}
		return errors.New("no stop at execve")
	}
	if err := stop(); err != nil { // the execve of unshare
		return -1, fmt.Errorf("user namespace helper: %w", err)
	}
	if err := unix.PtraceCont(pid, 0); err != nil {
		return -1, fmt.Errorf("user namespace helper: %w", err)
	}
	if err := stop(); err != nil { // the execve of its program, in the new namespace
		return -1, fmt.Errorf("user namespace helper: %w", err)
	}
	proc := "/proc/" + strconv.Itoa(pid) + "/"
	line := []byte(fmt.Sprintf("0 %d %d\n", r.HostID, r.Size))
	for _, w := range []struct {
		file string
		data []byte
	}{{"uid_map", line}, {"setgroups", []byte("deny")}, {"gid_map", line}} { // as Go's own maps are written
		if err := os.WriteFile(proc+w.file, w.data, 0); err != nil {
			return -1, fmt.Errorf("user namespace helper: %w", err)
		}
	}
	fd, err := unix.Open(proc+"ns/user", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("open user namespace: %w", err)
	}
	// The namespace must be the child's new one, not ours (an unshare that did not
	// unshare would leave this process's).
	var st, self unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || unix.Stat("/proc/self/ns/user", &self) != nil || st.Ino == self.Ino {
		unix.Close(fd)
		return -1, errors.New("user namespace helper: the child is still in this process's user namespace")
	}
	return fd, nil
}

// usernsByFork is usernsFD by a child of this process made with CLONE_NEWUSER, traced
// so that it stops at its execve.
func usernsByFork(r idRange) (int, error) {
	// A ptrace tracer is a thread: keep this goroutine on one for Start through Wait.
	goruntime.LockOSThread()
	defer goruntime.UnlockOSThread()
	m := []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(r.HostID), Size: int(r.Size)}}
	cmd := exec.Command("/proc/self/exe")
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  unix.CLONE_NEWUSER,
		UidMappings: m,
		GidMappings: m,
		Ptrace:      true,
		Pdeathsig:   unix.SIGKILL,
	}
	if err := cmd.Start(); err != nil {
		return -1, fmt.Errorf("user namespace helper: %w", err)
	}
	fd, err := unix.Open("/proc/"+strconv.Itoa(cmd.Process.Pid)+"/ns/user", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	if err != nil {
		return -1, fmt.Errorf("open user namespace: %w", err)
	}
	return fd, nil
}

// idmappedLowers mounts each layer idmapped through r at dir/lower/<i> and returns those
// paths (same order). The caller mounts the overlay and then calls detachLowers. userns,
// when not -1, is a user namespace mapping r to use (else one is made).
func idmappedLowers(layers []string, dir string, r idRange, userns int) (paths []string, err error) {
	if userns < 0 {
		if userns, err = usernsFD(r); err != nil {
			return nil, err
		}
		defer unix.Close(userns)
	}
	base := filepath.Join(dir, dirLowers)
	if err := os.Mkdir(base, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, err
	}
	defer func() {
		if err != nil {
			_ = detachLowers(dir)
		}
	}()
	for i, l := range layers {
		p := filepath.Join(base, strconv.Itoa(i))
		if err := os.Mkdir(p, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return nil, err
		}
		if err := idmappedMount(l, p, userns); err != nil {
			return nil, err
		}
		failpoint.Hit("local.userns.lower")
		paths = append(paths, p)
	}
	return paths, nil
}

func idmappedMount(src, dst string, userns int) error {
	fd, err := unix.OpenTree(unix.AT_FDCWD, src, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return fmt.Errorf("open_tree %s: %w", src, err)
	}
	defer unix.Close(fd)
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_IDMAP, Userns_fd: uint64(userns)}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, &attr); err != nil {
		return fmt.Errorf("idmap %s (its filesystem must support idmapped mounts, or run without user namespaces: --no-userns): %w", src, err)
	}
	if err := unix.MoveMount(fd, "", unix.AT_FDCWD, dst, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("move_mount %s: %w", dst, err)
	}
	return nil
}

// detachLowers unmounts and removes dir/lower (the overlay keeps its own clones). The
// error matters to teardown: removing dir while a layer is still mounted in it would
// delete the shared layer's files.
func detachLowers(dir string) error {
	base := filepath.Join(dir, dirLowers)
	ents, err := os.ReadDir(base)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	var errs []error
	for _, e := range ents {
		p := filepath.Join(base, e.Name())
		if err := unmountAll(p); err != nil {
			errs = append(errs, err)
			continue
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if len(errs) == 0 {
		_ = os.Remove(base)
	}
	return errors.Join(errs...)
}

// chownToRoot makes paths (not their contents) owned by the range's root.
func chownToRoot(r idRange, paths ...string) error {
	for _, p := range paths {
		if err := os.Lchown(p, int(r.HostID), int(r.HostID)); err != nil {
			return fmt.Errorf("chown %s to the sandbox's root: %w", p, err)
		}
	}
	return nil
}

// setNetNSSysctl writes a sysctl of the network namespace at nsPath, through a fresh
// procfs when fresh (see writeNetSysctl; log, or the default logger when nil, is told
// once that one cannot be had).
func setNetNSSysctl(nsPath, key, value string, fresh bool, log *slog.Logger) error {
	err := inNamespace(nsPath, unix.CLONE_NEWNET, func() error {
		return writeNetSysctl(key, value, fresh, log)
	})
	if err != nil {
		return fmt.Errorf("sysctl %s in %s: %w", key, nsPath, err)
	}
	return nil
}

// freshProcAbove is the count of running sandboxes from which a net sysctl is written
// through a procfs of its own rather than /proc (see writeNetSysctl). Measured with
// BenchmarkNetSysctl (2 cores, kernel 6.18; a write in a new network namespace, with n
// others that had looked up /proc/sys/net/ipv4): through /proc ~80-90 µs at n=0, 110 at
// 100, 170-190 at 300, 310 at 500, 425 at 700, 570-610 at 1,000; through a fresh procfs
// a constant ~230-340 µs (mostly the detached mount's unmount, which waits for an
// expedited RCU grace period that interrupts every CPU). They cross near 500.
const freshProcAbove = 500

// writeNetSysctl sets the net sysctl key (dotted) of the calling thread's network
// namespace: /proc/sys/net shows the namespace of the thread that looks it up.
//
// With fresh it looks the file up in a procfs of its own, mounted for this write and
// never attached anywhere (fsopen/fsmount; gone with its descriptor), not in /proc: there
// the kernel keeps one cached /proc/sys/net/ipv4 directory per network namespace that
// looked it up, all on one hash chain it compares one by one (each under a global lock)
// at every lookup — work per sandbox started that grew with the sandboxes running (issue
// 25). A fresh procfs (kernel ≥ 5.8: each mount its own superblock) has only this
// namespace's, at a constant cost that only pays with many namespaces (freshProcAbove).
// Where the new mount API is missing or refused, it writes through /proc (logged once).
func writeNetSysctl(key, value string, fresh bool, log *slog.Logger) error {
	rel := "sys/" + strings.ReplaceAll(key, ".", "/")
	if !fresh {
		return os.WriteFile("/proc/"+rel, []byte(value), 0o644)
	}
	mnt, err := freshProc()
	if err != nil {
		freshProcFallback.Do(func() {
			if log == nil {
				log = slog.Default()
			}
			log.Warn("local: no procfs of its own for net sysctls (new mount API refused); writing them through /proc, whose cost grows with the sandboxes running", "err", err)
		})
		return os.WriteFile("/proc/"+rel, []byte(value), 0o644)
	}
	defer unix.Close(mnt)
	fd, err := unix.Openat(mnt, rel, unix.O_WRONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return &fs.PathError{Op: "open", Path: "/proc/" + rel, Err: err}
	}
	f := os.NewFile(uintptr(fd), "/proc/"+rel)
	defer f.Close()
	_, err = f.Write([]byte(value))
	return err
}

// freshProcFallback logs once that freshProc failed.
var freshProcFallback sync.Once

// freshProcSysctl is whether a net sysctl is written through a fresh procfs now: when
// the backend runs freshProcAbove sandboxes or more.
func (b *Backend) freshProcSysctl() bool {
	b.mu.Lock()
	n := len(b.sandboxes)
	b.mu.Unlock()
	return n >= freshProcAbove
}

// freshProc is a descriptor of a new procfs mount attached nowhere (nosuid, nodev,
// noexec).
func freshProc() (int, error) {
	fsfd, err := unix.Fsopen("proc", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return -1, err
	}
	defer unix.Close(fsfd)
	if err := unix.FsconfigCreate(fsfd); err != nil {
		return -1, err
	}
	return unix.Fsmount(fsfd, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV|unix.MOUNT_ATTR_NOEXEC)
}

// rootfsBase picks where the root filesystems of sandboxes in user namespaces are
// mounted. runc resolves a container's root path as the sandbox's mapped root, which owns
// nothing on the host: every dir on the path must be searchable by others. The state
// dir's own <StateDir>/.rootfs is used when the state dir's ancestors already are (the
// state dir itself is the backend's, and made searchable); otherwise, rather than open up
// a data dir kept private (0700, holding the store and keys), a dir of its own under
// /run/sandboxd, named by a hash of the state dir. Only mount points live there.
func rootfsBase(stateDir string) (string, error) {
	searchable := func(d string) bool {
		st, err := os.Stat(d)
		return err == nil && st.Mode().Perm()&0o001 != 0
	}
	ok := true
	for d := filepath.Dir(stateDir); ; d = filepath.Dir(d) {
		ok = ok && searchable(d)
		if d == "/" {
			break
		}
	}
	if ok {
		if err := os.Chmod(stateDir, 0o711); err != nil {
			return "", err
		}
		return mkSearchable(filepath.Join(stateDir, dirRootfs))
	}
	sum := sha256.Sum256([]byte(stateDir))
	if !searchable("/run") {
		return "", fmt.Errorf("neither the ancestors of %s nor /run are searchable by others", stateDir)
	}
	if _, err := mkSearchable("/run/sandboxd"); err != nil {
		return "", err
	}
	return mkSearchable(filepath.Join("/run/sandboxd", "rootfs-"+hex.EncodeToString(sum[:6])))
}

// mkSearchable makes dir (0711) if needed and returns it.
func mkSearchable(dir string) (string, error) {
	if err := os.Mkdir(dir, 0o711); err != nil && !errors.Is(err, fs.ErrExist) {
		return "", err
	}
	return dir, os.Chmod(dir, 0o711)
}

// dirSysfs holds, for a sandbox in a user namespace on a host-made network namespace, a
// sysfs mounted by the backend from inside that network namespace; the container gets
// it bind-mounted at /sys. The container's root cannot mount sysfs itself there: sysfs
// needs a network namespace owned by the mounter's user namespace.
const dirSysfs = "sys"

// mountNetNSSysfs mounts a read-only sysfs showing the network namespace at nsPath on
// target.
func mountNetNSSysfs(nsPath, target string) error {
	if err := os.Mkdir(target, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	// The mounting thread's network namespace decides the sysfs's view of net devices.
	err := inNamespace(nsPath, unix.CLONE_NEWNET, func() error {
		return unix.Mount("sysfs", target, "sysfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "")
	})
	if err != nil {
		return fmt.Errorf("mount sysfs of %s: %w", nsPath, err)
	}
	return nil
}
