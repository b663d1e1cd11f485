package local

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/failpoint"
	"github.com/sandboxd/sandboxd/internal/fsarchive"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// Scratch volumes: empty at creation (or restored from a snapshot, see snapshot.go),
// private to the sandbox, removed with it. The same volume at several paths shares its
// content:
//
//   - memory: a tmpfs of the volume's size (else the sandbox's memory limit) at
//     <dir>/vol/<index>; its pages are charged to the memory cgroup of the process that
//     writes them, i.e. count against the sandbox's memory limit, as Kubernetes counts
//     memory-backed emptyDirs.
//   - disk: a subvolume of the backend's btrfs volume pool (volpool.go),
//     <pool>/sbx/<id>/<index>, limited (qgroup) to the volume's size, else to the
//     sandbox's disk limit when it has one (a budget of its own of that size, no longer
//     shared with the writable layer), else unlimited.
//
// Without the volume pool (no btrfs), disk volumes are made as before it, under
// <dir>/vol/<index>: with a size, a filesystem of its own made like the writable
// layer's (disk.go); without, a dir on the sandbox's disk filesystem when it has a disk
// limit (sharing it), else a plain dir on the host's disk (unlimited, like an emptyDir
// without sizeLimit).
//
// Volume roots and sub_path dirs are mode 0777, as Kubernetes makes emptyDirs, so that a
// run_as_user can write them; under a user namespace they belong to the mapped root.

const dirVolumes = "vol"

