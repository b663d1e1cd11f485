package local

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/internal/agent"
	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/failpoint"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// Pause and resume (runtime.Pauser).
//
//   - Freeze, every class: the sandbox's cgroup (a group's own, which holds its
//     containers') is frozen with the cgroup freezer, as a volume capture does
//     (snapshot.go). Memory stays allocated and counted. paused.json in the sandbox's dir
//     says so, so a restarted backend reports it paused and Resume thaws it.
//   - Checkpoint, gVisor (single containers, and groups whose containers all run: the
//     group's one sentry holds them all; gvisor_group_pause.go): the agent is told to
//     close its channel (agent.SuspendSignal: runsc cannot save the socket the gofer
//     bound on the host nor the connections on it; the agent also waits for the
//     children it is forking to exec, as they hold copies of the listener until then),
//     the sentry is paused (`runsc pause`: nothing in the sandbox runs from here on, so
//     nothing writes its volumes after the memory image is taken), then `runsc
//     checkpoint --leave-running` writes the image into <dir>/checkpoint.tmp (the
//     kernel stays paused: it was paused before the save), which is renamed to
//     <dir>/checkpoint: a checkpoint is complete or absent. Only then is
//     the sentry killed and its runtime state and cgroups removed; on any error before,
//     the sentry is resumed and the agent listens again, so a failed checkpoint leaves
//     the sandbox running as it was. The network namespace, the root filesystem's dirs
//     and the volumes stay. The root filesystem's writes live in runsc's overlay, whose
//     memory file the checkpoint holds.
//     Resume is `runsc restore --background` from it with the same bundle (same network
//     namespace, so the same address; runc.go: restoreBackground), the agent told to
//     listen again (agent.ResumeFile, made before the restore; agent.ResumeSignal if it
//     does not answer within resumeFallback), and the checkpoint removed once the agent
//     answers (the sentry reads the pages still loading from its own descriptor).
//
// A checkpointed sandbox has no process: its watcher (lifecycle.go) does not record the
// sentry's end as an exit but waits for Resume (a new sentry to watch) or Stop ("stopped
// while paused"). Recover (load) finds a sandbox with a complete checkpoint and no live
// sentry paused, removes a half-written one (checkpoint.tmp) and reports the sandbox as
// it is.

const (
	filePaused       = "paused.json"
	dirCheckpoint    = "checkpoint"
	dirCheckpointTmp = "checkpoint.tmp"
	// suspendTimeout bounds the wait for the agent to close its channel.
	suspendTimeout = 5 * time.Second
)

var (
	_ runtime.Pauser = (*Backend)(nil)
	_ runtime.Forker = (*Backend)(nil)
)

// testImageDirHook, set by tests, runs on a checkpoint's image dir before runsc writes
// it (to make the write fail).
var testImageDirHook func(dir string) error

// pauseMarker is paused.json.
type pauseMarker struct {
	Released bool      `json:"released"`
	Resuming bool      `json:"resuming,omitempty"` // a restore is under way
	At       time.Time `json:"at"`
	Bytes    int64     `json:"checkpoint_bytes,omitempty"`
}

// ckWait is how a checkpointed sandbox's watcher learns what follows the sentry's end.
type ckWait struct {
	next chan ckNext // buffered (1)
}

type ckNext struct {
	proc    *proc // the restored sentry (Resume)
	stopped bool  // Stop of the checkpointed sandbox
	// neither: the sentry ended for good (a failed checkpoint that took it along).
}

// criu is checked once: the runc class's checkpoint needs a working CRIU.
var criuWhy = sync.OnceValue(func() string {
	p, err := exec.LookPath("criu")
	if err != nil {
		return "runc needs CRIU for checkpoints and criu is not installed on this host: use the gvisor runtime class"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, p, "check").CombinedOutput(); err != nil {
		msg := strings.TrimSpace(string(out))
		if i := strings.IndexByte(msg, '\n'); i > 0 {
			msg = msg[:i]
		}
		return fmt.Sprintf("runc needs CRIU for checkpoints and `criu check` fails on this host (%s): use the gvisor runtime class", msg)
	}
	// CRIU works, but this backend drives checkpoints through runsc only.
	return "the local backend checkpoints runc sandboxes not yet (CRIU is not driven): use the gvisor runtime class"
})

// PauseSupport implements runtime.Pauser.
func (b *Backend) PauseSupport(class string) runtime.PauseSupport {
	rt, _, err := b.runtimeFor(class)
	if err != nil {
		return runtime.PauseSupport{Why: err.Error()}
	}
	if rt.gvisor {
		return runtime.PauseSupport{Freeze: true, Checkpoint: true}
	}
	return runtime.PauseSupport{Freeze: true, Why: criuWhy()}
}

