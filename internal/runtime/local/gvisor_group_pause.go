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
//   - Only a group whose containers all run is checkpointed: a container that has ended
//     (a completed init container, a sidecar that gave up) is still counted by runsc's
//     save (its init process is kept until runsc deletes the container), and a restore
//     would have to register it again, which its ended state does not allow. Such a
//     group is refused (checkpointGroupUnsupported); freeze works for it.
//   - Forks of a group, and so exports (export.go), are refused (forkUnsupported).

// containersOf returns s and its members (a group's containers, the primary first).
func containersOf(s *sandbox) []*sandbox {
	return append([]*sandbox{s}, s.members...)
}

// checkpointGroupUnsupported says why gVisor group s cannot be checkpointed ("" if it
// can): every container must be running.
func checkpointGroupUnsupported(s *sandbox) string {
	if len(s.members) == 0 {
		return "the group's containers are not known (its creation did not finish)"
	}
	for _, m := range s.members {
		ended := m.proc == nil || m.proc.exited()
		select {
		case <-m.done:
			ended = true
		default:
		}
		if ended {
			return fmt.Sprintf("container %q of the group has ended: a checkpoint of a multi-container gVisor sandbox needs every container running (runsc's restore must register each container its save counted); pause without release (freeze) works", m.name)
		}
	}
	return ""
}

// setGroupCk sets (ck non-nil) or clears the checkpoint waits of s's members.
func (b *Backend) setGroupCk(s *sandbox, set bool) []*ckWait {
	var cks []*ckWait
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, m := range s.members {
		if set {
			m.ck = &ckWait{next: make(chan ckNext, 1)}
		} else if m.ck != nil {
			cks = append(cks, m.ck)
			m.ck = nil
		}
	}
	return cks
}

// endGroupCk tells the members' watchers what followed a checkpoint that did not take
// (the sentry gone with it: their exits; or it runs on: nothing) and clears their waits.
func (b *Backend) endGroupCk(s *sandbox) {
	gone := s.proc == nil || s.proc.exited()
	for _, ck := range b.setGroupCk(s, false) {
		if gone {
			ck.next <- ckNext{}
		}
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
	for _, m := range s.members {
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
func (b *Backend) attachRestoredMembers(s *sandbox, pid int) ([]*proc, error) {
	news := make([]*proc, len(s.members))
	for i := range s.members {
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
		news[i] = gvisorProc(s.members[i], pr)
	}
	olds := make([]*proc, len(s.members))
	b.mu.Lock()
	for i, m := range s.members {
		olds[i], m.proc = m.proc, news[i]
	}
	b.mu.Unlock()
	for i, m := range s.members {
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

// loadGroupCk sets up the members of checkpointed group s being loaded (no sentry):
// their watchers wait, as the primary's, for Resume or Stop.
func (b *Backend) loadGroupCk(s *sandbox) {
	for _, m := range s.members {
		if m.proc != nil {
			m.proc.close()
			m.proc = nil
		}
		m.ck = &ckWait{next: make(chan ckNext, 1)}
	}
}
