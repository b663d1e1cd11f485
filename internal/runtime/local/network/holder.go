//go:build linux

package network

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// holder keeps the sandboxes' network namespaces alive without a mount on the host.
//
// A network namespace with no process in it lives as long as something refers to it;
// a bind mount of its nsfs file is the reference that survives a runner crash (as
// iproute2's /run/netns). Made on the host, those mounts grow the host's mount table by
// one per sandbox, and every runc create reads that table several times and copies it
// into the container's new mount namespace: the cost of a create grew with the number
// of sandboxes. So the bind mounts live in a mount namespace of their own, the holder:
// its root is a small tmpfs (nothing of the host's is pinned there), with the
// sandboxes' namespaces as <root>/ns/<id> and a procfs at <root>/proc (the source of
// its bind mounts). The holder itself is kept by one bind mount of its nsfs file on
// the host, <StateDir>/mntns, so it and every namespace in it outlive a runner crash,
// and a Manager made later opens it again.
//
// Processes on the host reach the holder's files through a thread of the runner that
// lives in it (the anchor): /proc/<pid>/task/<tid>/root is the holder's root, and the
// symlink <StateDir>/netns points at its ns directory, so a sandbox's namespace keeps
// the path <StateDir>/netns/<id> (the OCI spec's, the Attachment's) as before. Changes
// in the holder (a mount, an unmount) are made by a fresh thread that joins it and is
// discarded after (its filesystem context no longer the process's).
type holder struct {
	file string // <StateDir>/mntns: the bind mount of the holder's nsfs file
	link string // <StateDir>/netns: symlink to the anchor's view of the ns dir

	mu     sync.RWMutex // fd while in use; Lock to close
	fd     int          // the holder's nsfs file, -1 once closed
	nsDir  string       // in the holder: the namespaces' dir, holderNSPrefix + 32 random hex digits
	anchor *anchor
}

// anchor is the thread of the process in one holder; the Managers of the process that
// use that holder (tests make several on one state dir) share it.
type anchor struct {
	key        uint64 // the holder's namespace inode
	tid, refs  int
	stop, done chan struct{}
}

var anchors struct {
	sync.Mutex
	m map[uint64]*anchor
}

const (
	// holderNSPrefix begins the name of the holder's dir of the namespaces' bind mounts,
	// /ns-<32 random hex digits>: the netns link goes through /proc/<pid>/task/<tid>/root,
	// and should the runner die and both numbers be reused by another process before a
	// runtime it started follows the link, that process's root (a sandbox's, say) cannot
	// hold a path no one outside the holder knows.
	holderNSPrefix = "/ns-"
	holderProcDir  = "/proc" // in the holder: a procfs (sources of the bind mounts)
)

// openHolder opens the holder of stateDir, making it first when there is none (or
// after a reboot), starts its anchor thread and points <stateDir>/netns at it. A
// netns directory of the previous layout (host bind mounts) has its namespaces moved
// into the holder.
func openHolder(stateDir string) (*holder, error) {
	h := &holder{file: filepath.Join(stateDir, "mntns"), link: filepath.Join(stateDir, "netns"), fd: -1}
	// One opener at a time per state dir (two runners or Managers starting on one dir
	// must not both make a holder).
	dir, err := os.Open(stateDir)
	if err != nil {
		return nil, fmt.Errorf("network: %w", err)
	}
	defer dir.Close() // releases the lock
	if err := unix.Flock(int(dir.Fd()), unix.LOCK_EX); err != nil {
		return nil, fmt.Errorf("network: lock %s: %w", stateDir, err)
	}
	if isNSFS(h.file) {
		fd, err := unix.Open(h.file, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("network: open holder %s: %w", h.file, err)
		}
		h.fd = fd
	} else if err := h.create(stateDir); err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			h.close()
		}
	}()
	if h.nsDir == "" { // an existing holder: find its dir
		if err := h.findNSDir(); err != nil {
			return nil, err
		}
	}
	if err := h.startAnchor(); err != nil {
		return nil, err
	}
	if err := h.migrate(); err != nil {
		return nil, err
	}
	target := filepath.Join("/proc", strconv.Itoa(os.Getpid()), "task", strconv.Itoa(h.anchor.tid), "root", h.nsDir)
	tmp := h.link + ".tmp"
	_ = os.Remove(tmp)
	if err := os.Symlink(target, tmp); err != nil {
		return nil, fmt.Errorf("network: holder link: %w", err)
	}
	if err := os.Rename(tmp, h.link); err != nil {
		_ = os.Remove(tmp)
		return nil, fmt.Errorf("network: holder link: %w", err)
	}
	ok = true
	return h, nil
}

