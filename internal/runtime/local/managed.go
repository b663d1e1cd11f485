package local

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// Managed volumes (runtime.Volume.Managed; registered CLUSTER_LOCAL volumes,
// docs/volumes.md): one sparse ext4 image per volume, made like a sized scratch volume's
// (disk.go: no journal, no reserved blocks), in <StateDir>/.volumes/<name>/volume.img and
// loop-mounted once on the host at <StateDir>/.volumes/<name>/mnt (again after a host
// reboot, by the first EnsureManaged or sandbox that needs it). Every sandbox that mounts
// the volume gets a bind mount of that one directory (or of a sub_path dir in it, resolved
// without following symlinks: the content is sandbox-written), so concurrent read-write
// mounts share it. The image outlives sandboxes and runner restarts; RemoveManaged
// unmounts it (lazily, when sandboxes still hold it) and deletes it.

const (
	dirManaged       = ".volumes" // in StateDir; not a sandbox id (ids cannot start with a dot)
	fileManagedImage = "volume.img"
	dirManagedMount  = "mnt"
	// DefaultManagedVolumeBytes is a managed volume's size when none is asked for.
	DefaultManagedVolumeBytes = 10 << 30
	// MaxManagedVolumeBytes bounds one managed volume's size (the image is sparse: the host
	// disk holds only what is written).
	MaxManagedVolumeBytes = 16 << 40
)

var _ runtime.ManagedVolumes = (*Backend)(nil)

// ManagedUnavailable implements runtime.ManagedVolumes: managed volumes need loop devices.
func (b *Backend) ManagedUnavailable() string {
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		return "the local backend keeps managed volumes in loop-mounted images, and this host has no /dev/loop-control"
	}
	return ""
}

func (b *Backend) managedDir(name string) (string, error) {
	if !runtime.KeepNamePattern.MatchString(name) {
		return "", fmt.Errorf("%w: managed volume name %q does not match %s", runtime.ErrInvalidSpec, name, runtime.KeepNamePattern)
	}
	return filepath.Join(b.cfg.StateDir, dirManaged, name), nil
}

var _ runtime.ManagedSizer = (*Backend)(nil)

// ManagedSize implements runtime.ManagedSizer: the size of name's image (0 when missing).
func (b *Backend) ManagedSize(name string) (int64, error) {
	dir, err := b.managedDir(name)
	if err != nil {
		return 0, err
	}
	fi, err := os.Stat(filepath.Join(dir, fileManagedImage))
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	return fi.Size(), nil
}

// EnsureManaged implements runtime.ManagedVolumes.
func (b *Backend) EnsureManaged(name string, size int64) (int64, error) {
	dir, err := b.managedDir(name)
	if err != nil {
		return 0, err
	}
	if size == 0 {
		size = DefaultManagedVolumeBytes
	}
	if size < minDiskBytes || size > MaxManagedVolumeBytes {
		return 0, fmt.Errorf("%w: managed volume size %d bytes is not in [%d, %d]", runtime.ErrInvalidSpec, size, minDiskBytes, int64(MaxManagedVolumeBytes))
	}
	b.managedMu.Lock()
	defer b.managedMu.Unlock()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return 0, err
	}
	img := filepath.Join(dir, fileManagedImage)
	fresh := false
	if _, err := os.Lstat(img); errors.Is(err, fs.ErrNotExist) {
		tmpl, err := b.disks.get(size)
		if err != nil {
			return 0, err
		}
		tmp := img + ".tmp"
		_ = os.Remove(tmp)
		if err := copySparse(tmpl, tmp, size); err != nil {
			return 0, fmt.Errorf("managed volume image: %w", err)
		}
		if err := os.Rename(tmp, img); err != nil {
			return 0, err
		}
		fresh = true
	} else if err != nil {
		return 0, err
	}
	mnt, err := b.mountManagedLocked(dir)
	if err != nil {
		return 0, err
	}
	if !fresh {
		// A larger size grows the volume; a smaller one changes nothing (volumes never
		// shrink).
		if mnt, err = b.growManagedLocked(dir, mnt, size); err != nil {
			return 0, fmt.Errorf("managed volume %s: grow to %d bytes: %w", name, size, err)
		}
	}
	if fresh {
		// Like an emptyDir: empty, and writable by every user of every sandbox.
		_ = os.Remove(filepath.Join(mnt, "lost+found"))
		if err := os.Chmod(mnt, 0o777); err != nil {
			return 0, err
		}
	}
	// Usable: the filesystem answers. The capacity is the image's size (what was asked
	// for; ext4's own metadata takes a little of it).
	var st unix.Statfs_t
	if err := unix.Statfs(mnt, &st); err != nil {
		return 0, fmt.Errorf("managed volume %s: %w", name, err)
	}
	fi, err := os.Stat(img)
	if err != nil {
		return 0, err
	}
	return fi.Size(), nil
}

