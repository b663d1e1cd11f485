package local

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/types/known/durationpb"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1/agentv1connect"
	"github.com/sandboxd/sandboxd/internal/agent"
	"github.com/sandboxd/sandboxd/internal/agentconfig"
	"github.com/sandboxd/sandboxd/internal/failpoint"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/startseq"
)

// Multi-container sandboxes (a runtime.Spec with sidecars or init containers) run as a
// group of OCI containers, one per container of the spec, each with its own image, overlay
// root, cgroup and sandbox-agent as PID 1 (its own socket, identity, config and run dir):
//
//   - The primary is the sandbox's own container, in <StateDir>/<id> as a single
//     container is; the others ("members") live in <StateDir>/<id>/c/<name> (host-only,
//     like the rest of the sandbox's dir), under the OCI container id <id>.<name> (a
//     sandbox id has no dot, so no sandbox can collide with it).
//   - Cgroups: one per sandbox, <CgroupParent>/<id>, with one per container in it,
//     <CgroupParent>/<id>/<name>. No process sits in the sandbox's own cgroup, which
//     cgroup v2 requires of a cgroup with children that have controllers.
//   - Namespaces: the backend makes the group's UTS, network (without an attachment)
//     and, with user namespaces, user namespace before any container (groupns.go), and
//     every container joins them: they reach each other on localhost and share the
//     hostname. With user namespaces the containers join the group's user namespace
//     when it owns the network namespace (no host network: ports below 1024 work
//     there), else each gets a user namespace of its own with the same mapping (the
//     network's namespace is the host's, which a joined user namespace could not
//     enter). Either way the same IDs own the shared files. PID, mount, IPC and cgroup
//     namespaces are each container's own.
//   - Volumes are made once, by the primary, and bind-mounted into every container that
//     lists them; /etc/hosts of every container maps spec.HostAliases to 127.0.0.1.
//   - Start: all containers are created concurrently with their agents in standby (the
//     warm pool's mechanism: serving, nothing running); the members wait for the
//     primary's volumes before they mount them. Then
//     startseq.Run starts them (the agent's Start with the container's config) in the
//     order the spec asks: init containers one by one, each to exit 0, then the others
//     as their depends_on conditions hold.
//   - The primary's exit ends the sandbox: its watcher stops the members (SIGTERM, then
//     SIGKILL after memberGrace) before Wait returns. A member whose main command exits
//     non-zero is restarted by its agent within its RestartLimit, like a main command.
//
// Under gVisor the group is one runsc sandbox: see gvisor_group.go for what differs.

// dirMembers holds a group's members' dirs in the sandbox's dir.
const dirMembers = "c"

// memberGrace is how long a group's members get to stop after the primary ended.
const memberGrace = 10 * time.Second

func memberCID(id, name string) string  { return id + "." + name }
func memberDir(dir, name string) string { return filepath.Join(dir, dirMembers, name) }

// memberSpec is the single-container spec a member launches with: its container, the
// group's volumes and host aliases.
func memberSpec(group *runtime.Spec, c *runtime.Container) runtime.Spec {
	cc := group.Clone()
	return runtime.Spec{ID: group.ID, RuntimeClass: group.RuntimeClass, Container: c.Clone(),
		Volumes: cc.Volumes, HostAliases: cc.HostAliases}
}

// newMember is the tracked (not yet launched) member c of group sandbox s.
func newMember(s *sandbox, c *runtime.Container) *sandbox {
	return &sandbox{
		id: s.id, cid: memberCID(s.id, c.Name), dir: memberDir(s.dir, c.Name), rt: s.rt,
		cgroup: s.id + "/" + c.Name, name: c.Name, member: true, spec: memberSpec(&s.spec, c),
		ready: closedChan(), done: make(chan struct{}),
		egressCADir: s.egressCADir, // the group's egress CA, mounted in every container
	}
}

func closedChan() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}

// groupMembers makes the members of s (its spec is multi-container): init containers,
// then sidecars.
func groupMembers(s *sandbox) []*sandbox {
	var out []*sandbox
	for _, c := range s.spec.AllContainers() {
		if c != &s.spec.Container {
			out = append(out, newMember(s, c))
		}
	}
	return out
}

