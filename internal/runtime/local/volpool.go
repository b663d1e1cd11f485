package local

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// The volume pool: disk-medium scratch volumes are subvolumes of one btrfs filesystem
// per backend, so that a volume can be captured copy-on-write (a read-only snapshot
// subvolume takes milliseconds whatever the volume holds) and a restored volume is a
// writable snapshot of a cached one (O(1), shared extents).
//
// The filesystem lives in a sparse image, <StateDir>/.volumes/pool.img, the size of the
// host filesystem under StateDir (it cannot hold more than the host does anyway), loop
// mounted at <StateDir>/.volumes/mnt with discard=async (deleted data returns to the
// host) and noatime, quotas on. It is made on first use and mounted while anything is
// in it: when the last sandbox volume, capture and cache entry is gone, it is unmounted
// (its image stays for the next use), so a backend that has none holds no mount; so does
// Backend.Close when only cache entries are left (they stay in the image). A restarted
// backend finds the mount left by the earlier one, or Recover mounts the image again.
//
// In it:
//
//	sbx/<sandbox id>/<volume index>  a sandbox's disk volumes (removed by Destroy)
//	captures/<random>                read-only snapshots being archived (CaptureVolume)
//	cache/<digest>                   read-only restored snapshots (PrepareSnapshot)
//	meta/<digest>.json               a cache entry's size; its mtime is its last use
//	tmp/<random>                     cache entries being extracted
//
// Sizes are qgroup limits on referenced bytes: a sized volume gets its size; an unsized
// one gets the sandbox's disk limit when it has one (its own budget of that size, no
// longer shared with the writable layer), else none (like an emptyDir without
// sizeLimit). A sandbox that fills one gets EDQUOT ("Disk quota exceeded").
//
// When btrfs is not available (no mkfs.btrfs, or the mount fails) or Config.NoVolumePool
// says so, volumes are made as before the pool (volumes.go) and the backend neither
// captures nor restores snapshots (Support.NoSnapshots).

const (
	dirVolumePool  = ".volumes" // in StateDir; not a sandbox id (ids cannot start with a dot)
	filePoolImage  = "pool.img"
	dirPoolMount   = "mnt"
	poolSandboxes  = "sbx"
	poolCaptures   = "captures"
	poolCache      = "cache"
	poolCacheMeta  = "meta"
	poolTmp        = "tmp"
	minPoolBytes   = 1 << 30
	poolMountFlags = unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOATIME
	poolMountData  = "discard=async"
)

// errNoPool: the volume pool is not available on this host.
var errNoPool = fmt.Errorf("%w: file-system snapshots need btrfs (mkfs.btrfs and a kernel with btrfs) for the local backend's volume pool", errdefs.ErrNotImplemented)

type volPool struct {
	dir string // <StateDir>/.volumes

	mu       sync.Mutex
	disabled error             // set when the pool cannot be had: errNoPool, with the reason logged
	busy     int               // operations holding the mount (acquire/release)
	kept     map[string]string // kept volume name → the sandbox mounting it (keep.go)
}

func (p *volPool) img() string { return filepath.Join(p.dir, filePoolImage) }
func (p *volPool) mnt() string { return filepath.Join(p.dir, dirPoolMount) }

