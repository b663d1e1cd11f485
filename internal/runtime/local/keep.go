package local

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// Kept volumes (runtime.Volume.Keep): subvolumes of the volume pool that outlive their
// sandbox, <pool>/keep/<name>, limited (qgroup) to the volume's size, with the time of
// their last use in <pool>/keepmeta/<name> (an empty file's mtime, written by the host
// only: the sandbox could set the times of files inside the volume). A kept volume is
// sandbox-written content: the host creates, limits and deletes it by descriptor
// (subvolume ioctls; subvolDestroy walks nested subvolumes with O_NOFOLLOW) and never
// reads a path inside it. One live sandbox of this backend mounts it at a time; after a
// restart of the backend that claim is not recovered (the runner's own lock covers it).
// They are for sandboxes without a user namespace of their own (gVisor: owners inside
// are the sandbox's own IDs, the same for the next sandbox).

const (
	poolKeep     = "keep"
	poolKeepMeta = "keepmeta"
)

var _ runtime.KeptVolumes = (*Backend)(nil)

// keptVolume claims kept volume name for sandbox id, makes it (empty) when it does not
// exist, limits it to limit bytes and returns its path. The caller holds the pool.
func (p *volPool) keptVolume(id, name string, limit int64) (string, error) {
	if !runtime.KeepNamePattern.MatchString(name) || limit <= 0 {
		return "", fmt.Errorf("%w: kept volume %q of %d bytes", runtime.ErrInvalidSpec, name, limit)
	}
	p.mu.Lock()
	if user, ok := p.kept[name]; ok && user != id {
		p.mu.Unlock()
		return "", fmt.Errorf("%w: %s (sandbox %s)", runtime.ErrKeptInUse, name, user)
	}
	if p.kept == nil {
		p.kept = map[string]string{}
	}
	p.kept[name] = id
	p.mu.Unlock()
	path, err := p.openKept(name, limit)
	if err != nil {
		p.unclaimKept(id)
	}
	return path, err
}

func (p *volPool) openKept(name string, limit int64) (string, error) {
	base, err := p.openDir(poolKeep)
	if err != nil {
		return "", err
	}
	defer base.Close()
	vol, err := p.openDir(filepath.Join(poolKeep, name))
	if errors.Is(err, fs.ErrNotExist) {
		if err := subvolCreate(base, name); err != nil {
			return "", err
		}
		vol, err = p.openDir(filepath.Join(poolKeep, name))
	}
	if err != nil {
		return "", err
	}
	defer vol.Close()
	if !isSubvolume(vol) {
		return "", fmt.Errorf("kept volume %s: not a subvolume", name)
	}
	if err := qgroupLimit(vol, limit); err != nil {
		return "", err
	}
	stamp := filepath.Join(p.mnt(), poolKeepMeta, name)
	f, err := os.OpenFile(stamp, os.O_CREATE|os.O_WRONLY|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return "", err
	}
	f.Close()
	now := time.Now()
	if err := os.Chtimes(stamp, now, now); err != nil {
		return "", err
	}
	return vol.Name(), nil
}

// unclaimKept lets go of the kept volumes sandbox id claimed (its teardown).
func (p *volPool) unclaimKept(id string) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for name, user := range p.kept {
		if user == id {
			delete(p.kept, name)
		}
	}
}

// KeepUnavailable says why Volume.Keep does not work here ("" when it does).
func (b *Backend) KeepUnavailable() string {
	if !b.vols.available() {
		return "the local backend keeps volumes in its btrfs volume pool, which is off or unavailable on this host (mkfs.btrfs and btrfs in the kernel)"
	}
	return ""
}

// ListKept lists the kept volumes, least recently used first.
func (b *Backend) ListKept() ([]runtime.KeptVolume, error) {
	p := b.vols
	if p == nil || !p.imageExists() {
		return nil, nil
	}
	release, err := p.acquire()
	if err != nil {
		return nil, err
	}
	defer release()
	ents, err := os.ReadDir(filepath.Join(p.mnt(), poolKeep))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []runtime.KeptVolume
	for _, e := range ents {
		if !e.IsDir() || !runtime.KeepNamePattern.MatchString(e.Name()) {
			continue
		}
		k := runtime.KeptVolume{Name: e.Name()}
		if fi, err := os.Lstat(filepath.Join(p.mnt(), poolKeepMeta, e.Name())); err == nil {
			k.LastUsed = fi.ModTime()
		}
		_, k.InUse = p.kept[e.Name()]
		out = append(out, k)
	}
	slices.SortFunc(out, func(a, b runtime.KeptVolume) int { return a.LastUsed.Compare(b.LastUsed) })
	return out, nil
}

// RemoveKept deletes kept volume name; runtime.ErrKeptInUse while a sandbox mounts it.
func (b *Backend) RemoveKept(name string) error {
	if !runtime.KeepNamePattern.MatchString(name) {
		return fmt.Errorf("%w: kept volume name %q", runtime.ErrInvalidSpec, name)
	}
	p := b.vols
	if p == nil || !p.imageExists() {
		return nil
	}
	release, err := p.acquire()
	if err != nil {
		return err
	}
	defer release()
	const removing = "(removing)"
	p.mu.Lock()
	if user, ok := p.kept[name]; ok {
		p.mu.Unlock()
		return fmt.Errorf("%w: %s (sandbox %s)", runtime.ErrKeptInUse, name, user)
	}
	if p.kept == nil {
		p.kept = map[string]string{}
	}
	p.kept[name] = removing
	p.mu.Unlock()
	defer p.unclaimKept(removing)
	base, err := p.openDir(poolKeep)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer base.Close()
	var st unix.Stat_t
	if err := unix.Fstatat(int(base.Fd()), name, &st, unix.AT_SYMLINK_NOFOLLOW); errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err := subvolDestroy(base, name); err != nil {
		return err
	}
	if err := os.Remove(filepath.Join(p.mnt(), poolKeepMeta, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// errKeptNoPool: Volume.Keep without the volume pool.
var errKeptNoPool = fmt.Errorf("%w: kept volumes live in the local backend's btrfs volume pool, which is not available", errdefs.ErrNotImplemented)
