package local

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/internal/agent"
	"github.com/sandboxd/sandboxd/internal/agentconfig"
	"github.com/sandboxd/sandboxd/internal/logstore"
)

// The gVisor runtime class. runsc takes the same bundle as runc (one sandbox = one
// gVisor sandbox; a multi-container sandbox is one gVisor sandbox holding all its
// containers, see gvisor_group.go), with these differences:
//
//   - The agent channel. runc hands the agent a listening unix socket the backend made
//     on the host (fd 3, `--preserve-fds`); a host socket passed into gVisor
//     (`--pass-fd`) becomes a host-backed connected endpoint and accept(2) on it fails
//     with EINVAL. Instead the agent listens itself on agentconfig.StateDir/agent.sock
//     and runsc runs with --host-uds=create: the gofer creates, binds and listens on
//     that socket on the host side of the bind mount (<dir>/run/agent.sock, the same
//     path as for runc) and hands accepted connections to the sentry. So DialAgent,
//     the runner and recovery are the same for both classes, and no network (nor any
//     new authentication) is needed: a sandbox without a bridge works too. "create"
//     does not let the sandbox connect to host sockets (that would be "open"); it can
//     only make sockets in its own mounts. The one cost: connections cannot wait in a
//     backlog made before the agent runs, so Create waits until the agent answers a
//     dial (waitAgent), which is inside the ~0.6 s runsc needs to boot anyway.
//   - Security profile: the sentry's own seccomp filter and the user-space kernel are
//     the boundary; runsc ignores the OCI seccomp profile (it would only apply it inside
//     with --oci-seccomp), so none is written. Capabilities, no_new_privs, rlimits,
//     masked and read-only paths, the namespaces and the host cgroup limits (cgroup v1
//     hybrid here) are honoured as for runc.
//   - What differs inside: runsc drops CAP_NET_RAW (no --net-raw); the kernel is gVisor's
//     (uname 4.19.0-gvisor); an empty /tmp in the image is a tmpfs (counted in the
//     sandbox's memory); the root filesystem's writes go to runsc's own overlay, backed
//     by a file in our overlay's upper dir, so they are still removed with the sandbox.
//   - Signals: the pid runsc reports is the sandbox's (the sentry's), not the agent's,
//     so SIGTERM goes through `runsc kill`; SIGKILL to the sentry ends the whole sandbox
//     and stays a pidfd signal.
//   - Network: the sandbox's pre-made network namespace is configured (veth, address,
//     routes) before `runsc run`, which reads it once at boot; see launch. Without a
//     network, runsc boots with --network=none: a loopback-only stack (bootRuntime).
//   - The warm pool is runc-only: a claim enters the container's UTS namespace and
//     renames its dir, neither of which works for a gVisor sandbox.
//
// runsc must be a static build (CGO_ENABLED=0); scripts/build-runsc.sh builds the pinned
// RunscVersion into the cache where FindRunsc looks.

// RunscVersion is the gVisor version scripts/build-runsc.sh builds (keep them equal).
const RunscVersion = "v0.0.0-20260905035102-160fafc42237"

// RunscBuild names the build of RunscVersion that scripts/build-runsc.sh makes: with
// precompiled seccomp programs (its SECCOMP revision; keep them equal), so the sentry
// does not compile its filter at every start.
const RunscBuild = RunscVersion + "+seccomp1"

// GVisorClass is the runtime class name of gVisor.
const GVisorClass = "gvisor"

// runscFlags are runsc's global flags after --root. systrap is the platform that works
// without /dev/kvm; each gofer gets a new empty network namespace (the default, one
// shared "null" namespace, leaves a bind mount in the state root behind).
var runscFlags = []string{"--platform=systrap", "--host-uds=create", "--gofer-network-namespace=new"}

