package local

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1/agentv1connect"
	"github.com/sandboxd/sandboxd/internal/agent"
	"github.com/sandboxd/sandboxd/internal/agentconfig"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// Groups under gVisor: one runsc sandbox (one sentry, one user-space kernel) holds every
// container of a multi-container sandbox, through runsc's CRI multi-container support
// (the annotations below, runsc/specutils/cri.go). group.go drives them as it drives a
// runc group (held agents, startseq, restarts, the primary's exit, recovery, teardown);
// what differs is here:
//
//   - The primary is runsc's root container (container-type "sandbox"), the OCI id
//     being the sandbox id; it boots the sentry. Each other container is a subcontainer
//     (container-type "container", sandbox-id the primary's id) that `runsc run` starts
//     in that sentry, under the same container id as in a runc group (memberCID:
//     <id>.<name>). runsc knows every container by its id + "+" (runscID in gvisor.go:
//     runsc resolves ids as abbreviations, and <id> begins <id>.<name>); it takes ids
//     matching [\w+.-]+ of any length, and these are at most 63+1+63+1 characters.
//   - Network and hostname: the sentry has one network stack and one UTS namespace, so
//     every container shares them (localhost between containers) without joining
//     anything: the namespace paths a runc member joins are not put in a gVisor
//     member's spec. Without a network the sentry boots with --network=none, a
//     loopback-only stack (bootRuntime in gvisor.go), as a single container does.
//     PID, mount and IPC namespaces are each container's own inside the sentry.
//   - The agent channel: each container's agent listens itself on its own run dir's
//     socket, which that container's gofer creates on the host (--host-uds=create, as
//     for a single gVisor container; see gvisor.go): <member dir>/run/agent.sock.
//   - Resource limits: the sentry runs every container, so the host's cgroups cannot
//     tell them apart, and runsc does not enforce a subcontainer's limits (it makes an
//     empty cgroup for it, for tools to find). The group's total (Spec.TotalResources)
//     goes on the sentry's cgroup, the sandbox's own <CgroupParent>/<id> (runsc's
//     dev.gvisor.spec.cgroup-parent annotation); the containers' cgroups <id>/<name>
//     are runsc's empty ones. One container can use what another leaves unused, up to
//     the group's total: per-container limits are NOT enforced under gVisor.
//   - Exits: the pid runsc reports for any container is the sentry's. A member's exit is
//     `runsc wait <cid>` (per container) and its signals go through `runsc kill <cid>`
//     (gvContainer, each container's proc). The primary's agent is PID 1 of the sentry's
//     root PID namespace: when it exits, the sentry SIGKILLs every other process in it,
//     the members' included (pid_namespaces(7), which gVisor follows), and exits. So
//     the primary's agent does not exit when its main command has ended for good: it is
//     started with HoldExit (agentconfig), reports the end (its status; the backend
//     follows its Watch stream) and holds. Its proc's exit is that report; the watcher
//     then records the primary's exit and stops the members with their grace period
//     (SIGTERM, SIGKILL after memberGrace), as for runc, and only then ends the sentry
//     (endSentry: SIGKILL). A Stop sends every container SIGTERM at once, as for runc.
//     The sentry's own exit (a kill, a crash) still ends every container at once.
//   - The warm pool stays runc-only, and gVisor groups get no user namespace of the
//     backend's (the sentry is the boundary, as for a single gVisor container).

// runsc's CRI annotations (runsc/specutils/cri.go) and its cgroup parent annotation
// (runsc/container/container.go).
const (
	annoContainerType = "io.kubernetes.cri.container-type"
	annoSandboxID     = "io.kubernetes.cri.sandbox-id"
	annoContainerName = "io.kubernetes.cri.container-name"
	annoCgroupParent  = "dev.gvisor.spec.cgroup-parent"
	ctrTypeSandbox    = "sandbox"
	ctrTypeContainer  = "container"
)

