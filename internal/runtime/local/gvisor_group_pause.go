package local

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// Checkpoints of multi-container gVisor sandboxes (pause.go drives them; this is what a
// group adds). A group is one runsc sandbox: `runsc checkpoint` of its root container
// (the primary) saves the whole sentry, every container in it. The restore is runsc's
// multi-container restore (runsc/boot/restore.go): `runsc restore` of the root
// container starts the sentry and registers the root, then `runsc restore` of each
// subcontainer (same image path, the member's own bundle) registers it; the kernel is
// restored when the last of the containers the checkpoint counted has been registered.
// runsc matches the restored containers to the saved ones by their container names
// (the io.kubernetes.cri.container-name annotation: the spec's names), so a member keeps
// its own processes, root filesystem and agent.
//
//   - Every container's agent closes its channel before the save and listens again after
//     the restore (each has its own run dir, agent.ResumeFile, signals through
//     `runsc kill <cid>`).
//   - Every member's watcher, like the primary's, waits through the checkpoint (ck)
//     for the restored sentry (Resume) or "stopped while paused" (Stop).
//   - The group's volumes are the primary's (group.go): they stay in place as for a
//     single container, once for the whole group.
//   - A container that has ended (a completed init container, a sidecar that ended for
//     good: completed, or failed after its restart limit — its agent, the container's
//     init, has exited) would still be counted by runsc's save (its init process is
//     kept until runsc deletes the container), and a restore would have to register it
//     again, which an ended container cannot be. So it is deleted in runsc before the
//     save (dropEndedMembers); its exit and its agent's last status stay in its dir, so
//     it is reported as it was (and forks record it from there, see below). The members
//     the checkpoint holds are listed in it (fileCkMembers, written before the
//     checkpoint is committed); the restore registers those.
//   - No member is lost or run twice by ending during a checkpoint: saveImage reads once
//     (dropEndedMembers) which members have ended — a member has ended when its watcher
//     has recorded its exit (m.done closed; final: a container's agent restarts its
//     command itself and, once it exits, the container never runs again) — and that
//     reading is the checkpoint's: those are deleted and recorded, the others (held)
//     are to be in the image. The kernel is then paused (`runsc pause`: no container
//     changes state from there until the save is done), and every held member is
//     checked running in runsc (checkMembersRunning; one whose agent cannot be
//     suspended before the pause is checked likewise). One that ended between the
//     reading and the pause (its exit not yet recorded, perhaps in the image as a
//     stopped container) fails this checkpoint (errMemberEnded): the image is dropped,
//     the group runs on, its watcher records the exit (a Pause's checkpoint wait is
//     cleared for it: endGroupCk), and the checkpoint is taken again (saveAttempts),
//     this time with the member recorded as ended. A member that ends after the pause
//     (the kernel running again after a fork's save) is in the image as running: each
//     fork continues it from there and it ends there in its own time, as in the source;
//     it is not recorded (copyMemberRuns goes by the held list, not by what has ended
//     since).
//   - Forks of a group (fork.go): the sentry is checkpointed once (saveImage, the source
//     continuing after it), with a copy of every container's agent state dir
//     (copyMemberRuns), and each fork is made as a group is created (createGroup:
//     every container its own dir, bundle, overlay root, agent identity and cgroup;
//     the group's volumes made once by the primary, as writable snapshots of the
//     source's), but `runsc restore` of its root container (the sentry, into the fork's
//     own cgroup) then of each member takes the place of `runsc run` and the start
//     sequence (restoreGroupFork, finishGroupFork): the containers continue where the
//     source's were. Completed init containers (every group's, once it runs) and
//     sidecars that ended for good before the checkpoint are not in it: each fork
//     records them as they ended instead of launching them (recordCompletedMember: the
//     source's exit — an init container's exit code 0, a sidecar's exit code, reason,
//     message, restart count and finish time, bounded by endedExit — and a copy of its
//     agent state dir for its logs and last status, nothing run), and its sentry is
//     restored with the running containers only, as the checkpoint holds them.
//   - runsc's restore validates each container's spec against the one in the
//     checkpoint (runsc/specutils/restore.go, validateSpecs), annotations included,
//     and a group's root carries dev.gvisor.spec.cgroup-parent, the sentry's cgroup:
//     the source sandbox's own (<CgroupParent>/<id>), which a fork (another id) cannot
//     have. So a fork's restores run with --restore-spec-validation=warning
//     (restoreSpecValidation; runsc then logs the difference and goes on), and only a
//     fork's: a resume of the group itself is validated as before. This is safe
//     because of what that annotation and the validation are:
//       - The annotation is read by the host-side runsc only, where it starts the
//         sandbox (runsc/container/container.go, setupCgroupForRoot, for create, run
//         and restore alike): the sentry and gofer go into the cgroup it names, with
//         the restore spec's resources (the fork's group total), the containers'
//         cgroups (<id>/<name>) empty below it. The sentry never reads it (it is
//         compared by the validation only), so a fork's sentry runs in the fork's
//         cgroup under the fork's limits, and the source's cgroup is not touched.
//       - The validation is a consistency check of the caller's specs against the
//         checkpoint's, not an isolation boundary: what confines the restored sandbox
//         (the sentry's seccomp filter, namespaces, cgroup, gofer mounts, the network
//         namespace) is set up by the host runsc from the restore spec, which is ours;
//         the restored processes' own state (credentials, capabilities, argv, env) is
//         the checkpoint's, whatever the spec says. Its other checks are kept by our
//         own (groupForkMismatch, on every fork spec before anything is made): the
//         fork's containers are the source's (names and order, images, pinned by the
//         digests the checkpoint was taken on, commands, working dirs, security
//         settings, volume mounts, tmpfs) and its volumes the source's, so its OCI
//         specs are generated from the same inputs by the same code, and differ from
//         the source's where runsc lets them (ids, hostname, cgroups paths, mount
//         sources, namespace paths, environment, resources) and in that annotation.
//   - Exports of groups (export.go, whose import is a fork or a move on another runner):
//     the bundle carries each member's agent state dir and the members' names and image
//     digests, and the recorded exits of the completed init containers and of the
//     sidecars that had ended,
//     besides the sentry's image and the group's volumes (gvisor_group_export.go); the
//     import makes the group as a local fork is made.