// available says whether the pool can be used (it may still need mounting).
func (p *volPool) available() bool {
	if p == nil {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.disabled != nil {
		return false
	}
	if p.mountedLocked() {
		return true
	}
	if _, err := os.Stat(p.img()); err == nil {
		return true
	}
	if _, err := exec.LookPath("mkfs.btrfs"); err != nil {
		p.disabled = errNoPool
		return false
	}
	return true
}

// imageExists says whether the pool was ever made.
func (p *volPool) imageExists() bool {
	if p == nil {
		return false
	}
	_, err := os.Stat(p.img())
	return err == nil
}

// mountedLocked says whether the pool's filesystem is mounted.
func (p *volPool) mountedLocked() bool {
	var st unix.Statfs_t
	return unix.Statfs(p.mnt(), &st) == nil && st.Type == unix.BTRFS_SUPER_MAGIC
}

// mounted says whether the pool's filesystem is mounted (without mounting it).
func (p *volPool) mounted() bool {
	if p == nil {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.mountedLocked()
}

// acquire mounts the pool (making it on first use) and keeps it mounted until release.
func (p *volPool) acquire() (release func(), err error) {
	if p == nil {
		return nil, errNoPool
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.disabled != nil {
		return nil, p.disabled
	}
	if !p.mountedLocked() {
		if err := p.mountLocked(); err != nil {
			return nil, err
		}
	}
	p.busy++
	var once sync.Once
	return func() { once.Do(p.release) }, nil
}

func (p *volPool) release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.busy--
	if p.busy == 0 && p.emptyLocked() {
		_ = p.unmountLocked()
	}
}

// close unmounts the pool unless a sandbox volume or a capture is in it or an
// operation holds it (Backend.Close).
func (p *volPool) close() error {
	if p == nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.busy > 0 || !p.emptyLocked(poolSandboxes, poolCaptures, poolTmp) {
		return nil
	}
	return p.unmountLocked()
}

// sweepStale removes what an earlier process left in captures/ and tmp/: a capture it
// was archiving or an extraction it was making when it was killed (a closing backend
// removes its own). Recover calls it with the pool held, before this process makes any.
func (p *volPool) sweepStale(log *slog.Logger) {
	for _, d := range []string{poolCaptures, poolTmp} {
		dir, err := p.openDir(d)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			log.Warn("volume pool: open stale entries", "dir", d, "err", err)
			continue
		}
		names, err := dir.Readdirnames(-1)
		if err != nil {
			log.Warn("volume pool: list stale entries", "dir", d, "err", err)
		}
		for _, name := range names {
			if err := subvolDestroy(dir, name); err != nil {
				log.Warn("volume pool: remove what an earlier run left", "dir", d, "name", name, "err", err)
			}
		}
		dir.Close()
	}
}

// emptyLocked says whether nothing lives in the mounted pool (in dirs, default all).
func (p *volPool) emptyLocked(dirs ...string) bool {
	if len(dirs) == 0 {
		dirs = []string{poolSandboxes, poolCaptures, poolCache, poolTmp, poolKeep}
	}
	for _, d := range dirs {
		ents, err := os.ReadDir(filepath.Join(p.mnt(), d))
		if err != nil && !errors.Is(err, fs.ErrNotExist) || len(ents) > 0 {
			return false
		}
	}
	return true
}

func (p *volPool) unmountLocked() error {
	if !p.mountedLocked() {
		return nil
	}
	if err := unix.Unmount(p.mnt(), 0); err != nil {
		return fmt.Errorf("unmount volume pool: %w", err)
	}
	return nil
}

// mountLocked mounts the pool's image, making it first if there is none.
func (p *volPool) mountLocked() error {
	if err := os.MkdirAll(p.mnt(), 0o700); err != nil {
		return err
	}
	if _, err := os.Stat(p.img()); errors.Is(err, fs.ErrNotExist) {
		if err := p.mkfs(); err != nil {
			return err
		}
	}
	if err := mountLoopFS(p.img(), p.mnt(), "btrfs", poolMountFlags, poolMountData); err != nil {
		p.disabled = fmt.Errorf("%w (%w)", errNoPool, err)
		return p.disabled
	}
	root, err := os.Open(p.mnt())
	if err == nil {
		err = quotaEnable(root)
		root.Close()
	}
	for _, d := range []string{poolSandboxes, poolCaptures, poolCache, poolCacheMeta, poolTmp, poolKeep, poolKeepMeta} {
		if err == nil {
			if err = os.Mkdir(filepath.Join(p.mnt(), d), 0o700); errors.Is(err, fs.ErrExist) {
				err = nil
			}
		}
	}
	if err != nil {
		_ = unix.Unmount(p.mnt(), 0)
		return fmt.Errorf("volume pool: %w", err)
	}
	return nil
}

// mkfs makes the pool's image: sparse, the host filesystem's size, btrfs.
func (p *volPool) mkfs() error {
	if _, err := exec.LookPath("mkfs.btrfs"); err != nil {
		p.disabled = errNoPool
		return p.disabled
	}
	var st unix.Statfs_t
	if err := unix.Statfs(p.dir, &st); err != nil {
		return err
	}
	size := int64(st.Blocks) * st.Bsize
	if size < minPoolBytes {
		size = minPoolBytes
	}
	tmp := p.img() + ".tmp"
	_ = os.Remove(tmp)
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o600)
	if err != nil {
		return fmt.Errorf("volume pool image: %w", err)
	}
	err = f.Truncate(size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		var out []byte
		if out, err = exec.Command("mkfs.btrfs", "-q", "-f", tmp).CombinedOutput(); err != nil {
			err = fmt.Errorf("mkfs.btrfs: %w: %s", err, strings.TrimSpace(string(out)))
		}
	}
	if err == nil {
		err = os.Rename(tmp, p.img())
	}
	if err != nil {
		_ = os.Remove(tmp)
		p.disabled = fmt.Errorf("%w (%w)", errNoPool, err)
		return p.disabled
	}
	return nil
}

