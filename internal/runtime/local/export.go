package local

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/failpoint"
	"github.com/sandboxd/sandboxd/internal/fsarchive"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// Checkpoints that move to another host (runtime.CheckpointPorter), gVisor sandboxes
// (single containers, and groups: gvisor_group_export.go): the state Fork starts from
// (fork.go), written out as a bundle of parts, and forks made from such a bundle on
// another backend (or on this one).
//
// # Bundle format
//
// An exported checkpoint is a list of parts, each one internal/fsarchive stream (a PAX
// tar of a directory tree, zstd-compressed; fsarchive.Write/Extract), written through
// the caller's put in this order and named:
//
//	image           runsc's checkpoint image dir (`runsc checkpoint --image-path`: its
//	                state file and the memory pages file, which may be large and sparse;
//	                fsarchive stores holes as zeros, which zstd makes almost nothing of,
//	                and Extract punches them back: the file comes back byte for byte).
//	                Owners as on the host (no id map).
//	run             the agent's state dir as of the checkpoint (its logs and status: the
//	                restored kernel finds these host files again). Sockets in it are left
//	                out (the agent's own is made again). Owners as on the host.
//	group,          a multi-container group's only: group.json (its sidecars' names and
//	init-<k>,       image digests, the recorded exits of its completed init containers
//	member-<k>      and of its sidecars that had ended), init container k's and sidecar
//	                k's agent state dirs (gvisor_group_export.go).
//	volume-<index>  each disk volume of the spec (index into Spec.Volumes), from the
//	                read-only btrfs snapshot taken with the memory image (or the volumes of
//	                a checkpointed source as they are). Owners as the sandbox sees them
//	                (the source's user namespace's id map, as snapshot.go stores them).
//
// The compression is the bundle's only: the checkpoint on the host stays uncompressed,
// because `runsc restore --background` reads the pages file while the sandbox already
// runs (it cannot from a compressed image). CheckpointExport.Platform names what a
// restore needs exactly (CheckpointPlatform): the runsc build, the architecture and
// whether sandboxes have a network (runsc restores a checkpoint into the same kind of
// network stack it was taken in).
//
// Export takes the source's state as Fork does (forkSource, under the source's opMu): a
// checkpointed source's checkpoint and volumes as they are; a running or frozen one is
// checkpointed leaving it running, its volumes snapshotted while its kernel is paused,
// and it continues before anything is uploaded: the parts are written from the copies,
// which are removed when the export returns.
//
// Import (ForkFromCheckpoint) reads every part once, before any sandbox is made, into a
// staging dir of its own (<StateDir>/.imports/<random>, 0700: image/ and run/) and the
// volumes into fresh subvolumes of the volume pool (tmp/<random>/<index>), each bounded
// (fsarchive limits, importLimits: the image by the memory the sandbox may use plus
// what its root filesystem may hold, the agent's state likewise, a volume by its size): the parts are sandbox-made. Each spec is then
// made as a fork is (b.create with forkParams), up to forkParallel at once; the staging
// dir and subvolumes are removed at the end whatever happens (and by Recover after a
// crash). The spec's image must be pinned to a digest (image@sha256:...), the image the
// checkpoint was taken on: a restore onto other image files would be corrupt, so a pull
// that gives another digest is refused. A move is one spec with the source's ID.

const (
	partImage    = "image"
	partRun      = "run"
	partVolume   = "volume-"
	dirImports   = ".imports" // in StateDir; not a sandbox id (ids cannot start with a dot)
	importRunMax = 1 << 30
	// importSlack is what the image may hold beyond the sandbox's memory at least (its
	// state file, the root filesystem's writes: see importLimits).
	importSlack     = 1 << 30
	importMaxFiles  = 1 << 16 // image and run
	importVolFiles  = 1 << 20 // a volume
	runscVersionCmd = 20 * time.Second
	// corruptProbe bounds what is read on after a part that does not decode, to learn
	// whether it was altered in storage.
	corruptProbe = 64 << 20
)

var _ runtime.CheckpointPorter = (*Backend)(nil)

// runscIDs caches the build identity of each runsc binary (keyed by path and file
// identity, so a replaced binary is asked again): `runsc --version` runs once per binary.
var runscIDs sync.Map