// restoreSpecValidation is the runsc flag a fork of a group is restored with (see above).
const restoreSpecValidation = "--restore-spec-validation=warning"

// fileCkMembers, in a group's checkpoint, lists the members it holds.
const fileCkMembers = "sandboxd-members.json"

// memberEnded reports whether member m has ended (its exit recorded).
func memberEnded(m *sandbox) bool {
	select {
	case <-m.done:
		return true
	default:
		return false
	}
}

// containersOf returns s and its members that have not ended (a group's running
// containers, the primary first).
func containersOf(s *sandbox) []*sandbox {
	out := []*sandbox{s}
	for _, m := range s.members {
		if !memberEnded(m) {
			out = append(out, m)
		}
	}
	return out
}

// ckMembers returns the members of checkpointed group s that its checkpoint holds
// (their watchers wait for the restore).
func (b *Backend) ckMembers(s *sandbox) []*sandbox {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []*sandbox
	for _, m := range s.members {
		if m.ck != nil {
			out = append(out, m)
		}
	}
	return out
}

// checkpointGroupUnsupported says why gVisor group s cannot be checkpointed ("" if it
// can).
func checkpointGroupUnsupported(s *sandbox) string {
	if len(s.members) == 0 {
		return "the group's containers are not known (its creation did not finish)"
	}
	return ""
}

// dropEndedMembers deletes the ended members of group s in runsc (see above), so that
// its save counts only the running containers, and returns the others: the members
// the checkpoint is to hold (checked running once the kernel is paused,
// checkMembersRunning). Whether a member has ended is read here once (its watcher has
// recorded its exit: final), and that reading decides for the whole checkpoint: an
// ended member's checkpoint wait (Pause's) is cleared, its exit and agent state dir
// are what forks record.
func (b *Backend) dropEndedMembers(ctx context.Context, s *sandbox) ([]*sandbox, error) {
	var held, ended []*sandbox
	for _, m := range s.members {
		if memberEnded(m) {
			ended = append(ended, m)
		} else {
			held = append(held, m)
		}
	}
	b.mu.Lock()
	for _, m := range ended {
		m.ck = nil // its watcher is done (done closed): nothing waits on it
	}
	b.mu.Unlock()
	for _, m := range ended {
		if _, err := s.rt.run(ctx, "delete", "--force", m.cid); err != nil && !notExist(err) {
			b.log.Warn("checkpoint: delete an ended container", "sandbox", s.id, "container", m.name, "err", err)
			return nil, fmt.Errorf("container %q has ended and runsc could not delete it before the checkpoint", m.name)
		}
	}
	return held, nil
}

