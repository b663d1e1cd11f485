package local

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/internal/egress"
	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// Fork (runtime.Forker), gVisor single-container sandboxes. The source's state is taken
// once for all its forks:
//
//   - a running source is checkpointed as Pause does, into <its dir>/fork-<random>,
//     and while its kernel is still paused its disk volumes are snapshotted read-only
//     into the volume pool (tmp/<random>/<index>), so memory and files are of the same
//     instant; then it continues (`runsc resume`, its agent listens again) while its
//     forks are made: it is paused for the checkpoint only. A frozen source is thawed
//     for this and frozen again.
//   - a checkpointed source's checkpoint and volumes are used as they are (nothing of
//     it runs).
//
// Each fork is then made as Create makes a sandbox (its own dir, bundle, overlay root,
// network namespace and address, etc files, agent config with its own identity) but
// its disk volumes are writable btrfs snapshots of the source's (copy-on-write) and it
// is started with `runsc restore` from the source's checkpoint instead of `runsc run`.
// runsc reconfigures the restored network stack from the new namespace (its address),
// gives the restored processes the new container ID and hostname, and the agent,
// restored suspended, re-reads its identity from its new config file and listens again
// (agent/relisten.go). The root filesystem's writes are in runsc's overlay, whose memory
// file the checkpoint holds: each fork gets its own copy. A fork that fails is undone
// as a failed Create is. Up to forkParallel forks are restored at once.
//
// A group (gvisor_group_pause.go) is forked as a whole: one checkpoint of its sentry,
// each fork a group of its own (its containers' own dirs, agents and cgroups, the
// group's volumes snapshotted once).
//
// Not forked (refused): memory-medium volumes and disk volumes outside the btrfs pool
// (they would need a full copy), Docker Engine sandboxes. A group's containers that
// have ended (completed init containers, sidecars that ended for good) are recorded in
// each fork with the source's exit, never run again (gvisor_group_pause.go).

// forkParallel bounds the forks restored concurrently.
const forkParallel = 4

// forkParams is what a fork starts from.
type forkParams struct {
	image string // the source's checkpoint image dir
	vols  string // pool-relative dir holding the source's volumes by index ("" if none)
	// run is a copy of the source's agent state dir (logs, status) as of the checkpoint:
	// runsc's restore finds again every host file the sandbox's kernel knew (the agent's
	// open log files among them), so each fork starts with a copy.
	run string
	// digest is the image digest the checkpoint was taken on: the fork's image must be
	// the same (its root filesystem's lower layers), else the restore is refused.
	digest string
	// members, for a group (gvisor_group_pause.go), are its other containers' agent state
	// dirs (as run) by container name; memberDigests their image digests (as digest),
	// known before the checkpoint.
	members       map[string]string
	memberDigests map[string]string
	// completed, for a group, are its containers that had ended before the checkpoint
	// (so are not in it) by name: its init containers (completed) and its sidecars that
	// ended for good. Each fork records them as ended as they were, never run again.
	completed map[string]completedMember
	// ready, when not nil, is closed once image, vols and run are set, or err (the
	// source's checkpoint failed): the forks of a running source are made while it is
	// checkpointed, and wait for it (wait) only where they need it.
	ready chan struct{}
	err   error
	// egress is the source's egress secrets (nil: none, or not held: a checkpoint of
	// another runner, a restarted runner): a fork keeps its CA and placeholders.
	egress *egress.SandboxSecrets
}