// create makes a new holder and binds it on h.file.
func (h *holder) create(stateDir string) error {
	f, err := os.OpenFile(h.file, os.O_RDONLY|os.O_CREATE, 0o444)
	if err != nil {
		return fmt.Errorf("network: holder file: %w", err)
	}
	f.Close()
	type res struct {
		fd  int
		err error
	}
	resc := make(chan res, 1)
	var rnd [16]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return err
	}
	nsDir := holderNSPrefix + hex.EncodeToString(rnd[:])
	SpoilThread(func() {
		fd, err := makeHolderNS(stateDir, nsDir)
		resc <- res{fd, err}
	})
	r := <-resc
	if r.err != nil {
		return fmt.Errorf("network: make holder: %w", r.err)
	}
	// From the host's namespace: the holder is newer, so binding it here makes no loop.
	if err := unix.Mount("/proc/self/fd/"+strconv.Itoa(r.fd), h.file, "", unix.MS_BIND, ""); err != nil {
		unix.Close(r.fd)
		return fmt.Errorf("network: bind holder on %s: %w", h.file, err)
	}
	h.fd, h.nsDir = r.fd, nsDir
	return nil
}

// makeHolderNS, on a locked thread it then spoils: a new mount namespace, private
// throughout, whose root is a new tmpfs (mounted on dir there) with ns/ and a procfs.
// It returns an fd of it.
func makeHolderNS(dir, nsDir string) (int, error) {
	if err := unix.Unshare(unix.CLONE_FS | unix.CLONE_NEWNS); err != nil {
		return -1, fmt.Errorf("unshare: %w", err)
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return -1, fmt.Errorf("make private: %w", err)
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=0711,size=1m"); err != nil {
		return -1, fmt.Errorf("mount tmpfs: %w", err)
	}
	for _, d := range []string{nsDir, holderProcDir} {
		if err := os.Mkdir(dir+d, 0o711); err != nil {
			return -1, err
		}
	}
	if err := unix.Chdir(dir); err != nil {
		return -1, err
	}
	// The old root stacked under the new one, then detached: the holder pins nothing.
	if err := unix.PivotRoot(".", "."); err != nil {
		return -1, fmt.Errorf("pivot_root: %w", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return -1, fmt.Errorf("detach old root: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return -1, err
	}
	if err := unix.Mount("proc", holderProcDir, "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return -1, fmt.Errorf("mount proc: %w", err)
	}
	fd, err := unix.Open(holderProcDir+"/thread-self/ns/mnt", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	return fd, nil
}

// SpoilThread runs fn on a goroutine locked to an OS thread that ends with it (fn may
// move the thread into other namespaces), never the process's main thread: Go keeps
// that one (wedged) instead of ending it, and /proc/<pid> (mountinfo, ns/, root) shows
// the main thread's namespaces.
func SpoilThread(fn func()) {
	go func() {
		runtime.LockOSThread() // never unlocked but on the main thread
		if unix.Gettid() == unix.Getpid() {
			// Held here until fn's goroutine is on a thread: not this one.
			started := make(chan struct{})
			SpoilThread(func() { close(started); fn() })
			<-started
			runtime.UnlockOSThread()
			return
		}
		fn()
	}()
}

// enter moves the calling (locked, to be discarded) thread into the holder.
func (h *holder) enter() error {
	if h.fd < 0 {
		return ErrClosed
	}
	if err := unix.Unshare(unix.CLONE_FS); err != nil {
		return fmt.Errorf("unshare fs: %w", err)
	}
	if err := unix.Setns(h.fd, unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("join holder: %w", err)
	}
	return nil
}

// startAnchor sets h.anchor: the process's thread whose root is the holder's (h.link's
// target), started first if there is none.
func (h *holder) startAnchor() error {
	var st unix.Stat_t
	if err := unix.Fstat(h.fd, &st); err != nil {
		return fmt.Errorf("network: holder: %w", err)
	}
	anchors.Lock()
	defer anchors.Unlock()
	if a := anchors.m[st.Ino]; a != nil {
		a.refs++
		h.anchor = a
		return nil
	}
	a := &anchor{key: st.Ino, refs: 1, stop: make(chan struct{}), done: make(chan struct{})}
	errc := make(chan error, 1)
	tidc := make(chan int, 1)
	SpoilThread(func() {
		defer close(a.done)
		if err := h.enter(); err != nil {
			errc <- err
			return
		}
		tidc <- unix.Gettid()
		<-a.stop
	})
	select {
	case err := <-errc:
		return fmt.Errorf("network: holder anchor: %w", err)
	case a.tid = <-tidc:
	}
	if anchors.m == nil {
		anchors.m = map[uint64]*anchor{}
	}
	anchors.m[a.key] = a
	h.anchor = a
	return nil
}

// in runs fn on a fresh thread in the holder, where "/" is the holder's root.
func (h *holder) in(fn func() error) error {
	h.mu.RLock()
	defer h.mu.RUnlock()
	errc := make(chan error, 1)
	SpoilThread(func() {
		if err := h.enter(); err != nil {
			errc <- err
			return
		}
		errc <- fn()
	})
	return <-errc
}

// findNSDir sets h.nsDir from an existing holder's root: its one holderNSPrefix dir.
func (h *holder) findNSDir() error {
	var found []string
	err := h.in(func() error {
		ents, err := os.ReadDir("/")
		for _, e := range ents {
			if n := "/" + e.Name(); e.IsDir() && strings.HasPrefix(n, holderNSPrefix) && len(n) == len(holderNSPrefix)+32 {
				found = append(found, n)
			}
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("network: holder %s: %w", h.file, err)
	}
	if len(found) != 1 {
		return fmt.Errorf("network: holder %s: %d namespace dirs, want 1", h.file, len(found))
	}
	h.nsDir = found[0]
	return nil
}

// createNetNS makes a new network namespace held as id.
func (h *holder) createNetNS(id string) error {
	return h.in(func() error {
		p := h.nsDir + "/" + id
		f, err := os.OpenFile(p, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
		if err != nil {
			return err
		}
		f.Close()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			os.Remove(p)
			return fmt.Errorf("unshare netns: %w", err)
		}
		if err := unix.Mount(holderProcDir+"/thread-self/ns/net", p, "", unix.MS_BIND, ""); err != nil {
			os.Remove(p)
			return fmt.Errorf("bind-mount netns %s: %w", id, err)
		}
		return nil
	})
}

// hold binds the namespace open as fd (of this process) as id.
func (h *holder) hold(id string, fd int) error {
	return h.in(func() error {
		p := h.nsDir + "/" + id
		f, err := os.OpenFile(p, os.O_RDONLY|os.O_CREATE, 0o444)
		if err != nil {
			return err
		}
		f.Close()
		if isNSFS(p) {
			return nil
		}
		if err := unix.Mount(holderProcDir+"/self/fd/"+strconv.Itoa(fd), p, "", unix.MS_BIND, ""); err != nil {
			os.Remove(p)
			return fmt.Errorf("bind-mount netns %s: %w", id, err)
		}
		return nil
	})
}

// deleteNetNS lets go of the namespace of id (missing is fine). The namespace itself
// goes away with its last reference (processes inside it, open fds).
func (h *holder) deleteNetNS(id string) error {
	return h.in(func() error {
		p := h.nsDir + "/" + id
		if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && err != unix.EINVAL && err != unix.ENOENT {
			return fmt.Errorf("unmount netns %s: %w", id, err)
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("remove netns file: %w", err)
		}
		return nil
	})
}

// list returns the names in the holder's ns dir (held namespaces, and files a crash
// left between their creation and their mount).
func (h *holder) list() ([]string, error) {
	var names []string
	err := h.in(func() error {
		ents, err := os.ReadDir(h.nsDir)
		for _, e := range ents {
			names = append(names, e.Name())
		}
		return err
	})
	return names, err
}

// migrate moves the namespaces of a netns directory of the previous layout (a shared
// bind mount with a bind mount per sandbox) into the holder and removes the directory.
func (h *holder) migrate() error {
	fi, err := os.Lstat(h.link)
	if err != nil || !fi.IsDir() {
		return nil
	}
	ents, err := os.ReadDir(h.link)
	if err != nil {
		return fmt.Errorf("network: migrate %s: %w", h.link, err)
	}
	for _, e := range ents {
		p := filepath.Join(h.link, e.Name())
		if validID(e.Name()) == nil && isNSFS(p) {
			fd, err := unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				return fmt.Errorf("network: migrate %s: %w", p, err)
			}
			err = h.hold(e.Name(), fd)
			unix.Close(fd)
			if err != nil {
				return fmt.Errorf("network: migrate %s: %w", p, err)
			}
		}
		if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && err != unix.EINVAL && err != unix.ENOENT {
			return fmt.Errorf("network: migrate: unmount %s: %w", p, err)
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("network: migrate: %w", err)
		}
	}
	if err := unix.Unmount(h.link, unix.MNT_DETACH); err != nil && err != unix.EINVAL && err != unix.ENOENT {
		return fmt.Errorf("network: migrate: unmount %s: %w", h.link, err)
	}
	if err := os.Remove(h.link); err != nil {
		return fmt.Errorf("network: migrate: %w", err)
	}
	return nil
}

// close ends the anchor and closes the holder's fd; the holder stays (h.file).
func (h *holder) close() {
	if a := h.anchor; a != nil {
		h.anchor = nil
		anchors.Lock()
		if a.refs--; a.refs == 0 {
			delete(anchors.m, a.key)
			close(a.stop)
			<-a.done
		}
		anchors.Unlock()
	}
	h.mu.Lock()
	if h.fd >= 0 {
		unix.Close(h.fd)
		h.fd = -1
	}
	h.mu.Unlock()
}

// destroy closes h and removes the holder from the host (and with it every namespace
// it held that nothing else refers to) and the link.
func (h *holder) destroy() error {
	h.close()
	var errs []error
	if err := unix.Unmount(h.file, unix.MNT_DETACH); err != nil && err != unix.EINVAL && err != unix.ENOENT {
		errs = append(errs, fmt.Errorf("unmount %s: %w", h.file, err))
	}
	for _, p := range []string{h.file, h.link} {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// isNSFS reports whether path is an nsfs file (a mounted namespace).
func isNSFS(path string) bool {
	var st unix.Statfs_t
	return unix.Statfs(path, &st) == nil && st.Type == unix.NSFS_MAGIC
}

// HeldNetNS lists the network namespaces (and partial entries a crash left) held for
// the Manager of stateDir, without one: for leak checks in tests and tools.
func HeldNetNS(stateDir string) ([]string, error) {
	file := filepath.Join(stateDir, "mntns")
	if !isNSFS(file) {
		return nil, nil
	}
	fd, err := unix.Open(file, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	h := &holder{file: file, fd: fd}
	defer h.close()
	if err := h.findNSDir(); err != nil {
		return nil, err
	}
	return h.list()
}