// errMemberEnded is a checkpoint of a group that did not take because member m, which
// it was to hold, ended between dropEndedMembers and the pause of the kernel: it may
// be in the image as a stopped container, and its exit is not yet recorded. The group
// runs on; once m's watcher has recorded its exit (awaitMemberExit) a new checkpoint
// records m as ended (saveAttempts).
type errMemberEnded struct{ m *sandbox }

func (e *errMemberEnded) Error() string {
	return fmt.Sprintf("container %q ended during the checkpoint: try again", e.m.name)
}

// saveAttempts bounds the checkpoints of a group tried when a member ends during one.
const saveAttempts = 3

// awaitMemberExit waits (bounded) until member m's exit is recorded.
func awaitMemberExit(ctx context.Context, m *sandbox) {
	t := time.NewTimer(10 * time.Second)
	defer t.Stop()
	select {
	case <-m.done:
	case <-ctx.Done():
	case <-t.C:
	}
}

// checkMembersRunning returns an *errMemberEnded if a member of s that the checkpoint
// is to hold (held) is no longer running in runsc (its kernel paused: nothing changes
// from here on).
func (b *Backend) checkMembersRunning(ctx context.Context, s *sandbox, held []*sandbox) error {
	for _, m := range held {
		st, err := s.rt.state(ctx, m.cid)
		if err == nil && st.Status != "running" && st.Status != "paused" {
			err = fmt.Errorf("it is %s", st.Status)
		}
		if err != nil {
			b.log.Warn("checkpoint: a container is not running", "sandbox", s.id, "container", m.name, "err", err)
			return &errMemberEnded{m: m}
		}
	}
	return nil
}

// memberStopped reports whether member m of s is no longer running in runsc.
func (b *Backend) memberStopped(ctx context.Context, s, m *sandbox) bool {
	st, err := s.rt.state(ctx, m.cid)
	return err != nil || (st.Status != "running" && st.Status != "paused")
}

// writeCkMembers lists the members image (a checkpoint of group s, not yet committed)
// holds.
func (b *Backend) writeCkMembers(s *sandbox, held []*sandbox, image string) error {
	if len(s.members) == 0 {
		return nil
	}
	names := []string{}
	for _, m := range held {
		names = append(names, m.name)
	}
	return writeJSONAtomic(filepath.Join(image, fileCkMembers), names)
}

// setGroupCk sets (ck non-nil) the checkpoint waits of s's running members, or clears
// those of all its members.
func (b *Backend) setGroupCk(s *sandbox, set bool) []*ckWait {
	var cks []*ckWait
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, m := range s.members {
		if set {
			if !memberEnded(m) {
				m.ck = &ckWait{next: make(chan ckNext, 1)}
			}
		} else if m.ck != nil {
			cks = append(cks, m.ck)
			m.ck = nil
		}
	}
	return cks
}

// endGroupCk clears the checkpoint waits of s's members after a checkpoint that did
// not take. Each watcher is told to carry on as without one: a member whose container
// ended meanwhile (or with the sentry) then records its exit; one still running is
// watched as before (the message stays unread).
func (b *Backend) endGroupCk(s *sandbox) {
	for _, ck := range b.setGroupCk(s, false) {
		ck.next <- ckNext{}
	}
}

// stopGroupCk ends the members of checkpointed group s for Stop and Destroy: their
// Waits say "stopped while paused".
func (b *Backend) stopGroupCk(s *sandbox) {
	for _, m := range s.members {
		b.mu.Lock()
		ck := m.ck
		m.ck = nil
		b.mu.Unlock()
		if ck != nil {
			ck.next <- ckNext{stopped: true}
			<-m.done
		}
	}
}

