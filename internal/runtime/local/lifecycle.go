package local

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/encoding/protojson"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/internal/agent"
	"github.com/sandboxd/sandboxd/internal/agentconfig"
	"github.com/sandboxd/sandboxd/internal/failpoint"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

const cgroupRoot = "/sys/fs/cgroup"

// watch is one goroutine per sandbox parked in the netpoller on the init's pidfd: it
// records the Exit before anything can remove the cgroup or the status file.
func (b *Backend) watch(s *sandbox, lost string) {
	var ex runtime.Exit
	for {
		b.mu.Lock()
		p := s.proc
		b.mu.Unlock()
		if p != nil {
			_ = p.wait(context.Background())
		}
		b.mu.Lock()
		ck, cur := s.ck, s.proc
		b.mu.Unlock()
		if ck == nil {
			if cur != p && cur != nil {
				continue // resumed before this watcher looked (pause.go)
			}
			break
		}
		// Checkpointed (pause.go): the sentry's end is no exit. Wait for what follows.
		next := <-ck.next
		if next.stopped {
			ex = runtime.Exit{Reason: "Stopped", Message: "stopped while paused", At: time.Now().UTC()}
			if err := writeJSONAtomic(filepath.Join(s.dir, fileExit), &ex); err != nil && !errors.Is(err, fs.ErrNotExist) {
				b.log.Warn("record exit", "sandbox", s.id, "err", err)
			}
			s.exit = ex
			close(s.done)
			return
		}
		if next.proc == nil {
			break // the checkpoint failed and took the sandbox with it: an exit
		}
		// Resumed: s.proc is the restored sentry.
	}
	if err := readJSON(filepath.Join(s.dir, fileExit), &ex); err != nil {
		ex = b.computeExit(s, lost)
		if err := writeJSONAtomic(filepath.Join(s.dir, fileExit), &ex); err != nil && !errors.Is(err, fs.ErrNotExist) {
			b.log.Warn("record exit", "sandbox", s.id, "err", err)
		}
	}
	if len(s.members) > 0 {
		// The primary's exit ends a group: its other containers stop before Wait returns.
		b.stopMembers(context.Background(), s, memberGrace)
		endSentry(context.Background(), s) // a gVisor group's primary holds until now
	}
	s.exit = ex
	close(s.done)
}

// computeExit reads how the sandbox ended: the agent's final status (main command exit
// code, restarts, reason) and the memory cgroup's OOM kill count. lost is the reason when
// the agent left no final status (it was killed, or the container vanished).
func (b *Backend) computeExit(s *sandbox, lost string) runtime.Exit {
	ex := runtime.Exit{At: time.Now().UTC()}
	oom, _ := b.oomKills(b.oomCgroupOf(s))
	st, _ := readStatus(s.dir)
	limit := s.spec.Container.RestartLimit
	// status.json is the sandbox's to write: its restarts within the container's limit
	// whatever its state, and a final one held to what its agent could say.
	ex.Restarts = int(agent.BoundRestarts(st.GetRestartCount(), limit))
	st = agent.BoundFinal(st, limit, s.info.StartedAt, ex.At)
	final := st != nil
	if final {
		ex.Restarts = int(st.GetRestartCount())
		if st.ExitCode != nil {
			c := st.GetExitCode()
			ex.ExitCode = &c
		}
		ex.Reason, ex.Message = st.GetReason(), st.GetMessage()
		if st.FinishedAt != nil {
			ex.At = st.FinishedAt.AsTime()
		}
	}
	if !final {
		ex.Reason = lost
		switch lost {
		case "Vanished":
			ex.Message = "the container is gone and its agent left no final status"
		default:
			ex.Message = "the sandbox's agent was killed before the main command ended"
		}
	}
	if oom > 0 && (!final || (ex.ExitCode != nil && *ex.ExitCode == 128+int32(unix.SIGKILL))) {
		ex.Reason = "OOMKilled"
		ex.Message = fmt.Sprintf("memory limit exceeded: the kernel killed %d process(es)", oom)
	}
	return ex.WithDefaultReason()
}