// gvisorNoNetworkFlags are runsc's flags when the backend has no network: the sandbox's
// network namespace is a new, empty one, in which runsc's default (--network=sandbox,
// which takes over the namespace's configured interfaces) finds no interface up, not
// even loopback: 127.0.0.1 would be unreachable (the containers of a group talk over
// it). --network=none gives the sentry a loopback-only stack.
var gvisorNoNetworkFlags = []string{"--network=none"}

// bootRuntime is rt as it starts a container: gVisor without a network gets
// gvisorNoNetworkFlags. (No other command of runsc depends on the network mode.)
func (b *Backend) bootRuntime(rt *ociRuntime) *ociRuntime {
	if !rt.gvisor || b.cfg.Network != nil {
		return rt
	}
	r := *rt
	r.flags = gvisorNoNetworkFlags
	return &r
}

// runsc container ids. runsc takes the id a command names as an abbreviation: it acts
// on the one container whose id starts with it, and fails when several do. With the
// sandbox ids as they are, `runsc delete ab` would fail for as long as a sandbox "abc"
// exists (ids can be chosen by callers: anyone could make another's sandbox impossible
// to stop or destroy), and once "ab" is gone it would delete "abc". So runsc knows
// container cid as cid + "+" (runscID): no sandbox id or group member id (<id>.<name>)
// has a '+', so no such id begins another, and every id names one container. ('+' is
// in runsc's id alphabet, [\w+.-]; '_' is too, but runsc's state file names use it as
// a separator.) Before running a command on a container, runsc's state file for
// exactly that id, <root>/<runsc id>_sandbox:<its sandbox's id>.state, must exist (else the error says it does
// not exist, as notExist recognises): a container of ours that is gone is never
// mistaken for another. (Only this backend deletes its containers, so one cannot
// vanish between the check and the command.) A container started before ids had the
// '+' keeps its id (runscID finds its state file).

// gvisorByID are the runsc commands run (ociRuntime.run) that name a container: its id
// is their first argument that is not a flag.
var gvisorByID = map[string]bool{"kill": true, "delete": true, "wait": true, "state": true,
	"pause": true, "resume": true, "checkpoint": true} // (checkpoint's flags: --image-path=DIR, one argument)

// runscIDSuffix ends every container id runsc knows (see above).
const runscIDSuffix = "+"

// runscState reports whether runsc has a container with exactly the id rid.
func (r *ociRuntime) runscState(rid string) bool {
	ents, _ := os.ReadDir(r.root) // not a glob: the state dir's path may hold '*' or '['
	for _, e := range ents {
		if n := e.Name(); strings.HasPrefix(n, rid+"_sandbox:") && strings.HasSuffix(n, ".state") {
			return true
		}
	}
	return false
}

// runscID is the id runsc knows container cid by (cid for other runtimes).
func (r *ociRuntime) runscID(cid string) string {
	if !r.gvisor || r.runscState(cid) { // the latter: started before the suffix
		return cid
	}
	return cid + runscIDSuffix
}

// fromRunscID is the container id of runsc's id rid.
func (r *ociRuntime) fromRunscID(rid string) string {
	if !r.gvisor {
		return rid
	}
	return strings.TrimSuffix(rid, runscIDSuffix)
}

// gvisorArgs maps the container id a runsc command names to runsc's (runscID) and
// fails, as "does not exist", when runsc has no container with exactly that id. rid is
// the runsc id the command names ("" when it names none).
func (r *ociRuntime) gvisorArgs(args []string) (out []string, rid string, err error) {
	if !r.gvisor || len(args) == 0 || !gvisorByID[args[0]] {
		return args, "", nil
	}
	for i, a := range args[1:] {
		if strings.HasPrefix(a, "-") {
			continue
		}
		if strings.ContainsAny(a, "*?[\\/") { // never a glob or a path: ids are [a-z0-9._-]
			return nil, "", fmt.Errorf("%s %s: bad container id %q", r.class, args[0], a)
		}
		rid := r.runscID(a)
		if !r.runscState(rid) {
			return nil, "", fmt.Errorf("%s %s: container %q does not exist", r.class, args[0], a)
		}
		out := append([]string(nil), args...)
		out[i+1] = rid
		return out, rid, nil
	}
	return args, "", nil
}