// growManagedLocked grows dir's image, mounted on mnt, to size bytes when it is smaller,
// and returns where it is mounted then. Online first: the sparse file is extended, its
// loop device told (LOOP_SET_CAPACITY) and the mounted ext4 resized (resize2fs on the
// device; the kernel turns the filesystem meta_bg as needed: the images have no resize
// inode). The kernel allows that only with CAP_SYS_RESOURCE; without it, a volume no
// sandbox mounts is grown offline (unmounted, e2fsck -f, resize2fs on the image,
// mounted again), and one that sandboxes mount is refused (grow it when they ended).
// Idempotent and safe to retry: the filesystem's size, not the file's, says whether it
// is done. b.managedMu is held.
func (b *Backend) growManagedLocked(dir, mnt string, size int64) (string, error) {
	img := filepath.Join(dir, fileManagedImage)
	fi, err := os.Stat(img)
	if err != nil {
		return mnt, err
	}
	var st unix.Statfs_t
	if err := unix.Statfs(mnt, &st); err != nil {
		return mnt, err
	}
	// Big enough: ext4's metadata takes a little of the file (a few %).
	if fi.Size() >= size && int64(st.Blocks)*st.Bsize >= size-size/16 {
		return mnt, nil
	}
	dev, devNum, err := loopDeviceOf(mnt, img)
	if err != nil {
		return mnt, err
	}
	if fi.Size() < size {
		if err := os.Truncate(img, size); err != nil {
			return mnt, err
		}
	}
	f, err := os.OpenFile(dev, os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return mnt, err
	}
	err = unix.IoctlSetInt(int(f.Fd()), unix.LOOP_SET_CAPACITY, 0)
	f.Close()
	if err != nil {
		return mnt, fmt.Errorf("loop set capacity %s: %w", dev, err)
	}
	out, onlineErr := exec.Command("resize2fs", dev).CombinedOutput()
	if onlineErr == nil {
		return mnt, nil
	}
	online := fmt.Sprintf("online resize2fs %s: %v: %s", dev, onlineErr, strings.TrimSpace(string(out)))
	putBack := func() {
		// Put the file back as it was (the filesystem does not reach past it), so its
		// size keeps saying the capacity.
		if fi.Size() < size && os.Truncate(img, fi.Size()) == nil {
			if f, err := os.OpenFile(dev, os.O_RDWR|unix.O_CLOEXEC, 0); err == nil {
				_ = unix.IoctlSetInt(int(f.Fd()), unix.LOOP_SET_CAPACITY, 0)
				f.Close()
			}
		}
	}
	busy := func(why string) error {
		// Not the online attempt's output: it names host paths.
		return fmt.Errorf("%w: the volume is mounted by sandboxes (%s) and cannot grow while they run on this runner (online resizing is not allowed here)", runtime.ErrManagedBusy, why)
	}
	// Offline, only when nothing but the runner's own mount holds the filesystem: no
	// other mount of the device in any mount namespace (sandboxes bind it into theirs).
	n, err := mountsOfDeviceAnywhere(devNum)
	// A mount namespace made meanwhile (a runc create, an `ip netns exec`) holds a copy
	// of every host mount until it has pivoted or ended: wait a little for such a copy
	// to go before calling the volume in use.
	for deadline := time.Now().Add(managedBusyWait); err == nil && n > 1 && time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
		n, err = mountsOfDeviceAnywhere(devNum)
	}
	if err != nil || n > 1 {
		putBack()
		if err != nil {
			return mnt, err
		}
		return mnt, busy(fmt.Sprintf("%d mounts of it", n))
	}
	if err := unix.Unmount(mnt, unix.UMOUNT_NOFOLLOW); err != nil {
		putBack()
		return mnt, busy(fmt.Sprintf("unmount: %v", err))
	}
	// The mount held the loop device (autoclear): it detaches once no mount anywhere
	// holds the filesystem. Still attached: someone does; mount that same device back
	// (never a second loop device of one image) and refuse.
	if !loopDetached(devNum, img, 3*time.Second) {
		if err := unix.Mount(dev, mnt, "ext4", unix.MS_NOSUID|unix.MS_NODEV, "noinit_itable"); err != nil {
			return mnt, fmt.Errorf("mount %s back on %s: %w", dev, mnt, err)
		}
		putBack()
		return mnt, busy("its loop device stayed attached")
	}
	if out, err := exec.Command("e2fsck", "-f", "-p", img).CombinedOutput(); err != nil {
		// Exit 1: errors corrected; anything more is a failure.
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() > 1 {
			_, _ = b.mountManagedLocked(dir)
			return mnt, fmt.Errorf("e2fsck %s: %w: %s", img, err, strings.TrimSpace(string(out)))
		}
	}
	out, err = exec.Command("resize2fs", img, strconv.FormatInt(size/1024, 10)+"K").CombinedOutput()
	mnt2, merr := b.mountManagedLocked(dir)
	if err != nil {
		return mnt2, fmt.Errorf("resize2fs %s: %w: %s (after %s)", img, err, strings.TrimSpace(string(out)), online)
	}
	return mnt2, merr
}

