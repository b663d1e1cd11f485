package local

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"
	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/fsarchive"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// File-system snapshots of disk volumes (runtime.VolumeCapturer, runtime.SnapshotCache),
// on the volume pool (volpool.go).
//
// Capture: the pool's dirty data is written out (syncfs, the workload running), then
// the sandbox's cgroup is frozen (every container of a group, and under gVisor
// the sentry, are below it), a read-only snapshot subvolume of the volume is taken into
// <pool>/captures/<random>, and the cgroup is thawed: the workload pauses for the freeze
// and one btrfs snapshot, milliseconds whatever the volume holds. The capture is then
// archived (fsarchive.Write) from the snapshot while the sandbox runs on, and deleted by
// Close; it lives outside the sandbox's dirs, so a Destroy in between leaves it alone.
// Under gVisor, what the sentry has not yet written through to the host (its own page
// cache of a gofer-mounted file) is not in the capture: gVisor writes regular files
// through to the host by default, so in practice the capture has what the workload wrote.
//
// Restore: PrepareSnapshot extracts an archive (fsarchive.Extract, owners as the
// sandbox sees them) into a temp subvolume, makes it read-only and renames it to
// <pool>/cache/<digest>; a volume restoring it is a writable snapshot of that entry
// (poolVolume in volumes.go), owners then shifted into the sandbox's id range. The cache
// is bounded (Config.SnapshotCacheBytes): least recently used entries beyond it are
// deleted, except those a restore is using.
//
// Memory volumes (tmpfs) have no snapshots: a capture copies the tree into a capture
// subvolume with the sandbox frozen (the pause is the copy's time, which grows with
// what the volume holds), and a restore copies the cache entry into the new tmpfs.

var digestRE = regexp.MustCompile(`^[0-9a-f]{64}$`)

// Config.SnapshotCacheBytes default: a tenth of the pool's size, at most this.
const maxDefaultSnapshotCache = 20 << 30

var (
	_ runtime.VolumeCapturer  = (*Backend)(nil)
	_ runtime.SnapshotCache   = (*Backend)(nil)
	_ runtime.SupportReporter = (*Backend)(nil)
)

// Support implements runtime.SupportReporter: without the volume pool the backend takes
// and restores no snapshots.
func (b *Backend) Support() runtime.Support {
	return runtime.Support{NoSnapshots: !b.vols.available()}
}

// snapCache is the bookkeeping of <pool>/cache.
type snapCache struct {
	b      *Backend
	flight singleflight.Group

	mu    sync.Mutex
	inUse map[string]int // digest -> restores (and prepares) using it now
}

// cacheMeta is <pool>/meta/<digest>.json.
type cacheMeta struct {
	Bytes int64 `json:"bytes"`
	Files int64 `json:"files"`
}

type cacheEntry struct {
	digest string
	meta   cacheMeta
	used   time.Time
}

func (c *snapCache) metaPath(digest string) string {
	return filepath.Join(c.b.vols.mnt(), poolCacheMeta, digest+".json")
}

func (c *snapCache) hold(digest string) func() {
	c.mu.Lock()
	if c.inUse == nil {
		c.inUse = map[string]int{}
	}
	c.inUse[digest]++
	c.mu.Unlock()
	return func() {
		c.mu.Lock()
		if c.inUse[digest]--; c.inUse[digest] <= 0 {
			delete(c.inUse, digest)
		}
		c.mu.Unlock()
	}
}

// use marks the cached digest in use (a restore: eviction spares it until done) and
// touches it (most recently used). The caller holds the pool.
func (c *snapCache) use(digest string) (cacheEntry, func(), error) {
	if !digestRE.MatchString(digest) {
		return cacheEntry{}, nil, fmt.Errorf("%w: restore digest %q is not a hex sha256", runtime.ErrInvalidSpec, digest)
	}
	done := c.hold(digest)
	var m cacheMeta
	if err := readJSON(c.metaPath(digest), &m); err != nil {
		done()
		if errors.Is(err, fs.ErrNotExist) {
			return cacheEntry{}, nil, fmt.Errorf("snapshot %s is not in the local backend's cache (PrepareSnapshot first)", digest)
		}
		return cacheEntry{}, nil, err
	}
	if _, err := os.Stat(filepath.Join(c.b.vols.mnt(), poolCache, digest)); err != nil {
		done()
		return cacheEntry{}, nil, fmt.Errorf("snapshot %s is not in the local backend's cache (PrepareSnapshot first): %w", digest, err)
	}
	now := time.Now()
	_ = os.Chtimes(c.metaPath(digest), now, now)
	return cacheEntry{digest: digest, meta: m, used: now}, done, nil
}

