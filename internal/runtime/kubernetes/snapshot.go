package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sync/singleflight"
	corev1 "k8s.io/api/core/v1"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/internal/agent"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/fsarchive"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// File-system snapshots of scratch volumes (runtime.VolumeCapturer, runtime.SnapshotCache).
//
// A scratch volume is an emptyDir on the node, out of the runner's reach: a capture goes
// through the agent of a container that mounts the volume's root (the primary first),
// over the pinned gate channel, and so does a restore, unless no workload agent can fill
// it alone (fillsInPlace), when the runner's filler does (globalvol.go). A volume
// restored into sub_path mounts only is captured through the filler, the one container
// mounting its root, which stays for that (capturedViaFiller); one mounted by sub_path
// only and not restored has no filler, and CaptureVolume refuses it.
//
// Capture: the agent archives the mounted directory (AgentService.ArchivePath,
// fsarchive.Write, owners as the container sees them) while the workload runs: nothing
// is frozen (Pause is 0), so the archive is crash-consistent per file, like a tarball
// of an emptyDir, not a point-in-time image of the whole volume. The archive is made
// by a process inside the sandbox: the runner bounds its size (SnapshotTarget's
// maximum) and it is only ever unpacked by fsarchive.Extract, inside a sandbox. The
// statistics the agent reports are the sandbox's word (negative ones are clamped). The
// stream runs when the runner writes the archive (WriteArchive), so a capture holds the
// Pod: Stop and Destroy wait for open captures (at most captureHold) before they delete
// it, and the runner captures a delete's volumes before it stops the sandbox
// (runtime.LiveCapturer).
//
// Restore: PrepareSnapshot downloads the archive once per digest (concurrent calls
// share it) into Config.SnapshotCacheDir/<digest>.tar.zst, bounded by
// Config.SnapshotCacheBytes (least recently used entries beyond it go, except those a
// Create is restoring from). A Pod restoring a volume starts its agents in standby
// (agentconfig.Config.Standby, the mechanism of multi-container Pods): once the agent
// filling the volume answers (the first container mounting its root writable; or, when
// a container makes a directory in it when created or none mounts its root writable,
// the filler, after every container making one: fillDirs), the runner streams the
// cached archive to it (AgentService.ExtractPath: fsarchive.Extract into the empty
// mount, in place around those directories, within the limits PrepareSnapshot was
// given) and only then starts the main commands, so the volume is filled before any of
// the sandbox's own code runs. Init containers run
// before that (the kubelet starts them): a restored volume mounted by one is refused.

var digestRE = regexp.MustCompile(`^[0-9a-f]{64}$`)

const (
	// defaultSnapshotCacheBytes is Config.SnapshotCacheBytes's default.
	defaultSnapshotCacheBytes = 10 << 30
	// captureHold bounds how long Stop and Destroy wait for open captures.
	captureHold = 10 * time.Minute
	cacheSuffix = ".tar.zst"
	// maxArchiveMessage bounds one ArchivePath message read from the agent.
	maxArchiveMessage = 4 << 20
	// extractChunk is the size of ExtractPath's messages.
	extractChunk = 256 << 10
)

var (
	_ runtime.VolumeCapturer = (*Backend)(nil)
	_ runtime.SnapshotCache  = (*Backend)(nil)
	_ runtime.LiveCapturer   = (*Backend)(nil)
)

// CapturesLive implements runtime.LiveCapturer: an emptyDir goes with the Pod, and the
// archive is read through the agent, so a capture needs the sandbox running.
func (b *Backend) CapturesLive() bool { return true }

// volumeMount finds where volume can be reached: the first container (primary, then
// sidecars) mounting its root, writable when writable is set. The name is the
// container's runtime name ("" for the primary).
func volumeMount(spec *runtime.Spec, volume string, writable bool) (container, path string, err error) {
	found := false
	for i := range spec.Volumes {
		if spec.Volumes[i].Name == volume {
			found = true
		}
	}
	if !found {
		return "", "", fmt.Errorf("%w: %q", runtime.ErrVolumeNotFound, volume)
	}
	var why []string
	for _, c := range spec.Containers() {
		for _, m := range c.VolumeMounts {
			switch {
			case m.Volume != volume:
			case m.SubPath != "":
				why = append(why, fmt.Sprintf("container %s mounts only its sub-path %q", c.ContainerName(), m.SubPath))
			case writable && m.ReadOnly:
				why = append(why, fmt.Sprintf("container %s mounts it read-only", c.ContainerName()))
			default:
				name := c.ContainerName()
				if c == &spec.Container {
					name = ""
				}
				return name, m.Path, nil
			}
		}
	}
	if len(why) == 0 {
		why = append(why, "no container mounts it")
	}
	return "", "", fmt.Errorf("volume %q: no container mounts its root%s (%s)", volume, map[bool]string{true: " writable", false: ""}[writable], strings.Join(why, "; "))
}

