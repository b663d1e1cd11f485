package kubernetes

// Multi-container sandboxes (runtime.Spec.Multi): one Pod holds the whole group.
//
//   - The primary is the Pod's `sandbox` container, as in a single-container Pod; every
//     sidecar is one more container; the init containers are the Pod's initContainers,
//     after an `install` init container that copies the agent and the gate into the bin
//     emptyDir (the gate container, whose postStart hook does it otherwise, starts only
//     after the init containers). The kubelet runs the init containers in order, each
//     under its own agent (not held: it runs its command once and exits with its code),
//     and a failing one fails the Pod.
//   - Every container runs its own sandbox-agent (`sandbox-gate exec-agent`), with its
//     own config in the Secret (key configKey(name), mounted as that container's
//     config.json), its own run emptyDir (socket, status, log) and its own identity.
//     The primary's and the sidecars' agents start held (agentconfig.Config.Standby:
//     exec-agent completes the standby config with the container's environment and
//     working dir, which the agent merges the Start config onto); startseq.Run then
//     starts them in depends_on order through Ops (the agent's Start call), probing
//     where the spec asks.
//   - The gate mounts each non-init container's run emptyDir at
//     gate.ContainersDir/<name> (the primary's also at gate.RunDir, as in a
//     single-container Pod) and picks the agent by the TLS server name of the
//     connection. Every connection is still pinned to the sandbox's own certificates,
//     and the backend verifies the identity of the container's agent on it, so a
//     container can neither send the runner to another container's agent nor to
//     another sandbox's.
//   - The primary's end ends the sandbox: the gate ends with the primary's agent (its
//     final status in the termination message, as in a single-container Pod); the
//     backend then deletes the Pod with its grace period, which stops the sidecars.
//     Sidecars that exit non-zero are restarted by their agents (RestartLimit).

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"regexp"
	"strconv"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1/agentv1connect"
	"github.com/sandboxd/sandboxd/internal/agent"
	"github.com/sandboxd/sandboxd/internal/agentconfig"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes/gate"
)

// containerInstall is the init container that installs the agent and the gate in Pods
// with init containers.
const containerInstall = "install"

// member is one container of a group as the Pod holds it.
type member struct {
	c       *runtime.Container
	name    string // runtime name (ContainerName)
	pod     string // the Pod's container name
	index   int    // in Spec.AllContainers: names the Pod volumes of this container
	init    bool
	primary bool
}

// prefixedName matches the Pod container names given to containers whose own name is
// reserved: no container keeps a name of that form, so the two never collide.
var prefixedName = regexp.MustCompile(`^c[0-9]+-`)

// members lists spec's containers in Spec.AllContainers order with their Pod names: the
// primary is containerMain, the others keep their names unless reserved (the backend's
// own containers) or of the prefixed form, which become c<index>-<name>.
func members(spec *runtime.Spec) []member {
	all := spec.AllContainers()
	out := make([]member, 0, len(all))
	for i, c := range all {
		m := member{c: c, name: c.ContainerName(), index: i, init: i < len(spec.InitContainers), primary: c == &spec.Container}
		switch {
		case m.primary:
			m.pod = containerMain
		case m.name == containerMain || m.name == containerGate || m.name == containerInstall || m.name == containerFiller || prefixedName.MatchString(m.name):
			p := "c" + strconv.Itoa(i) + "-" + m.name
			if len(p) > 63 {
				p = p[:63]
			}
			for p[len(p)-1] == '-' {
				p = p[:len(p)-1]
			}
			m.pod = p
		default:
			m.pod = m.name
		}
		out = append(out, m)
	}
	return out
}

// configKey is the Secret key of a container's agent config: the primary's is
// gate.ConfigFile (as in a single-container Pod), the others' config-<name>.json.
func configKey(m member) string {
	if m.primary {
		return gate.ConfigFile
	}
	return "config-" + m.name + ".json"
}