// runscBuild names the runsc build at binary: the version it prints ("runsc version X"),
// or, for a build that prints none (VERSION_MISSING: built from source without a
// version stamp), the sha256 of the binary itself.
func runscBuild(binary string) (string, error) {
	var st unix.Stat_t
	if err := unix.Stat(binary, &st); err != nil {
		return "", err
	}
	key := fmt.Sprintf("%s\x00%d:%d:%d:%d", binary, st.Dev, st.Ino, st.Size, st.Mtim.Nano())
	if v, ok := runscIDs.Load(key); ok {
		return v.(string), nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), runscVersionCmd)
	defer cancel()
	out, err := exec.CommandContext(ctx, binary, "--version").Output()
	if err != nil {
		return "", fmt.Errorf("%s --version: %w", binary, err)
	}
	v := ""
	for _, l := range strings.Split(string(out), "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(l), "runsc version "); ok {
			v = strings.TrimSpace(rest)
		}
	}
	if v == "" || v == "VERSION_MISSING" || strings.ContainsFunc(v, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("._+-", r))
	}) {
		f, err := os.Open(binary)
		if err != nil {
			return "", err
		}
		defer f.Close()
		h := sha256.New()
		if _, err := io.Copy(h, f); err != nil {
			return "", err
		}
		v = "sha256-" + hex.EncodeToString(h.Sum(nil))[:24]
	}
	runscIDs.Store(key, v)
	return v, nil
}

// CheckpointPlatform implements runtime.CheckpointPorter.
func (b *Backend) CheckpointPlatform(class string) string {
	rt, _, err := b.runtimeFor(class)
	if err != nil || !rt.gvisor || !b.PauseSupport(class).Checkpoint {
		return ""
	}
	v, err := runscBuild(rt.binary)
	if err != nil {
		b.log.Warn("checkpoint platform: the runsc build", "class", class, "err", err)
		return ""
	}
	p := "gvisor runsc-" + v + " linux/" + goruntime.GOARCH
	if b.cfg.Network == nil {
		p += " network-none" // bootRuntime: --network=none
	}
	return p
}

// exportPart is one part of an export: a dir (absolute, or in the pool when pool) and
// the id map its owners are read through.
type exportPart struct {
	name string
	dir  string
	pool bool
	ids  fsarchive.IDMap
}

// ExportCheckpoint implements runtime.CheckpointPorter.
func (b *Backend) ExportCheckpoint(ctx context.Context, id string, put func(ctx context.Context, part string, r io.Reader) error) (runtime.CheckpointExport, error) {
	s, err := b.running(ctx, id)
	if err != nil {
		return runtime.CheckpointExport{}, fmt.Errorf("export checkpoint of %s: %w", id, err)
	}
	if why := b.forkUnsupported(s); why != "" {
		return runtime.CheckpointExport{}, fmt.Errorf("export checkpoint of %s: %w: %s", id, errdefs.ErrNotImplemented, why)
	}
	platform := b.CheckpointPlatform(s.rt.class)
	if platform == "" {
		return runtime.CheckpointExport{}, fmt.Errorf("export checkpoint of %s: %w: the runtime class %q has no checkpoint platform on this host", id, errdefs.ErrNotImplemented, s.rt.class)
	}
	var ids fsarchive.IDMap
	if r, ok, err := readIDRange(s.dir); err != nil {
		return runtime.CheckpointExport{}, fmt.Errorf("export checkpoint of %s: %w", id, err)
	} else if ok {
		ids = fsarchive.IDMap{HostBase: r.HostID, Size: r.Size}
	}
	s.opMu.Lock()
	defer s.opMu.Unlock()
	select {
	case <-s.done:
		return runtime.CheckpointExport{}, errNotRunning(id)
	default:
	}
	start := time.Now()
	fp, cleanup, cont, err := b.forkSource(ctx, s)
	if err != nil {
		return runtime.CheckpointExport{}, fmt.Errorf("export checkpoint of %s: %w", id, err)
	}
	defer cleanup()
	ex := runtime.CheckpointExport{Platform: platform, Class: s.rt.class}
	if s.egress != nil {
		// Its CA and placeholders, for the runner wire (never a part): the restored
		// processes trust that CA and hold those placeholders.
		if ex.Egress, err = egressStateOf(s.egress); err != nil {
			return runtime.CheckpointExport{}, fmt.Errorf("export checkpoint of %s: %w: %w", id, errdefs.ErrNotImplemented, err)
		}
	}
	if cont != nil {
		// The source continues before anything is uploaded: the parts are copies.
		cont()
		ex.Took = time.Since(start)
	}
	parts := []exportPart{{name: partImage, dir: fp.image}, {name: partRun, dir: fp.run}}
	if s.spec.Multi() {
		gparts, gcleanup, err := b.groupExportParts(s, fp) // gvisor_group_export.go
		if err != nil {
			return runtime.CheckpointExport{}, fmt.Errorf("export checkpoint of %s: %w", id, err)
		}
		defer gcleanup()
		parts = append(parts, gparts...)
	}
	for i, v := range s.spec.Volumes {
		if v.Medium != runtime.MediumMemory {
			parts = append(parts, exportPart{name: partVolume + strconv.Itoa(i), dir: filepath.Join(fp.vols, strconv.Itoa(i)), pool: true, ids: ids})
		}
	}
	for _, p := range parts {
		st, err := b.writePart(ctx, p, put)
		if err != nil {
			return runtime.CheckpointExport{}, fmt.Errorf("export checkpoint of %s: part %s: %w", id, p.name, err)
		}
		ex.Parts = append(ex.Parts, p.name)
		ex.Bytes += st.Bytes
		if p.name == partImage {
			if st.Skipped > 0 {
				// runsc writes regular files only; a restore without what was left out
				// would not be the sandbox.
				return runtime.CheckpointExport{}, fmt.Errorf("export checkpoint of %s: part %s: %d entries of the checkpoint image are not regular files or directories", id, p.name, st.Skipped)
			}
			failpoint.Hit("local.export.image")
		}
	}
	return ex, nil
}

