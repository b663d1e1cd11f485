package local

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/internal/failpoint"
	"github.com/sandboxd/sandboxd/internal/runtime/local/network"
)

// The namespaces a group's containers share (group.go) are made by the backend before
// any of its containers, and held as descriptors while they are created: the primary
// and the members then join the same namespaces by path and can all be created at
// once, instead of the members waiting for the primary's pid (/proc/<pid>/ns/*).
//
//   - UTS: always; the backend sets the sandbox's hostname in it (runc may not set one
//     in a namespace it joins).
//   - Network: when the sandbox has no network attachment (loopback only); the backend
//     brings up lo and sets netSysctls. With an attachment, its namespace (the host's
//     user namespace owns it) is joined instead.
//   - User (with user namespaces): mapping 0..Size-1 to the sandbox's ID range, owning
//     the UTS and network namespaces made with it, so the containers' root may bind
//     ports below 1024 and owns the shared files. The containers join it when the
//     network namespace is the group's own; on an attachment's namespace, which a
//     joined user namespace could not enter (runc joins the user namespace first),
//     each gets a user namespace of its own with the same mapping. It also serves
//     every container's idmapped image layers (userns.go), so no container makes a
//     helper of its own for them.
//
// Nothing is persisted: the descriptors live in the backend's process only while Create
// runs (closed on every path by createGroup, and by the kernel if the process dies);
// once the containers are in the namespaces they keep them alive, and no path of the
// sandbox's is ever resolved to reach them (the runtime opens /proc/<backend pid>/fd/N).

// groupNS holds a group's namespaces as descriptors; -1 where not made.
type groupNS struct {
	user, uts, net int
}

// newGroupNS makes a group's namespaces: a user namespace mapping ids (when set), a UTS
// namespace with hostname host and, with newNet, a network namespace with lo up and
// netSysctls set. The namespaces are made by a child that never runs (it is traced, so
// it stops at its execve) and is killed once they are open, as usernsFD does.
func newGroupNS(host string, ids *idRange, newNet, freshProc bool, log *slog.Logger) (g *groupNS, err error) {
	g = &groupNS{user: -1, uts: -1, net: -1}
	defer func() {
		if err != nil {
			g.close()
			g = nil
		}
	}()
	if err := g.open(ids, newNet); err != nil {
		return nil, err
	}
	if err := inNamespaceFD(g.uts, unix.CLONE_NEWUTS, func() error { return unix.Sethostname([]byte(host)) }); err != nil {
		return nil, fmt.Errorf("group namespaces: hostname: %w", err)
	}
	if g.net >= 0 {
		if err := inNamespaceFD(g.net, unix.CLONE_NEWNET, loopbackUp); err != nil {
			return nil, fmt.Errorf("group namespaces: loopback: %w", err)
		}
		for k, v := range netSysctls {
			if err := setNetNSSysctl(g.path(g.net), k, v, freshProc, log); err != nil {
				return nil, fmt.Errorf("group namespaces: %w", err)
			}
		}
	}
	return g, nil
}

// open makes the namespaces and opens them (see newGroupNS).
func (g *groupNS) open(ids *idRange, newNet bool) error {
	// A ptrace tracer is a thread: keep this goroutine on one for Start through Wait.
	goruntime.LockOSThread()
	defer goruntime.UnlockOSThread()
	attr := &syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWUTS, Ptrace: true, Pdeathsig: unix.SIGKILL}
	if ids != nil {
		m := []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(ids.HostID), Size: int(ids.Size)}}
		attr.Cloneflags |= unix.CLONE_NEWUSER
		attr.UidMappings, attr.GidMappings = m, m
	}
	if newNet {
		attr.Cloneflags |= unix.CLONE_NEWNET
	}
	cmd := exec.Command("/proc/self/exe")
	cmd.SysProcAttr = attr
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("group namespaces: helper: %w", err)
	}
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	nsDir := "/proc/" + strconv.Itoa(cmd.Process.Pid) + "/ns/"
	for _, n := range []struct {
		fd   *int
		name string
		want bool
	}{{&g.user, "user", ids != nil}, {&g.uts, "uts", true}, {&g.net, "net", newNet}} {
		if !n.want {
			continue
		}
		fd, err := unix.Open(nsDir+n.name, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("group namespaces: open %s: %w", n.name, err)
		}
		*n.fd = fd
	}
	return nil
}

// path is where the runtime (another process) opens the namespace held by fd.
func (g *groupNS) path(fd int) string {
	if fd < 0 {
		return ""
	}
	return "/proc/" + strconv.Itoa(os.Getpid()) + "/fd/" + strconv.Itoa(fd)
}

// close closes the descriptors; the namespaces live on while a container is in them.
func (g *groupNS) close() {
	if g == nil {
		return
	}
	for _, fd := range []*int{&g.user, &g.uts, &g.net} {
		if *fd >= 0 {
			_ = unix.Close(*fd)
			*fd = -1
		}
	}
}