// setupVolumes makes spec's volumes for sandbox id in dir and returns the OCI mounts of
// its volume mounts. disk is the sandbox's disk limit (0: none). Disk volumes are
// subvolumes of the volume pool (volpool.go) when it is available, else made as below.
// A fork's (fork != nil) are writable snapshots of its source's (fork.go).
func (b *Backend) setupVolumes(id, dir string, spec *runtime.Spec, disk int64, ids *idRange, fork *forkParams) ([]specs.Mount, map[string]string, error) {
	if len(spec.Volumes) == 0 {
		return nil, nil, nil
	}
	base := filepath.Join(dir, dirVolumes)
	if err := os.Mkdir(base, 0o711); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, nil, err
	}
	// Like an emptyDir, a volume (and its sub_path dirs) is writable by every user of the
	// sandbox: a run_as_user other than root must be able to use it.
	chown := func(p string) error {
		if err := os.Chmod(p, 0o777); err != nil {
			return err
		}
		if ids == nil {
			return nil
		}
		return chownToRoot(*ids, p)
	}
	var release func()
	usePool := false
	for _, v := range spec.Volumes {
		if (v.Medium == runtime.MediumMemory && v.RestoreDigest == "") || v.Managed != "" {
			continue
		}
		if !usePool && b.vols.available() {
			r, err := b.vols.acquire()
			if err == nil {
				release, usePool = r, true
				defer release()
			} else if !errors.Is(err, errNoPool) {
				return nil, nil, fmt.Errorf("volume %q: %w", v.Name, err)
			} else {
				b.log.Warn("volume pool unavailable: volumes without snapshots", "err", err)
			}
		}
		if v.RestoreDigest != "" && !usePool {
			return nil, nil, fmt.Errorf("volume %q: %w", v.Name, errNoPool)
		}
	}
	roots := map[string]string{}
	for i, v := range spec.Volumes {
		root := filepath.Join(base, strconv.Itoa(i))
		switch {
		case v.Managed != "":
			// Shared by every sandbox naming it, forks included; never the sandbox's to own:
			// root is a bind of it.
			if err := b.bindManaged(v.Managed, root); err != nil {
				return nil, nil, fmt.Errorf("volume %q: %w", v.Name, err)
			}
		case v.Medium == runtime.MediumMemory:
			if err := os.Mkdir(root, 0o755); err != nil {
				return nil, nil, err
			}
			opts := []string{"mode=0777"}
			if size := cmp(v.SizeBytes, spec.Resources.MemoryBytes); size > 0 {
				opts = append(opts, "size="+strconv.FormatInt(size, 10))
			}
			if ids != nil {
				opts = append(opts, fmt.Sprintf("uid=%d,gid=%d", ids.HostID, ids.HostID))
			}
			if err := unix.Mount("tmpfs", root, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, strings.Join(opts, ",")); err != nil {
				return nil, nil, fmt.Errorf("volume %q: mount tmpfs: %w", v.Name, err)
			}
			if v.RestoreDigest != "" {
				if err := b.restoreMemory(root, v, cmp(v.SizeBytes, spec.Resources.MemoryBytes), ids); err != nil {
					return nil, nil, fmt.Errorf("volume %q: %w", v.Name, err)
				}
			}
		case v.Keep != "" && (!usePool || ids != nil || fork != nil):
			if !usePool {
				return nil, nil, fmt.Errorf("volume %q: %w", v.Name, errKeptNoPool)
			}
			return nil, nil, fmt.Errorf("volume %q: %w: kept volumes are for sandboxes without a user namespace of their own (gvisor), never forks", v.Name, errdefs.ErrNotImplemented)
		case v.Keep != "":
			var err error
			if root, err = b.vols.keptVolume(id, v.Keep, v.SizeBytes); err != nil {
				return nil, nil, fmt.Errorf("volume %q: %w", v.Name, err)
			}
		case usePool && fork != nil:
			var err error
			if root, err = b.forkVolume(id, i, fork, cmp(v.SizeBytes, disk)); err != nil {
				return nil, nil, fmt.Errorf("volume %q: %w", v.Name, err)
			}
		case fork != nil:
			return nil, nil, fmt.Errorf("volume %q: %w: forks copy disk volumes of the btrfs volume pool only", v.Name, errdefs.ErrNotImplemented)
		case usePool:
			var err error
			if root, err = b.poolVolume(id, i, v, cmp(v.SizeBytes, disk), ids); err != nil {
				return nil, nil, fmt.Errorf("volume %q: %w", v.Name, err)
			}
			if err := chown(root); err != nil {
				return nil, nil, err
			}
		case v.SizeBytes > 0:
			if err := b.disks.mountNewFS(filepath.Join(base, strconv.Itoa(i)+".img"), root, v.SizeBytes); err != nil {
				return nil, nil, fmt.Errorf("volume %q: %w", v.Name, err)
			}
			_ = os.Remove(filepath.Join(root, "lost+found")) // a fresh volume is empty
			if err := chown(root); err != nil {
				return nil, nil, err
			}
		default:
			if disk > 0 {
				root = filepath.Join(dir, dirDisk, dirVolumes, strconv.Itoa(i))
			}
			if err := os.MkdirAll(root, 0o755); err != nil {
				return nil, nil, fmt.Errorf("volume %q: %w", v.Name, err)
			}
			if err := chown(root); err != nil {
				return nil, nil, err
			}
		}
		roots[v.Name] = root
		failpoint.Hit("local.volumes.volume")
	}
	mounts, err := volumeMounts(roots, spec.VolumeMounts, ids, base, sandboxWritten(spec, fork != nil), managedVolumes(spec))
	return mounts, roots, err
}

// poolVolume makes sandbox id's disk volume number index, v, in the volume pool (held
// by the caller), limited to limit bytes (0: none): empty, or a writable snapshot of the
// cached snapshot v.RestoreDigest with its owners shifted into ids.
func (b *Backend) poolVolume(id string, index int, v runtime.Volume, limit int64, ids *idRange) (string, error) {
	if v.RestoreDigest == "" {
		return b.vols.createVolume(id, index, limit, nil)
	}
	entry, done, err := b.snaps.use(v.RestoreDigest)
	if err != nil {
		return "", err
	}
	defer done()
	if limit > 0 && entry.meta.Bytes > limit {
		return "", fmt.Errorf("%w: volume %q: its snapshot holds %d bytes, more than the volume's %d", runtime.ErrInvalidSpec, v.Name, entry.meta.Bytes, limit)
	}
	src, err := b.vols.openDir(filepath.Join(poolCache, v.RestoreDigest))
	if err != nil {
		return "", fmt.Errorf("snapshot %s: %w", v.RestoreDigest, err)
	}
	defer src.Close()
	root, err := b.vols.createVolume(id, index, limit, src)
	if err != nil {
		return "", err
	}
	if ids != nil {
		vol, err := b.vols.openDir(filepath.Join(poolSandboxes, id, strconv.Itoa(index)))
		if err != nil {
			return "", err
		}
		defer vol.Close()
		if err := shiftOwners(vol, *ids, 0); err != nil {
			return "", fmt.Errorf("restore snapshot %s: %w", v.RestoreDigest, err)
		}
	}
	return root, nil
}