// member returns s's container called name ("" or the primary's name: s itself).
func (s *sandbox) container(name string) *sandbox {
	if name == "" || name == s.spec.ContainerName() {
		return s
	}
	for _, m := range s.members {
		if m.name == name {
			return m
		}
	}
	return nil
}

// createGroup creates the containers of multi-container sandbox s (registered, its dir
// made) and runs the start sequence. On error the caller tears s (and its members) down.
func (b *Backend) createGroup(ctx context.Context, s *sandbox, spec *runtime.Spec, t *time.Time) error {
	id := s.id
	// Every image at once: the launches below find them pulled (or being pulled).
	for _, c := range spec.AllContainers() {
		if c != &spec.Container {
			go func(ref string, creds *runtime.Credentials) { _, _ = b.cfg.Images.Pull(ctx, ref, creds) }(c.Image, c.PullCredentials)
		}
	}
	members := groupMembers(s)
	b.mu.Lock()
	s.name = spec.ContainerName()
	s.cgroup = id + "/" + s.name
	s.members = members
	b.mu.Unlock()
	if err := os.Mkdir(filepath.Join(s.dir, dirMembers), 0o700); err != nil {
		return fmt.Errorf("create sandbox %s: %w", id, err)
	}
	held := func(c *runtime.Container, cs *sandbox) func(*Image) (*agentconfig.Config, error) {
		return func(img *Image) (*agentconfig.Config, error) {
			cfg, err := containerAgentConfig(c, id, img)
			if err != nil {
				return nil, fmt.Errorf("container %q: %w", c.ContainerName(), err)
			}
			cfg.HoldExit = cs.holdsExit() // gvisor_group.go
			cs.held, cs.secretEnv = cfg, c.SecretEnv
			return &agentconfig.Config{Standby: true, Hostname: cfg.Hostname}, nil
		}
	}
	host := runtime.Hostname(id)
	launch := b.launchRuncGroup
	if s.rt.gvisor {
		launch = b.launchGVisorGroup // gvisor_group.go
	}
	if err := launch(ctx, s, spec, members, host, held, t); err != nil {
		if s.fork != nil {
			// A fork's sentry, restored half (its members wait in it), ends first.
			killSentry(ctx, filepath.Join(s.dir, filePid))
		}
		return err
	}
	failpoint.Hit("local.group.primary")
	b.step(ctx, "members", t)
	failpoint.Hit("local.group.members")
	if s.fork != nil {
		// A fork (gvisor_group_pause.go): its containers continue the source's, started.
		if err := b.finishGroupFork(ctx, s); err != nil {
			return fmt.Errorf("sandbox %s: %w", id, err)
		}
		b.step(ctx, "fork: agents", t)
	} else if err := startseq.Run(ctx, spec, &groupOps{b: b, s: s}); err != nil {
		return fmt.Errorf("sandbox %s: %w", id, err) // a *startseq.Failure names the container
	}
	failpoint.Hit("local.group.started")
	if err := writeJSONAtomic(filepath.Join(s.dir, fileInfo), &s.info); err != nil {
		return err
	}
	failpoint.Hit("local.group.info")
	b.step(ctx, "started", t)
	return nil
}

// heldConfig makes a container's held (standby) agent config, keeping its real one in cs.
type heldConfig = func(c *runtime.Container, cs *sandbox) func(*Image) (*agentconfig.Config, error)