// agentIdentityID is the identity a container's agent proves: the sandbox ID for the
// primary (as in a single-container Pod), <id>/<name> for the others.
func agentIdentityID(id string, m member) string {
	if m.primary {
		return id
	}
	return id + "/" + m.name
}

// group is what Create prepares for a multi-container spec.
type group struct {
	members []member
	sc      map[string]*corev1.SecurityContext // by runtime name
	// secret holds each container's agent config (configKey).
	secret map[string][]byte
	// start is each held container's Start config (JSON), by runtime name.
	start  map[string][]byte
	idents map[string]*agentconfig.Identity
}

// prepareGroup resolves every container's command, security context and agent configs.
func (b *Backend) prepareGroup(ctx context.Context, spec *runtime.Spec, placeholders map[string]string) (*group, error) {
	g := &group{members: members(spec), sc: map[string]*corev1.SecurityContext{}, secret: map[string][]byte{},
		start: map[string][]byte{}, idents: map[string]*agentconfig.Identity{}}
	for _, m := range g.members {
		c := m.c
		creds := c.PullCredentials
		imageUser := ""
		if imageUserNeeded(c.Security) {
			ic, err := b.cfg.ImageConfig(ctx, c.Image, creds)
			if err != nil {
				return nil, fmt.Errorf("container %s: %w", m.name, errImageUser(c.Image, err))
			}
			imageUser = ic.User
		}
		sc, runAs := securityFor(c.Security, imageUser)
		g.sc[m.name] = sc
		argv, err := b.containerArgv(ctx, c, creds)
		if err != nil {
			return nil, fmt.Errorf("container %s: %w", m.name, err)
		}
		ident := agent.NewIdentity(agentIdentityID(spec.ID, m))
		g.idents[m.name] = ident
		full := agentconfig.Config{
			Argv:         argv,
			Env:          egressStartEnv(c, placeholders), // none in init containers: checkEgress
			WorkingDir:   c.WorkingDir,
			RestartLimit: c.RestartLimit,
			Hostname:     runtime.Hostname(spec.ID),
			User:         runAs,
			// KUBERNETES-store secrets: the kubelet sets them; only names in files.
			EnvFromProcess: secretRefNames(c),
		}
		for _, f := range c.Files {
			full.Files = append(full.Files, agentconfig.File{Path: f.Path, Content: f.Content, Mode: f.Mode})
		}
		inPod := full
		if m.init {
			// Run once by the kubelet, in order: never held, never restarted (a failure
			// fails the sandbox).
			inPod.RestartLimit = 0
		} else {
			start, err := json.Marshal(&full)
			if err != nil {
				return nil, err
			}
			g.start[m.name] = start
			inPod = agentconfig.Config{Standby: true, Hostname: full.Hostname, EnvFromProcess: full.EnvFromProcess}
		}
		inPod.Identity = ident
		b, err := json.Marshal(&inPod)
		if err != nil {
			return nil, err
		}
		g.secret[configKey(m)] = b
	}
	return g, nil
}

// containerArgv is c's main command: [command]+args, or its image's entrypoint and cmd
// merged with them.
func (b *Backend) containerArgv(ctx context.Context, c *runtime.Container, creds *runtime.Credentials) ([]string, error) {
	return b.argv(ctx, &runtime.Spec{Container: runtime.Container{Image: c.Image, Command: c.Command, Args: c.Args, PullCredentials: creds}})
}