// errNotRunning: Pause of a sandbox that has ended.
func errNotRunning(id string) error {
	return fmt.Errorf("sandbox %s is not running", id)
}

// running returns tracked sandbox id, ready and not ended.
func (b *Backend) running(ctx context.Context, id string) (*sandbox, error) {
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
	select {
	case <-s.done:
		return nil, errNotRunning(id)
	default:
	}
	return s, nil
}

func (b *Backend) pausedOf(s *sandbox) *pauseMarker {
	b.mu.Lock()
	defer b.mu.Unlock()
	return s.paused
}

func (b *Backend) setPaused(s *sandbox, m *pauseMarker) {
	b.mu.Lock()
	s.paused = m
	b.mu.Unlock()
}

// Pause implements runtime.Pauser.
func (b *Backend) Pause(ctx context.Context, id string, release bool) (runtime.PauseInfo, error) {
	start := time.Now()
	s, err := b.running(ctx, id)
	if err != nil {
		return runtime.PauseInfo{}, err
	}
	if release {
		if why := b.checkpointUnsupported(s); why != "" {
			return runtime.PauseInfo{}, fmt.Errorf("pause %s releasing its resources: %w: %s", id, errdefs.ErrNotImplemented, why)
		}
	}
	s.opMu.Lock()
	defer s.opMu.Unlock()
	if b.pausedOf(s) != nil {
		return runtime.PauseInfo{}, fmt.Errorf("pause %s: %w", id, runtime.ErrAlreadyPaused)
	}
	select {
	case <-s.done:
		return runtime.PauseInfo{}, errNotRunning(id)
	default:
	}
	if !release {
		if err := b.freeze(ctx, s); err != nil {
			return runtime.PauseInfo{}, fmt.Errorf("pause %s: %w", id, err)
		}
		m := &pauseMarker{At: time.Now().UTC()}
		if err := writeJSONAtomic(filepath.Join(s.dir, filePaused), m); err != nil {
			_ = b.thaw(ctx, s)
			return runtime.PauseInfo{}, fmt.Errorf("pause %s: %w", id, err)
		}
		b.setPaused(s, m)
		return runtime.PauseInfo{Took: time.Since(start)}, nil
	}
	unreserve, err := b.reserveCheckpoint(s, false)
	if err != nil {
		return runtime.PauseInfo{}, fmt.Errorf("pause %s: %w", id, err)
	}
	// Held until the image is counted as s's (its pause marker) or removed.
	defer unreserve()
	size, err := b.checkpoint(ctx, s)
	if err != nil {
		return runtime.PauseInfo{}, fmt.Errorf("pause %s: %w", id, err)
	}
	return runtime.PauseInfo{Released: true, Took: time.Since(start), CheckpointBytes: size}, nil
}

// checkpointUnsupported says why sandbox s cannot be checkpointed ("" if it can).
func (b *Backend) checkpointUnsupported(s *sandbox) string {
	if !s.rt.gvisor {
		return b.PauseSupport(s.rt.class).Why
	}
	if s.spec.Engine != nil {
		return "checkpoints of sandboxes running a Docker Engine are not implemented"
	}
	if s.spec.Multi() {
		return checkpointGroupUnsupported(s) // gvisor_group_pause.go
	}
	return ""
}

// checkpoint checkpoints running gVisor sandbox s (opMu held) into <dir>/checkpoint and
// ends its sentry; on an error the sandbox runs on as it was.
func (b *Backend) checkpoint(ctx context.Context, s *sandbox) (int64, error) {
	var (
		ck   *ckWait
		tmp  string
		held []*sandbox
		err  error
	)
	for attempt := 1; ; attempt++ {
		ck = &ckWait{next: make(chan ckNext, 1)}
		b.mu.Lock()
		s.ck = ck
		b.mu.Unlock()
		b.setGroupCk(s, true) // a group's members wait through it too
		tmp, held, err = b.saveImage(ctx, s, filepath.Join(s.dir, dirCheckpointTmp))
		if err == nil {
			break
		}
		b.mu.Lock()
		s.ck = nil
		b.mu.Unlock()
		if s.proc == nil || s.proc.exited() {
			ck.next <- ckNext{} // the sandbox did not survive: its watcher records the exit
			b.endGroupCk(s)
			return 0, err
		}
		b.endGroupCk(s) // a member that ended meanwhile records its exit now
		var me *errMemberEnded
		if !errors.As(err, &me) || attempt == saveAttempts {
			return 0, err
		}
		// The next checkpoint records it as ended (gvisor_group_pause.go).
		awaitMemberExit(ctx, me.m)
	}
	if err := b.writeCkMembers(s, held, tmp); err != nil {
		b.continueAfterSave(ctx, s, tmp)
		return 0, b.abandonCheckpoint(s, ck, err)
	}
	// The commit point: a complete checkpoint under its final name.
	final := filepath.Join(s.dir, dirCheckpoint)
	if err := os.RemoveAll(final); err != nil {
		b.continueAfterSave(ctx, s, tmp)
		return 0, b.abandonCheckpoint(s, ck, err)
	}
	if err := os.Rename(tmp, final); err != nil {
		b.continueAfterSave(ctx, s, tmp)
		return 0, b.abandonCheckpoint(s, ck, err)
	}
	syncDir(s.dir)
	failpoint.Hit("local.pause.renamed")
	size := dirBytes(final)
	m := &pauseMarker{Released: true, At: time.Now().UTC(), Bytes: size}
	if err := writeJSONAtomic(filepath.Join(s.dir, filePaused), m); err != nil {
		b.log.Warn("pause: write marker (the checkpoint itself says the sandbox is paused)", "sandbox", s.id, "err", err)
	}
	b.setPaused(s, m)
	failpoint.Hit("local.pause.marked")
	// The sentry ends; its watcher waits for Resume or Stop (ck).
	b.endCheckpointed(ctx, s)
	failpoint.Hit("local.pause.ended")
	return size, nil
}