// PrepareSnapshot implements runtime.SnapshotCache.
func (b *Backend) PrepareSnapshot(ctx context.Context, digest string, limits runtime.ArchiveLimits, open func(context.Context) (io.ReadCloser, error)) error {
	if !digestRE.MatchString(digest) {
		return fmt.Errorf("%w: snapshot digest %q is not a hex sha256", runtime.ErrInvalidSpec, digest)
	}
	if !b.vols.available() {
		return errNoPool
	}
	ch := b.snaps.flight.DoChan(digest, func() (any, error) {
		// Not the caller's ctx: another caller may be waiting for the same download.
		return nil, b.snaps.prepare(context.WithoutCancel(ctx), digest, limits, open)
	})
	select {
	case r := <-ch:
		return r.Err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (c *snapCache) prepare(ctx context.Context, digest string, limits runtime.ArchiveLimits, open func(context.Context) (io.ReadCloser, error)) error {
	release, err := c.b.vols.acquire()
	if err != nil {
		return err
	}
	defer release()
	done := c.hold(digest)
	defer done()
	if _, err := os.Stat(filepath.Join(c.b.vols.mnt(), poolCache, digest)); err == nil {
		if _, err := os.Stat(c.metaPath(digest)); err == nil {
			now := time.Now()
			_ = os.Chtimes(c.metaPath(digest), now, now)
			return nil
		}
	}
	tmpDir, err := c.b.vols.openDir(poolTmp)
	if err != nil {
		return err
	}
	defer tmpDir.Close()
	name := randomName()
	if err := subvolCreate(tmpDir, name); err != nil {
		return err
	}
	defer func() {
		if err := subvolDestroy(tmpDir, name); err != nil {
			c.b.log.Warn("snapshot cache: remove an extraction", "digest", digest, "err", err)
		}
	}()
	root, err := c.b.vols.openDir(filepath.Join(poolTmp, name))
	if err != nil {
		return err
	}
	defer root.Close()
	rc, err := open(ctx)
	if err != nil {
		return fmt.Errorf("snapshot %s: %w", digest, err)
	}
	defer rc.Close()
	st, err := fsarchive.Extract(ctx, rc, root, limits, fsarchive.IDMap{})
	if err != nil {
		return fmt.Errorf("snapshot %s: %w", digest, err)
	}
	// The reader checks the digest at its end, which the archive's own end may precede:
	// read on to it (a little trailing data at most).
	if n, err := io.Copy(io.Discard, io.LimitReader(rc, maxTrailing+1)); err != nil {
		return fmt.Errorf("snapshot %s: %w", digest, err)
	} else if n > maxTrailing {
		return fmt.Errorf("snapshot %s: %w: data after the archive's end", digest, fsarchive.ErrInvalid)
	}
	// The entry appears read-only and complete: a read-only snapshot of the extraction
	// (a read-only subvolume cannot be renamed), then its meta, which lists it.
	cacheDir, err := c.b.vols.openDir(poolCache)
	if err != nil {
		return err
	}
	defer cacheDir.Close()
	if err := subvolDestroy(cacheDir, digest); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("snapshot %s: replace a partial cache entry: %w", digest, err)
	}
	if err := subvolSnapshot(root, cacheDir, digest, true); err != nil {
		return fmt.Errorf("snapshot %s: %w", digest, err)
	}
	if err := writeJSONAtomic(c.metaPath(digest), cacheMeta{Bytes: st.Bytes, Files: st.Files}); err != nil {
		_ = subvolDestroy(cacheDir, digest)
		return err
	}
	c.evict(digest)
	return nil
}

// maxTrailing is how much may follow an archive's end in its blob (padding).
const maxTrailing = 1 << 20

// entries lists the cache, most recently used first. The caller holds the pool.
func (c *snapCache) entries() []cacheEntry {
	ents, _ := os.ReadDir(filepath.Join(c.b.vols.mnt(), poolCacheMeta))
	var out []cacheEntry
	for _, e := range ents {
		d, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || !digestRE.MatchString(d) {
			continue
		}
		fi, err := e.Info()
		if err != nil {
			continue
		}
		var m cacheMeta
		if readJSON(filepath.Join(c.b.vols.mnt(), poolCacheMeta, e.Name()), &m) != nil {
			continue
		}
		out = append(out, cacheEntry{digest: d, meta: m, used: fi.ModTime()})
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].used.After(out[j].used) })
	return out
}