// writePart streams part p as an fsarchive through put (never held whole).
func (b *Backend) writePart(ctx context.Context, p exportPart, put func(ctx context.Context, part string, r io.Reader) error) (runtime.ArchiveStats, error) {
	var root *os.File
	var err error
	if p.pool {
		root, err = b.vols.openDir(p.dir)
	} else {
		var fd int
		fd, err = unix.Open(p.dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err == nil {
			root = os.NewFile(uintptr(fd), p.dir)
		}
	}
	if err != nil {
		return runtime.ArchiveStats{}, err
	}
	defer root.Close()
	pr, pw := io.Pipe()
	type result struct {
		st  runtime.ArchiveStats
		err error
	}
	done := make(chan result, 1)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		st, err := fsarchive.Write(wctx, root, pw, p.ids)
		pw.CloseWithError(err) // nil: io.EOF for put
		done <- result{st, err}
	}()
	perr := put(ctx, p.name, pr)
	// A put that returned early: the writer stops on its next write.
	pr.CloseWithError(errors.New("put returned before the part's end"))
	cancel()
	r := <-done
	switch {
	case perr != nil:
		return r.st, perr
	case r.err != nil:
		return r.st, r.err
	}
	return r.st, nil
}

// pinnedDigest is the digest ref is pinned to ("name@sha256:<hex>").
func pinnedDigest(ref string) (string, bool) {
	i := strings.LastIndexByte(ref, '@')
	if i < 0 {
		return "", false
	}
	d := ref[i+1:]
	if !strings.HasPrefix(d, "sha256:") || len(d) == len("sha256:") {
		return "", false
	}
	return d, true
}

// importParts is the parts a checkpoint of spec has, in the order they are written.
func importParts(spec *runtime.Spec) []string {
	parts := append([]string{partImage, partRun}, groupParts(spec)...)
	for i, v := range spec.Volumes {
		if v.Medium != runtime.MediumMemory {
			parts = append(parts, partVolume+strconv.Itoa(i))
		}
	}
	return parts
}

// importUnsupported says why a sandbox of spec cannot be made from a checkpoint ("" if
// it can), as forkUnsupported does for a local source.
func (b *Backend) importUnsupported(spec *runtime.Spec) string {
	if spec.Engine != nil {
		return "checkpoints of sandboxes running a Docker Engine are not implemented"
	}
	for _, v := range spec.Volumes {
		if v.Medium == runtime.MediumMemory {
			return fmt.Sprintf("volume %q is memory-backed: forks copy disk volumes only", v.Name)
		}
	}
	if hasDiskVolume(spec) && !b.vols.available() {
		return "forks of sandboxes with volumes need the btrfs volume pool"
	}
	return ""
}