// deleteGroupContainers removes runsc's state of the members of s (checkpointed: the
// sentry is gone) and their cgroups; the primary's and the sandbox's are the caller's.
func (b *Backend) deleteGroupContainers(ctx context.Context, s *sandbox) {
	for _, m := range s.members {
		if _, err := s.rt.run(ctx, "delete", "--force", m.cid); err != nil && !notExist(err) && !gvisorMemberGone(ctx, m) {
			b.log.Warn("pause: delete a checkpointed container", "sandbox", s.id, "container", m.name, "err", err)
		}
		if err := b.removeCgroups(m.cgroupRel()); err != nil {
			b.log.Warn("pause: remove cgroups", "sandbox", s.id, "container", m.name, "err", err)
		}
	}
}

// restoreMembers registers the members of group s with the sentry being restored from
// image (`runsc restore` of each subcontainer, in the group's order); the last one
// starts the kernel's restore.
func (b *Backend) restoreMembers(ctx context.Context, s *sandbox, image string) error {
	for _, m := range b.ckMembers(s) {
		if err := func() error {
			out, err := os.OpenFile(filepath.Join(m.dir, fileAgentOut), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
			if err != nil {
				return err
			}
			defer out.Close()
			markResume(filepath.Join(shownDir(m.dir), dirRun))
			cmd := m.rt.command(ctx, "restore", "--detach", "--image-path="+image, "--bundle", b.bundle(m), m.rt.runscID(m.cid))
			cmd.Stdout, cmd.Stderr = out, out
			if err := cmd.Run(); err != nil {
				return fmt.Errorf("%s restore of container %q: %w: %s", m.rt.class, m.name, err, tailOf(out.Name(), 1024))
			}
			return nil
		}(); err != nil {
			return err
		}
	}
	return nil
}

// attachRestoredMembers gives each member of group s its proc on the restored sentry
// (pid) and records it in its info.json; it returns the members' old procs.
func (b *Backend) attachRestoredMembers(s *sandbox, members []*sandbox, pid int) ([]*proc, error) {
	news := make([]*proc, len(members))
	for i := range members {
		pr, err := openProc(pid, 0)
		if err != nil || pr == nil {
			for _, p := range news[:i] {
				p.close()
			}
			if err == nil {
				err = fmt.Errorf("the restored sandbox is gone")
			}
			return nil, err
		}
		news[i] = gvisorProc(members[i], pr)
	}
	olds := make([]*proc, len(members))
	b.mu.Lock()
	for i, m := range members {
		olds[i], m.proc = m.proc, news[i]
	}
	b.mu.Unlock()
	for i, m := range members {
		m.info.Pid, m.info.PidStart = pid, news[i].start
		if err := writeJSONAtomic(filepath.Join(m.dir, fileInfo), &m.info); err != nil {
			b.log.Warn("restore: write info", "sandbox", s.id, "container", m.name, "err", err)
		}
	}
	return olds, nil
}

// handRestoredMembers hands the members' watchers their restored procs.
func (b *Backend) handRestoredMembers(s *sandbox) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, m := range s.members {
		if m.ck != nil {
			m.ck.next <- ckNext{proc: m.proc}
			m.ck = nil
		}
	}
}

// loadGroupCk sets up the members of checkpointed group s being loaded (no sentry)
// from its checkpoint image: those it holds wait, as the primary, for Resume or Stop;
// the others had ended before it was taken (their exits are recorded).
func (b *Backend) loadGroupCk(s *sandbox, image string) {
	if len(s.members) == 0 {
		return
	}
	var names []string
	held := map[string]bool{}
	if err := readJSON(filepath.Join(image, fileCkMembers), &names); err == nil {
		for _, n := range names {
			held[n] = true
		}
	} else {
		for _, m := range s.members { // every member without a recorded exit
			if _, err := os.Stat(filepath.Join(m.dir, fileExit)); err != nil {
				held[m.name] = true
			}
		}
	}
	for _, m := range s.members {
		if m.proc != nil {
			m.proc.close()
			m.proc = nil
		}
		if held[m.name] {
			m.ck = &ckWait{next: make(chan ckNext, 1)}
		}
	}
}