// saveImage writes a checkpoint of running gVisor sandbox s into dir (made afresh),
// leaving its kernel paused; it returns dir and, for a group, the members the
// checkpoint holds (its other members had ended: dropEndedMembers). On an error s runs
// on; a group member that ended during the save is an *errMemberEnded.
func (b *Backend) saveImage(ctx context.Context, s *sandbox, dir string) (string, []*sandbox, error) {
	if err := os.RemoveAll(dir); err != nil {
		return "", nil, err
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return "", nil, err
	}
	fail := func(err error) (string, []*sandbox, error) {
		_ = os.RemoveAll(dir)
		return "", nil, err
	}
	if testImageDirHook != nil {
		if err := testImageDirHook(dir); err != nil {
			return fail(err)
		}
	}
	failpoint.Hit("local.pause.tmp")
	t := time.Now()
	held, err := b.dropEndedMembers(ctx, s)
	if err != nil {
		return fail(err)
	}
	running := append([]*sandbox{s}, held...)
	// Every container's agent (a group's: each has its own channel).
	resumeAll := func() {
		for _, c := range running {
			b.resumeAgent(ctx, c)
		}
		for _, c := range running {
			b.awaitAgent(ctx, c)
		}
	}
	if testSaveHook != nil {
		testSaveHook(s)
	}
	for _, c := range running {
		if err := b.suspendAgent(ctx, c); err != nil {
			if c.member && b.memberStopped(ctx, s, c) {
				// It ended since dropEndedMembers: see checkMembersRunning.
				running = slices.DeleteFunc(running, func(x *sandbox) bool { return x == c })
				resumeAll()
				return fail(&errMemberEnded{m: c})
			}
			resumeAll()
			if c.member {
				err = fmt.Errorf("container %q: %w", c.name, err)
			}
			return fail(err)
		}
	}
	failpoint.Hit("local.pause.suspended")
	b.step(ctx, "save: suspend agent", &t)
	if _, err := s.rt.run(ctx, "pause", s.cid); err != nil {
		resumeAll()
		return fail(err)
	}
	failpoint.Hit("local.pause.paused")
	b.step(ctx, "save: runsc pause", &t)
	if err := b.checkMembersRunning(ctx, s, held); err != nil {
		var me *errMemberEnded
		if errors.As(err, &me) {
			running = slices.DeleteFunc(running, func(c *sandbox) bool { return c == me.m })
		}
		b.continueContainers(ctx, s, running, "")
		return fail(err)
	}
	if _, err := s.rt.run(ctx, "checkpoint", "--leave-running", "--image-path="+dir, s.cid); err != nil {
		b.log.Warn("checkpoint failed", "sandbox", s.id, "err", err)
		b.continueContainers(ctx, s, running, "")
		if strings.Contains(err.Error(), "bound host socket") {
			// Not the agent's listener, as a rule: the agent says it is suspended only
			// once it has closed the listener and its connections, their descriptors are
			// closed and the children it was forking meanwhile (which hold copies until
			// their exec) have exec'd; a resume of an earlier suspension cannot reopen
			// it (agent/relisten.go). Each of those waits is bounded (2 s), so a fork
			// stalled longer between fork and exec would show here too. Otherwise a
			// process of the sandbox holds a unix socket bound on a host-backed path,
			// and retrying would not help.
			return fail(errors.New("runsc could not checkpoint the sandbox: a unix socket bound on a host-backed path (a volume, for one) is open in it"))
		}
		// The details (host paths, a goroutine dump) are for the log only.
		return fail(errors.New("runsc could not checkpoint the sandbox (the runner's log has the details)"))
	}
	failpoint.Hit("local.pause.saved")
	b.step(ctx, "save: runsc checkpoint", &t)
	return dir, held, nil
}