// wait waits until fp's image, vols and run are set; it returns the error of the
// source's checkpoint if that failed.
func (fp *forkParams) wait(ctx context.Context) error {
	if fp.ready == nil {
		return nil
	}
	select {
	case <-fp.ready:
		return fp.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// copyRunDir copies the agent state dir src (sandbox-written: copied as it is, links
// not followed, copy-on-write where the filesystem can) into dst, which exists.
func copyRunDir(ctx context.Context, src, dst string) error {
	out, err := exec.CommandContext(ctx, "cp", "-a", "--reflink=auto", "--no-dereference", src+"/.", dst+"/").CombinedOutput()
	if err != nil {
		return fmt.Errorf("copy the agent's state: %w: %s", err, strings.TrimSpace(string(out)))
	}
	_ = os.Remove(filepath.Join(dst, agentSocket))
	return nil
}

// Fork implements runtime.Forker.
func (b *Backend) Fork(ctx context.Context, src string, specs []*runtime.Spec) ([]runtime.Info, []error) {
	infos := make([]runtime.Info, len(specs))
	errs := make([]error, len(specs))
	failAll := func(err error) ([]runtime.Info, []error) {
		for i := range errs {
			errs[i] = err
		}
		return infos, errs
	}
	if len(specs) == 0 {
		return infos, errs
	}
	s, err := b.running(ctx, src)
	if err != nil {
		return failAll(fmt.Errorf("fork %s: %w", src, err))
	}
	if why := b.forkUnsupported(s); why != "" {
		return failAll(fmt.Errorf("fork %s: %w: %s", src, errdefs.ErrNotImplemented, why))
	}
	for i, sp := range specs {
		switch {
		case sp == nil:
			errs[i] = fmt.Errorf("%w: fork %d: no spec", runtime.ErrInvalidSpec, i)
		case sp.RuntimeClass != "" && sp.RuntimeClass != s.rt.class:
			errs[i] = fmt.Errorf("%w: fork %s: runtime class %q, the source's is %q", runtime.ErrInvalidSpec, sp.ID, sp.RuntimeClass, s.rt.class)
		case len(sp.Volumes) != len(s.spec.Volumes):
			errs[i] = fmt.Errorf("%w: fork %s: %d volumes, the source has %d", runtime.ErrInvalidSpec, sp.ID, len(sp.Volumes), len(s.spec.Volumes))
		case s.spec.Multi() || sp.Multi():
			if why := groupForkMismatch(&s.spec, sp); why != "" { // gvisor_group_pause.go
				errs[i] = fmt.Errorf("%w: fork %s: %s", runtime.ErrInvalidSpec, sp.ID, why)
			}
		}
	}
	if !slices.ContainsFunc(errs, func(e error) bool { return e == nil }) {
		return infos, errs // nothing to fork: the source is not checkpointed for nothing
	}
	s.opMu.Lock()
	defer s.opMu.Unlock()
	if m := b.pausedOf(s); m == nil || !m.Released {
		// One checkpoint for all the forks, removed once they are made (ckptspace.go).
		release, err := b.reserveCheckpoint(s, true)
		if err != nil {
			return failAll(fmt.Errorf("fork %s: %w", src, err))
		}
		defer release()
		return b.forkRunning(ctx, s, specs, infos, errs)
	}
	fp, cleanup, cont, err := b.forkSource(ctx, s)
	if err != nil {
		return failAll(fmt.Errorf("fork %s: %w", src, err))
	}
	defer cleanup()
	fp.egress = s.egress
	if cont != nil {
		// The source continues while its forks are made (all they need of it is taken).
		contDone := make(chan struct{})
		go func() {
			defer close(contDone)
			t := time.Now()
			cont()
			b.step(ctx, "fork source: continues (concurrent)", &t)
		}()
		defer func() { <-contDone }()
	}
	b.makeForks(ctx, specs, s.rt.class, fp, "of "+src, infos, errs)
	return infos, errs
}

// forkRunning is Fork of running (or frozen) sandbox s (opMu held): its forks are made
// (dirs, disk, network namespace and address, overlay, bundle) while s is checkpointed,
// and wait for its checkpoint only to restore from it (and for its volume snapshots to
// make theirs). A failed checkpoint fails every fork (each undone as a failed Create)
// with its error, and s runs on as before.
func (b *Backend) forkRunning(ctx context.Context, s *sandbox, specs []*runtime.Spec, infos []runtime.Info, errs []error) ([]runtime.Info, []error) {
	pending := &forkParams{digest: s.info.ImageDigest, memberDigests: memberDigests(s), ready: make(chan struct{}), egress: s.egress}
	made := make(chan struct{})
	go func() {
		defer close(made)
		b.makeForks(ctx, specs, s.rt.class, pending, "of "+s.id, infos, errs)
	}()
	fp, cleanup, cont, err := b.forkSource(ctx, s)
	if err != nil {
		pending.err = err
		close(pending.ready)
		<-made
		for i := range errs {
			errs[i] = fmt.Errorf("fork %s: %w", s.id, err)
		}
		return infos, errs
	}
	defer cleanup() // after the forks (made)
	pending.image, pending.vols, pending.run, pending.members, pending.completed = fp.image, fp.vols, fp.run, fp.members, fp.completed
	close(pending.ready)
	if cont != nil {
		// The source continues while its forks are restored (all they need of it is taken).
		contDone := make(chan struct{})
		go func() {
			defer close(contDone)
			t := time.Now()
			cont()
			b.step(ctx, "fork source: continues (concurrent)", &t)
		}()
		defer func() { <-contDone }()
	}
	<-made
	return infos, errs
}

// makeForks makes each of specs whose errs entry is nil (as class, from fp), up to
// forkParallel at once, into infos and errs; what says where from in errors.
func (b *Backend) makeForks(ctx context.Context, specs []*runtime.Spec, class string, fp *forkParams, what string, infos []runtime.Info, errs []error) {
	sem := make(chan struct{}, forkParallel)
	var wg sync.WaitGroup
	for i, sp := range specs {
		if errs[i] != nil {
			continue
		}
		sp := sp.Clone()
		sp.RuntimeClass = class
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				errs[i] = ctx.Err()
				return
			}
			defer func() { <-sem }()
			infos[i], errs[i] = b.create(ctx, &sp, fp)
			if errs[i] != nil {
				errs[i] = fmt.Errorf("fork %s %s: %w", sp.ID, what, errs[i])
			}
		}()
	}
	wg.Wait()
}