// readStatus reads the agent's last status from the run dir of the sandbox in dir (which
// the sandbox can write: read without following anything, bounded).
func readStatus(dir string) (*agentv1.StatusResponse, error) {
	b, err := readSandboxFile(dir, shownRel(dir)+dirRun+"/"+agentconfig.StatusFile, maxStatusBytes)
	if err != nil {
		return nil, err
	}
	var st agentv1.StatusResponse
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(b, &st); err != nil {
		return nil, err
	}
	return &st, nil
}

// OOMKills returns how many processes the kernel's OOM killer has killed in the sandbox's
// memory cgroup so far (cgroup v1 memory.oom_control, or v2 memory.events).
func (b *Backend) OOMKills(id string) (int, error) {
	if !validID(id) {
		return 0, fmt.Errorf("%w: %q", runtime.ErrNotFound, id)
	}
	b.mu.Lock()
	s := b.sandboxes[id]
	b.mu.Unlock()
	if s != nil {
		n, err := b.oomKills(b.oomCgroupOf(s))
		for _, m := range s.members { // a group: every container's
			k, _ := b.oomKills(m.cgroupRel())
			n += k
		}
		return n, err
	}
	var pi persistedInfo
	if err := readJSON(filepath.Join(b.dir(id), fileInfo), &pi); err == nil && pi.Cgroup != "" {
		return b.oomKills(pi.Cgroup)
	}
	return b.oomKills(b.containerID(id))
}

// containerID maps a sandbox id to its container's id (they differ for a sandbox that
// claimed a pooled container).
func (b *Backend) containerID(id string) string {
	b.mu.Lock()
	s := b.sandboxes[id]
	var cid string
	if s != nil {
		cid = s.cid
	}
	b.mu.Unlock()
	if cid != "" {
		return cid
	}
	var pi persistedInfo
	if err := readJSON(filepath.Join(b.dir(id), fileInfo), &pi); err == nil && pi.ContainerID != "" {
		return pi.ContainerID
	}
	return id
}

// oomKills counts the OOM kills in the cgroup rel (below CgroupParent).
func (b *Backend) oomKills(cgroup string) (int, error) {
	rel := filepath.Join(b.cfg.CgroupParent, cgroup)
	if data, err := os.ReadFile(filepath.Join(cgroupRoot, "memory", rel, "memory.oom_control")); err == nil {
		return parseCounter(data, "oom_kill")
	}
	data, err := os.ReadFile(filepath.Join(cgroupRoot, rel, "memory.events"))
	if err != nil {
		return 0, fmt.Errorf("%w: no memory cgroup for %s", runtime.ErrNotFound, cgroup)
	}
	return parseCounter(data, "oom_kill")
}

func parseCounter(data []byte, key string) (int, error) {
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		f := bytes.Fields(sc.Bytes())
		if len(f) == 2 && string(f[0]) == key {
			return strconv.Atoi(string(f[1]))
		}
	}
	return 0, nil
}

// get returns the tracked sandbox id, loading it from its dir if this Backend has not
// seen it yet (the runner may call Wait or Destroy before Recover).
func (b *Backend) get(ctx context.Context, id string) (*sandbox, error) {
	if !validID(id) {
		return nil, fmt.Errorf("%w: %q", runtime.ErrNotFound, id)
	}
	b.mu.Lock()
	s := b.sandboxes[id]
	b.mu.Unlock()
	if s != nil {
		return s, nil
	}
	s, err := b.load(id, nil)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	if cur := b.sandboxes[id]; cur != nil { // lost a race with another loader
		b.mu.Unlock()
		if s.proc != nil {
			s.proc.close()
		}
		return cur, nil
	}
	b.sandboxes[id] = s
	b.mu.Unlock()
	b.startWatch(s, "Vanished")
	return s, nil
}