// launchRuncGroup creates the containers of runc group s: the group's namespaces are made
// up front (groupns.go) and every container, the primary included, is created at once.
func (b *Backend) launchRuncGroup(ctx context.Context, s *sandbox, spec *runtime.Spec, members []*sandbox, host string, held heldConfig, t *time.Time) error {
	id := s.id
	join := newJoinParams(nil)
	if b.ids != nil {
		// The group's ID range, recorded in the primary's dir (freed with it) before any
		// container starts: every container maps it.
		r, err := b.ids.alloc(s.dir)
		if err != nil {
			return fmt.Errorf("sandbox %s: %w", id, err)
		}
		failpoint.Hit("local.create.idrange")
		join.ids = &r
	}
	// The shared namespaces are set up while the containers' launches make their dirs;
	// each waits for them (and a member for the primary's volumes) before it needs them.
	go func() {
		join.err = b.setupGroupNS(ctx, s, join, host)
		close(join.ready)
	}()
	defer func() {
		<-join.ready
		join.ns.close() // the containers hold the namespaces now (or none is left)
	}()
	all := append([]*sandbox{s}, members...)
	errs := make([]error, len(all))
	var wg sync.WaitGroup
	for i, m := range all {
		c := &spec.Container
		if m != s {
			c, _ = spec.Find(m.name)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if m != s {
				if err := os.Mkdir(m.dir, 0o700); err != nil {
					errs[i] = containerErr(m.name, err)
					return
				}
			}
			m.join = join
			defer func() { m.join = nil }()
			now := time.Now()
			lt := &now
			if m == s {
				defer join.setVolumes(nil, errPrimaryFailed) // unless published
				lt = t                                       // the steps traced are the primary's
			}
			if _, _, err := b.launch(ctx, m, c.PullCredentials, host, c.Resources, held(c, m), lt); err != nil {
				errs[i] = containerErr(m.name, err)
				return
			}
			if m != s {
				go b.watch(m, "Killed")
			}
		}()
	}
	wg.Wait()
	if join.err != nil {
		return fmt.Errorf("sandbox %s: %w", id, join.err)
	}
	if errs[0] != nil {
		return errs[0] // the members' errors only say that the primary's launch failed
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return nil
}

// containerErr names the container an error of a group's Create is about.
func containerErr(name string, err error) error {
	return fmt.Errorf("container %q: %w", name, err)
}

// groupOps is startseq.Ops over a group's containers, all created with held agents.
type groupOps struct {
	b *Backend
	s *sandbox
}

func (g *groupOps) find(name string) (*sandbox, error) {
	c := g.s.container(name)
	if c == nil {
		return nil, fmt.Errorf("%w: %q", runtime.ErrContainerNotFound, name)
	}
	return c, nil
}

// Start sends the container its config: the agent writes its files and starts the main
// command. What /.sandboxd/config.json shows inside becomes that config too.
func (g *groupOps) Start(ctx context.Context, name string) error {
	c, err := g.find(name)
	if err != nil {
		return err
	}
	return g.b.startHeld(ctx, c)
}

// startHeld sends held container c its config (c.held, with c.secretEnv over its
// environment) through the agent's channel, then writes what /.sandboxd/config.json shows
// inside: the config without the secret environment, which is in no file (docs/secrets.md).
func (b *Backend) startHeld(ctx context.Context, c *sandbox) error {
	startJSON, shownJSON, err := startConfigs(c.held, c.secretEnv)
	if err != nil {
		return err
	}
	// As the pool's Start: the identity was set at creation.
	if err := startAgent(ctx, nil, c.dir, c.ident, startJSON); err != nil {
		return fmt.Errorf("start: %w (agent output: %s)", err, tailOf(filepath.Join(c.dir, fileAgentOut), 512))
	}
	b.mu.Lock()
	c.secretEnv = nil // the agent has them; this process keeps no copy
	b.mu.Unlock()
	return writeInPlace(filepath.Join(shownDir(c.dir), fileAgentConfig), shownJSON)
}

// startConfigs are the agent config cfg as Start sends it (secretEnv merged over its
// environment) and as the config file shows it (without secretEnv).
func startConfigs(cfg *agentconfig.Config, secretEnv map[string]string) (start, shown []byte, err error) {
	shown, err = json.Marshal(cfg)
	if err != nil || len(secretEnv) == 0 {
		return shown, shown, err
	}
	withSecrets := *cfg
	withSecrets.Env = agentconfig.MergeEnv(cfg.Env, secretEnv)
	start, err = json.Marshal(&withSecrets)
	return start, shown, err
}

// Exec runs argv in container name through its agent (probes).
func (g *groupOps) Exec(ctx context.Context, name string, argv []string, timeout time.Duration) (int, error) {
	c, err := g.find(name)
	if err != nil {
		return 0, err
	}
	hc := agent.NewHTTPClient(func(ctx context.Context) (net.Conn, error) { return dialVerified(ctx, c.dir, c.ident) })
	defer hc.CloseIdleConnections()
	cl := agentv1connect.NewAgentServiceClient(hc, "http://sandbox-agent", connect.WithGRPC())
	req := &agentv1.ExecRequest{Command: argv, MaxOutputBytes: 4096}
	if timeout > 0 {
		req.Timeout = durationpb.New(timeout)
	}
	resp, err := cl.Exec(ctx, connect.NewRequest(req))
	if err != nil {
		return 0, err
	}
	return int(resp.Msg.GetExitCode()), nil
}

// Wait waits for container name's main command to have ended for good (its agent exits
// then) and returns its exit code.
func (g *groupOps) Wait(ctx context.Context, name string) (int32, error) {
	c, err := g.find(name)
	if err != nil {
		return 0, err
	}
	var ex runtime.Exit
	if c == g.s {
		// The primary's watcher starts when Create returns: poll its pidfd (a wait with a
		// context would leave a read deadline on it for the watcher).
		for c.proc != nil && !c.proc.exited() {
			select {
			case <-ctx.Done():
				return 0, ctx.Err()
			case <-time.After(20 * time.Millisecond):
			}
		}
		ex = g.b.computeExit(c, "Killed")
	} else {
		select {
		case <-c.done:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
		ex = c.exit
	}
	if ex.ExitCode == nil {
		return 0, fmt.Errorf("container %q ended without an exit code: %s: %s", name, ex.Reason, ex.Message)
	}
	return *ex.ExitCode, nil
}

// stopMembers stops s's members: SIGTERM, SIGKILL after grace; it returns once they
// have all ended.
func (b *Backend) stopMembers(ctx context.Context, s *sandbox, grace time.Duration) {
	var wg sync.WaitGroup
	for _, m := range s.members {
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case <-m.done:
				return
			default:
			}
			if m.proc != nil {
				_ = m.proc.signal(unix.SIGTERM)
			}
			if grace > 0 {
				timer := time.NewTimer(grace)
				defer timer.Stop()
				select {
				case <-m.done:
					return
				case <-timer.C:
				case <-ctx.Done():
				}
			}
			if err := b.kill(ctx, m); err != nil {
				b.log.Warn("stop container", "sandbox", s.id, "container", m.name, "err", err)
			}
		}()
	}
	wg.Wait()
}