// groupRestored reports whether the members of group s (being loaded) that its
// checkpoint image holds all run (loadMembers found them in runsc, on the recorded
// sentry); true for a single container.
func groupRestored(s *sandbox, image string) bool {
	if len(s.members) == 0 {
		return true
	}
	var names []string
	if err := readJSON(filepath.Join(image, fileCkMembers), &names); err != nil {
		return false
	}
	for _, n := range names {
		m := s.container(n)
		if m == nil || m == s || m.proc == nil || m.proc.exited() {
			return false
		}
	}
	return true
}

// groupForkUnsupported says why group s cannot be forked ("" if it can). Its containers
// that have ended (completed init containers, sidecars that ended for good) are no
// obstacle: each fork records them as they ended.
func (b *Backend) groupForkUnsupported(s *sandbox) string {
	if m := b.pausedOf(s); m != nil && m.Released {
		if _, _, err := checkpointedMemberRuns(s, filepath.Join(s.dir, dirCheckpoint)); err != nil {
			return err.Error()
		}
	}
	return ""
}

// isInitMember reports whether member m of group s is one of its init containers.
func isInitMember(s *sandbox, m *sandbox) bool {
	c, init := s.spec.Find(m.name)
	return c != nil && init
}

// completedMember is a container of a group a fork starts from that had ended before
// the checkpoint (a completed init container, a sidecar that ended for good): its
// recorded exit and (when known) its agent state dir (its logs and last status).
type completedMember struct {
	exit runtime.Exit
	run  string
}

// completedExit is the exit of a completed init container as a fork records it (a copy,
// exit code 0 required: an init container that did not complete would not have let the
// group start).
func completedExit(name string, ex runtime.Exit) (runtime.Exit, error) {
	if ex.ExitCode == nil || *ex.ExitCode != 0 {
		return runtime.Exit{}, fmt.Errorf("init container %q did not complete (exit code %v)", name, ex.ExitCode)
	}
	code := int32(0)
	ex.ExitCode = &code
	return ex.WithDefaultReason(), nil
}

// memberExit is the recorded exit of ended member m of group s as a fork records it:
// an init container's as completedExit, a sidecar's as endedExit.
func memberExit(s, m *sandbox, ex runtime.Exit) (runtime.Exit, error) {
	if isInitMember(s, m) {
		return completedExit(m.name, ex)
	}
	return endedExit(ex, time.Now()), nil // gvisor_group_export.go
}

// recordCompletedMember records member m of fork s, which had ended in the source
// before its checkpoint (s.fork.completed: an init container, a sidecar that ended for
// good), as ended as it was instead of launching it: its dir holds its exit and a copy
// of its agent state dir (its logs), nothing runs, and it ends at once.
func (b *Backend) recordCompletedMember(ctx context.Context, s, m *sandbox) error {
	if err := s.fork.wait(ctx); err != nil {
		return err
	}
	c, ok := s.fork.completed[m.name]
	if !ok {
		return fmt.Errorf("its exit is not recorded in the checkpoint")
	}
	ex, err := memberExit(s, m, c.exit)
	if err != nil {
		return err
	}
	if c.run != "" {
		run := filepath.Join(m.dir, dirRun)
		if err := os.Mkdir(run, 0o700); err != nil {
			return err
		}
		if err := copyRunDir(ctx, c.run, run); err != nil {
			return err
		}
	}
	if err := writeJSONAtomic(filepath.Join(m.dir, fileExit), &ex); err != nil {
		return err
	}
	b.mu.Lock()
	m.exit = ex
	b.mu.Unlock()
	close(m.done) // no watcher: it never runs in the fork (finishGroupFork skips it)
	return nil
}