// forkUnsupported says why sandbox s cannot be forked ("" if it can).
func (b *Backend) forkUnsupported(s *sandbox) string {
	if why := b.checkpointUnsupported(s); why != "" {
		return why
	}
	if s.spec.Multi() {
		if why := b.groupForkUnsupported(s); why != "" { // gvisor_group_pause.go
			return why
		}
	}
	for _, v := range s.spec.Volumes {
		if v.Medium == runtime.MediumMemory {
			return fmt.Sprintf("volume %q is memory-backed: forks copy disk volumes only", v.Name)
		}
	}
	if hasDiskVolume(&s.spec) && !b.vols.available() {
		return "forks of sandboxes with volumes need the btrfs volume pool"
	}
	return ""
}

// forkSource takes what forks of s start from (s.opMu held); cleanup removes what it
// made for them. cont, when not nil, lets a running source continue (its kernel was
// paused for the checkpoint): the caller runs it, concurrently with the forks, before
// it releases s.opMu.
func (b *Backend) forkSource(ctx context.Context, s *sandbox) (fp *forkParams, cleanup func(), cont func(), err error) {
	nothing := func() {}
	m := b.pausedOf(s)
	if m != nil && m.Released {
		fp := &forkParams{image: filepath.Join(s.dir, dirCheckpoint), run: filepath.Join(shownDir(s.dir), dirRun), digest: s.info.ImageDigest,
			memberDigests: memberDigests(s)}
		if len(s.members) > 0 {
			var err error
			if fp.members, fp.completed, err = checkpointedMemberRuns(s, fp.image); err != nil {
				return nil, nil, nil, err
			}
		}
		if hasDiskVolume(&s.spec) {
			fp.vols = filepath.Join(poolSandboxes, s.id)
			release, err := b.vols.acquire()
			if err != nil {
				return nil, nil, nil, err
			}
			return fp, release, nil, nil
		}
		return fp, nothing, nil, nil
	}
	// What follows the checkpoint is not cut short by the caller's context: the source
	// must not stay paused.
	cctx := context.WithoutCancel(ctx)
	refreeze := func() {}
	if m != nil { // frozen: thawed for the checkpoint, frozen again after
		if err := b.thaw(ctx, s); err != nil {
			return nil, nil, nil, err
		}
		refreeze = func() {
			if err := b.freeze(cctx, s); err != nil {
				b.log.Warn("fork: freeze the source again", "sandbox", s.id, "err", err)
			}
		}
	}
	fp, cleanup, err = b.forkCheckpoint(ctx, s)
	if err != nil {
		refreeze() // saveImage let it continue
		return nil, nil, nil, err
	}
	return fp, cleanup, func() { b.continueAfterSave(cctx, s, ""); refreeze() }, nil
}