// CaptureVolume implements runtime.VolumeCapturer.
func (b *Backend) CaptureVolume(ctx context.Context, id, volume string) (runtime.VolumeCapture, error) {
	s, err := b.get(id)
	if err != nil {
		return nil, err
	}
	if i := globalIndex(&s.spec, volume); i >= 0 {
		return b.captureGlobal(s, volume, i)
	}
	var container, path string
	filler := false
	if i := capturedIndex(&s.spec, volume); i >= 0 {
		// Mounted by sub_path only, filled through the filler, which stays for this
		// (keepsFillerForCaptures) and mounts its root.
		container, path, filler = containerFiller, fillerPath(i), true
	} else if container, path, err = volumeMount(&s.spec, volume, false); err != nil {
		if errors.Is(err, runtime.ErrVolumeNotFound) {
			return nil, err
		}
		return nil, fmt.Errorf("%w: %w", errdefs.ErrNotImplemented, err)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	select {
	case <-s.done:
		return nil, fmt.Errorf("capture volume %q of %s: the sandbox has ended, and its emptyDirs with its Pod", volume, id)
	default:
	}
	if filler {
		if cs := podContainerStatus(statusesOf(s.pod), containerFiller); cs != nil && cs.State.Terminated != nil {
			// Nothing else mounts the volume's root: with the filler gone (OOM-killed at its
			// memory limit, crashed, or ended after the fill by an older runner), nothing
			// can read the whole volume while the sandbox runs.
			return nil, fmt.Errorf("%w: volume %q is mounted by sub_path only, and the runner's filler container, the one container mounting its root, has terminated (%s): it cannot be captured while the sandbox runs", errdefs.ErrNotImplemented, volume, fillerEnd(cs.State.Terminated))
		}
	}
	if s.captures == 0 {
		s.capturesIdle = make(chan struct{})
	}
	s.captures++
	return &capture{b: b, s: s, container: container, path: path, filler: filler}, nil
}

// fillerEnd says how the filler terminated, from the kubelet's view (its reason and
// exit code; never its message, which the filler's agent writes).
func fillerEnd(t *corev1.ContainerStateTerminated) string {
	if t.Reason != "" {
		return fmt.Sprintf("%s, exit code %d", runtimeText(t.Reason), t.ExitCode)
	}
	return fmt.Sprintf("exit code %d", t.ExitCode)
}

// CapturesStoppedGlobals implements runtime.StoppedGlobalCapturer: a GLOBAL writer's
// copy is read through the filler after the workload stopped (globalvol.go).
func (b *Backend) CapturesStoppedGlobals() bool { return true }

var _ runtime.StoppedGlobalCapturer = (*Backend)(nil)

// captureGlobal captures GLOBAL writer copy volume (spec volume i) of s through the
// filler, which mounts it at fillerPath(i): also once the workload has ended, until
// the Pod is deleted.
func (b *Backend) captureGlobal(s *sandbox, volume string, i int) (runtime.VolumeCapture, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if s.deleted || podEnded(s.pod) || s.pod != nil && s.pod.DeletionTimestamp != nil {
		return nil, fmt.Errorf("capture GLOBAL volume %q of %s: the Pod is gone or going, and the copy with it", volume, s.id)
	}
	// Only a copy the workload has written to its end: never one still being filled, or
	// one of a workload that never started (a Create cut short, an image never pulled),
	// or while any workload container may still write.
	if s.neverStarted || s.pod == nil || s.pod.Annotations[annotationWorkloadStarted] != "true" {
		return nil, fmt.Errorf("capture GLOBAL volume %q of %s: its workload never started: the copy is not committed", volume, s.id)
	}
	if workloadRuns(s.pod, &s.spec) {
		return nil, fmt.Errorf("capture GLOBAL volume %q of %s: its workload has not ended", volume, s.id)
	}
	if s.captures == 0 {
		s.capturesIdle = make(chan struct{})
	}
	s.captures++
	return &capture{b: b, s: s, container: containerFiller, path: fillerPath(i), filler: true}, nil
}

// capture is an open capture of a volume: the archive is read when it is written.
type capture struct {
	b               *Backend
	s               *sandbox
	container, path string
	filler          bool // through the filler (captureGlobal, capturedViaFiller)
	once            sync.Once
}

func (c *capture) Pause() time.Duration { return 0 }

func (c *capture) WriteArchive(ctx context.Context, w io.Writer) (runtime.ArchiveStats, error) {
	// The agent sends the archive in chunks of 256 KiB: a larger message is refused, not
	// buffered (what comes from the sandbox is bounded).
	cl := agent.NewClient(func(ctx context.Context) (net.Conn, error) { return c.b.dialAgent(ctx, c.s.id, c.container, c.filler) },
		connect.WithReadMaxBytes(maxArchiveMessage))
	st, err := cl.ArchivePath(ctx, connect.NewRequest(&agentv1.ArchivePathRequest{Path: c.path}))
	if err != nil {
		return runtime.ArchiveStats{}, fmt.Errorf("archive %s in %s: %w", c.path, c.s.id, err)
	}
	defer func() { _ = st.Close() }()
	var stats *agentv1.ArchiveStats
	for st.Receive() {
		m := st.Msg()
		if stats != nil {
			return runtime.ArchiveStats{}, fmt.Errorf("archive %s in %s: the agent sent data after its statistics", c.path, c.s.id)
		}
		if d := m.GetData(); len(d) > 0 {
			if _, err := w.Write(d); err != nil {
				return runtime.ArchiveStats{}, err
			}
		}
		stats = m.GetStats()
	}
	if err := st.Err(); err != nil {
		return runtime.ArchiveStats{}, fmt.Errorf("archive %s in %s: %w", c.path, c.s.id, err)
	}
	if stats == nil {
		return runtime.ArchiveStats{}, fmt.Errorf("archive %s in %s: the stream ended without the archive's statistics", c.path, c.s.id)
	}
	return runtime.ArchiveStats{Files: max(stats.GetFiles(), 0), Bytes: max(stats.GetBytes(), 0), Skipped: max(stats.GetSkipped(), 0)}, nil
}

func (c *capture) Close() error {
	c.once.Do(func() {
		c.b.mu.Lock()
		defer c.b.mu.Unlock()
		if c.s.captures--; c.s.captures == 0 {
			close(c.s.capturesIdle)
		}
	})
	return nil
}

// waitCaptures waits (at most captureHold) until s's open captures are closed.
func (b *Backend) waitCaptures(ctx context.Context, s *sandbox) {
	b.mu.Lock()
	done := s.capturesIdle
	n := s.captures
	b.mu.Unlock()
	if n == 0 {
		return
	}
	select {
	case <-done:
	case <-ctx.Done():
	case <-time.After(captureHold):
		b.log.Warn("open captures still hold the sandbox: stopping it anyway", "sandbox", s.id)
	}
}

// snapCache is the bookkeeping of Config.SnapshotCacheDir.
type snapCache struct {
	flight singleflight.Group

	mu     sync.Mutex
	limits map[string]runtime.ArchiveLimits // the last PrepareSnapshot's, by digest
	inUse  map[string]int                   // digest -> Creates restoring from it now
}

func (b *Backend) cachePath(digest string) string {
	return filepath.Join(b.cfg.SnapshotCacheDir, digest+cacheSuffix)
}

// PrepareSnapshot implements runtime.SnapshotCache.
func (b *Backend) PrepareSnapshot(ctx context.Context, digest string, limits runtime.ArchiveLimits, open func(context.Context) (io.ReadCloser, error)) error {
	if b.cfg.SnapshotCacheDir == "" {
		return fmt.Errorf("%w: the kubernetes backend has no snapshot cache directory", errdefs.ErrNotImplemented)
	}
	if !digestRE.MatchString(digest) {
		return fmt.Errorf("%w: snapshot digest %q is not a hex sha256", runtime.ErrInvalidSpec, digest)
	}
	c := &b.snaps
	c.mu.Lock()
	c.limits[digest] = limits
	c.mu.Unlock()
	now := time.Now()
	if err := os.Chtimes(b.cachePath(digest), now, now); err == nil {
		return nil
	}
	ch := c.flight.DoChan(digest, func() (any, error) {
		// The download is shared: it runs to its end whichever caller goes away.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Hour)
		defer cancel()
		return nil, b.download(dctx, digest, open)
	})
	select {
	case r := <-ch:
		return r.Err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (b *Backend) download(ctx context.Context, digest string, open func(context.Context) (io.ReadCloser, error)) error {
	final := b.cachePath(digest)
	if _, err := os.Stat(final); err == nil {
		return nil
	}
	if err := os.MkdirAll(b.cfg.SnapshotCacheDir, 0o700); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(b.cfg.SnapshotCacheDir, ".dl-*")
	if err != nil {
		return err
	}
	keep := false
	defer func() {
		if !keep {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	rc, err := open(ctx)
	if err != nil {
		return fmt.Errorf("snapshot %s: %w", digest, err)
	}
	defer rc.Close()
	limit := b.cacheBytes()
	n, err := io.Copy(tmp, io.LimitReader(rc, limit+1))
	if err != nil {
		return fmt.Errorf("snapshot %s: download: %w", digest, err)
	}
	if n > limit {
		return fmt.Errorf("snapshot %s: the archive is larger than the snapshot cache (%d bytes)", digest, limit)
	}
	if err := tmp.Sync(); err != nil {
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), final); err != nil {
		return err
	}
	keep = true
	b.evict(digest)
	return nil
}

func (b *Backend) cacheBytes() int64 {
	if b.cfg.SnapshotCacheBytes > 0 {
		return b.cfg.SnapshotCacheBytes
	}
	return defaultSnapshotCacheBytes
}

type cacheEntry struct {
	digest string
	size   int64
	used   time.Time
}

// cacheEntries lists the cache, most recently used first.
func (b *Backend) cacheEntries() []cacheEntry {
	des, err := os.ReadDir(b.cfg.SnapshotCacheDir)
	if err != nil {
		return nil
	}
	var out []cacheEntry
	for _, de := range des {
		d, ok := strings.CutSuffix(de.Name(), cacheSuffix)
		if !ok || !digestRE.MatchString(d) || !de.Type().IsRegular() {
			continue
		}
		fi, err := de.Info()
		if err != nil {
			continue
		}
		out = append(out, cacheEntry{digest: d, size: fi.Size(), used: fi.ModTime()})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].used.After(out[j].used) })
	return out
}

// evict removes the least recently used entries beyond the cache's size, except keep
// and those in use.
func (b *Backend) evict(keep string) {
	c := &b.snaps
	entries := b.cacheEntries()
	var total int64
	for _, e := range entries {
		total += e.size
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := len(entries) - 1; i >= 0 && total > b.cacheBytes(); i-- {
		e := entries[i]
		if e.digest == keep || c.inUse[e.digest] > 0 {
			continue
		}
		if err := os.Remove(b.cachePath(e.digest)); err == nil || errors.Is(err, os.ErrNotExist) {
			total -= e.size
			delete(c.limits, e.digest)
		}
	}
}

// CachedSnapshots implements runtime.SnapshotCache.
func (b *Backend) CachedSnapshots(limit int) []string {
	if b.cfg.SnapshotCacheDir == "" || limit <= 0 {
		return nil
	}
	var out []string
	for _, e := range b.cacheEntries() {
		if len(out) == limit {
			break
		}
		out = append(out, e.digest)
	}
	return out
}

// cleanCache removes downloads a previous process left unfinished.
func (b *Backend) cleanCache() {
	if b.cfg.SnapshotCacheDir == "" {
		return
	}
	des, _ := os.ReadDir(b.cfg.SnapshotCacheDir)
	for _, de := range des {
		if strings.HasPrefix(de.Name(), ".dl-") {
			os.Remove(filepath.Join(b.cfg.SnapshotCacheDir, de.Name()))
		}
	}
}

// restore is one volume a Create fills from a snapshot.
type restore struct {
	volume, digest  string
	container, path string
	limits          runtime.ArchiveLimits
	// subDirs, waitFor: the directories made in the volume before the fill and the
	// containers making them (fillDirs), for a volume filled through the filler.
	subDirs, waitFor []string
}

// fillsInPlace reports whether a workload container's agent fills the restored scratch
// volume (the pre-filler way, kept for it): a container mounts its root writable, and no
// container makes a directory in it when created (subPaths: no sub_path mount, no
// working directory or nested mount point below a mount). Otherwise the runner's filler
// (globalvol.go) fills it as a GLOBAL copy: root with fsarchive's capabilities, mounting
// the whole volume, whatever the workload's mounts (a sub_path or read-only only), into
// the kubelet's and the runtime's directories in place (fillDirs). A volume no container
// mounts is not filled at all (planRestores refuses it).
func fillsInPlace(spec *runtime.Spec, volume string) bool {
	mounted := false
	for _, c := range spec.Containers() {
		for _, m := range c.VolumeMounts {
			mounted = mounted || m.Volume == volume
		}
	}
	if !mounted {
		return true
	}
	if _, _, err := volumeMount(spec, volume, true); err != nil {
		return false
	}
	dirs, _, err := subPaths(spec, volume)
	return err == nil && len(dirs) == 0
}

// fillDirs is the one home of what a fill through the filler must know of the
// directories made in the empty volume (a GLOBAL copy or a restored scratch volume):
// subPaths, at most fsarchive.MaxExisting of them and each one fsarchive takes, else
// ErrInvalidSpec naming the volume and the fields, before anything is made.
func fillDirs(spec *runtime.Spec, volume string) (dirs, waitFor []string, err error) {
	if dirs, waitFor, err = subPaths(spec, volume); err != nil {
		return nil, nil, err
	}
	if len(dirs) > fsarchive.MaxExisting {
		return nil, nil, fmt.Errorf("%w: volume %q: its mounts have %d distinct sub_paths, working directories and nested mount points below them (containers[].volume_mounts[].sub_path, containers[].working_dir (or, when unset, the image's working directory), containers[].volume_mounts[].mount_path), at most %d on Kubernetes",
			runtime.ErrInvalidSpec, volume, len(dirs), fsarchive.MaxExisting)
	}
	if err := fsarchive.CheckExisting(dirs); err != nil {
		return nil, nil, fmt.Errorf("%w: volume %q: a sub_path, working directory or nested mount point below its mounts (containers[].volume_mounts[].sub_path, containers[].working_dir (or, when unset, the image's working directory), containers[].volume_mounts[].mount_path): %w",
			runtime.ErrInvalidSpec, volume, err)
	}
	return dirs, waitFor, nil
}

// maxImageWorkDir bounds an image's working directory the runner takes (imageWorkDirs):
// the image, and so its config, is the caller's.
const maxImageWorkDir = 4096

// imageWorkDirs returns spec with each workload container's working directory made
// explicit when the spec sets none and the container mounts a volume restored from a
// snapshot (a scratch volume or a GLOBAL copy, filled before the workload starts): the
// image's (its config's WorkingDir, read as for the image's command, Config.ImageConfig).
// The container runtime makes that directory when it creates the container, in the
// empty volume when it lies below the volume's mount, so the fill must know it
// (subPaths) exactly as a working_dir of the spec: the volume is then filled through the
// filler in place around it (the snapshot's directory there, with its owner and mode,
// fills it; else it stays as the runtime made it, root 0755), and one below a read-only
// mount is refused. The Pod container and the agent get it as the spec's, which the
// runtime would have used anyway; the persisted spec holds it, so Recover judges the
// restore as Create did. spec itself is not changed (a copy is returned when one is).
//
// An image config that cannot be read leaves the working directory to the image, as
// before (a warning): the fill then fails only if it does lie below the mount (the
// volume is not empty), an error that names this cause. A working directory that is
// not absolute, or longer than maxImageWorkDir, or holds a NUL, is left to the runtime
// (which refuses it).
func (b *Backend) imageWorkDirs(ctx context.Context, spec *runtime.Spec) *runtime.Spec {
	restored := map[string]bool{}
	for _, v := range spec.Volumes {
		if v.RestoreDigest != "" {
			restored[v.Name] = true
		}
	}
	if len(restored) == 0 {
		return spec
	}
	out := *spec
	out.Sidecars = slices.Clone(spec.Sidecars)
	changed := false
	for _, c := range out.Containers() {
		if c.WorkingDir != "" || !slices.ContainsFunc(c.VolumeMounts, func(m runtime.VolumeMount) bool { return restored[m.Volume] }) {
			continue
		}
		ic, err := b.cfg.ImageConfig(ctx, c.Image, c.PullCredentials)
		if err != nil {
			b.log.Warn("image config unreadable: a working directory the image sets below a restored volume's mount is not known before the fill",
				"sandbox", spec.ID, "container", c.ContainerName(), "image", c.Image, "err", err)
			continue
		}
		wd := ic.WorkingDir
		if wd == "" || !path.IsAbs(wd) || len(wd) > maxImageWorkDir || strings.ContainsRune(wd, 0) {
			continue
		}
		c.WorkingDir = path.Clean(wd)
		changed = true
	}
	if !changed {
		return spec
	}
	return &out
}

// subPaths are the directories that exist in volume's empty copy (a GLOBAL copy, or a
// scratch volume restored through the filler) once
// the workload's containers are created, each once, and the runtime names of the
// containers making them ("" the primary): the fill must wait for those containers and
// fill those directories in place (ExtractPathRequest sub_dirs,
// fsarchive.ExtractOptions.Existing), refusing an archive with a file or symlink there.
//
//   - A mount's sub_path: the kubelet makes that directory (and its parents:
//     doSafeMakeDir, following no symlink, mode that of the volume's root, 0777 for an
//     emptyDir) and bind-mounts it when it creates the container.
//   - A container's working directory below a mount of the volume, and a mount point of
//     another mount nested below one (the deepest mount holding the path is of the
//     volume; podMountPoints: a volume mount, a group container's tmpfs path, or under a
//     read-only root filesystem a ReadOnlyWritablePaths tmpfs such as /tmp): the
//     container runtime (runc) makes them, root 0755, when it creates the container, in
//     the mounted directory of the copy. Each is the path inside the copy:
//     the mount's sub_path joined with the path below its mount path.
//
// So the copy is filled once every one of these containers is created (its agent
// answers), and the kubelet and runtime make them in the empty copy, never in
// sandbox-written content. Init containers mounting a restored volume are refused
// (planRestores). A working directory the image sets (none in the spec) is seen here
// once Create has made it the spec's (imageWorkDirs).
//
// The runtime cannot make a directory through a read-only mount (it mounts, remounts
// read-only, then makes the working directory and the nested mount points: EROFS), and
// the copy is still empty then: a working directory or nested mount point below a
// read-only mount of the copy is refused (ErrInvalidSpec naming the field), where a local
// runner takes it if the volume holds the directory.
func subPaths(spec *runtime.Spec, volume string) (dirs, containers []string, err error) {
	add := func(d string) bool {
		if d == "" || d == "." {
			return false
		}
		if !slices.Contains(dirs, d) {
			dirs = append(dirs, d)
		}
		return true
	}
	for _, c := range spec.Containers() {
		name := c.ContainerName()
		if c == &spec.Container {
			name = ""
		}
		made := false
		for _, m := range c.VolumeMounts {
			if m.Volume == volume && add(m.SubPath) {
				made = true
			}
		}
		// below: p's path inside the copy when the deepest of c's mounts holding p
		// (strictly, or p itself too when self) is of volume; field names p for a refusal.
		below := func(p string, self bool, field string) string {
			if !path.IsAbs(p) || err != nil {
				return ""
			}
			p = path.Clean(p)
			var owner *runtime.VolumeMount
			for i := range c.VolumeMounts {
				m := &c.VolumeMounts[i]
				if (p == m.Path && self) || strings.HasPrefix(p, m.Path+"/") {
					if owner == nil || len(m.Path) > len(owner.Path) {
						owner = m
					}
				}
			}
			if owner == nil || owner.Volume != volume || p == owner.Path {
				return ""
			}
			if owner.ReadOnly {
				err = fmt.Errorf("%w: container %s: %s %s is below the read-only mount at %s of volume %q, which is filled before the sandbox starts (a GLOBAL volume, or one restored from a snapshot): on Kubernetes the container runtime must make it in the empty volume before the fill, and cannot through a read-only mount (mount the volume read-write, or use a path outside the mount)",
					runtime.ErrInvalidSpec, c.ContainerName(), field, p, owner.Path, volume)
				return ""
			}
			return path.Join(owner.SubPath, p[len(owner.Path)+1:]) // "" and "." are the root
		}
		if add(below(c.WorkingDir, true, "working_dir (or, when unset, the image's working directory)")) {
			made = true
		}
		for _, p := range podMountPoints(spec, c) {
			if add(below(p.path, false, p.field)) {
				made = true
			}
		}
		if err != nil {
			return nil, nil, err
		}
		if made {
			containers = append(containers, name)
		}
	}
	return dirs, containers, nil
}

// mountPoint is a path where c's Pod container has a mount, and the spec field it comes of.
type mountPoint struct{ path, field string }

// podMountPoints are the mount points of c's Pod container, as the Pod is built: its
// volume mounts; in a group (multi.go containerMounts), its tmpfs paths (memory emptyDirs
// of its own); and, under a read-only root filesystem, the memory emptyDirs keeping
// runtime.ReadOnlyWritablePaths writable (security.go volumesFor, containerMounts), each
// unless something else is mounted at its path. runc makes each mount point in whatever
// is mounted above it, a volume's copy included.
func podMountPoints(spec *runtime.Spec, c *runtime.Container) []mountPoint {
	var out []mountPoint
	taken := map[string]bool{}
	for _, m := range c.VolumeMounts {
		out = append(out, mountPoint{m.Path, "the mount point (volume_mounts[].mount_path)"})
		taken[m.Path] = true
	}
	if spec.Multi() {
		for _, p := range c.Tmpfs {
			if !taken[p] {
				out = append(out, mountPoint{p, "the tmpfs mount point (tmpfs)"})
				taken[p] = true
			}
		}
	}
	if c.Security != nil && c.Security.ReadOnlyRootFS {
		for _, p := range runtime.ReadOnlyWritablePaths {
			if !taken[p] {
				out = append(out, mountPoint{p, "the writable tmpfs mount point a read-only root filesystem keeps (security)"})
			}
		}
	}
	return out
}

// planRestores checks spec's restored volumes before anything is made: each has its
// archive cached and is filled either by the agent of a container mounting its root
// writable (fillsInPlace) or, a GLOBAL copy or a disk scratch volume otherwise, by the
// filler into the directories the kubelet and runc make (fillDirs, its bounds); a
// memory scratch volume needing the filler is refused, as is a restored volume an init
// container (which runs before the restore) mounts, and GLOBAL copies whose sizes add up
// to more than maxFillerCopiesBytes. The archives are marked in use until release.
func (b *Backend) planRestores(spec *runtime.Spec) (plan []restore, release func(), err error) {
	release = func() {}
	if n := globalCopiesBytes(spec); n > maxFillerCopiesBytes {
		return nil, release, fmt.Errorf("%w: the GLOBAL volumes' sizes add up to more than %d bytes, the most the runner's filler takes on Kubernetes",
			runtime.ErrInvalidSpec, int64(maxFillerCopiesBytes))
	}
	for i, v := range spec.Volumes {
		if v.RestoreDigest == "" {
			continue
		}
		if b.cfg.SnapshotCacheDir == "" {
			return nil, release, fmt.Errorf("%w: volume %q: this kubernetes backend restores no snapshots (no cache directory)", errdefs.ErrNotImplemented, v.Name)
		}
		if !digestRE.MatchString(v.RestoreDigest) {
			return nil, release, fmt.Errorf("%w: volume %q: restore digest is not a hex sha256", runtime.ErrInvalidSpec, v.Name)
		}
		for _, ic := range spec.InitContainers {
			for _, m := range ic.VolumeMounts {
				if m.Volume == v.Name {
					return nil, release, fmt.Errorf("%w: volume %q is restored from a snapshot, but init container %s mounts it: init containers run before the restore on Kubernetes", runtime.ErrInvalidSpec, v.Name, ic.ContainerName())
				}
			}
		}
		var container, path string
		viaFill := filled(spec, i)
		if viaFill {
			// A GLOBAL copy, or a scratch volume no workload agent fills alone
			// (fillsInPlace): through the filler (globalvol.go), whatever the workload's mounts.
			container, path = containerFiller, fillerPath(i)
			if v.Global == nil && v.Medium == runtime.MediumMemory {
				// Its tmpfs pages would be charged to the filler, and the Pod's memory
				// limit would have to take the volume's size (the caller's) on top of
				// the sandbox's memory, with no request behind it.
				return nil, release, fmt.Errorf("%w: memory volume %q is restored from a snapshot and mounted by sub_path, read-only only, or with a working directory or mount point below its mount: on Kubernetes such a volume is filled by the runner's filler, which a memory volume cannot be (its pages would be charged outside the sandbox's memory); mount it at its root, writable, in one container, with no sub_path mounts of it and no directories below its mount",
					runtime.ErrInvalidSpec, v.Name)
			}
		} else if container, path, err = volumeMount(spec, v.Name, true); err != nil {
			return nil, release, fmt.Errorf("%w: restore from a snapshot: %w", runtime.ErrInvalidSpec, err)
		}
		if _, err := os.Stat(b.cachePath(v.RestoreDigest)); err != nil {
			return nil, release, fmt.Errorf("volume %q: snapshot %s is not prepared on this runner: %w", v.Name, v.RestoreDigest, err)
		}
		b.snaps.mu.Lock()
		limits := b.snaps.limits[v.RestoreDigest]
		b.snaps.mu.Unlock()
		// The volume's own size bounds what it can take (the emptyDir's sizeLimit).
		if v.SizeBytes > 0 && (limits.MaxBytes == 0 || limits.MaxBytes > v.SizeBytes) {
			limits.MaxBytes = v.SizeBytes
		}
		r := restore{volume: v.Name, digest: v.RestoreDigest, container: container, path: path, limits: limits}
		if viaFill {
			if r.subDirs, r.waitFor, err = fillDirs(spec, v.Name); err != nil {
				return nil, release, err
			}
		}
		plan = append(plan, r)
	}
	if len(plan) == 0 {
		return nil, release, nil
	}
	c := &b.snaps
	c.mu.Lock()
	for _, r := range plan {
		c.inUse[r.digest]++
	}
	c.mu.Unlock()
	var once sync.Once
	return plan, func() {
		once.Do(func() {
			c.mu.Lock()
			defer c.mu.Unlock()
			for _, r := range plan {
				if c.inUse[r.digest]--; c.inUse[r.digest] <= 0 {
					delete(c.inUse, r.digest)
				}
			}
		})
	}, nil
}

// holdInStandby reports whether a single-container sandbox's agent is held in standby
// before its main command starts: to fill its restored volumes, and for a GLOBAL writer
// (also of an empty volume) until its filler's agent answers.
func holdInStandby(spec *runtime.Spec, plan []restore) bool {
	return len(plan) > 0 || commits(spec)
}

// runRestores fills the planned volumes through the agents (held in standby), each once
// its container's agent answers.
func (b *Backend) runRestores(ctx context.Context, s *sandbox, plan []restore) error {
	if commits(&s.spec) {
		// A GLOBAL writer's workload starts only once the filler's agent answers: the
		// gate holds the Pod for that agent, and the commit archives through it.
		if err := b.waitAgent(ctx, s, containerFiller); err != nil {
			return fmt.Errorf("GLOBAL volume filler: %w", err)
		}
	}
	for _, r := range plan {
		if err := b.waitFill(ctx, s, r); err != nil {
			return fmt.Errorf("restore volume %q: %w", r.volume, err)
		}
		start := time.Now()
		stats, err := b.extract(ctx, s.id, r)
		if err != nil {
			return fmt.Errorf("restore volume %q from snapshot %s: %w", r.volume, r.digest, err)
		}
		b.log.Debug("volume restored", "sandbox", s.id, "volume", r.volume, "files", stats.GetFiles(), "bytes", stats.GetBytes(), "took", time.Since(start))
	}
	return b.endFiller(ctx, s)
}

// waitFill waits, within one StartTimeout for all of them, for r's container and for the
// containers making directories in the copy (r.waitFor: the kubelet and the runtime made
// them in the empty copy once their agents answer, subPaths).
func (b *Backend) waitFill(ctx context.Context, s *sandbox, r restore) error {
	wctx, cancel := context.WithTimeout(ctx, b.cfg.StartTimeout)
	defer cancel()
	for _, name := range append([]string{r.container}, r.waitFor...) {
		if err := b.waitAgent(wctx, s, name); err != nil {
			if ctx.Err() == nil && wctx.Err() != nil {
				return fmt.Errorf("the containers the fill waits for did not all answer within %s: %w", b.cfg.StartTimeout, err)
			}
			return err
		}
	}
	return nil
}

func (b *Backend) extract(ctx context.Context, id string, r restore) (*agentv1.ArchiveStats, error) {
	f, err := os.Open(b.cachePath(r.digest))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	cl := agent.NewClient(func(ctx context.Context) (net.Conn, error) { return b.dialAgent(ctx, id, r.container, true) })
	st := cl.ExtractPath(ctx)
	send := func() error {
		if err := st.Send(&agentv1.ExtractPathRequest{Path: r.path, MaxBytes: r.limits.MaxBytes, MaxFiles: r.limits.MaxFiles, SubDirs: r.subDirs}); err != nil {
			return err
		}
		buf := make([]byte, extractChunk)
		for {
			n, err := f.Read(buf)
			if n > 0 {
				if err := st.Send(&agentv1.ExtractPathRequest{Data: buf[:n]}); err != nil {
					return err
				}
			}
			if errors.Is(err, io.EOF) {
				return nil
			}
			if err != nil {
				return fmt.Errorf("read the cached archive: %w", err)
			}
		}
	}
	serr := send()
	res, err := st.CloseAndReceive()
	switch {
	case err == nil && serr != nil && !errors.Is(serr, io.EOF):
		return nil, serr
	case err == nil:
		return res.Msg.GetStats(), nil
	case connect.CodeOf(err) == connect.CodeResourceExhausted:
		return nil, fmt.Errorf("%w: %w", fsarchive.ErrTooLarge, err)
	case connect.CodeOf(err) == connect.CodeInvalidArgument:
		return nil, fmt.Errorf("%w: %w", fsarchive.ErrInvalid, err)
	case apierr.Reason(err) == apierr.VolumeSubPathNotDirectory:
		// A sub_path (working directory, nested mount point) the volume's content makes
		// a file or symlink (fsarchive.ErrNotDir): refused as the local backend refuses
		// it (ErrInvalidSpec), never mounted through.
		return nil, fmt.Errorf("%w: volume %q: a sub_path of it (%s) is a symlink or not a directory in the volume: %w",
			runtime.ErrInvalidSpec, r.volume, clipList(r.subDirs), err)
	case len(r.subDirs) > 0 && connect.CodeOf(err) == connect.CodeFailedPrecondition:
		// Not the spec's fault: the copy held more than the directories made before the
		// fill (an agent older than the runner ignores sub_dirs and finds them; or the
		// runtime made another directory there).
		return nil, fmt.Errorf("volume %q: the copy was not empty before the fill (expected only %s): %w; is the agent image older than the runner (an older agent ignores sub_dirs)?",
			r.volume, clipList(r.subDirs), err)
	case connect.CodeOf(err) == connect.CodeFailedPrecondition:
		// The container runtime made a directory in the volume before the fill: a working
		// directory the runner could not read from the image's config (imageWorkDirs).
		return nil, fmt.Errorf("volume %q: the volume was not empty before the fill: %w; does the image set a working directory below the volume's mount that the runner cannot read from the image's config (set working_dir)?",
			r.volume, err)
	}
	return nil, err
}

// restoresVolumes reports whether spec fills a volume from a snapshot.
func restoresVolumes(spec *runtime.Spec) bool {
	for _, v := range spec.Volumes {
		if v.RestoreDigest != "" {
			return true
		}
	}
	return false
}

// heldInStandby reports whether s's primary agent (at ip) answers still in standby.
func (b *Backend) heldInStandby(ctx context.Context, s *sandbox, ip string) bool {
	pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	c := agent.NewClient(func(ctx context.Context) (net.Conn, error) { return b.dialGate(ctx, s, ip, "") })
	st, err := c.Status(pctx, connect.NewRequest(&agentv1.StatusRequest{}))
	return err == nil && st.Msg.GetState() == agentv1.MainState_MAIN_STATE_STANDBY
}

// clipList joins names for an error message, bounded.
func clipList(names []string) string {
	s := strings.Join(names, ", ")
	if len(s) > 512 {
		s = s[:512] + "..."
	}
	return s
}