// restoreMemory fills the memory volume mounted at root (a tmpfs of size bytes, 0: no
// size of its own) with a copy of the cached snapshot v.RestoreDigest, owners shifted
// into ids. The pool is held by the caller. The copy's pages are charged to the
// runner's memory cgroup, not the sandbox's (the tmpfs's size still bounds them).
func (b *Backend) restoreMemory(root string, v runtime.Volume, size int64, ids *idRange) error {
	entry, done, err := b.snaps.use(v.RestoreDigest)
	if err != nil {
		return err
	}
	defer done()
	if size > 0 && entry.meta.Bytes > size {
		return fmt.Errorf("%w: volume %q: its snapshot holds %d bytes, more than the volume's %d", runtime.ErrInvalidSpec, v.Name, entry.meta.Bytes, size)
	}
	src, err := b.vols.openDir(filepath.Join(poolCache, v.RestoreDigest))
	if err != nil {
		return fmt.Errorf("snapshot %s: %w", v.RestoreDigest, err)
	}
	defer src.Close()
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	dst := os.NewFile(uintptr(fd), root)
	defer dst.Close()
	var m fsarchive.IDMap
	if ids != nil {
		m = fsarchive.IDMap{HostBase: ids.HostID, Size: ids.Size}
	}
	if _, err := copyTree(context.Background(), src, fsarchive.IDMap{}, dst, m, runtime.ArchiveLimits{}); err != nil {
		return fmt.Errorf("restore snapshot %s: %w", v.RestoreDigest, err)
	}
	return nil
}

// maxRestoreDepth bounds the directory nesting of a restored volume (shiftOwners keeps
// one descriptor open per level).
const maxRestoreDepth = 1024