// startWatch starts the watchers of a loaded sandbox s and of its members.
func (b *Backend) startWatch(s *sandbox, lost string) {
	for _, m := range s.members {
		go b.watch(m, lost)
	}
	go b.watch(s, lost)
}

// loadMembers loads the members of group sandbox s (loaded from its dir). With states
// (the runtime's list) a container the runtime does not run is not reopened.
func (b *Backend) loadMembers(s *sandbox, states map[string]containerState) error {
	s.name = s.spec.ContainerName()
	if s.cgroup == "" {
		s.cgroup = s.id + "/" + s.name
	}
	s.members = groupMembers(s)
	for _, m := range s.members {
		var pi persistedInfo
		if err := readJSON(filepath.Join(m.dir, fileInfo), &pi); err != nil {
			continue // never started
		}
		m.info, m.ident, m.cpus = pi, pi.Agent, pi.CPUs
		if states != nil {
			if st, ok := states[m.cid]; !ok || st.Status == "stopped" || st.Pid != pi.Pid {
				continue
			}
		}
		pr, err := openProc(pi.Pid, pi.PidStart)
		if err != nil {
			for _, m := range s.members {
				if m.proc != nil {
					m.proc.close()
				}
			}
			return err
		}
		m.proc = gvisorProc(m, pr)
	}
	return nil
}

// membersOf returns the members of s to tear down: those tracked, or for a sandbox known
// only from its dir, those whose dirs are there.
func (b *Backend) membersOf(s *sandbox) []*sandbox {
	if s.members != nil {
		return s.members
	}
	ents, err := os.ReadDir(filepath.Join(s.dir, dirMembers))
	if err != nil {
		return nil
	}
	var out []*sandbox
	for _, e := range ents {
		name := e.Name()
		if !e.IsDir() || !validID(name) {
			continue
		}
		out = append(out, &sandbox{id: s.id, cid: memberCID(s.id, name), dir: memberDir(s.dir, name), rt: s.rt,
			cgroup: s.id + "/" + name, name: name, member: true})
	}
	return out
}

// teardownMembers tears down s's members (before the primary: they hold its volumes
// and namespaces) and reports whether s is a group.
func (b *Backend) teardownMembers(ctx context.Context, s *sandbox) (bool, error) {
	if s.member {
		return false, nil
	}
	ms := b.membersOf(s)
	group := s.cgroup != "" && s.cgroup != s.cid || len(ms) > 0
	var errs []error
	for _, m := range ms {
		if err := b.teardown(ctx, m); err != nil {
			errs = append(errs, err)
		}
	}
	return group, errors.Join(errs...)
}