// resourcesFor is a container's resource requirements (see podFor). disk > 0 sets the
// ephemeral-storage limit (the primary carries the sandbox's).
func resourcesFor(r runtime.Resources, disk int64) corev1.ResourceRequirements {
	res := corev1.ResourceRequirements{}
	if r.MilliCPU > 0 || r.MemoryBytes > 0 || r.RequestMilliCPU > 0 || r.RequestMemoryBytes > 0 || disk > 0 {
		res.Limits, res.Requests = corev1.ResourceList{}, corev1.ResourceList{}
		if disk > 0 {
			// A cap, not a reservation (the local backend's disk images are sparse too): an
			// explicit zero request, as a limit alone would make the request default to it
			// and reserve --disk (10 Gi) of node storage per sandbox at scheduling.
			res.Limits[corev1.ResourceEphemeralStorage] = *resource.NewQuantity(disk, resource.BinarySI)
			res.Requests[corev1.ResourceEphemeralStorage] = *resource.NewQuantity(0, resource.BinarySI)
		}
		// Requests are what the scheduler places by; a limit without one is also the
		// request (as Kubernetes itself defaults it).
		if m := r.MilliCPU; m > 0 {
			res.Limits[corev1.ResourceCPU] = *resource.NewMilliQuantity(m, resource.DecimalSI)
		}
		if m := cmp.Or(r.RequestMilliCPU, r.MilliCPU); m > 0 {
			res.Requests[corev1.ResourceCPU] = *resource.NewMilliQuantity(m, resource.DecimalSI)
		}
		if m := r.MemoryBytes; m > 0 {
			res.Limits[corev1.ResourceMemory] = *resource.NewQuantity(m, resource.BinarySI)
		}
		if m := cmp.Or(r.RequestMemoryBytes, r.MemoryBytes); m > 0 {
			res.Requests[corev1.ResourceMemory] = *resource.NewQuantity(m, resource.BinarySI)
		}
	}
	return res
}

// podForGroup is the Pod of a multi-container spec (see the top of this file).
func (b *Backend) podForGroup(spec *runtime.Spec, g *group, rcName string, lbls map[string]string, pullSecrets []string) *corev1.Pod {
	pod := b.podFor(spec, rcName, lbls, pullSecrets, g.sc[spec.ContainerName()])
	// podFor's single config volume and the primary's volume mounts are rebuilt per
	// container below.
	vols := pod.Spec.Volumes[:0]
	for _, v := range pod.Spec.Volumes {
		if v.Name == "bin" || v.Name == "tls" {
			vols = append(vols, v)
		}
	}
	gateC := pod.Spec.Containers[0]
	var gateMounts []corev1.VolumeMount
	for _, vm := range gateC.VolumeMounts {
		if vm.Name != "run" {
			gateMounts = append(gateMounts, vm)
		}
	}
	shared, index := scratchVolumes(spec)
	vols = append(vols, shared...)
	disk := spec.Resources.DiskBytes
	if disk == 0 {
		disk = b.cfg.DiskBytes
	}
	var inits, containers []corev1.Container
	for _, m := range g.members {
		i := strconv.Itoa(m.index)
		run, cfg := "run-"+i, "config-"+i
		vols = append(vols,
			corev1.Volume{Name: run, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
			corev1.Volume{Name: cfg, VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
				SecretName: secretName(spec.ID), DefaultMode: ptr(int32(0o444)),
				Items: []corev1.KeyToPath{{Key: configKey(m), Path: gate.ConfigFile}},
			}}},
		)
		extra, mounts := containerMounts(m, index)
		vols = append(vols, extra...)
		command := []string{gate.GatePath, "exec-agent"}
		if !m.init && !m.primary {
			// A sidecar's restarts and exit outlive its agent in the Pod's status
			// (ContainerStatuses); the primary's go through the gate, an init
			// container's are the kubelet's.
			command = append(command, gate.FlagTerminationLog)
		}
		c := corev1.Container{
			Name: m.pod, Image: m.c.Image, ImagePullPolicy: b.pullPolicy(spec, m.c),
			Command:         command,
			WorkingDir:      m.c.WorkingDir,
			SecurityContext: g.sc[m.name],
			VolumeMounts: append([]corev1.VolumeMount{
				{Name: "bin", MountPath: gate.BinDir, ReadOnly: true},
				{Name: run, MountPath: gate.RunDir},
				{Name: cfg, MountPath: gate.ConfigDir, ReadOnly: true},
			}, mounts...),
		}
		if m.primary {
			c.Resources = resourcesFor(m.c.Resources, disk)
		} else {
			c.Resources = resourcesFor(m.c.Resources, 0)
		}
		if m.init {
			inits = append(inits, c)
			continue
		}
		containers = append(containers, c)
		gateMounts = append(gateMounts, corev1.VolumeMount{Name: run, MountPath: gate.ContainersDir + "/" + m.name})
		if m.primary {
			gateMounts = append(gateMounts, corev1.VolumeMount{Name: run, MountPath: gate.RunDir})
		}
	}
	gateC.VolumeMounts = gateMounts
	if len(inits) > 0 {
		// The gate's postStart hook installs the binaries too late for init containers.
		install := corev1.Container{
			Name: containerInstall, Image: b.cfg.AgentImage, ImagePullPolicy: b.cfg.ImagePullPolicy,
			Command:                  []string{"/sandbox-gate", "install"},
			VolumeMounts:             []corev1.VolumeMount{{Name: "bin", MountPath: gate.BinDir}},
			Resources:                gateC.Resources,
			SecurityContext:          gateSecurityContext(),
			TerminationMessagePolicy: corev1.TerminationMessageReadFile,
		}
		pod.Spec.InitContainers = append([]corev1.Container{install}, inits...)
	}
	pod.Spec.Containers = append([]corev1.Container{gateC}, containers...)
	pod.Spec.Volumes = vols
	if len(spec.HostAliases) > 0 {
		pod.Spec.HostAliases = []corev1.HostAlias{{IP: "127.0.0.1", Hostnames: append([]string(nil), spec.HostAliases...)}}
	}
	return pod
}