// testSaveHook, when set (tests), runs in saveImage once the ended members are dropped,
// before the agents are suspended and the kernel paused.
var testSaveHook func(s *sandbox)

// continueAfterSave resumes the paused kernel and the suspended agent of s after
// saveImage (removing image unless "").
func (b *Backend) continueAfterSave(ctx context.Context, s *sandbox, image string) {
	b.continueContainers(ctx, s, containersOf(s), image)
}

// continueContainers resumes the paused kernel of s and the suspended agents of
// containers cs (removing image unless "").
func (b *Backend) continueContainers(ctx context.Context, s *sandbox, cs []*sandbox, image string) {
	if image != "" {
		_ = os.RemoveAll(image)
	}
	for _, c := range cs {
		markResume(filepath.Join(shownDir(c.dir), dirRun))
	}
	if _, err := s.rt.run(ctx, "resume", s.cid); err != nil {
		b.log.Warn("checkpoint: resume the sandbox", "sandbox", s.id, "err", err)
	}
	for _, c := range cs {
		b.awaitAgent(ctx, c)
	}
}

func (b *Backend) abandonCheckpoint(s *sandbox, ck *ckWait, err error) error {
	b.mu.Lock()
	s.ck = nil
	b.mu.Unlock()
	if s.proc == nil || s.proc.exited() {
		ck.next <- ckNext{}
	}
	b.endGroupCk(s)
	return err
}

// endCheckpointed ends the sentry of checkpointed sandbox s and removes its runtime
// state and cgroups (its resources are free).
func (b *Backend) endCheckpointed(ctx context.Context, s *sandbox) {
	if s.proc != nil {
		_ = s.proc.signal(unix.SIGKILL)
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_ = s.proc.wait(wctx)
		cancel()
	}
	b.deleteGroupContainers(ctx, s)
	if _, err := s.rt.run(ctx, "delete", "--force", s.cid); err != nil && !notExist(err) {
		b.log.Warn("pause: delete the checkpointed container", "sandbox", s.id, "err", err)
	}
	b.removeSandboxCgroups(s)
}

// removeSandboxCgroups removes the cgroups of sandbox s (its sentry's: a group's
// is the sandbox's own, around its containers').
func (b *Backend) removeSandboxCgroups(s *sandbox) {
	if err := b.removeCgroups(s.cgroupRel()); err != nil {
		b.log.Warn("pause: remove cgroups", "sandbox", s.id, "err", err)
	}
	if len(s.members) > 0 {
		if err := b.removeCgroups(s.id); err != nil {
			b.log.Warn("pause: remove cgroups", "sandbox", s.id, "err", err)
		}
	}
}

// suspendAgent tells the agent of gVisor sandbox s to close its channel and waits until
// it has (agent.SuspendedFile in its state dir).
func (b *Backend) suspendAgent(ctx context.Context, s *sandbox) error {
	flag := filepath.Join(shownDir(s.dir), dirRun, agent.SuspendedFile)
	_ = os.Remove(flag)
	_ = os.Remove(filepath.Join(shownDir(s.dir), dirRun, agent.ResumeFile))
	if _, err := s.rt.run(ctx, "kill", s.cid, "USR1"); err != nil {
		return fmt.Errorf("suspend the agent: %w", err)
	}
	deadline := time.Now().Add(suspendTimeout)
	for wait := 200 * time.Microsecond; ; wait = min(2*wait, 10*time.Millisecond) {
		if fi, err := os.Lstat(flag); err == nil && fi.Mode().IsRegular() {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the agent did not suspend within %s", suspendTimeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
	}
}

// resumeFallback is how long a restored agent is given to find agent.ResumeFile before
// it is sent agent.ResumeSignal (an agent of a checkpoint made before it polled).
const resumeFallback = 250 * time.Millisecond

// markResume creates agent.ResumeFile in the agent state dir run (the host's side of
// it): a suspended agent that finds it listens again (agent/relisten.go). It is made
// before `runsc restore` and before a paused kernel continues, so the agent resumes
// without a signal sent through the runsc CLI.
func markResume(run string) {
	// O_EXCL|O_NOFOLLOW: the dir is sandbox-writable; an existing entry (a stale file,
	// or anything the sandbox put there) is removed first, never followed.
	p := filepath.Join(run, agent.ResumeFile)
	_ = os.Remove(p)
	if f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY|unix.O_NOFOLLOW, 0o644); err == nil {
		_ = f.Close()
	}
}