// killMembers SIGKILLs s's members and waits for their exits to be recorded.
func (b *Backend) killMembers(ctx context.Context, s *sandbox) error {
	var errs []error
	for _, m := range s.members {
		errs = append(errs, b.kill(ctx, m))
	}
	return errors.Join(errs...)
}

// ContainerStatuses implements runtime.ContainerStatusReporter: each container's state
// from its agent's status file (read bounded, without following links: the sandbox can
// write it) or, once it has ended, its recorded exit.
func (b *Backend) ContainerStatuses(ctx context.Context, id string) ([]runtime.ContainerStatus, error) {
	s, err := b.get(ctx, id)
	if err != nil {
		return nil, err
	}
	if !s.spec.Multi() {
		return nil, nil
	}
	// Not waiting for Create: while init containers run, the others show as waiting.
	b.mu.Lock()
	byName := map[string]*sandbox{s.spec.ContainerName(): s}
	for _, m := range s.members {
		byName[m.name] = m
	}
	b.mu.Unlock()
	var out []runtime.ContainerStatus
	for _, c := range s.spec.AllContainers() {
		_, init := s.spec.Find(c.Name)
		cs := runtime.ContainerStatus{Name: c.ContainerName(), Init: init, State: runtime.ContainerWaiting}
		m := byName[c.ContainerName()]
		if m == nil {
			out = append(out, runtime.ContainerStatus{Name: cs.Name, Init: init, State: runtime.ContainerWaiting, Reason: "ContainerCreating"})
			continue
		}
		ended := false
		select {
		case <-m.done:
			ended = true
		default:
		}
		st, _ := readStatus(m.dir)
		if st != nil {
			// The member's status.json is the sandbox's to write: bounded like a final one.
			cs.Restarts = int(agent.BoundRestarts(st.GetRestartCount(), c.RestartLimit))
			if st.ExitCode != nil {
				c := st.GetExitCode()
				cs.ExitCode = &c
			}
			switch st.GetState() {
			case agentv1.MainState_MAIN_STATE_RUNNING:
				cs.State = runtime.ContainerRunning
			case agentv1.MainState_MAIN_STATE_RESTARTING:
				cs.Reason, cs.Message = "Restarting", agent.StatusText(st.GetMessage())
			case agentv1.MainState_MAIN_STATE_COMPLETED, agentv1.MainState_MAIN_STATE_FAILED, agentv1.MainState_MAIN_STATE_STOPPED:
				cs.State = runtime.ContainerExited
				cs.Reason, cs.Message = st.GetReason(), agent.StatusText(st.GetMessage())
				if !agent.IsReason(cs.Reason) {
					cs.Reason = agent.ReasonError
				}
			}
		}
		if ended {
			ex := m.exit
			cs.State = runtime.ContainerExited
			cs.ExitCode, cs.Reason, cs.Message = ex.ExitCode, ex.Reason, ex.Message
			if ex.Restarts > cs.Restarts {
				cs.Restarts = ex.Restarts
			}
		}
		if cs.State == runtime.ContainerWaiting && cs.Reason == "" {
			cs.Reason = "ContainerCreating"
			if st != nil {
				cs.Reason = "Waiting"
			}
		}
		out = append(out, cs)
	}
	return out, nil
}

// memberOf returns the dir and agent identity of container name of sandbox id, or an
// error wrapping runtime.ErrContainerNotFound.
func (b *Backend) memberOf(ctx context.Context, id, name string) (string, *agentconfig.Identity, error) {
	s, err := b.get(ctx, id)
	if err != nil {
		return "", nil, err
	}
	if err := waitReady(ctx, s); err != nil {
		return "", nil, err
	}
	c := s.container(name)
	if c == nil {
		return "", nil, fmt.Errorf("%w: %q in sandbox %s", runtime.ErrContainerNotFound, name, id)
	}
	b.mu.Lock()
	ident := c.ident
	b.mu.Unlock()
	return c.dir, ident, nil
}

// addHostAliases adds names → 127.0.0.1 to the hosts file at path.
func addHostAliases(path string, names []string) error {
	if len(names) == 0 {
		return nil
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString("127.0.0.1\t" + strings.Join(names, " ") + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

var _ startseq.Ops = (*groupOps)(nil)