// scratchVolumes are the spec's shared scratch volumes as emptyDirs, and the Pod volume
// name of each (by the spec's volume name).
func scratchVolumes(spec *runtime.Spec) ([]corev1.Volume, map[string]string) {
	var vols []corev1.Volume
	index := map[string]string{}
	for i, v := range spec.Volumes {
		name := "vol-" + strconv.Itoa(i)
		index[v.Name] = name
		ed := &corev1.EmptyDirVolumeSource{}
		if v.Medium == runtime.MediumMemory {
			ed.Medium = corev1.StorageMediumMemory
		}
		if v.SizeBytes > 0 {
			ed.SizeLimit = resource.NewQuantity(v.SizeBytes, resource.BinarySI)
		}
		vols = append(vols, corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{EmptyDir: ed}})
	}
	return vols, index
}

// containerMounts are a container's mounts of the shared volumes, its tmpfs paths
// (memory emptyDirs of its own) and, under a read-only root, the memory emptyDirs that
// keep ReadOnlyWritablePaths writable (unless something is mounted there).
func containerMounts(m member, index map[string]string) ([]corev1.Volume, []corev1.VolumeMount) {
	var vols []corev1.Volume
	var mounts []corev1.VolumeMount
	c := m.c
	taken := map[string]bool{}
	for _, vm := range c.VolumeMounts {
		mounts = append(mounts, corev1.VolumeMount{Name: index[vm.Volume], MountPath: vm.Path, ReadOnly: vm.ReadOnly, SubPath: vm.SubPath})
		taken[vm.Path] = true
	}
	prefix := "c" + strconv.Itoa(m.index) + "-"
	for i, p := range c.Tmpfs {
		if taken[p] {
			continue
		}
		taken[p] = true
		name := prefix + "tmpfs-" + strconv.Itoa(i)
		vols = append(vols, corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory}}})
		mounts = append(mounts, corev1.VolumeMount{Name: name, MountPath: p})
	}
	if c.Security != nil && c.Security.ReadOnlyRootFS {
		for i, p := range runtime.ReadOnlyWritablePaths {
			if taken[p] {
				continue
			}
			name := prefix + "writable-" + strconv.Itoa(i)
			vols = append(vols, corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{
				Medium: corev1.StorageMediumMemory, SizeLimit: resource.NewQuantity(readOnlyTmpBytes, resource.BinarySI),
			}}})
			mounts = append(mounts, corev1.VolumeMount{Name: name, MountPath: p})
		}
	}
	return vols, mounts
}