// budget is the cache's size bound.
func (c *snapCache) budget() int64 {
	if c.b.cfg.SnapshotCacheBytes > 0 {
		return c.b.cfg.SnapshotCacheBytes
	}
	var st unix.Statfs_t
	if err := unix.Statfs(c.b.vols.mnt(), &st); err != nil {
		return maxDefaultSnapshotCache
	}
	return min(int64(st.Blocks)*st.Bsize/10, maxDefaultSnapshotCache)
}

// evict deletes least recently used entries while the cache is over its budget, sparing
// keep and the entries in use. The caller holds the pool.
func (c *snapCache) evict(keep string) {
	ents := c.entries()
	budget := c.budget()
	var total int64
	for _, e := range ents {
		total += e.meta.Bytes
	}
	for i := len(ents) - 1; i >= 0 && total > budget; i-- {
		e := ents[i]
		c.mu.Lock()
		busy := c.inUse[e.digest] > 0 || e.digest == keep
		c.mu.Unlock()
		if busy {
			continue
		}
		if err := c.remove(e.digest); err != nil {
			c.b.log.Warn("snapshot cache: evict", "digest", e.digest, "err", err)
			continue
		}
		total -= e.meta.Bytes
	}
}

// remove deletes a cache entry (meta first: an entry without meta is not listed).
func (c *snapCache) remove(digest string) error {
	if err := os.Remove(c.metaPath(digest)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	dir, err := c.b.vols.openDir(poolCache)
	if err != nil {
		return err
	}
	defer dir.Close()
	if err := subvolDestroy(dir, digest); err != nil && !errors.Is(err, unix.ENOENT) {
		return err
	}
	return nil
}

// CachedSnapshots implements runtime.SnapshotCache.
func (b *Backend) CachedSnapshots(max int) []string {
	if max <= 0 || !b.vols.mounted() {
		return nil // an unmounted pool holds no cache entries
	}
	var out []string
	for _, e := range b.snaps.entries() {
		if len(out) == max {
			break
		}
		out = append(out, e.digest)
	}
	return out
}

// PurgeSnapshotCache deletes every cached snapshot no restore is using (and with it the
// volume pool's mount when nothing else is in it).
func (b *Backend) PurgeSnapshotCache() error {
	if !b.vols.mounted() {
		return nil
	}
	release, err := b.vols.acquire()
	if err != nil {
		return err
	}
	defer release()
	var errs []error
	for _, e := range b.snaps.entries() {
		b.snaps.mu.Lock()
		busy := b.snaps.inUse[e.digest] > 0
		b.snaps.mu.Unlock()
		if !busy {
			errs = append(errs, b.snaps.remove(e.digest))
		}
	}
	// Entries a crash left without meta.
	if ents, err := os.ReadDir(filepath.Join(b.vols.mnt(), poolCache)); err == nil {
		for _, e := range ents {
			if _, err := os.Stat(b.snaps.metaPath(e.Name())); errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, b.snaps.remove(e.Name()))
			}
		}
	}
	return errors.Join(errs...)
}

// CaptureVolume implements runtime.VolumeCapturer.
func (b *Backend) CaptureVolume(ctx context.Context, id, volume string) (runtime.VolumeCapture, error) {
	s, err := b.get(ctx, id)
	if err != nil {
		return nil, err
	}
	if err := waitReady(ctx, s); err != nil {
		return nil, err
	}
	if s.failed {
		return nil, fmt.Errorf("%w: %s", runtime.ErrNotFound, id)
	}
	index := -1
	for i, v := range s.spec.Volumes {
		if v.Name == volume {
			index = i
		}
	}
	if index < 0 {
		return nil, fmt.Errorf("%w: sandbox %s has no scratch volume %q", runtime.ErrVolumeNotFound, id, volume)
	}
	if !b.vols.available() {
		return nil, errNoPool
	}
	release, err := b.vols.acquire()
	if err != nil {
		return nil, err
	}
	var c *volumeCapture
	if s.spec.Volumes[index].Medium == runtime.MediumMemory {
		c, err = b.captureMemory(ctx, s, index)
	} else {
		c, err = b.capture(s, index)
	}
	if err != nil {
		release()
		return nil, fmt.Errorf("capture volume %q of %s: %w", volume, id, err)
	}
	c.release = release
	return c, nil
}