// groupForkMismatch says how fork spec f differs from group spec src in what its
// containers' OCI specs are made of ("" if it does not): runsc's restore validation,
// which a fork of a group runs without, would have refused it (see above).
func groupForkMismatch(src, f *runtime.Spec) string {
	a, b := src.AllContainers(), f.AllContainers()
	if len(a) != len(b) {
		return fmt.Sprintf("%d containers, the source has %d", len(b), len(a))
	}
	for i := range a {
		x, y := a[i], b[i]
		_, xInit := src.Find(x.ContainerName())
		_, yInit := f.Find(y.ContainerName())
		switch {
		case x.ContainerName() != y.ContainerName() || xInit != yInit:
			return fmt.Sprintf("container %d is %q, the source's is %q", i, y.ContainerName(), x.ContainerName())
		case x.Image != y.Image:
			return fmt.Sprintf("container %q: image %q, the source's is %q", y.ContainerName(), y.Image, x.Image)
		case x.Command != y.Command || !slices.Equal(x.Args, y.Args) || x.WorkingDir != y.WorkingDir:
			return fmt.Sprintf("container %q: command, arguments or working dir not the source's", y.ContainerName())
		case !reflect.DeepEqual(x.Security, y.Security):
			return fmt.Sprintf("container %q: security settings not the source's", y.ContainerName())
		case !reflect.DeepEqual(x.VolumeMounts, y.VolumeMounts) || !slices.Equal(x.Tmpfs, y.Tmpfs):
			return fmt.Sprintf("container %q: volume mounts or tmpfs not the source's", y.ContainerName())
		}
	}
	if !reflect.DeepEqual(src.Volumes, f.Volumes) || !slices.Equal(src.HostAliases, f.HostAliases) {
		return "volumes or host aliases not the source's"
	}
	return ""
}

// memberDigests are the image digests of group s's members by name (nil for a single
// container).
func memberDigests(s *sandbox) map[string]string {
	if len(s.members) == 0 {
		return nil
	}
	out := map[string]string{}
	for _, m := range s.members {
		out[m.name] = m.info.ImageDigest
	}
	return out
}

// checkpointedMemberRuns returns the agent state dirs of checkpointed group s's members
// by name, as forks of its checkpoint image start from them, and the members that had
// ended before it was taken (not in it: their exits recorded in their dirs), as
// copyMemberRuns does for a running group.
func checkpointedMemberRuns(s *sandbox, image string) (map[string]string, map[string]completedMember, error) {
	var names []string
	if err := readJSON(filepath.Join(image, fileCkMembers), &names); err != nil {
		return nil, nil, fmt.Errorf("the group's checkpoint does not list its containers: %w", err)
	}
	held := map[string]bool{}
	for _, n := range names {
		held[n] = true
	}
	out := map[string]string{}
	done := map[string]completedMember{}
	for _, m := range s.members {
		run := filepath.Join(shownDir(m.dir), dirRun)
		if held[m.name] {
			out[m.name] = run
			continue
		}
		var ex runtime.Exit
		if err := readJSON(filepath.Join(m.dir, fileExit), &ex); err != nil {
			return nil, nil, fmt.Errorf("container %q is not in the checkpoint and its exit is not recorded: %w", m.name, err)
		}
		ex, err := memberExit(s, m, ex)
		if err != nil {
			return nil, nil, err
		}
		done[m.name] = completedMember{exit: ex, run: run}
	}
	return out, done, nil
}

// copyMemberRuns copies the agent state dirs of running group s's members (its kernel
// paused after the checkpoint into image, which holds the members held) next to image,
// for its forks; cleanups gets what removes them. The members not held had ended before
// the save (dropEndedMembers: their exits recorded, final) and are returned with their
// exits. A member held that has ended since (after the kernel was checked paused with it
// running) is in the checkpoint: each fork continues it from there, as the source does.
func (b *Backend) copyMemberRuns(ctx context.Context, s *sandbox, image string, held []*sandbox, cleanups *[]func()) (map[string]string, map[string]completedMember, error) {
	out := map[string]string{}
	done := map[string]completedMember{}
	for _, m := range s.members {
		ended := !slices.Contains(held, m)
		var ex runtime.Exit
		if ended {
			if !memberEnded(m) { // dropEndedMembers left out only ended members
				return nil, nil, fmt.Errorf("container %q is not in the checkpoint and has not ended", m.name)
			}
			var err error
			if ex, err = memberExit(s, m, m.exit); err != nil {
				return nil, nil, err
			}
		}
		run := image + "-run." + m.name
		if err := os.Mkdir(run, 0o700); err != nil {
			return nil, nil, err
		}
		*cleanups = append(*cleanups, func() { _ = os.RemoveAll(run) })
		if err := copyRunDir(ctx, filepath.Join(shownDir(m.dir), dirRun), run); err != nil {
			return nil, nil, fmt.Errorf("container %q: %w", m.name, err)
		}
		if ended {
			done[m.name] = completedMember{exit: ex, run: run}
		} else {
			out[m.name] = run
		}
	}
	return out, done, nil
}