// dropStaleLocks removes runsc's lock files of container rid that have no state file
// beside them. runsc opens a container's lock file with O_CREATE after finding its state
// file: a command that found it just before a concurrent delete removed both recreates
// the lock file, fails, and leaves it behind. run calls this after every such command
// that failed, and after a delete, so whoever could have made one also removes it. A
// create under the same id holds its lock file (flock) from before its state file
// exists until it is written: a lock file is removed only while it can be locked at once
// and no state file is beside it.
func (r *ociRuntime) dropStaleLocks(rid string) {
	ents, _ := os.ReadDir(r.root)
	for _, e := range ents {
		n := e.Name()
		if !strings.HasPrefix(n, rid+"_sandbox:") || !strings.HasSuffix(n, ".lock") || !e.Type().IsRegular() {
			continue
		}
		state := filepath.Join(r.root, strings.TrimSuffix(n, ".lock")+".state")
		if _, err := os.Lstat(state); !errors.Is(err, fs.ErrNotExist) {
			continue
		}
		f, err := os.OpenFile(filepath.Join(r.root, n), os.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			continue
		}
		if unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) == nil {
			if _, err := os.Lstat(state); errors.Is(err, fs.ErrNotExist) {
				_ = os.Remove(filepath.Join(r.root, n))
			}
		}
		f.Close() // releases the lock
	}
}

// isGVisor reports whether a runtime class is driven as runsc.
func isGVisor(class, binary string) bool {
	return class == GVisorClass || strings.HasPrefix(filepath.Base(binary), "runsc")
}

// agentListenAddr is where the agent listens inside a gVisor sandbox.
var agentListenAddr = "unix:" + path.Join(agentconfig.StateDir, agentSocket)

// FindRunsc returns the runsc binary to use for the gvisor class, or "": $SANDBOXD_RUNSC,
// else the pinned build in ${SANDBOXD_CACHE:-/var/cache/sandboxd}/runsc/<RunscBuild>/,
// else a plain build of the pinned version in .../runsc/<RunscVersion>/ (made by an
// earlier build script: the same runsc, without precompiled seccomp programs), else runsc
// on $PATH.
func FindRunsc() string {
	if p := os.Getenv("SANDBOXD_RUNSC"); p != "" {
		if abs, err := filepath.Abs(p); err == nil && isExecutable(abs) {
			return abs
		}
		return ""
	}
	cache := os.Getenv("SANDBOXD_CACHE")
	if cache == "" {
		cache = "/var/cache/sandboxd"
	}
	for _, build := range []string{RunscBuild, RunscVersion} {
		if p := filepath.Join(cache, "runsc", build, "runsc"); isExecutable(p) {
			return p
		}
	}
	if p, err := exec.LookPath("runsc"); err == nil {
		if abs, err := filepath.Abs(p); err == nil {
			return abs
		}
	}
	return ""
}

func isExecutable(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0
}

// DefaultRuntimes is the runtime classes a Backend offers when Config.Runtimes is empty:
// runc, and gvisor when FindRunsc finds runsc. Which classes a sandbox may use is the
// runner's policy's business.
func DefaultRuntimes() map[string]string {
	m := map[string]string{"runc": "/usr/sbin/runc"}
	if p := FindRunsc(); p != "" {
		m[GVisorClass] = p
	}
	return m
}

// RuntimeClasses lists the classes this Backend runs, the default first.
func (b *Backend) RuntimeClasses() []string {
	out := []string{b.cfg.DefaultRuntime}
	for c := range b.runtimes {
		if c != b.cfg.DefaultRuntime {
			out = append(out, c)
		}
	}
	slices.Sort(out[1:])
	return out
}