// ForkFromCheckpoint implements runtime.CheckpointPorter.
func (b *Backend) ForkFromCheckpoint(ctx context.Context, cp runtime.CheckpointExport, open func(ctx context.Context, part string) (io.ReadCloser, error), specs []*runtime.Spec) ([]runtime.Info, []error) {
	infos := make([]runtime.Info, len(specs))
	errs := make([]error, len(specs))
	failAll := func(err error) ([]runtime.Info, []error) {
		for i := range errs {
			if errs[i] == nil {
				errs[i] = err
			}
		}
		return infos, errs
	}
	var ref *runtime.Spec
	for i, sp := range specs {
		if sp == nil {
			errs[i] = fmt.Errorf("%w: fork %d: no spec", runtime.ErrInvalidSpec, i)
		} else if ref == nil {
			ref = sp
		}
	}
	if ref == nil {
		return infos, errs
	}
	class := ref.RuntimeClass
	if class == "" {
		class = cp.Class
	}
	_, class, err := b.runtimeFor(class)
	if err != nil {
		return failAll(fmt.Errorf("fork from checkpoint: %w", err))
	}
	platform := b.CheckpointPlatform(class)
	if platform == "" {
		return failAll(fmt.Errorf("fork from checkpoint: %w: this backend restores no checkpoints of runtime class %q (the checkpoint's platform is %q)", errdefs.ErrNotImplemented, class, cp.Platform))
	}
	if cp.Platform != platform {
		return failAll(fmt.Errorf("fork from checkpoint: %w: the checkpoint's platform is %q, this backend's for runtime class %q is %q", errdefs.ErrNotImplemented, cp.Platform, class, platform))
	}
	if why := b.importUnsupported(ref); why != "" {
		return failAll(fmt.Errorf("fork from checkpoint: %w: %s", errdefs.ErrNotImplemented, why))
	}
	digest, ok := pinnedDigest(ref.Image)
	if !ok {
		return failAll(fmt.Errorf("%w: fork from checkpoint: image %q is not pinned to the digest the checkpoint was taken on (image@sha256:...)", runtime.ErrInvalidSpec, ref.Image))
	}
	want := importParts(ref)
	if got := slices.Clone(cp.Parts); len(got) != len(want) || !sameSet(got, want) {
		return failAll(fmt.Errorf("%w: fork from checkpoint: the checkpoint's parts %q are not the spec's %q", runtime.ErrInvalidSpec, cp.Parts, want))
	}
	for i, sp := range specs {
		if errs[i] != nil || sp == ref {
			continue
		}
		switch {
		case sp.RuntimeClass != "" && sp.RuntimeClass != class:
			errs[i] = fmt.Errorf("%w: fork %s: runtime class %q, the checkpoint's is %q", runtime.ErrInvalidSpec, sp.ID, sp.RuntimeClass, class)
		case sp.Image != ref.Image:
			errs[i] = fmt.Errorf("%w: fork %s: image %q, the checkpoint's is %q", runtime.ErrInvalidSpec, sp.ID, sp.Image, ref.Image)
		case !slices.Equal(importParts(sp), want) || len(sp.Volumes) != len(ref.Volumes):
			errs[i] = fmt.Errorf("%w: fork %s: volumes not the checkpoint's", runtime.ErrInvalidSpec, sp.ID)
		case ref.Multi() || sp.Multi():
			if why := groupForkMismatch(ref, sp); why != "" { // gvisor_group_pause.go
				errs[i] = fmt.Errorf("%w: fork %s: %s", runtime.ErrInvalidSpec, sp.ID, why)
			}
		}
	}
	if !slices.ContainsFunc(errs, func(e error) bool { return e == nil }) {
		return infos, errs
	}
	// The egress secrets' CA and placeholders come with cp (the runner wire), checked
	// before any part is read.
	secrets, err := egressFromState(ref, cp.Egress)
	if err != nil {
		return failAll(fmt.Errorf("%w: fork from checkpoint: %w", runtime.ErrInvalidSpec, err))
	}
	fp, cleanup, err := b.stageImport(ctx, cp, open, specs, errs)
	if err != nil {
		return failAll(fmt.Errorf("fork from checkpoint: %w", err))
	}
	defer cleanup()
	failpoint.Hit("local.import.staged")
	fp.digest = digest
	fp.egress = secrets
	if ref.Multi() {
		if err := readGroupExport(filepath.Dir(fp.image), ref, fp); err != nil { // gvisor_group_export.go
			return failAll(fmt.Errorf("fork from checkpoint: %w", err))
		}
	}
	b.makeForks(ctx, specs, class, fp, "from checkpoint", infos, errs)
	return infos, errs
}