// forkDigest is the image digest container s of a fork must have ("": any).
func (s *sandbox) forkDigest() string {
	if s.member {
		return s.fork.memberDigests[s.name]
	}
	return s.fork.digest
}

// forkRun is the agent state dir container s of a fork starts from (after fork.wait).
func (s *sandbox) forkRun() string {
	if s.member {
		return s.fork.members[s.name]
	}
	return s.fork.run
}

// restoreGroupFork is the runtime step of container s of a fork of a group (launch,
// with its bundle, pid file and agent state dir run): its agent's state is the
// source's container's, and `runsc restore` registers it with the fork's sentry, the
// root container first (it starts the sentry: launchGVisorGroup launches it before the
// members), then each member, one at a time (mu); the last one restores the kernel.
// The containers' procs and agents follow once all are restored (finishGroupFork).
func (b *Backend) restoreGroupFork(ctx context.Context, s *sandbox, bundle, pidFile, run string, out *os.File, mu *sync.Mutex) error {
	if err := s.fork.wait(ctx); err != nil {
		return err
	}
	if err := copyRunDir(ctx, s.forkRun(), run); err != nil {
		return err
	}
	markResume(run) // restored suspended (pause.go); it re-reads its identity
	rt := *b.bootRuntime(s.rt)
	rt.extra = append(slices.Clone(rt.extra), restoreSpecValidation)
	if !s.member {
		return rt.restore(ctx, s.cid, bundle, s.fork.image, pidFile, out)
	}
	mu.Lock()
	defer mu.Unlock()
	cmd := rt.command(ctx, "restore", "--detach", "--image-path="+s.fork.image, "--bundle", bundle, rt.runscID(s.cid))
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s restore of container %q: %w: %s", rt.class, s.name, err, tailOf(out.Name(), 1024))
	}
	return nil
}

// finishGroupFork gives the containers of fork s (every one restored) their procs on the
// restored sentry, starts the members' watchers and waits for every agent. On an error
// the caller tears s down; the sentry is killed first (its members wait in it).
func (b *Backend) finishGroupFork(ctx context.Context, s *sandbox) (err error) {
	pidFile := filepath.Join(s.dir, filePid)
	defer func() {
		if err != nil {
			killSentry(ctx, pidFile)
		}
	}()
	pid, err := readPid(pidFile)
	if err != nil {
		return err
	}
	raw, err := openProc(pid, 0)
	if err != nil {
		return fmt.Errorf("the restored sandbox: %w", err)
	}
	if raw == nil {
		return fmt.Errorf("the restored sandbox is gone: %s", tailOf(filepath.Join(s.dir, fileAgentOut), 1024))
	}
	b.mu.Lock()
	s.proc = gvisorProc(s, raw)
	b.mu.Unlock()
	s.info.Pid, s.info.PidStart = pid, raw.start
	running := containersOf(s)[1:] // an ended member (recordCompletedMember) is recorded, not restored
	if _, err := b.attachRestoredMembers(s, running, pid); err != nil {
		return err
	}
	for _, m := range running {
		go b.watch(m, "Killed")
	}
	if err := b.waitRestoredAgent(ctx, s); err != nil {
		return err
	}
	for _, m := range running {
		if err := b.waitRestoredAgent(ctx, m); err != nil {
			return fmt.Errorf("container %q: %w", m.name, err)
		}
	}
	return nil
}

// killSentry SIGKILLs the sentry named by pidFile, if any, and waits (bounded) for it.
func killSentry(ctx context.Context, pidFile string) {
	pid, err := readPid(pidFile)
	if err != nil {
		return
	}
	if p, _ := openProc(pid, 0); p != nil {
		_ = p.signal(unix.SIGKILL)
		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		_ = p.wait(wctx)
		cancel()
		p.close()
	}
}