// inGVisorGroup reports whether s is a container of a multi-container gVisor sandbox.
func (s *sandbox) inGVisorGroup() bool {
	return s.rt != nil && s.rt.gvisor && (s.member || s.spec.Multi())
}

// holdsExit reports whether s's agent holds after its main command ended (it is the
// primary of a gVisor group: see above).
func (s *sandbox) holdsExit() bool { return s.inGVisorGroup() && !s.member }

// gvisorGroupSpec adapts the OCI spec of a gVisor group's container s (see above).
func (b *Backend) gvisorGroupSpec(s *sandbox, sp *specs.Spec) {
	if !s.inGVisorGroup() {
		return
	}
	if sp.Annotations == nil {
		sp.Annotations = map[string]string{}
	}
	sp.Annotations[annoContainerName] = s.name
	if !s.member {
		sp.Annotations[annoContainerType] = ctrTypeSandbox
		sp.Annotations[annoSandboxID] = s.rt.runscID(s.cid)
		// The sentry goes into the sandbox's cgroup with the spec's resources (the
		// group's total: createGroup launches the primary with it); runsc makes the
		// primary's own cgroup, cgroupsPath, empty under it.
		sp.Annotations[annoCgroupParent] = b.cgroupsPath(s.id)
		return
	}
	sp.Annotations[annoContainerType] = ctrTypeContainer
	sp.Annotations[annoSandboxID] = s.rt.runscID(s.id) // the primary's
	for i := range sp.Linux.Namespaces {
		switch sp.Linux.Namespaces[i].Type {
		case specs.NetworkNamespace, specs.UTSNamespace, specs.UserNamespace:
			sp.Linux.Namespaces[i].Path = "" // the sentry's, shared by every container
		}
	}
	sp.Hostname = ""
	// runsc does not apply a subcontainer's resources (the sentry's cgroup has the
	// group's); none are written, so that none appear to be.
	sp.Linux.Resources = &specs.LinuxResources{Devices: sp.Linux.Resources.Devices}
}

// oomCgroupOf is the cgroup (below CgroupParent) whose OOM kills are s's: under gVisor
// a group's processes all live in the sentry, in the sandbox's own cgroup.
func (b *Backend) oomCgroupOf(s *sandbox) string {
	if s.inGVisorGroup() && !s.member {
		return s.id
	}
	return s.cgroupRel()
}

// gvContainer is a container of a gVisor group as a proc: pid and pidfd are the
// sentry's, the exit is the container's own. A member's exit is `runsc wait <cid>`
// (which returns when the container's init has exited), and its signals go through
// `runsc kill <cid>`. The primary's agent holds (agentconfig.Config.HoldExit): its
// exit is its agent's report that the main command has ended for good (Watch, or the
// status file), and the sentry is ended by endSentry once the members have stopped.
// Either way the sentry's exit is every container's.
type gvContainer struct {
	rt      *ociRuntime
	cid     string
	primary bool
	sentry  *proc         // the sentry's pidfd (the proc's f)
	gone    chan struct{} // closed when the sentry has exited (or the proc is closed)
	done    chan struct{}
	end     sync.Once
	cancel  context.CancelFunc
}