func (b *Backend) capture(s *sandbox, index int) (*volumeCapture, error) {
	src, err := b.vols.openDir(filepath.Join(poolSandboxes, s.id, strconv.Itoa(index)))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: the volume was made without the volume pool", errdefs.ErrNotImplemented)
	}
	if err != nil {
		return nil, err
	}
	defer src.Close()
	if !isSubvolume(src) {
		return nil, fmt.Errorf("%w: the volume is not a subvolume of the volume pool", errdefs.ErrNotImplemented)
	}
	captures, err := b.vols.openDir(poolCaptures)
	if err != nil {
		return nil, err
	}
	defer captures.Close()
	c := &volumeCapture{b: b, name: randomName()}
	if r, ok, err := readIDRange(s.dir); err != nil {
		return nil, err
	} else if ok {
		c.ids = fsarchive.IDMap{HostBase: r.HostID, Size: r.Size}
	}
	// A snapshot writes out the volume's dirty data first: write the bulk of it out now,
	// while the workload runs, so that the frozen part is short.
	if err := unix.Syncfs(int(src.Fd())); err != nil {
		return nil, fmt.Errorf("sync the volume pool: %w", err)
	}
	start := time.Now()
	thaw, err := freezeCgroup(b.freezeCgroup(s))
	if err != nil {
		return nil, err
	}
	err = subvolSnapshot(src, captures, c.name, true)
	if terr := thaw(); err == nil && terr != nil {
		// The snapshot is taken but the sandbox stays frozen: say so.
		_ = subvolDestroy(captures, c.name)
		err = terr
	}
	c.pause = time.Since(start)
	if err != nil {
		return nil, err
	}
	return c, nil
}

// captureMemory captures a memory volume (a tmpfs, which has no snapshots): its tree is
// copied into a capture subvolume with the sandbox frozen, so the pause is the copy's
// time (it grows with the volume; the tmpfs's size bounds it). Owners are copied as the
// sandbox sees them.
func (b *Backend) captureMemory(ctx context.Context, s *sandbox, index int) (*volumeCapture, error) {
	srcFD, err := unix.Open(filepath.Join(s.dir, dirVolumes, strconv.Itoa(index)), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	src := os.NewFile(uintptr(srcFD), "volume")
	defer src.Close()
	var st unix.Statfs_t
	if err := unix.Fstatfs(srcFD, &st); err != nil || st.Type != unix.TMPFS_MAGIC {
		return nil, fmt.Errorf("%w: the memory volume is not mounted (the sandbox has ended)", errdefs.ErrNotImplemented)
	}
	var ids fsarchive.IDMap
	if r, ok, err := readIDRange(s.dir); err != nil {
		return nil, err
	} else if ok {
		ids = fsarchive.IDMap{HostBase: r.HostID, Size: r.Size}
	}
	captures, err := b.vols.openDir(poolCaptures)
	if err != nil {
		return nil, err
	}
	defer captures.Close()
	c := &volumeCapture{b: b, name: randomName()} // owners already as the sandbox sees them
	if err := subvolCreate(captures, c.name); err != nil {
		return nil, err
	}
	dst, err := b.vols.openDir(filepath.Join(poolCaptures, c.name))
	if err == nil {
		defer dst.Close()
		start := time.Now()
		var thaw func() error
		if thaw, err = freezeCgroup(b.freezeCgroup(s)); err == nil {
			_, err = copyTree(ctx, src, ids, dst, fsarchive.IDMap{}, runtime.ArchiveLimits{})
			if terr := thaw(); err == nil {
				err = terr
			}
		}
		c.pause = time.Since(start)
	}
	if err != nil {
		_ = subvolDestroy(captures, c.name)
		return nil, err
	}
	return c, nil
}

// copyTree copies the tree under src (owners read through srcIDs) into the empty dir
// dst (owners written through dstIDs) by an fsarchive stream: by descriptor, never
// following a symlink, within limits.
func copyTree(ctx context.Context, src *os.File, srcIDs fsarchive.IDMap, dst *os.File, dstIDs fsarchive.IDMap, limits runtime.ArchiveLimits) (runtime.ArchiveStats, error) {
	pr, pw := io.Pipe()
	werr := make(chan error, 1)
	go func() {
		_, err := fsarchive.Write(ctx, src, pw, srcIDs)
		pw.CloseWithError(err)
		werr <- err
	}()
	st, err := fsarchive.Extract(ctx, pr, dst, limits, dstIDs)
	pr.CloseWithError(errors.New("copy ended"))
	if e := <-werr; err == nil {
		err = e
	}
	return st, err
}

// freezeCgroup is the cgroup (below CgroupParent) that holds every process of s: a
// group's own (its containers' cgroups are below it; under gVisor its sentry is in it),
// else the container's.
func (b *Backend) freezeCgroup(s *sandbox) string {
	rel := s.cgroupRel()
	if s.spec.Multi() {
		rel = s.id
	}
	return filepath.Join(b.cfg.CgroupParent, rel)
}

type volumeCapture struct {
	b       *Backend
	name    string
	ids     fsarchive.IDMap
	pause   time.Duration
	release func()

	mu      sync.Mutex
	written bool
	closed  bool
}

func (c *volumeCapture) Pause() time.Duration { return c.pause }

func (c *volumeCapture) WriteArchive(ctx context.Context, w io.Writer) (runtime.ArchiveStats, error) {
	c.mu.Lock()
	if c.closed || c.written {
		c.mu.Unlock()
		return runtime.ArchiveStats{}, errors.New("volume capture: WriteArchive after Close or a second time")
	}
	c.written = true
	c.mu.Unlock()
	root, err := c.b.vols.openDir(filepath.Join(poolCaptures, c.name))
	if err != nil {
		return runtime.ArchiveStats{}, err
	}
	defer root.Close()
	return fsarchive.Write(ctx, root, w, c.ids)
}

func (c *volumeCapture) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	defer c.release()
	dir, err := c.b.vols.openDir(poolCaptures)
	if err != nil {
		return err
	}
	defer dir.Close()
	return subvolDestroy(dir, c.name)
}