// loopDetached waits up to d for the loop device devNum to no longer be bound to img.
func loopDetached(devNum, img string, d time.Duration) bool {
	for deadline := time.Now().Add(d); ; time.Sleep(20 * time.Millisecond) {
		bf, err := os.ReadFile("/sys/dev/block/" + devNum + "/loop/backing_file")
		if err != nil || strings.TrimSuffix(strings.TrimSpace(string(bf)), " (deleted)") != img {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}

// mountsOfDeviceAnywhere counts the mounts of device "major:minor" in every mount
// namespace of the host (each namespace once: /proc/<pid>/mountinfo of one process per
// namespace), the runner's own included.
func mountsOfDeviceAnywhere(dev string) (int, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	seen := map[string]bool{}
	n := 0
	for _, e := range ents {
		if e.Name()[0] < '0' || e.Name()[0] > '9' {
			continue
		}
		ns, err := os.Readlink("/proc/" + e.Name() + "/ns/mnt")
		if err != nil || seen[ns] {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/mountinfo")
		if err != nil {
			continue // the process ended
		}
		seen[ns] = true
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); len(f) > 2 && f[2] == dev {
				n++
			}
		}
	}
	if len(seen) == 0 {
		return 0, errors.New("no mount namespace readable under /proc")
	}
	return n, nil
}

// loopDeviceOf returns the loop device mounted on mnt (its path and "major:minor"),
// checking that img backs it.
func loopDeviceOf(mnt, img string) (string, string, error) {
	var st unix.Stat_t
	if err := unix.Stat(mnt, &st); err != nil {
		return "", "", err
	}
	num := fmt.Sprintf("%d:%d", unix.Major(st.Dev), unix.Minor(st.Dev))
	sys := "/sys/dev/block/" + num
	bf, err := os.ReadFile(filepath.Join(sys, "loop", "backing_file"))
	if err != nil {
		return "", "", fmt.Errorf("%s is not on a loop device: %w", mnt, err)
	}
	if strings.TrimSpace(string(bf)) != img {
		return "", "", fmt.Errorf("%s is on a loop device of %q, not %s", mnt, strings.TrimSpace(string(bf)), img)
	}
	ue, err := os.ReadFile(filepath.Join(sys, "uevent"))
	if err != nil {
		return "", "", err
	}
	for _, l := range strings.Split(string(ue), "\n") {
		if name, ok := strings.CutPrefix(l, "DEVNAME="); ok && strings.HasPrefix(name, "loop") && !strings.Contains(name, "/") {
			return "/dev/" + name, num, nil
		}
	}
	return "", "", fmt.Errorf("no device name for %s", sys)
}

// mountManagedLocked mounts dir's image on dir/mnt unless it is mounted there already, and
// returns dir/mnt. b.managedMu is held.
func (b *Backend) mountManagedLocked(dir string) (string, error) {
	mnt := filepath.Join(dir, dirManagedMount)
	if err := os.Mkdir(mnt, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return "", err
	}
	if mounted, err := isMountPoint(mnt); err != nil {
		return "", err
	} else if mounted {
		return mnt, nil
	}
	img := filepath.Join(dir, fileManagedImage)
	if err := awaitImageReleased(img, 10*time.Second); err != nil {
		return "", fmt.Errorf("managed volume: %w", err)
	}
	if err := mountLoopFSWith(img, mnt, "ext4", unix.MS_NOSUID|unix.MS_NODEV, "noinit_itable", true); err != nil {
		return "", fmt.Errorf("managed volume: %w", err)
	}
	return mnt, nil
}

// awaitImageReleased waits, up to d, until no loop device backs the image img. An
// unmounted filesystem lives on while another mount namespace still holds a copy of
// its mount (one made a moment ago copies the whole table: runc's, the network
// holder's), and its loop device with it; mounting the image again meanwhile would make
// a second filesystem instance of one image, which reads what the first has not yet
// written back (seen: a file written before the unmount read empty) and corrupts it when
// both write.
func awaitImageReleased(img string, d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		held := false
		for _, l := range LoopDevicesUnder(filepath.Dir(img)) {
			held = held || l.File == img
		}
		if !held {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the image %s is still attached to a loop device from an earlier mount (held elsewhere); try again", img)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// bindManaged binds managed volume name's filesystem onto root (made here, a host-only
// dir of the sandbox, which its container's mounts name), mounting its image when
// needed; a volume EnsureManaged never made is an error (a sandbox never creates one).
// Bound under managedMu, so that the sandbox holds the volume's filesystem from here on,
// never the bare dir/mnt an offline grow unmounts for a while (a grow counts this
// mount and refuses while it exists); teardownVolumes unmounts it.
func (b *Backend) bindManaged(name, root string) error {
	dir, err := b.managedDir(name)
	if err != nil {
		return err
	}
	b.managedMu.Lock()
	defer b.managedMu.Unlock()
	mnt, err := b.managedRootLocked(name, dir)
	if err != nil {
		return err
	}
	if err := os.Mkdir(root, 0o700); err != nil {
		return err
	}
	if err := unix.Mount(mnt, root, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("managed volume %s: bind: %w", name, err)
	}
	return nil
}

// managedRoot returns the host directory of managed volume name (dir/mnt), mounting its
// image when needed. Sandboxes get a bind of it (bindManaged).
func (b *Backend) managedRoot(name string) (string, error) {
	dir, err := b.managedDir(name)
	if err != nil {
		return "", err
	}
	b.managedMu.Lock()
	defer b.managedMu.Unlock()
	return b.managedRootLocked(name, dir)
}

func (b *Backend) managedRootLocked(name, dir string) (string, error) {
	if _, err := os.Lstat(filepath.Join(dir, fileManagedImage)); err != nil {
		return "", fmt.Errorf("%w: managed volume %s does not exist on this runner (deleted?)", runtime.ErrInvalidSpec, name)
	}
	return b.mountManagedLocked(dir)
}

// RemoveManaged implements runtime.ManagedVolumes.
func (b *Backend) RemoveManaged(name string) error {
	dir, err := b.managedDir(name)
	if err != nil {
		return err
	}
	b.managedMu.Lock()
	defer b.managedMu.Unlock()
	if err := unmountAll(filepath.Join(dir, dirManagedMount)); err != nil {
		return err
	}
	if mounted, err := isMountPoint(filepath.Join(dir, dirManagedMount)); err == nil && mounted {
		return fmt.Errorf("managed volume %s: still mounted", name)
	}
	return os.RemoveAll(dir)
}

// isMountPoint says whether p (a directory, not a symlink) is a mount point: on another
// device than its parent, or the same mount bound again (the mount IDs differ).
func isMountPoint(p string) (bool, error) {
	var a, b unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, p, unix.AT_SYMLINK_NOFOLLOW, unix.STATX_MNT_ID, &a); err != nil {
		return false, err
	}
	if err := unix.Statx(unix.AT_FDCWD, filepath.Dir(p), unix.AT_SYMLINK_NOFOLLOW, unix.STATX_MNT_ID, &b); err != nil {
		return false, err
	}
	if a.Attributes_mask&unix.STATX_ATTR_MOUNT_ROOT != 0 {
		return a.Attributes&unix.STATX_ATTR_MOUNT_ROOT != 0, nil
	}
	return a.Mnt_id != b.Mnt_id || a.Dev_major != b.Dev_major || a.Dev_minor != b.Dev_minor, nil
}

// openBeneath opens the directory sub (clean, relative, "" for root itself) below root
// without following any symlink or leaving root (openat2 RESOLVE_BENEATH |
// RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV), making each missing
// component (mode 0777, like an emptyDir's sub_path dirs). The tree below root is
// sandbox-written: a symlink or a file anywhere on the way is an error, never followed.
func openBeneath(root, sub string) (*os.File, error) {
	how := unix.OpenHow{Flags: unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC | unix.O_NOFOLLOW,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV}
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0) // the host's path
	if err != nil {
		return nil, fmt.Errorf("open volume root: %w", err)
	}
	for _, part := range strings.Split(sub, "/") {
		if part == "" || part == "." {
			continue
		}
		if part == ".." || strings.ContainsRune(part, 0) {
			unix.Close(fd)
			return nil, fmt.Errorf("sub_path component %q", part)
		}
		made := false
		if err := unix.Mkdirat(fd, part, 0o777); err == nil {
			made = true
		} else if !errors.Is(err, unix.EEXIST) {
			unix.Close(fd)
			return nil, fmt.Errorf("sub_path %q: make %q: %w", sub, part, err)
		}
		next, err := unix.Openat2(fd, part, &how)
		unix.Close(fd)
		if err != nil {
			if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.EXDEV) || errors.Is(err, unix.ENOTDIR) {
				return nil, fmt.Errorf("%w: sub_path %q: %q is a symlink, not a directory, or leaves the volume", runtime.ErrInvalidSpec, sub, part)
			}
			return nil, fmt.Errorf("sub_path %q: open %q: %w", sub, part, err)
		}
		fd = next
		if made {
			// By descriptor: the name may be a symlink by now.
			_ = unix.Fchmod(fd, 0o777)
		}
	}
	return os.NewFile(uintptr(fd), filepath.Join(root, sub)), nil
}

// bindFD bind-mounts the directory f holds on target (an empty dir the host owns): the
// kernel follows the descriptor, no path is resolved again.
func bindFD(f *os.File, target string) error {
	if err := os.Mkdir(target, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	src := fmt.Sprintf("/proc/self/fd/%d", f.Fd())
	if err := unix.Mount(src, target, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind %s on %s: %w", f.Name(), target, err)
	}
	return nil
}

// managedBusyWait is how long an offline grow waits for other mounts of the volume's
// device (copies in mount namespaces being made) to go before it reports it in use.
const managedBusyWait = 3 * time.Second