// shiftOwners moves the owners of everything below dir (ids as the sandbox sees them)
// into the sandbox's host id range r; ids outside it become the range's nobody. It walks
// by descriptor and never follows a symlink: the tree is sandbox-made.
func shiftOwners(dir *os.File, r idRange, depth int) error {
	if depth > maxRestoreDepth {
		return fmt.Errorf("directories nested deeper than %d", maxRestoreDepth)
	}
	shift := func(id uint32) int {
		if id >= r.Size {
			id = nobodyID
		}
		return int(r.HostID + id)
	}
	fd := int(dir.Fd())
	for {
		ents, err := dir.ReadDir(1024)
		for _, e := range ents {
			var st unix.Stat_t
			if err := unix.Fstatat(fd, e.Name(), &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				return err
			}
			if err := unix.Fchownat(fd, e.Name(), shift(st.Uid), shift(st.Gid), unix.AT_SYMLINK_NOFOLLOW); err != nil {
				return fmt.Errorf("chown %s: %w", e.Name(), err)
			}
			if st.Mode&unix.S_IFMT != unix.S_IFDIR {
				continue
			}
			cfd, err := unix.Openat(fd, e.Name(), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				return err
			}
			child := os.NewFile(uintptr(cfd), e.Name())
			err = shiftOwners(child, r, depth+1)
			child.Close()
			if err != nil {
				return err
			}
		}
		if errors.Is(err, io.EOF) || (err == nil && len(ents) == 0) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// nobodyID is the id files of ids the sandbox does not map get.
const nobodyID = 65534

// volumeMounts are the bind mounts of one container's VolumeMounts of the volumes at
// roots (by name): every container of a group that lists a volume gets the same dir.
// A sub_path of a managed volume (whose content earlier sandboxes wrote) is resolved by
// descriptor, never following a symlink, and bound on a dir of stage (the sandbox's
// host-only volume dir, unmounted by teardownVolumes), which the container's mount names.
//
// So is a sub_path of a volume in written (sandboxWritten): one restored from a snapshot
// archive, a GLOBAL volume's copy, or a fork's copy of its source's volume all start
// with content a sandbox wrote, where a planted symlink (to /, /etc, "..") must never be
// followed by the host (chmod, chown or bind it).
func volumeMounts(roots map[string]string, vms []runtime.VolumeMount, ids *idRange, stage string, written, managedVols map[string]bool) ([]specs.Mount, error) {
	chown := func(p string) error {
		if err := os.Chmod(p, 0o777); err != nil {
			return err
		}
		if ids == nil {
			return nil
		}
		return chownToRoot(*ids, p)
	}
	var mounts []specs.Mount
	for j, m := range vms {
		src, ok := roots[m.Volume]
		if !ok {
			return nil, fmt.Errorf("%w: volume %q is not one of the sandbox's", runtime.ErrInvalidSpec, m.Volume)
		}
		if managed := managedVols[m.Volume]; managed || written[m.Volume] {
			if m.SubPath != "" {
				if err := os.MkdirAll(stage, 0o711); err != nil {
					return nil, err
				}
				f, err := openBeneath(src, m.SubPath)
				if err != nil {
					return nil, fmt.Errorf("volume %q: %w", m.Volume, err)
				}
				target := filepath.Join(stage, "sub-"+strconv.Itoa(j)+"-"+strconv.Itoa(len(mounts)))
				err = bindFD(f, target)
				f.Close()
				if err != nil {
					return nil, fmt.Errorf("volume %q: %w", m.Volume, err)
				}
				src = target
			}
			mode := "rw"
			if m.ReadOnly {
				mode = "ro"
			}
			// Not rbind: nothing is mounted inside a managed volume the sandbox should see.
			bind := "bind"
			if !managed {
				bind = "rbind"
			}
			mounts = append(mounts, specs.Mount{Destination: m.Path, Type: "bind", Source: src,
				Options: []string{bind, mode, "nosuid", "nodev"}})
			continue
		}
		// sub_path dirs are made one by one, each owned by the sandbox's root. The volume
		// is new and empty: nothing in it can be a symlink yet.
		for _, part := range strings.Split(m.SubPath, "/") {
			if part == "" {
				continue
			}
			src = filepath.Join(src, part)
			if err := os.Mkdir(src, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
				return nil, fmt.Errorf("volume %q: sub_path: %w", m.Volume, err)
			}
			if err := chown(src); err != nil {
				return nil, err
			}
		}
		mode := "rw"
		if m.ReadOnly {
			mode = "ro"
		}
		mounts = append(mounts, specs.Mount{Destination: m.Path, Type: "bind", Source: src,
			Options: []string{"rbind", mode, "nosuid", "nodev"}})
	}
	// Parents before children: a volume may be mounted inside another.
	slices.SortStableFunc(mounts, func(a, b specs.Mount) int { return strings.Compare(a.Destination, b.Destination) })
	return mounts, nil
}

// sandboxWritten are spec's volumes whose content a sandbox wrote before this one starts:
// restored from an archive, GLOBAL copies, or (forked) copies of the source's volumes.
func sandboxWritten(spec *runtime.Spec, forked bool) map[string]bool {
	out := map[string]bool{}
	for _, v := range spec.Volumes {
		if v.RestoreDigest != "" || v.Global != nil || (forked && v.Medium != runtime.MediumMemory) {
			out[v.Name] = true
		}
	}
	return out
}

// managedVolumes are spec's managed (registered) volumes (managed.go).
func managedVolumes(spec *runtime.Spec) map[string]bool {
	out := map[string]bool{}
	for _, v := range spec.Volumes {
		if v.Managed != "" {
			out[v.Name] = true
		}
	}
	return out
}

// cmp returns a if set, else b.
func cmp(a, b int64) int64 {
	if a > 0 {
		return a
	}
	return b
}

// teardownVolumes unmounts dir's volumes (memory and sized ones are mounts).
func teardownVolumes(dir string) error {
	base := filepath.Join(dir, dirVolumes)
	ents, err := os.ReadDir(base)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	var errs []error
	for _, e := range ents {
		if e.IsDir() {
			errs = append(errs, unmountAll(filepath.Join(base, e.Name())))
		}
	}
	return errors.Join(errs...)
}