// gvisorProc makes the proc of s, a container of a gVisor group, from sentry, the
// sentry's pidfd (what runsc's pid file names); nil stays nil (the sandbox is gone), and
// any other sandbox's proc is sentry itself.
func gvisorProc(s *sandbox, sentry *proc) *proc {
	if sentry == nil || !s.inGVisorGroup() {
		return sentry
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &gvContainer{rt: s.rt, cid: s.cid, primary: !s.member, sentry: sentry,
		gone: make(chan struct{}), done: make(chan struct{}), cancel: cancel}
	go func() {
		_ = sentry.wait(ctx) // the sentry's end is every container's
		close(c.gone)
		c.ended()
	}()
	if c.primary {
		if st, _ := readStatus(s.dir); finalState(st) { // a sandbox loaded while its primary holds
			c.ended()
		}
		go c.watchAgent(ctx, s.dir, s.ident)
	} else {
		go c.waitExit(ctx)
	}
	return &proc{pid: sentry.pid, start: sentry.start, f: sentry.f, rc: sentry.rc, ctr: c}
}

func (c *gvContainer) ended() { c.end.Do(func() { close(c.done) }) }

// gvWatchRetry is how long the primary's watch waits before it dials its agent again
// (it is not listening yet, or no more) and rereads the status file.
const gvWatchRetry = 100 * time.Millisecond

// gvWatchMaxBytes bounds one status message from the primary's agent (the sandbox's).
const gvWatchMaxBytes = 64 << 10

// watchAgent ends the primary's proc once its agent reports the main command's final end
// (COMPLETED, FAILED or STOPPED): from its Watch stream, or from the status file it
// rewrites on every change (the agent stops serving when the command has ended).
func (c *gvContainer) watchAgent(ctx context.Context, dir string, ident *agentconfig.Identity) {
	defer c.ended()
	hc := agent.NewHTTPClient(func(ctx context.Context) (net.Conn, error) { return dialVerified(ctx, dir, ident) })
	defer hc.CloseIdleConnections()
	cl := agentv1connect.NewAgentServiceClient(hc, "http://sandbox-agent", connect.WithGRPC(), connect.WithReadMaxBytes(gvWatchMaxBytes))
	for {
		if st, _ := readStatus(dir); finalState(st) {
			return
		}
		if stream, err := cl.Watch(ctx, connect.NewRequest(&agentv1.WatchRequest{})); err == nil {
			for stream.Receive() {
				if finalState(stream.Msg()) {
					_ = stream.Close()
					return
				}
			}
			_ = stream.Close()
		}
		select {
		case <-ctx.Done():
			return
		case <-c.done:
			return
		case <-time.After(gvWatchRetry):
		}
	}
}

// finalState reports whether st is an agent's status after its main command has ended
// for good.
func finalState(st *agentv1.StatusResponse) bool { return agent.FinalState(st) }

// endSentry ends the sentry of gVisor group s once its primary's agent, held after the
// main command ended, is not needed: the members have stopped (the watcher) or are
// being killed (teardown). It SIGKILLs the sentry and waits, bounded, for its exit.
func endSentry(ctx context.Context, s *sandbox) {
	if s.proc == nil || s.proc.ctr == nil || !s.proc.ctr.primary {
		return
	}
	c := s.proc.ctr
	_ = c.sentry.signal(unix.SIGKILL)
	t := time.NewTimer(gvSignalTimeout)
	defer t.Stop()
	select {
	case <-c.gone:
	case <-ctx.Done():
	case <-t.C:
	}
}

// gvWaitRetries bounds how often a failed `runsc wait` is retried while runsc still
// reports the container running.
const gvWaitRetries = 20

// waitExit runs `runsc wait` until the container has exited. runsc wait also fails when
// it cannot reach the sentry for a moment: the container counts as ended only once
// runsc no longer reports it running.
func (c *gvContainer) waitExit(ctx context.Context) {
	defer c.ended()
	for try := 0; try < gvWaitRetries; try++ {
		if _, err := c.rt.run(ctx, "wait", c.cid); err == nil || ctx.Err() != nil {
			return
		}
		st, err := c.rt.state(ctx, c.cid)
		if err != nil || st.Status != "running" {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-c.done:
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (c *gvContainer) exited() bool {
	select {
	case <-c.done:
		return true
	default:
	}
	if c.sentry.exited() { // before its waiter has seen it (a sandbox just loaded)
		c.ended()
		return true
	}
	return false
}

func (c *gvContainer) wait(ctx context.Context) error {
	select {
	case <-c.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// gvSignalTimeout bounds one `runsc kill`.
const gvSignalTimeout = 10 * time.Second

// signal sends sig to the container's init (its agent, PID 1 of its PID namespace in
// the sentry: SIGKILL takes every process of the container along). SIGKILL to the
// primary goes to the sentry (as for a single gVisor container): it ends the group.
func (c *gvContainer) signal(sig unix.Signal) error {
	if c.primary && sig == unix.SIGKILL {
		return c.sentry.signal(sig)
	}
	if c.exited() {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), gvSignalTimeout)
	defer cancel()
	err := c.rt.kill(ctx, c.cid, strconv.Itoa(int(sig)))
	if err != nil && (c.exited() || notExist(err) || strings.Contains(err.Error(), "not running")) {
		return nil
	}
	return err
}

// close stops the waiters (the pidfd is the proc's to close).
func (c *gvContainer) close() { c.cancel() }

// state is `runsc state <cid>`.
func (r *ociRuntime) state(ctx context.Context, cid string) (containerState, error) {
	out, err := r.run(ctx, "state", cid)
	if err != nil {
		return containerState{}, err
	}
	var st containerState
	err = json.Unmarshal(out, &st)
	return st, err
}

// gvisorMemberGone reports whether runsc no longer knows gVisor member s after a failed
// `runsc delete --force`. Once the sentry has exited, runsc cannot delete a subcontainer
// cleanly: it still signals 0 to the sentry's pid, which a zombie answers until its
// parent (the host's init, for a sentry `runsc run --detach` left behind) reaps it, and
// then fails to reach the dead sentry's control socket. Its Destroy removes the
// container's state all the same, and the gofer has ended with the sentry; the cgroups
// are teardown's to remove.
func gvisorMemberGone(ctx context.Context, s *sandbox) bool {
	if !s.member || s.rt == nil || !s.rt.gvisor {
		return false
	}
	_, err := s.rt.state(ctx, s.cid)
	return err != nil && notExist(err)
}

// launchGVisorGroup creates the containers of gVisor group s: the primary first, as a
// single gVisor sandbox is made (its network, its volumes) but with the group's total
// resources on the sentry, then the members into its sentry, concurrently. They join
// no namespace by path (gvisorGroupSpec): what they share is the sentry's.
func (b *Backend) launchGVisorGroup(ctx context.Context, s *sandbox, spec *runtime.Spec, members []*sandbox, host string, held heldConfig, t *time.Time) error {
	_, att, err := b.launch(ctx, s, spec.PullCredentials, host, spec.TotalResources(), held(&spec.Container, s), t)
	if err != nil {
		return containerErr(s.name, err)
	}
	join := newJoinParams(nil)
	join.att = att
	close(join.ready)
	join.setVolumes(s.volumeRoots, nil)
	errs := make([]error, len(members))
	var wg sync.WaitGroup
	for i, m := range members {
		c, init := spec.Find(m.name)
		wg.Go(func() {
			if err := os.Mkdir(m.dir, 0o700); err != nil {
				errs[i] = containerErr(m.name, err)
				return
			}
			if s.fork != nil {
				// Known by now: the primary's restore waited for the source's checkpoint.
				if err := s.fork.wait(ctx); err != nil {
					errs[i] = containerErr(m.name, err)
					return
				}
				if _, ended := s.fork.completed[m.name]; ended || init {
					// A fork's container that had ended in the source before its
					// checkpoint (which does not hold it: a completed init container, a
					// sidecar that ended for good): recorded as it ended, never run again.
					if err := b.recordCompletedMember(ctx, s, m); err != nil { // gvisor_group_pause.go
						errs[i] = containerErr(m.name, err)
					}
					return
				}
			}
			m.join, m.fork = join, s.fork
			defer func() { m.join = nil }()
			mt := time.Now() // the member's own steps (a zero start would trace nonsense)
			if _, _, err := b.launch(ctx, m, c.PullCredentials, host, c.Resources, held(c, m), &mt); err != nil {
				errs[i] = containerErr(m.name, err)
				return
			}
			if s.fork == nil { // a fork's members are watched once restored (finishGroupFork)
				go b.watch(m, "Killed")
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}