// Freezing. The cgroup v1 freezer when the host has it (hybrid hosts: runc puts the
// sandbox's processes in every v1 hierarchy), else cgroup v2's cgroup.freeze. Both are
// hierarchical: freezing a group's cgroup freezes its containers'. A cgroup that is gone
// (the sandbox has stopped) has nothing to freeze.

const freezeTimeout = 5 * time.Second

func freezeCgroup(rel string) (thaw func() error, err error) {
	noop := func() error { return nil }
	v1 := filepath.Join(cgroupRoot, "freezer", rel)
	if _, err := os.Stat(filepath.Join(v1, "freezer.state")); err == nil {
		return freezeWith(filepath.Join(v1, "freezer.state"), "FROZEN", "THAWED", filepath.Join(v1, "freezer.state"), "FROZEN")
	}
	for _, v2 := range []string{filepath.Join(cgroupRoot, rel), filepath.Join(cgroupRoot, "unified", rel)} {
		if _, err := os.Stat(filepath.Join(v2, "cgroup.freeze")); err == nil {
			return freezeWith(filepath.Join(v2, "cgroup.freeze"), "1", "0", filepath.Join(v2, "cgroup.events"), "frozen 1")
		}
	}
	return noop, nil
}

func freezeWith(ctl, freeze, thawValue, state, frozen string) (func() error, error) {
	thaw := func() error {
		if err := os.WriteFile(ctl, []byte(thawValue), 0); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("thaw: %w", err)
		}
		return nil
	}
	if err := os.WriteFile(ctl, []byte(freeze), 0); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return func() error { return nil }, nil // gone meanwhile
		}
		_ = thaw()
		return nil, fmt.Errorf("freeze: %w", err)
	}
	deadline := time.Now().Add(freezeTimeout)
	for wait := 50 * time.Microsecond; ; wait = min(2*wait, 5*time.Millisecond) {
		data, err := os.ReadFile(state)
		if err != nil {
			_ = thaw()
			if errors.Is(err, fs.ErrNotExist) {
				return func() error { return nil }, nil
			}
			return nil, fmt.Errorf("freeze: %w", err)
		}
		if containsLine(string(data), frozen) {
			return thaw, nil
		}
		if time.Now().After(deadline) {
			_ = thaw()
			return nil, fmt.Errorf("freeze: the sandbox did not freeze within %s", freezeTimeout)
		}
		time.Sleep(wait)
	}
}

func containsLine(s, line string) bool {
	return slices.Contains(strings.Split(s, "\n"), line)
}