// load reads a sandbox from its dir. With states (from the runtime's list) a container
// the runtime does not know or reports stopped is not reopened.
func (b *Backend) load(id string, states map[string]containerState) (*sandbox, error) {
	dir := b.dir(id)
	s := &sandbox{id: id, cid: id, dir: dir, ready: make(chan struct{}), done: make(chan struct{})}
	close(s.ready)
	if err := readJSON(filepath.Join(dir, fileSpec), &s.spec); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("%w: %s", runtime.ErrNotFound, id)
		}
		return nil, err
	}
	rt, _, err := b.runtimeFor(s.spec.RuntimeClass)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", id, err)
	}
	s.rt = rt
	if s.spec.Multi() {
		s.cgroup = id + "/" + s.spec.ContainerName() // see group.go
	}
	if err := readJSON(filepath.Join(dir, fileInfo), &s.info); err != nil {
		// Create never finished: there is no container to wait for.
		s.info.RuntimeClass = rt.class
		return s, nil
	}
	if s.info.ContainerID != "" {
		s.cid = s.info.ContainerID
	}
	s.ident = s.info.Agent
	s.cpus = s.info.CPUs
	if s.info.Cgroup != "" {
		s.cgroup = s.info.Cgroup
	}
	if s.spec.Multi() {
		if err := b.loadMembers(s, states); err != nil {
			return nil, err
		}
	}
	if b.loadPaused(s) {
		return s, nil // checkpointed: no sentry (pause.go)
	}
	if states != nil {
		if st, ok := states[s.cid]; !ok || st.Status == "stopped" || st.Pid != s.info.Pid {
			return s, nil
		}
	}
	pr, err := openProc(s.info.Pid, s.info.PidStart)
	if err != nil {
		for _, m := range s.members {
			if m.proc != nil {
				m.proc.close()
			}
		}
		return nil, err
	}
	s.proc = gvisorProc(s, pr)
	return s, nil
}