// inNamespaceFD is inNamespace for a namespace held by fd.
func inNamespaceFD(fd, nstype int, fn func() error) error {
	errc := make(chan error, 1)
	network.SpoilThread(func() { // the thread dies with the goroutine (see inNamespace)
		if err := unix.Setns(fd, nstype); err != nil {
			errc <- fmt.Errorf("setns: %w", err)
			return
		}
		errc <- fn()
	})
	return <-errc
}

// loopbackUp brings up lo in the calling thread's network namespace.
func loopbackUp() error {
	s, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(s)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(s, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("get lo flags: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(s, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("bring lo up: %w", err)
	}
	return nil
}

// joinParams is what a group's containers share (group.go): set up once by createGroup
// while the containers' launches make their own dirs, then joined by all of them.
type joinParams struct {
	ids *idRange // the group's ID range (nil without user namespaces); set before any launch

	ready chan struct{} // closed when setErr has been called
	err   error
	ns    *groupNS
	att   *Attachment
	sysfs string // the group's sysfs dir (see mountNetNSSysfs), or ""

	volOnce  sync.Once
	volReady chan struct{} // closed when the primary's volumes are made (or failed)
	volErr   error
	volumes  map[string]string // the group's volume roots by name

	forkMu sync.Mutex // a fork's members' restores, one at a time (gvisor_group_pause.go)
}

func newJoinParams(ids *idRange) *joinParams {
	return &joinParams{ids: ids, ready: make(chan struct{}), volReady: make(chan struct{})}
}

// wait waits until the shared namespaces are set up.
func (j *joinParams) wait(ctx context.Context) error {
	select {
	case <-j.ready:
		return j.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// setVolumes publishes the group's volumes (made by the primary's launch); the first
// call counts.
func (j *joinParams) setVolumes(roots map[string]string, err error) {
	j.volOnce.Do(func() {
		j.volumes, j.volErr = roots, err
		close(j.volReady)
	})
}

// waitVolumes waits for the group's volumes.
func (j *joinParams) waitVolumes(ctx context.Context) (map[string]string, error) {
	select {
	case <-j.volReady:
		return j.volumes, j.volErr
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// errPrimaryFailed is a member's launch error when the primary's failed first.
var errPrimaryFailed = errors.New("the primary container could not be created")

// nsPaths are the namespace paths a container of the group joins: net and uts always,
// user only when the network namespace is the group's own (see above).
func (j *joinParams) nsPaths() (netns, utsns, userns string) {
	if j.ns == nil { // a gVisor group's members share the sentry's (gvisor_group.go)
		if j.att != nil {
			return j.att.NetNSPath, "", ""
		}
		return "", "", ""
	}
	utsns = j.ns.path(j.ns.uts)
	if j.att != nil && j.att.NetNSPath != "" {
		return j.att.NetNSPath, utsns, ""
	}
	return j.ns.path(j.ns.net), utsns, j.ns.path(j.ns.user)
}

// idmapUserNS is the user namespace for the containers' idmapped layers (-1: none).
func (j *joinParams) idmapUserNS() int {
	if j == nil || j.ns == nil {
		return -1
	}
	return j.ns.user
}

// setupGroupNS sets up what group sandbox s's containers share (j.ids is set): its
// network attachment (the primary's cid names it, so teardown finds it) with its rules and
// egress secrets and, for a user namespace, the attachment's sysctls and sysfs (see mountNetNSSysfs),
// then the group's namespaces.
func (b *Backend) setupGroupNS(ctx context.Context, s *sandbox, j *joinParams, host string) error {
	fresh := b.freshProcSysctl()
	if b.cfg.Network != nil {
		att, err := b.cfg.Network.Setup(ctx, s.cid)
		if err != nil {
			return fmt.Errorf("network setup: %w", err)
		}
		j.att = att
		failpoint.Hit("local.create.network")
		if err := b.applyRules(s, s.cid); err != nil {
			return err
		}
		if err := b.registerEgressSecrets(s, s.cid); err != nil {
			return err
		}
		failpoint.Hit("local.create.rules")
		if j.ids != nil && att != nil && att.NetNSPath != "" {
			// A root mapped into a user namespace that does not own this network
			// namespace can neither set its sysctls nor mount its sysfs: the backend
			// does both, once for every container.
			for k, v := range netSysctls {
				if err := setNetNSSysctl(att.NetNSPath, k, v, fresh, b.log); err != nil {
					return err
				}
			}
			sysfs := filepath.Join(s.dir, dirSysfs)
			if err := mountNetNSSysfs(att.NetNSPath, sysfs); err != nil {
				return err
			}
			j.sysfs = sysfs
			failpoint.Hit("local.create.sysfs")
		}
	}
	ns, err := newGroupNS(host, j.ids, j.att == nil || j.att.NetNSPath == "", fresh, b.log)
	if err != nil {
		return err
	}
	j.ns = ns
	failpoint.Hit("local.group.ns")
	return nil
}