// openDir opens the pool dir rel (below the mount), which must exist.
func (p *volPool) openDir(rel string) (*os.File, error) {
	fd, err := unix.Open(filepath.Join(p.mnt(), rel), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: filepath.Join(p.mnt(), rel), Err: err}
	}
	return os.NewFile(uintptr(fd), filepath.Join(p.mnt(), rel)), nil
}

// volumePath is where sandbox id's volume number index lives in the pool.
func (p *volPool) volumePath(id string, index int) string {
	return filepath.Join(p.mnt(), poolSandboxes, id, strconv.Itoa(index))
}

// createVolume makes the (empty, or with from a snapshot of from) subvolume of sandbox
// id's volume number index, limited to limit bytes (0: none), and returns its path. The
// caller holds the pool (acquire).
func (p *volPool) createVolume(id string, index int, limit int64, from *os.File) (string, error) {
	base, err := p.openDir(poolSandboxes)
	if err != nil {
		return "", err
	}
	defer base.Close()
	if err := unix.Mkdirat(int(base.Fd()), id, 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
		return "", fmt.Errorf("volume pool: %w", err)
	}
	parent, err := p.openDir(filepath.Join(poolSandboxes, id))
	if err != nil {
		return "", err
	}
	defer parent.Close()
	name := strconv.Itoa(index)
	if from != nil {
		err = subvolSnapshot(from, parent, name, false)
	} else {
		err = subvolCreate(parent, name)
	}
	if err != nil {
		return "", err
	}
	vol, err := p.openDir(filepath.Join(poolSandboxes, id, name))
	if err != nil {
		return "", err
	}
	defer vol.Close()
	if err := qgroupLimit(vol, limit); err != nil {
		return "", err
	}
	return vol.Name(), nil
}

// removeSandbox deletes sandbox id's volumes. It mounts the pool if it must and the
// sandbox may have volumes there (mayHave; volumes left by an earlier run, before
// Recover mounted it), and does nothing when the pool was never made.
func (p *volPool) removeSandbox(id string, mayHave bool) error {
	p.unclaimKept(id) // its kept volumes stay, for the next sandbox
	if p == nil || !p.imageExists() || (!mayHave && !p.mounted()) {
		return nil
	}
	release, err := p.acquire()
	if err != nil {
		return nil //nolint:nilerr // no pool: nothing of the sandbox's can be in it
	}
	defer release()
	base, err := p.openDir(poolSandboxes)
	if err != nil {
		return err
	}
	defer base.Close()
	dir, err := p.openDir(filepath.Join(poolSandboxes, id))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer dir.Close()
	ents, err := dir.ReadDir(-1)
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range ents {
		if err := subvolDestroy(dir, e.Name()); err != nil {
			// Not a subvolume (a crash between mkdir and create cannot leave one, but be
			// safe): remove it as a directory.
			if rerr := os.RemoveAll(filepath.Join(dir.Name(), e.Name())); rerr != nil {
				errs = append(errs, err)
			}
		}
	}
	if err := unix.Unlinkat(int(base.Fd()), id, unix.AT_REMOVEDIR); err != nil && !errors.Is(err, unix.ENOENT) {
		errs = append(errs, fmt.Errorf("volume pool: remove %s: %w", id, err))
	}
	return errors.Join(errs...)
}

// hasDiskVolume says whether spec has a disk-medium volume.
func hasDiskVolume(spec *runtime.Spec) bool {
	for _, v := range spec.Volumes {
		if v.Medium != runtime.MediumMemory {
			return true
		}
	}
	return false
}

// randomName is a fresh name for a capture or temp subvolume.
func randomName() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