// waitRestoredAgent waits for the agent of s, restored suspended with agent.ResumeFile
// in place, to answer; one that does not within resumeFallback is sent
// agent.ResumeSignal.
func (b *Backend) waitRestoredAgent(ctx context.Context, s *sandbox) error {
	wctx, cancel := context.WithTimeout(ctx, resumeFallback)
	err := b.waitAgent(wctx, s)
	cancel()
	if err == nil || ctx.Err() != nil || errors.Is(err, agent.ErrIdentity) || (s.proc != nil && s.proc.exited()) {
		return err
	}
	b.resumeAgent(ctx, s)
	return b.waitAgent(ctx, s)
}

// resumeAgent tells the agent of gVisor sandbox s to listen again (agent.ResumeFile,
// which the signal needs too, and agent.ResumeSignal).
func (b *Backend) resumeAgent(ctx context.Context, s *sandbox) {
	markResume(filepath.Join(shownDir(s.dir), dirRun))
	if _, err := s.rt.run(ctx, "kill", s.cid, "USR2"); err != nil {
		b.log.Warn("resume the agent", "sandbox", s.id, "err", err)
	}
}

// Resume implements runtime.Pauser.
func (b *Backend) Resume(ctx context.Context, id string) (runtime.Info, error) {
	s, err := b.get(ctx, id)
	if err != nil {
		return runtime.Info{}, err
	}
	if err := waitReady(ctx, s); err != nil {
		return runtime.Info{}, err
	}
	s.opMu.Lock()
	defer s.opMu.Unlock()
	m := b.pausedOf(s)
	if m == nil {
		return runtime.Info{}, fmt.Errorf("resume %s: %w", id, runtime.ErrNotPaused)
	}
	if !m.Released {
		if err := b.thaw(ctx, s); err != nil {
			return runtime.Info{}, fmt.Errorf("resume %s: %w", id, err)
		}
		if err := os.Remove(filepath.Join(s.dir, filePaused)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			b.log.Warn("resume: remove marker", "sandbox", id, "err", err)
		}
		b.setPaused(s, nil)
		return b.infoOf(s), nil
	}
	if err := b.restore(ctx, s); err != nil {
		return runtime.Info{}, fmt.Errorf("resume %s: %w", id, err)
	}
	return b.infoOf(s), nil
}

func (b *Backend) infoOf(s *sandbox) runtime.Info {
	info := s.info.toInfo(s.id)
	if b.cfg.Network != nil {
		if a, err := b.cfg.Network.Lookup(s.cid); err == nil && a != nil && a.IP.IsValid() {
			info.IP = a.IP.String()
		}
	}
	return info
}

// restore restores checkpointed sandbox s (opMu held) from its checkpoint; on an error
// it stays checkpointed (ErrCheckpointLost when its checkpoint is unusable).
func (b *Backend) restore(ctx context.Context, s *sandbox) error {
	image := filepath.Join(s.dir, dirCheckpoint)
	if fi, err := os.Lstat(image); err != nil || !fi.IsDir() {
		return runtime.ErrCheckpointLost
	}
	t := time.Now()
	resuming := *b.pausedOf(s)
	resuming.Resuming = true
	if err := writeJSONAtomic(filepath.Join(s.dir, filePaused), &resuming); err != nil {
		return err
	}
	failpoint.Hit("local.resume.marked")
	b.step(ctx, "resume: marker", &t)
	pr, err := b.restoreSentry(ctx, s, image)
	t = time.Now()
	if err != nil {
		resuming.Resuming = false
		_ = writeJSONAtomic(filepath.Join(s.dir, filePaused), &resuming)
		return err
	}
	b.mu.Lock()
	ck := s.ck
	s.ck = nil
	s.paused = nil
	b.mu.Unlock()
	if ck != nil {
		ck.next <- ckNext{proc: pr}
	}
	b.handRestoredMembers(s)
	// The checkpoint first: a crash in between leaves the marker saying a resume was
	// under way, which loadPaused reads with the restored sentry alive as running.
	if err := os.RemoveAll(image); err != nil {
		b.log.Warn("resume: remove checkpoint", "sandbox", s.id, "err", err)
	}
	failpoint.Hit("local.resume.removed")
	if err := os.Remove(filepath.Join(s.dir, filePaused)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		b.log.Warn("resume: remove marker", "sandbox", s.id, "err", err)
	}
	b.step(ctx, "resume: cleanup", &t)
	return nil
}