func sameSet(a, b []string) bool {
	slices.Sort(a)
	b = slices.Clone(b)
	slices.Sort(b)
	return slices.Equal(a, b)
}

// importLimits are the bounds of the parts of a checkpoint restored as specs (those
// without an error): the image holds the sandbox's memory and its root filesystem's
// writes (runsc's overlay: not counted in its memory), bounded by its disk limit, or
// without one by what the state dir's filesystem has free (as the sandbox's own writes
// were); the agent's state (its logs) likewise, at least importRunMax; a volume by its
// size (or the disk limit, or the pool's free space when it has neither).
func (b *Backend) importLimits(specs []*runtime.Spec, errs []error) (image, run runtime.ArchiveLimits, vols map[string]runtime.ArchiveLimits) {
	var mem int64
	var first *runtime.Spec
	for i, sp := range specs {
		if errs[i] != nil {
			continue
		}
		if first == nil {
			first = sp
		}
		m := sp.Resources.MemoryBytes
		if m <= 0 {
			m = hostMemory()
		}
		mem = max(mem, m)
	}
	disk := b.diskBytes(first.Resources)
	writes := disk
	if writes <= 0 {
		writes = freeBytes(b.cfg.StateDir)
	}
	image = runtime.ArchiveLimits{MaxBytes: mem + max(importSlack, writes), MaxFiles: importMaxFiles}
	run = runtime.ArchiveLimits{MaxBytes: max(importRunMax, writes), MaxFiles: importMaxFiles}
	vols = map[string]runtime.ArchiveLimits{}
	for i, v := range first.Volumes {
		if v.Medium == runtime.MediumMemory {
			continue
		}
		limit := cmp(v.SizeBytes, disk)
		if limit <= 0 {
			limit = freeBytes(b.vols.mnt())
		}
		vols[partVolume+strconv.Itoa(i)] = runtime.ArchiveLimits{MaxBytes: limit, MaxFiles: importVolFiles}
	}
	return image, run, vols
}

// hostMemory is the host's RAM in bytes.
func hostMemory() int64 {
	var si unix.Sysinfo_t
	if err := unix.Sysinfo(&si); err != nil {
		return 1 << 40
	}
	return int64(si.Totalram) * int64(si.Unit)
}

// freeBytes is what the filesystem of path has free (1 byte when unknown: nothing fits).
func freeBytes(path string) int64 {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return 1
	}
	return max(int64(st.Bavail)*st.Bsize, 1)
}