// groupOps are startseq.Ops on a sandbox being created.
type groupOps struct {
	b *Backend
	s *sandbox
}

func (o groupOps) member(name string) (member, error) {
	for _, m := range o.s.group.members {
		if m.name == name {
			return m, nil
		}
	}
	return member{}, fmt.Errorf("%w: %q", runtime.ErrContainerNotFound, name)
}

// Start: an init container is started by the kubelet, in order; Start waits until it
// has started (or ended). Any other container's agent is waited for through the gate
// and sent its Start config.
func (o groupOps) Start(ctx context.Context, name string) error {
	m, err := o.member(name)
	if err != nil {
		return err
	}
	if m.init {
		_, err := o.b.waitPod(ctx, o.s, m.pod, func(p *corev1.Pod) (bool, error) {
			cs := podContainerStatus(p.Status.InitContainerStatuses, m.pod)
			return cs != nil && (cs.State.Running != nil || cs.State.Terminated != nil), nil
		})
		return err
	}
	if err := o.b.waitAgent(ctx, o.s, name); err != nil {
		return err
	}
	c := o.b.agentClient(o.s.id, name)
	_, err = c.Start(ctx, connect.NewRequest(&agentv1.StartRequest{Config: o.s.group.start[name]}))
	return err
}

func (o groupOps) Exec(ctx context.Context, name string, argv []string, timeout time.Duration) (int, error) {
	c := o.b.agentClient(o.s.id, name)
	ectx, cancel := context.WithTimeout(ctx, timeout+5*time.Second)
	defer cancel()
	res, err := c.Exec(ectx, connect.NewRequest(&agentv1.ExecRequest{Command: argv, Timeout: durationpb.New(timeout)}))
	if err != nil {
		return 0, err
	}
	return int(res.Msg.GetExitCode()), nil
}