// waitReady waits for a Create of s in progress to finish.
func waitReady(ctx context.Context, s *sandbox) error {
	select {
	case <-s.ready:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Wait implements runtime.Backend.
func (b *Backend) Wait(ctx context.Context, id string) (runtime.Exit, error) {
	s, err := b.get(ctx, id)
	if err != nil {
		return runtime.Exit{}, err
	}
	select {
	case <-s.done:
		return s.exit, nil
	case <-ctx.Done():
		return runtime.Exit{}, ctx.Err()
	}
}

// Stop implements runtime.Backend: SIGTERM to the agent (PID 1 forwards it to the main
// command), SIGKILL after grace. With a private PID namespace, SIGKILL to its init takes
// every process in it along, so no `runc kill --all` (and its ~10 ms exec) is needed.
func (b *Backend) Stop(ctx context.Context, id string, grace time.Duration) error {
	s, err := b.get(ctx, id)
	if err != nil {
		return err
	}
	if err := waitReady(ctx, s); err != nil {
		return err
	}
	if b.stopPaused(ctx, s) {
		return nil // checkpointed: Wait says "stopped while paused"
	}
	select {
	case <-s.done:
		return nil
	default:
	}
	for _, m := range s.members {
		if m.proc != nil {
			_ = m.proc.signal(unix.SIGTERM) // a group's containers stop together
		}
	}
	if err := b.terminate(ctx, s); err != nil {
		return fmt.Errorf("stop %s: %w", id, err)
	}
	if grace > 0 {
		timer := time.NewTimer(grace)
		defer timer.Stop()
		select {
		case <-s.done:
			return nil
		case <-timer.C:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if err := b.killMembers(ctx, s); err != nil {
		return fmt.Errorf("stop %s: %w", id, err)
	}
	return b.kill(ctx, s)
}

// terminate sends SIGTERM to the agent: through the pidfd of the container's init for
// runc; for gVisor, whose init pid on the host is the sentry's, through `runsc kill`.
func (b *Backend) terminate(ctx context.Context, s *sandbox) error {
	if s.proc == nil {
		return nil
	}
	if s.rt.gvisor {
		err := s.rt.kill(ctx, s.cid, "TERM")
		if err != nil && (s.proc.exited() || notExist(err) || strings.Contains(err.Error(), "not running")) {
			return nil
		}
		return err
	}
	return s.proc.signal(unix.SIGTERM)
}

// kill SIGKILLs the container and waits for the watcher to have recorded the exit.
func (b *Backend) kill(ctx context.Context, s *sandbox) error {
	select {
	case <-s.done:
		return nil
	default:
	}
	if s.proc != nil {
		if err := s.proc.signal(unix.SIGKILL); err != nil {
			return fmt.Errorf("kill %s: %w", s.id, err)
		}
	}
	select {
	case <-s.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Destroy implements runtime.Backend. It is idempotent: a sandbox that is already gone is
// not an error.
func (b *Backend) Destroy(ctx context.Context, id string) error {
	s, err := b.get(ctx, id)
	if errors.Is(err, runtime.ErrNotFound) {
		if validID(id) {
			// A dir without spec.json is a Create that died before writing it.
			if _, serr := os.Stat(b.dir(id)); serr == nil {
				return b.teardownUnknown(ctx, id, "")
			}
		}
		return nil
	}
	if err != nil {
		return err
	}
	if err := waitReady(ctx, s); err != nil {
		return err
	}
	if s.failed {
		return nil // a failed Create, undone already
	}
	b.stopPaused(ctx, s) // thawed, or the checkpoint's end recorded
	if err := b.killMembers(ctx, s); err != nil {
		return err
	}
	if err := b.kill(ctx, s); err != nil {
		return err
	}
	if err := b.teardown(ctx, s); err != nil {
		return err
	}
	b.mu.Lock()
	if b.sandboxes[id] == s {
		delete(b.sandboxes, id)
	}
	b.mu.Unlock()
	return nil
}

// teardownUnknown tears down sandbox id from what its dir still says: a Create that
// died before its spec was complete, or a sandbox that cannot be loaded. class is the
// runtime class if known.
func (b *Backend) teardownUnknown(ctx context.Context, id, class string) error {
	rt, _, err := b.runtimeFor(class)
	if err != nil {
		rt, _, _ = b.runtimeFor("")
	}
	cid := id
	var pi persistedInfo
	if readJSON(filepath.Join(b.dir(id), fileInfo), &pi) == nil && pi.ContainerID != "" && isPoolID(pi.ContainerID) {
		cid = pi.ContainerID
	}
	cgroup := pi.Cgroup
	var spec runtime.Spec
	if cgroup == "" && readJSON(filepath.Join(b.dir(id), fileSpec), &spec) == nil && spec.Multi() {
		cgroup = id + "/" + spec.ContainerName() // a group whose Create died before info.json
	}
	return b.teardown(ctx, &sandbox{id: id, cid: cid, dir: b.dir(id), rt: rt, cgroup: cgroup})
}

// teardown removes everything of a sandbox whose processes are gone (or never started):
// runtime state, cgroups, overlay, network, files. Every step tolerates "already gone",
// and the whole is driven by what the host shows (the sweep, sweep.go) as well as by
// the sandbox's files, so it also finishes a Create or a teardown that a crash cut short
// at any step.
func (b *Backend) teardown(ctx context.Context, s *sandbox) error {
	failpoint.Hit("local.teardown.begin")
	var errs []error
	group, err := b.teardownMembers(ctx, s)
	if err != nil {
		errs = append(errs, err)
	}
	if s.proc != nil {
		// Create's undo path: the container may have started.
		if !s.proc.exited() {
			_ = s.proc.signal(unix.SIGKILL)
			_ = s.proc.wait(ctx)
		}
		endSentry(ctx, s)
	}
	if err := s.rt.delete(ctx, s.cid); err != nil {
		// A container that never got as far as running, or whose pid we never learnt.
		if _, ferr := s.rt.run(ctx, "delete", "--force", s.cid); ferr != nil && !notExist(ferr) && !gvisorMemberGone(ctx, s) {
			errs = append(errs, err)
		}
	}
	failpoint.Hit("local.teardown.container")
	if err := b.removeCgroups(s.cgroupRel()); err != nil {
		errs = append(errs, err)
	}
	if group {
		if err := b.removeCgroups(s.id); err != nil { // the sandbox's, once its containers' are gone
			errs = append(errs, err)
		}
	}
	failpoint.Hit("local.teardown.cgroups")
	bundle := b.bundle(s)
	rootfs := b.rootfs(bundle, s.cid)
	umountErr := errors.Join(unmountAll(rootfs), unmountAll(filepath.Join(bundle, "rootfs")), detachLowers(s.dir), unmountAll(filepath.Join(s.dir, dirSysfs)),
		teardownVolumes(s.dir), unmountAll(filepath.Join(s.dir, dirDisk))) // after the overlay, whose upper dir it holds
	failpoint.Hit("local.teardown.unmounted")
	if umountErr == nil {
		// Whatever else is mounted there (a step the code above does not know), and the
		// loop devices of disk images no mount holds (a crash between attach and mount).
		umountErr = unmountUnder(rootfs, s.dir)
		if left := detachLoopsUnder(s.dir); len(left) > 0 {
			b.log.Warn("destroy: loop devices still attached; they detach when their filesystem is last unmounted elsewhere",
				"sandbox", s.id, "devices", left)
		}
	}
	if umountErr != nil {
		errs = append(errs, umountErr)
	}
	if !s.member && !isPoolID(s.id) {
		// The sandbox's disk volumes in the volume pool (its captures are not its own).
		if err := b.vols.removeSandbox(s.id, s.spec.ID == "" || hasDiskVolume(&s.spec)); err != nil {
			errs = append(errs, err)
		}
	}
	ids, hasIDs, _ := readIDRange(s.dir)
	if b.cfg.Network != nil && !s.member {
		if err := b.cfg.Network.Teardown(s.cid); err != nil {
			errs = append(errs, fmt.Errorf("network teardown: %w", err))
		}
	}
	failpoint.Hit("local.teardown.network")
	if umountErr == nil {
		if err := os.RemoveAll(s.dir); err != nil {
			errs = append(errs, err)
		} else if hasIDs && b.ids != nil {
			b.ids.release(ids)
		}
		if isPoolID(s.cid) {
			if err := os.RemoveAll(bundle); err != nil {
				errs = append(errs, err)
			}
		}
		if b.rootfsBase != "" {
			if err := os.Remove(rootfs); err != nil && !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, err)
			}
		}
	}
	if s.proc != nil {
		s.proc.close()
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("destroy %s: %w", s.id, err)
	}
	return nil
}

// removeCgroups removes the sandbox's cgroup in every hierarchy the runtime left it in.
func (b *Backend) removeCgroups(id string) error {
	ents, err := os.ReadDir(cgroupRoot)
	if err != nil {
		return nil
	}
	dirs := []string{filepath.Join(cgroupRoot, b.cfg.CgroupParent, id)} // pure cgroup v2
	for _, e := range ents {
		if e.IsDir() || e.Type()&fs.ModeSymlink != 0 {
			dirs = append(dirs, filepath.Join(cgroupRoot, e.Name(), b.cfg.CgroupParent, id))
		}
	}
	// A container whose start was cut short can still have processes in its cgroups:
	// kill them, and give the kernel a moment to let go of the cgroups.
	var errs []error
	for attempt := 0; ; attempt++ {
		errs = errs[:0]
		busy := false
		for _, d := range dirs {
			if err := unix.Rmdir(d); err != nil && !errors.Is(err, unix.ENOENT) {
				busy = busy || errors.Is(err, unix.EBUSY)
				errs = append(errs, fmt.Errorf("remove cgroup %s: %w", d, err))
			}
		}
		if !busy || attempt == 40 {
			return errors.Join(errs...)
		}
		for _, d := range dirs {
			killCgroupProcs(d)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// killCgroupProcs sends SIGKILL to every process in the cgroup at dir.
func killCgroupProcs(dir string) {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return
	}
	for f := range strings.FieldsSeq(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil && pid > 1 {
			_ = unix.Kill(pid, unix.SIGKILL)
		}
	}
}