// forkCheckpoint checkpoints running sandbox s for forks and snapshots its volumes,
// leaving its kernel paused; on an error it runs on.
func (b *Backend) forkCheckpoint(ctx context.Context, s *sandbox) (*forkParams, func(), error) {
	var (
		image string
		held  []*sandbox
		err   error
	)
	for attempt := 1; ; attempt++ {
		image, held, err = b.saveImage(ctx, s, filepath.Join(s.dir, "fork-"+randomName()))
		var me *errMemberEnded
		if err == nil || !errors.As(err, &me) || attempt == saveAttempts {
			break
		}
		// A member ended during the save: the next one records it as ended
		// (gvisor_group_pause.go).
		awaitMemberExit(ctx, me.m)
	}
	if err != nil {
		return nil, nil, err
	}
	fp := &forkParams{image: image, run: image + "-run", digest: s.info.ImageDigest, memberDigests: memberDigests(s)}
	var cleanups []func()
	cleanup := func() {
		for i := len(cleanups) - 1; i >= 0; i-- {
			cleanups[i]()
		}
	}
	cleanups = append(cleanups, func() { _ = os.RemoveAll(image); _ = os.RemoveAll(fp.run) })
	t := time.Now()
	err = os.Mkdir(fp.run, 0o700)
	if err == nil {
		err = copyRunDir(ctx, filepath.Join(shownDir(s.dir), dirRun), fp.run)
	}
	if err == nil && len(s.members) > 0 {
		fp.members, fp.completed, err = b.copyMemberRuns(ctx, s, image, held, &cleanups) // gvisor_group_pause.go
	}
	if err != nil {
		b.continueAfterSave(ctx, s, "")
		cleanup()
		return nil, nil, err
	}
	if hasDiskVolume(&s.spec) {
		// The kernel is paused: the volumes are as the memory image knows them.
		vols, release, err := b.snapshotVolumes(s)
		if err != nil {
			b.continueAfterSave(ctx, s, "")
			cleanup()
			return nil, nil, err
		}
		fp.vols = vols
		cleanups = append(cleanups, release)
	}
	b.step(ctx, "fork source: run dir, volume snapshots", &t)
	return fp, cleanup, nil
}

// snapshotVolumes snapshots the disk volumes of s read-only into the pool's
// tmp/<random>/<index> and returns that dir (pool-relative) and what removes it.
func (b *Backend) snapshotVolumes(s *sandbox) (string, func(), error) {
	release, err := b.vols.acquire()
	if err != nil {
		return "", nil, err
	}
	tmp, err := b.vols.openDir(poolTmp)
	if err != nil {
		release()
		return "", nil, err
	}
	defer tmp.Close()
	name := randomName()
	if err := subvolCreate(tmp, name); err != nil {
		release()
		return "", nil, err
	}
	rel := filepath.Join(poolTmp, name)
	remove := func() {
		if t, err := b.vols.openDir(poolTmp); err == nil {
			if err := subvolDestroy(t, name); err != nil {
				b.log.Warn("fork: remove volume snapshots", "err", err)
			}
			t.Close()
		}
		release()
	}
	parent, err := b.vols.openDir(rel)
	if err != nil {
		remove()
		return "", nil, err
	}
	defer parent.Close()
	for i, v := range s.spec.Volumes {
		if v.Medium == runtime.MediumMemory {
			continue
		}
		src, err := b.vols.openDir(filepath.Join(poolSandboxes, s.id, strconv.Itoa(i)))
		if err == nil {
			err = subvolSnapshot(src, parent, strconv.Itoa(i), true)
			src.Close()
		}
		if err != nil {
			remove()
			return "", nil, fmt.Errorf("volume %q: %w", v.Name, err)
		}
	}
	return rel, remove, nil
}

// forkVolume makes fork id's disk volume number index, a writable snapshot of the
// source's (fork.vols/<index>), limited to limit bytes. The pool is held by the caller.
func (b *Backend) forkVolume(id string, index int, fork *forkParams, limit int64) (string, error) {
	src, err := b.vols.openDir(filepath.Join(fork.vols, strconv.Itoa(index)))
	if err != nil {
		return "", fmt.Errorf("the source's volume: %w", err)
	}
	defer src.Close()
	return b.vols.createVolume(id, index, limit, src)
}