// Wait: an init container's exit code is in the Pod status; any other container's comes
// from its agent's final status.
func (o groupOps) Wait(ctx context.Context, name string) (int32, error) {
	m, err := o.member(name)
	if err != nil {
		return 0, err
	}
	if m.init {
		var code int32
		_, err := o.b.waitPod(ctx, o.s, m.pod, func(p *corev1.Pod) (bool, error) {
			cs := podContainerStatus(p.Status.InitContainerStatuses, m.pod)
			if cs != nil && cs.State.Terminated != nil {
				code = cs.State.Terminated.ExitCode
				return true, nil
			}
			return false, nil
		})
		return code, err
	}
	c := o.b.agentClient(o.s.id, name)
	for {
		stream, err := c.Watch(ctx, connect.NewRequest(&agentv1.WatchRequest{}))
		if err == nil {
			for stream.Receive() {
				st := stream.Msg()
				switch st.GetState() {
				case agentv1.MainState_MAIN_STATE_COMPLETED, agentv1.MainState_MAIN_STATE_FAILED, agentv1.MainState_MAIN_STATE_STOPPED:
					_ = stream.Close()
					return st.GetExitCode(), nil
				}
			}
			_ = stream.Close()
		}
		// The agent is gone: the container has ended (its code is the agent's exit code,
		// the main command's).
		o.b.mu.Lock()
		p := o.s.pod
		o.b.mu.Unlock()
		if cs := podContainerStatus(statusesOf(p), m.pod); cs != nil && cs.State.Terminated != nil {
			return cs.State.Terminated.ExitCode, nil
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-o.s.done:
			return 0, errors.New("the sandbox has ended")
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func statusesOf(p *corev1.Pod) []corev1.ContainerStatus {
	if p == nil {
		return nil
	}
	return p.Status.ContainerStatuses
}

func podContainerStatus(list []corev1.ContainerStatus, name string) *corev1.ContainerStatus {
	for i := range list {
		if list[i].Name == name {
			return &list[i]
		}
	}
	return nil
}

func (b *Backend) agentClient(id, container string) interface {
	Start(context.Context, *connect.Request[agentv1.StartRequest]) (*connect.Response[agentv1.StartResponse], error)
	Exec(context.Context, *connect.Request[agentv1.ExecRequest]) (*connect.Response[agentv1.ExecResponse], error)
	Watch(context.Context, *connect.Request[agentv1.WatchRequest]) (*connect.ServerStreamForClient[agentv1.StatusResponse], error)
	Status(context.Context, *connect.Request[agentv1.StatusRequest]) (*connect.Response[agentv1.StatusResponse], error)
	Stop(context.Context, *connect.Request[agentv1.StopRequest]) (*connect.Response[agentv1.StopResponse], error)
} {
	return agent.NewClient(func(ctx context.Context) (net.Conn, error) { return b.dialAgent(ctx, id, container, true) })
}

// statusClient is the client ContainerStatuses asks container name's agent with: one
// per container of s, made on first use.
func (b *Backend) statusClient(s *sandbox, id, name string) agentv1connect.AgentServiceClient {
	b.mu.Lock()
	defer b.mu.Unlock()
	if c := s.statusClients[name]; c != nil {
		return c
	}
	if s.statusClients == nil {
		s.statusClients = map[string]agentv1connect.AgentServiceClient{}
	}
	c := agent.NewClient(func(ctx context.Context) (net.Conn, error) { return b.DialAgent(ctx, id, name) })
	s.statusClients[name] = c
	return c
}

// waitPod waits until done(pod) holds, the Pod cannot start (startError), the sandbox
// ends or StartTimeout passes. target ("" none) is the Pod container waited for: its own
// start failure is checked before done (an init container that the runtime failed to
// start is terminated too, which done would take for run), the whole Pod's after it (an
// init container that completed must not be failed by the next one's failure in the
// same status).
func (b *Backend) waitPod(ctx context.Context, s *sandbox, target string, done func(*corev1.Pod) (bool, error)) (*corev1.Pod, error) {
	timer := time.NewTimer(b.cfg.StartTimeout)
	defer timer.Stop()
	for {
		b.mu.Lock()
		pod, ch := s.pod, s.changed
		b.mu.Unlock()
		if pod != nil {
			if target != "" {
				if err := podContainerStartError(pod, target, &s.spec); err != nil {
					return pod, err
				}
			}
			if ok, err := done(pod); ok || err != nil {
				return pod, err
			}
			if err := startError(pod, &s.spec); err != nil {
				return pod, err
			}
		}
		select {
		case <-s.done:
			if pod != nil {
				if ok, err := done(pod); ok || err != nil {
					return pod, err
				}
			}
			return pod, fmt.Errorf("the Pod ended: %s", podSummary(pod))
		default:
		}
		select {
		case <-ch:
		case <-s.done:
		case <-timer.C:
			return pod, fmt.Errorf("the Pod did not start within %s: %s", b.cfg.StartTimeout, podSummary(pod))
		case <-ctx.Done():
			return pod, ctx.Err()
		}
	}
}

// waitAgent waits until container name's agent answers through the gate.
func (b *Backend) waitAgent(ctx context.Context, s *sandbox, name string) error {
	if _, err := b.waitPod(ctx, s, "", func(p *corev1.Pod) (bool, error) { return p.Status.PodIP != "", nil }); err != nil {
		return err
	}
	pctx, cancel := context.WithTimeout(ctx, b.cfg.StartTimeout)
	defer cancel()
	c := b.agentClient(s.id, name)
	for {
		sctx, scancel := context.WithTimeout(pctx, 5*time.Second)
		_, err := c.Status(sctx, connect.NewRequest(&agentv1.StatusRequest{}))
		scancel()
		if err == nil {
			return nil
		}
		b.mu.Lock()
		pod := s.pod
		b.mu.Unlock()
		if serr := startError(pod, &s.spec); serr != nil {
			return serr
		}
		select {
		case <-s.done:
			return fmt.Errorf("the Pod ended: %s", podSummary(pod))
		case <-pctx.Done():
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("container %s: its agent did not answer within %s: %w (%s)", name, b.cfg.StartTimeout, err, podSummary(pod))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// primaryEnded reports whether a group's primary has ended for good: its container (the
// agent exits once the main command has) or the gate (which ends after it) terminated.
func primaryEnded(p *corev1.Pod) bool {
	for _, name := range []string{containerMain, containerGate} {
		if cs := podContainerStatus(statusesOf(p), name); cs != nil && cs.State.Terminated != nil {
			return true
		}
	}
	return false
}

var _ runtime.ContainerStatusReporter = (*Backend)(nil)

// ContainerStatuses implements runtime.ContainerStatusReporter: init containers from the
// Pod status (the kubelet ran them); the others from the Pod status and what their
// agents last said (watchAgents: whether the main command is held, running or ended,
// its restarts and its last exit). A container the kubelet has not reported yet is
// asked of its agent (one client per container). nil for a single-container sandbox.
func (b *Backend) ContainerStatuses(ctx context.Context, id string) ([]runtime.ContainerStatus, error) {
	s, err := b.get(id)
	if err != nil {
		return nil, err
	}
	if !s.spec.Multi() {
		return nil, nil
	}
	b.mu.Lock()
	pod := s.pod
	ended := false
	select {
	case <-s.done:
		ended = true
	default:
	}
	b.mu.Unlock()
	ms := members(&s.spec)
	out := make([]runtime.ContainerStatus, len(ms))
	var wg sync.WaitGroup
	for i, m := range ms {
		st := &out[i]
		st.Name, st.Init, st.State = m.name, m.init, runtime.ContainerWaiting
		var cs *corev1.ContainerStatus
		if pod != nil {
			if m.init {
				cs = podContainerStatus(pod.Status.InitContainerStatuses, m.pod)
			} else {
				cs = podContainerStatus(pod.Status.ContainerStatuses, m.pod)
			}
		}
		fromPod(st, cs)
		if m.primary && (ended || primaryEnded(pod)) {
			ex := exitOf(pod, false, m.c.RestartLimit, commits(&s.spec))
			st.State, st.ExitCode, st.Restarts, st.Reason, st.Message = runtime.ContainerExited, ex.ExitCode, ex.Restarts, ex.Reason, ex.Message
			continue
		}
		if !m.init {
			// What the container's agent last said (watchAgents): also known once the
			// agent is gone with its container.
			b.mu.Lock()
			last := s.agentStatus[m.name]
			b.mu.Unlock()
			// A container that has ended left its agent's final status in its
			// termination message: it stands over a watch that missed the end. The
			// message (the container's workload can write it) is never shown raw: a
			// status is not text (fromPod clipped other text), and what it says is
			// bounded (boundedFinal).
			if cs != nil && cs.State.Terminated != nil {
				t := cs.State.Terminated
				said := statusInMessage(t)
				if said != nil {
					st.Message = ""
				}
				if said != nil && !finalState(last) {
					if fin := boundedFinal(said, m.c.RestartLimit, terminatedView(t)); fin != nil {
						last = fin
					}
				}
			}
			if last != nil {
				fromAgent(st, last, m.c.RestartLimit)
			}
			if cs != nil && cs.State.Terminated != nil && cs.State.Terminated.Reason == "OOMKilled" {
				st.Reason, st.Message = "OOMKilled", "memory limit exceeded" // the kubelet's word stands
			}
		}
		if ended && st.State != runtime.ContainerExited {
			// The sandbox has ended: its Pod is stopped or gone, with every container.
			st.State, st.Reason, st.Message = runtime.ContainerExited, "Stopped", "the sandbox has ended"
			continue
		}
		// The kubelet reports a container only at its next relist: its agent may answer
		// well before. Once the kubelet has reported it, its view and the agent's watch
		// (agentStatus) stand: no call dials each sidecar's agent, whose container can
		// make it slow to answer.
		if m.init || ended || cs != nil || pod == nil || pod.Status.PodIP == "" {
			continue
		}
		client := b.statusClient(s, id, m.name)
		wg.Add(1)
		go func() {
			defer wg.Done()
			actx, cancel := context.WithTimeout(ctx, 3*time.Second)
			defer cancel()
			res, err := client.Status(actx, connect.NewRequest(&agentv1.StatusRequest{}))
			if err != nil {
				return // the Pod's view stands
			}
			fromAgent(st, res.Msg, m.c.RestartLimit)
		}()
	}
	wg.Wait()
	return out, nil
}

// fromPod fills st from the kubelet's view of the container.
func fromPod(st *runtime.ContainerStatus, cs *corev1.ContainerStatus) {
	switch {
	case cs == nil:
		st.Reason = "Pending"
	case cs.State.Terminated != nil:
		t := cs.State.Terminated
		c := t.ExitCode
		// The message is the container's termination log, which its workload writes.
		st.State, st.ExitCode, st.Reason, st.Message = runtime.ContainerExited, &c, t.Reason, sandboxText(t.Message)
	case cs.State.Running != nil:
		st.State = runtime.ContainerRunning
	case cs.State.Waiting != nil:
		st.Reason, st.Message = cs.State.Waiting.Reason, cs.State.Waiting.Message
	}
}

// fromAgent fills st from the container's agent: its main command's state. The agent
// runs in the sandbox, so what it says is held as a final status in a termination
// message is (boundedFinal): restarts within the container's limit, an agent's reason
// (else Error), a bounded printable message.
func fromAgent(st *runtime.ContainerStatus, a *agentv1.StatusResponse, restartLimit int) {
	st.Restarts = int(agent.BoundRestarts(a.GetRestartCount(), restartLimit))
	if a.ExitCode != nil {
		c := a.GetExitCode()
		st.ExitCode = &c
	}
	st.Reason, st.Message = a.GetReason(), sandboxText(a.GetMessage())
	if st.Reason != "" && !agent.IsReason(st.Reason) {
		st.Reason = agent.ReasonError
	}
	switch a.GetState() {
	case agentv1.MainState_MAIN_STATE_STANDBY:
		st.State, st.Reason, st.Message = runtime.ContainerWaiting, "Held", "waiting for its dependencies"
	case agentv1.MainState_MAIN_STATE_STARTING:
		st.State = runtime.ContainerWaiting
	case agentv1.MainState_MAIN_STATE_RUNNING, agentv1.MainState_MAIN_STATE_RESTARTING:
		st.State = runtime.ContainerRunning
	case agentv1.MainState_MAIN_STATE_COMPLETED, agentv1.MainState_MAIN_STATE_FAILED, agentv1.MainState_MAIN_STATE_STOPPED:
		st.State = runtime.ContainerExited
	}
}

// watchAgents follows the agent status of each of a group's containers but the primary
// (whose end the gate reports) until it is final, the sandbox ends or the backend is
// closed: ContainerStatuses reports restarts and the last exit of a sidecar from it, also
// once its container (with its agent) has ended.
func (b *Backend) watchAgents(s *sandbox) {
	if !s.spec.Multi() {
		return
	}
	for _, c := range s.spec.Sidecars {
		go b.watchAgent(s, c.ContainerName())
	}
}

func (b *Backend) watchAgent(s *sandbox, name string) {
	c := b.agentClient(s.id, name)
	for {
		stream, err := c.Watch(b.ctx, connect.NewRequest(&agentv1.WatchRequest{}))
		if err == nil {
			for stream.Receive() {
				st := stream.Msg()
				b.mu.Lock()
				if s.agentStatus == nil {
					s.agentStatus = map[string]*agentv1.StatusResponse{}
				}
				s.agentStatus[name] = st
				b.mu.Unlock()
				if finalState(st) {
					_ = stream.Close()
					return
				}
			}
			_ = stream.Close()
		}
		select {
		case <-s.done:
			return
		case <-b.ctx.Done():
			return
		case <-time.After(500 * time.Millisecond):
		}
	}
}