// restoreSentry starts sandbox s (its bundle, network and dirs in place) from image and
// waits for its agent; s.proc and info.json then describe the restored sentry. On an
// error nothing of the restored sentry is left.
func (b *Backend) restoreSentry(ctx context.Context, s *sandbox, image string) (*proc, error) {
	t := time.Now()
	if len(s.info.CPUs) > 0 {
		if err := ensureCpusetParents(b.cfg.CgroupParent); err != nil {
			return nil, err
		}
	}
	out, err := os.OpenFile(filepath.Join(s.dir, fileAgentOut), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer out.Close()
	if b.cfg.Network != nil && !s.member {
		a, err := b.cfg.Network.Lookup(s.cid)
		if err != nil {
			return nil, fmt.Errorf("the sandbox's network: %w", err)
		}
		if err := readdAddress(a); err != nil {
			return nil, fmt.Errorf("the sandbox's network: %w", err)
		}
	}
	b.step(ctx, "resume: network", &t)
	pidFile := filepath.Join(s.dir, filePid)
	_ = os.Remove(pidFile)
	undo := func(err error) (*proc, error) {
		uctx := context.WithoutCancel(ctx)
		if len(s.members) > 0 { // the sentry first: a half-restored group's members wait in it
			if pid, perr := readPid(pidFile); perr == nil {
				if p, _ := openProc(pid, 0); p != nil {
					_ = p.signal(unix.SIGKILL)
					wctx, cancel := context.WithTimeout(uctx, 10*time.Second)
					_ = p.wait(wctx)
					cancel()
					p.close()
				}
			}
		}
		b.deleteGroupContainers(uctx, s)
		if _, derr := s.rt.run(uctx, "delete", "--force", s.cid); derr != nil && !notExist(derr) {
			b.log.Warn("restore: undo", "sandbox", s.id, "err", derr)
		}
		b.removeSandboxCgroups(s)
		return nil, err
	}
	markResume(filepath.Join(shownDir(s.dir), dirRun))
	// A group's sentry is restored with its limits: its members' restores follow.
	bundle, limits := b.bundle(s), (*cpuLimits)(nil)
	if len(s.members) == 0 {
		if bundle, limits, err = restoreBundle(bundle, filepath.Join(s.dir, restoreBundleDir)); err != nil {
			return undo(err)
		}
	}
	if err := b.bootRuntime(s.rt).restore(ctx, s.cid, bundle, image, pidFile, out); err != nil {
		return undo(err)
	}
	if err := applyCPULimits(limits); err != nil { // restorecpu.go
		return undo(err)
	}
	// A group's members, then (runsc restores the kernel once the last has come).
	if len(s.members) > 0 {
		failpoint.Hit("local.resume.root")
	}
	if err := b.restoreMembers(ctx, s, image); err != nil {
		return undo(err)
	}
	b.step(ctx, "resume: runsc restore", &t)
	pid, err := readPid(pidFile)
	if err != nil {
		return undo(err)
	}
	raw, err := openProc(pid, 0)
	if err != nil {
		return undo(fmt.Errorf("the restored sandbox: %w", err))
	}
	if raw == nil {
		return undo(fmt.Errorf("the restored sandbox is gone: %s", tailOf(filepath.Join(s.dir, fileAgentOut), 1024)))
	}
	pr := gvisorProc(s, raw)
	var oldMembers []*proc
	members := b.ckMembers(s)
	if len(members) > 0 {
		if oldMembers, err = b.attachRestoredMembers(s, members, pid); err != nil {
			_ = pr.signal(unix.SIGKILL)
			_ = pr.wait(context.WithoutCancel(ctx))
			pr.close()
			return undo(err)
		}
	}
	b.mu.Lock() // the watcher reads it under the lock (lifecycle.go)
	old := s.proc
	s.proc = pr
	b.mu.Unlock()
	oldInfo := s.info
	s.info.Pid, s.info.PidStart = pid, pr.start
	if err := writeJSONAtomic(filepath.Join(s.dir, fileInfo), &s.info); err != nil {
		b.log.Warn("restore: write info", "sandbox", s.id, "err", err)
	}
	failpoint.Hit("local.resume.restored")
	b.step(ctx, "resume: info", &t)
	err = b.waitRestoredAgent(ctx, s)
	for _, m := range members {
		if err != nil {
			break
		}
		if err = b.waitRestoredAgent(ctx, m); err != nil {
			err = fmt.Errorf("container %q: %w", m.name, err)
		}
	}
	if err != nil {
		_ = pr.signal(unix.SIGKILL)
		_ = pr.wait(context.WithoutCancel(ctx))
		pr.close()
		b.mu.Lock()
		s.proc = old
		for i, m := range members {
			m.proc.close()
			m.proc = oldMembers[i]
		}
		b.mu.Unlock()
		s.info = oldInfo
		_ = writeJSONAtomic(filepath.Join(s.dir, fileInfo), &s.info)
		return undo(err)
	}
	if old != nil {
		old.close()
	}
	for _, p := range oldMembers {
		if p != nil {
			p.close()
		}
	}
	failpoint.Hit("local.resume.agent")
	b.step(ctx, "resume: agent answers", &t)
	return pr, nil
}

// stopPaused ends paused sandbox s for Stop and Destroy: a frozen one is thawed (its
// processes then stop as a running sandbox's do); a checkpointed one's checkpoint is
// removed and its Wait returns "stopped while paused". It reports whether s was
// checkpointed (and is now ended).
func (b *Backend) stopPaused(ctx context.Context, s *sandbox) bool {
	s.opMu.Lock()
	defer s.opMu.Unlock()
	m := b.pausedOf(s)
	if m == nil {
		return false
	}
	if !m.Released {
		if err := b.thaw(ctx, s); err != nil {
			b.log.Warn("stop: thaw", "sandbox", s.id, "err", err)
		}
		_ = os.Remove(filepath.Join(s.dir, filePaused))
		b.setPaused(s, nil)
		return false
	}
	_ = os.RemoveAll(filepath.Join(s.dir, dirCheckpoint))
	b.stopGroupCk(s) // a group's members end first (the primary's end does not stop them)
	b.mu.Lock()
	ck := s.ck
	s.ck = nil
	s.paused = nil
	b.mu.Unlock()
	_ = os.Remove(filepath.Join(s.dir, filePaused))
	if ck != nil {
		ck.next <- ckNext{stopped: true}
	}
	<-s.done
	return true
}

// loadPaused sets up sandbox s, being loaded from its dir (info.json read), as what a
// pause, resume or fork that a crash may have cut short left. It reports whether s is
// checkpointed (its watcher is then to wait, s.proc nil):
//
//   - a half-written checkpoint (checkpoint.tmp, a fork's fork-*) is removed; a sentry
//     still there had its kernel paused and its agent suspended for it: both continue.
//   - a complete checkpoint and no live sentry: checkpointed. A live sentry is either
//     the one checkpointed (a crash before it was ended: it is ended now) or, when the
//     marker says a resume was under way, the restored one (running: the checkpoint is
//     removed and its agent told to listen).
//   - a marker of a checkpoint that is not there: lost; the sandbox is reported gone.
//   - a frozen sandbox's marker: it stays frozen.
func (b *Backend) loadPaused(s *sandbox) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	interrupted := false
	if ents, err := os.ReadDir(s.dir); err == nil {
		for _, e := range ents {
			if n := e.Name(); n == dirCheckpointTmp || strings.HasPrefix(n, "fork-") { // fork.go
				_ = os.RemoveAll(filepath.Join(s.dir, n))
				interrupted = true
			}
		}
	}
	var m pauseMarker
	hasMarker := readJSON(filepath.Join(s.dir, filePaused), &m) == nil
	ended := false
	if _, err := os.Stat(filepath.Join(s.dir, fileExit)); err == nil {
		ended = true
	}
	var alive *proc
	if s.info.Pid > 0 {
		alive, _ = openProc(s.info.Pid, s.info.PidStart)
		if alive != nil && alive.exited() {
			alive.close()
			alive = nil
		}
	}
	if alive != nil {
		defer alive.close()
	}
	image := filepath.Join(s.dir, dirCheckpoint)
	fi, err := os.Lstat(image)
	complete := err == nil && fi.IsDir()
	// A group's restore is done once its members run in the sentry (restoreSentry
	// records the primary's new sentry after theirs): a sentry that does not run them
	// all is one cut short, which the complete checkpoint replaces.
	restored := alive != nil && hasMarker && m.Resuming && (!complete || groupRestored(s, image))
	switch {
	case ended:
		if complete || hasMarker {
			_ = os.RemoveAll(image)
			_ = os.Remove(filepath.Join(s.dir, filePaused))
		}
		return false
	case restored:
		// Restored: running.
		for _, c := range containersOf(s) {
			b.resumeAgent(ctx, c)
			b.awaitAgent(ctx, c)
		}
		_ = os.Remove(filepath.Join(s.dir, filePaused))
		_ = os.RemoveAll(image)
		return false
	case complete:
		if alive != nil {
			_ = alive.signal(unix.SIGKILL)
			wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
			_ = alive.wait(wctx)
			wcancel()
		}
		b.deleteGroupContainers(ctx, s)
		if _, err := s.rt.run(ctx, "delete", "--force", s.cid); err != nil && !notExist(err) {
			b.log.Warn("recover: delete the checkpointed container", "sandbox", s.id, "err", err)
		}
		b.removeSandboxCgroups(s)
		b.loadGroupCk(s, image)
		if !hasMarker || !m.Released || m.Resuming {
			m = pauseMarker{Released: true, At: fi.ModTime().UTC(), Bytes: dirBytes(image)}
			_ = writeJSONAtomic(filepath.Join(s.dir, filePaused), &m)
		}
		s.paused = &m
		s.ck = &ckWait{next: make(chan ckNext, 1)}
		return true
	case hasMarker && m.Released:
		// Paused without a checkpoint: lost. The sandbox is reported as it is (gone).
		_ = os.Remove(filepath.Join(s.dir, filePaused))
		if alive == nil {
			ex := runtime.Exit{Reason: "CheckpointLost", Message: runtime.ErrCheckpointLost.Error(), At: time.Now().UTC()}
			_ = writeJSONAtomic(filepath.Join(s.dir, fileExit), &ex)
		}
		return false
	case interrupted && alive != nil:
		// A checkpoint cut short: the sandbox continues.
		if _, err := s.rt.run(ctx, "resume", s.cid); err != nil {
			b.log.Debug("recover: resume after an interrupted checkpoint", "sandbox", s.id, "err", err)
		}
		for _, c := range containersOf(s) {
			b.resumeAgent(ctx, c)
			b.awaitAgent(ctx, c)
		}
	case hasMarker:
		s.paused = &m // frozen
	}
	return false
}

