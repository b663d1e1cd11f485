package local

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
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
//   - A container that has ended (a completed init container, a sidecar that gave up)
//     would still be counted by runsc's save (its init process is kept until runsc
//     deletes the container), and a restore would have to register it again, which an
//     ended container cannot be. So it is deleted in runsc before the save
//     (dropEndedMembers); its exit and its agent's last status stay in its dir, so it
//     is reported as it was. The members the checkpoint holds are listed in it
//     (fileCkMembers, written before the checkpoint is committed); the restore
//     registers those. A member that ends between that deletion and the save (the
//     kernel is paused first) makes the checkpoint fail, the group running on.
//   - Forks of a group, and so exports (export.go, whose import is a fork), are refused
//     (errForkGroup): runsc's restore validates each container's spec against the one
//     in the checkpoint (runsc/specutils/restore.go), and among the annotations it
//     compares is dev.gvisor.spec.cgroup-parent, which for a group's root container
//     names the sentry's cgroup, the source sandbox's own (<CgroupParent>/<id>). A fork
//     (another id) is refused by runsc: `"Annotations" does not match across checkpoint
//     restore for container: "app", checkpoint map[...cgroup-parent:/<parent>/<source>]
//     restore map[...cgroup-parent:/<parent>/<fork>]`. Dropping the annotation would put
//     the sentry in the root container's own cgroup with the members' cgroups under it,
//     which cgroup v2 forbids for cgroups with controllers (see gvisor_group.go).

// errForkGroup is why a group is not forked (see above).
const errForkGroup = "forks of multi-container gVisor sandboxes are not possible with this runsc: " +
	"its restore requires each container's dev.gvisor.spec.cgroup-parent annotation to match the checkpoint's, " +
	"and a group's names the source sandbox's own cgroup (pause and resume of groups work)"

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
// its save counts only the running containers.
func (b *Backend) dropEndedMembers(ctx context.Context, s *sandbox) error {
	for _, m := range s.members {
		if !memberEnded(m) {
			continue
		}
		if _, err := s.rt.run(ctx, "delete", "--force", m.cid); err != nil && !notExist(err) {
			b.log.Warn("checkpoint: delete an ended container", "sandbox", s.id, "container", m.name, "err", err)
			return fmt.Errorf("container %q has ended and runsc could not delete it before the checkpoint", m.name)
		}
	}
	return nil
}

// checkMembersRunning reports an error if a member of s that the checkpoint is to hold
// is no longer running in runsc (its kernel paused: nothing changes from here on).
func (b *Backend) checkMembersRunning(ctx context.Context, s *sandbox) error {
	for _, m := range b.ckMembers(s) {
		st, err := s.rt.state(ctx, m.cid)
		if err == nil && st.Status != "running" && st.Status != "paused" {
			err = fmt.Errorf("it is %s", st.Status)
		}
		if err != nil {
			b.log.Warn("checkpoint: a container is not running", "sandbox", s.id, "container", m.name, "err", err)
			return fmt.Errorf("container %q ended during the checkpoint: try again", m.name)
		}
	}
	return nil
}

// writeCkMembers lists the members image (a checkpoint of group s, not yet committed)
// holds.
func (b *Backend) writeCkMembers(s *sandbox, image string) error {
	if len(s.members) == 0 {
		return nil
	}
	names := []string{}
	for _, m := range b.ckMembers(s) {
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