// stageImport reads every part of cp into a staging dir and fresh pool subvolumes and
// returns the forkParams of them (digest unset) and what removes them.
func (b *Backend) stageImport(ctx context.Context, cp runtime.CheckpointExport, open func(ctx context.Context, part string) (io.ReadCloser, error), specs []*runtime.Spec, errs []error) (_ *forkParams, _ func(), err error) {
	var cleanups []func()
	cleanup := func() {
		for i := len(cleanups) - 1; i >= 0; i-- {
			cleanups[i]()
		}
	}
	defer func() {
		if err != nil {
			cleanup()
		}
	}()
	imports := filepath.Join(b.cfg.StateDir, dirImports)
	if err := os.Mkdir(imports, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, nil, err
	}
	stage := filepath.Join(imports, randomName())
	if err := os.Mkdir(stage, 0o700); err != nil {
		return nil, nil, err
	}
	cleanups = append(cleanups, func() {
		if err := os.RemoveAll(stage); err != nil {
			b.log.Warn("fork from checkpoint: remove the staging dir", "dir", stage, "err", err)
		}
	})
	fp := &forkParams{image: filepath.Join(stage, partImage), run: filepath.Join(stage, partRun)}
	imageLimits, runLimits, volLimits := b.importLimits(specs, errs)
	var pool *os.File // tmp/<name> in the pool, holding the volumes by index
	if len(volLimits) > 0 {
		release, err := b.vols.acquire()
		if err != nil {
			return nil, nil, err
		}
		cleanups = append(cleanups, release)
		tmp, err := b.vols.openDir(poolTmp)
		if err != nil {
			return nil, nil, err
		}
		defer tmp.Close()
		name := randomName()
		if err := subvolCreate(tmp, name); err != nil {
			return nil, nil, err
		}
		cleanups = append(cleanups, func() {
			if t, err := b.vols.openDir(poolTmp); err == nil {
				if err := subvolDestroy(t, name); err != nil {
					b.log.Warn("fork from checkpoint: remove the staged volumes", "err", err)
				}
				t.Close()
			}
		})
		fp.vols = filepath.Join(poolTmp, name)
		if pool, err = b.vols.openDir(fp.vols); err != nil {
			return nil, nil, err
		}
		defer pool.Close()
		// Limits are computed with the pool mounted (an unsized volume: its free space).
		_, _, volLimits = b.importLimits(specs, errs)
	}
	for _, part := range cp.Parts {
		var root *os.File
		var limits runtime.ArchiveLimits
		grp, _ := isGroupPart(part) // gvisor_group_export.go
		switch {
		case part == partImage || part == partRun || grp:
			dir := filepath.Join(stage, part)
			if err := os.Mkdir(dir, 0o700); err != nil {
				return nil, nil, err
			}
			fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				return nil, nil, err
			}
			root = os.NewFile(uintptr(fd), dir)
			limits = imageLimits
			if part == partRun {
				limits = runLimits
			} else if grp {
				limits = groupPartLimits(part, runLimits)
			}
		default:
			l, ok := volLimits[part]
			if !ok || pool == nil { // checked against the spec already
				return nil, nil, fmt.Errorf("%w: unexpected part %q", runtime.ErrInvalidSpec, part)
			}
			index := strings.TrimPrefix(part, partVolume)
			if err := subvolCreate(pool, index); err != nil {
				return nil, nil, err
			}
			if root, err = b.vols.openDir(filepath.Join(fp.vols, index)); err != nil {
				return nil, nil, err
			}
			limits = l
		}
		err := extractPart(ctx, open, part, root, limits)
		root.Close()
		if err != nil {
			return nil, nil, fmt.Errorf("part %s: %w", part, err)
		}
	}
	return fp, cleanup, nil
}

// extractPart unpacks part (read through open) into root within limits, and reads its
// reader to the end (which checks its digest there).
func extractPart(ctx context.Context, open func(ctx context.Context, part string) (io.ReadCloser, error), part string, root *os.File, limits runtime.ArchiveLimits) error {
	rc, err := open(ctx, part)
	if err != nil {
		return err
	}
	defer rc.Close()
	if _, err := fsarchive.Extract(ctx, rc, root, limits, fsarchive.IDMap{}); err != nil {
		if errors.Is(err, fsarchive.ErrInvalid) {
			// A stream that does not decode may be one altered in storage: the reader
			// says so at its end (blob.ErrCorrupt), which a little more reading finds.
			if _, rerr := io.Copy(io.Discard, io.LimitReader(rc, corruptProbe)); rerr != nil {
				return fmt.Errorf("%w (%v)", rerr, err) //nolint:errorlint // the reader's verdict is the error
			}
		}
		return err
	}
	if n, err := io.Copy(io.Discard, io.LimitReader(rc, maxTrailing+1)); err != nil {
		return err
	} else if n > maxTrailing {
		return fmt.Errorf("%w: data after the archive's end", fsarchive.ErrInvalid)
	}
	return nil
}

// sweepImports removes the staging dirs an earlier process left (Recover).
func (b *Backend) sweepImports() {
	dir := filepath.Join(b.cfg.StateDir, dirImports)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			b.log.Warn("recover: remove a checkpoint import's staging dir", "name", e.Name(), "err", err)
		}
	}
}