// awaitAgent waits (a while) until the agent of s, told to listen again, answers.
func (b *Backend) awaitAgent(ctx context.Context, s *sandbox) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	fallback := time.Now().Add(resumeFallback)
	for {
		c, err := dialVerified(ctx, s.dir, s.ident)
		if err == nil {
			_ = c.Close()
			return
		}
		if !fallback.IsZero() && time.Now().After(fallback) {
			b.resumeAgent(ctx, s) // an agent that does not poll for agent.ResumeFile
			fallback = time.Time{}
		}
		select {
		case <-ctx.Done():
			b.log.Warn("the agent does not answer after an interrupted checkpoint", "sandbox", s.id, "err", err)
			return
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// freeze freezes sandbox s in place: its cgroup (a group's, holding its containers')
// with the cgroup freezer; a gVisor sandbox with `runsc pause`, which stops every task
// of its kernel (the sentry itself must go on answering runsc: `runsc list` and
// `runsc state` hang on a frozen sentry, and a restarted backend runs them).
func (b *Backend) freeze(ctx context.Context, s *sandbox) error {
	if s.rt.gvisor {
		_, err := s.rt.run(ctx, "pause", s.cid)
		return err
	}
	_, err := freezeCgroup(b.freezeCgroup(s))
	return err
}

// thaw undoes freeze.
func (b *Backend) thaw(ctx context.Context, s *sandbox) error {
	if s.rt.gvisor {
		if _, err := s.rt.run(ctx, "resume", s.cid); err != nil && !strings.Contains(err.Error(), "not paused") && !strings.Contains(err.Error(), "running") {
			return err
		}
		return nil
	}
	return thawCgroup(b.freezeCgroup(s))
}

// thawCgroup thaws the cgroup rel (below the cgroup root), v1 freezer or v2.
func thawCgroup(rel string) error {
	v1 := filepath.Join(cgroupRoot, "freezer", rel, "freezer.state")
	if _, err := os.Stat(v1); err == nil {
		if err := os.WriteFile(v1, []byte("THAWED"), 0); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("thaw: %w", err)
		}
		return nil
	}
	for _, v2 := range []string{filepath.Join(cgroupRoot, rel), filepath.Join(cgroupRoot, "unified", rel)} {
		if _, err := os.Stat(filepath.Join(v2, "cgroup.freeze")); err == nil {
			if err := os.WriteFile(filepath.Join(v2, "cgroup.freeze"), []byte("0"), 0); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("thaw: %w", err)
			}
			return nil
		}
	}
	return nil
}

// dirBytes is the allocated size of the files in dir (a checkpoint: flat).
func dirBytes(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return nil
		}
		if fi, err := d.Info(); err == nil {
			if st, ok := fi.Sys().(*syscall.Stat_t); ok {
				n += st.Blocks * 512
			} else {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}

func syncDir(dir string) {
	if f, err := os.Open(dir); err == nil {
		_ = f.Sync()
		f.Close()
	}
}

// isPaused reports whether sandbox id is paused (tracked, or per its marker).
func (b *Backend) isPaused(id string) bool {
	b.mu.Lock()
	s := b.sandboxes[id]
	b.mu.Unlock()
	if s != nil {
		return b.pausedOf(s) != nil
	}
	_, err := os.Lstat(filepath.Join(b.dir(id), filePaused))
	return err == nil
}