// agentWaitTimeout bounds how long Create waits for a gVisor sandbox's agent to listen.
const agentWaitTimeout = 30 * time.Second

// waitAgent waits until the agent of s (started by runsc, listening on its own) accepts
// a connection on its socket, or the sandbox has ended after its agent ran; it fails
// when the sandbox ends without its agent having run.
// agentPollMax caps the interval of waitAgent's dials: a refused dial of a unix
// socket costs microseconds, and every millisecond between the agent listening and
// the dial is on the start, resume and fork paths.
const agentPollMax = 2 * time.Millisecond

func (b *Backend) waitAgent(ctx context.Context, s *sandbox) error {
	ctx, cancel := context.WithTimeout(ctx, agentWaitTimeout)
	defer cancel()
	runDir := filepath.Join(shownDir(s.dir), dirRun)
	pause := time.Millisecond
	for {
		c, err := dialVerified(ctx, s.dir, s.ident)
		if err == nil {
			return c.Close()
		}
		if errors.Is(err, agent.ErrIdentity) {
			return fmt.Errorf("sandbox %s: %w", s.id, err)
		}
		if s.proc != nil && s.proc.exited() {
			// A main command that ends at once may take the agent (and the sandbox) with
			// it before a dial got through: that is an exit for the watcher to record,
			// as under runc. The agent ran once it has opened its main log (the log
			// store's index, created in newAgent before the agent answers or starts its
			// main command); status.json is no marker: a new agent writes none before
			// its main command's RUNNING, and an agent killed while STARTING ran all
			// the same. Without the index the agent never ran: a start error.
			if _, err := os.Lstat(logstore.IndexPath(filepath.Join(runDir, agentconfig.LogsDir), agentconfig.MainLog)); err == nil {
				return nil
			}
			return fmt.Errorf("the sandbox exited before its agent listened: %s", tailOf(filepath.Join(s.dir, fileAgentOut), 1024))
		}
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return fmt.Errorf("agent not listening after %v: %w: %s", agentWaitTimeout, err, tailOf(filepath.Join(s.dir, fileAgentOut), 1024))
			}
			return ctx.Err()
		case <-time.After(pause):
		}
		pause = min(2*pause, agentPollMax)
	}
}

// ensureCpusetParents makes the cgroup v1 cpuset dirs from the root down to parent
// (the sandboxes' cgroup parent) and gives each an empty cpuset.cpus and cpuset.mems its
// own parent's. runc does this for a container's new ancestors; runsc does not, and a
// child's cpuset can only be a subset of its parent's (EACCES otherwise), so a gVisor
// sandbox with a cpuset needs it done first. Without a v1 cpuset hierarchy it does
// nothing.
func ensureCpusetParents(parent string) error {
	root := filepath.Join(cgroupRoot, "cpuset")
	if _, err := os.Stat(filepath.Join(root, "cpuset.cpus")); err != nil {
		return nil
	}
	dir := root
	for _, part := range strings.Split(strings.Trim(parent, "/"), "/") {
		if part == "" {
			continue
		}
		up := dir
		dir = filepath.Join(dir, part)
		if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("cpuset cgroup %s: %w", dir, err)
		}
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			cur, err := os.ReadFile(filepath.Join(dir, f))
			if err != nil {
				return fmt.Errorf("cpuset cgroup %s: %w", dir, err)
			}
			if strings.TrimSpace(string(cur)) != "" {
				continue
			}
			v, err := os.ReadFile(filepath.Join(up, f))
			if err != nil {
				return fmt.Errorf("cpuset cgroup %s: %w", up, err)
			}
			if err := os.WriteFile(filepath.Join(dir, f), v, 0o644); err != nil {
				return fmt.Errorf("cpuset cgroup %s: %s: %w", dir, f, err)
			}
		}
	}
	return nil
}
