package local

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/moby/profiles/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/internal/agentconfig"
	"github.com/sandboxd/sandboxd/internal/image"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

const (
	cpuPeriod        = 100000
	minCPUQuota      = 1000 // the kernel refuses quotas under 1 ms
	defaultPidsLimit = 4096
	maxNoFile        = 1048576
	agentPath        = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
)

// validID reports whether id is a usable sandbox id: [a-z0-9-], at most 63 characters, no
// leading or trailing dash (it becomes a hostname and a path component).
// maxIDLen is the longest sandbox ID (a hostname label).
const maxIDLen = 63

func validID(id string) bool { return runtime.ValidID(id, maxIDLen) }

// defaultCaps is the usual container capability set without CAP_NET_RAW: no raw or
// packet sockets (spoofing, sniffing the bridge); ping works through ICMP datagram
// sockets instead (net.ipv4.ping_group_range in the sandbox's network namespace).
var defaultCaps = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD",
	"CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE",
	"CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
}

var maskedPaths = []string{
	"/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
	"/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/sys/firmware", "/proc/scsi",
}

// readonlyPaths: /sys/fs/cgroup too, because on a cgroup v1 host runc mounts a writable
// tmpfs there under the controllers' read-only mounts, where a sandbox could plant a
// memory.max of its own for its programs to find.
var readonlyPaths = []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger", "/sys/fs/cgroup"}

// defaultSeccomp builds the default seccomp profile for defaultCaps once.
func defaultSeccomp() (*specs.LinuxSeccomp, error) { return seccompFor(defaultCaps) }

// seccompFor builds the default seccomp profile for a capability set: the profile
// allows the system calls a capability needs (mount for CAP_SYS_ADMIN, ...) only with it.
// The x32 ABI is left out on a kernel without it (seccomparch.go).
func seccompFor(caps []string) (*specs.LinuxSeccomp, error) {
	s := &specs.Spec{Process: &specs.Process{Capabilities: &specs.LinuxCapabilities{Bounding: caps}}}
	p, err := seccomp.GetDefaultProfile(s)
	if err != nil {
		return nil, err
	}
	p.Syscalls = withoutIoctls(p.Syscalls, btrfsSubvolumeIoctls)
	return withoutX32(p, hostHasX32()), nil
}

// btrfsSubvolumeIoctls make a btrfs subvolume or snapshot. Any user may make one in a
// directory it can write, and a disk volume is a subvolume of the volume pool
// (volpool.go) whose size is a qgroup limit: a subvolume made inside it would be a
// qgroup of its own, outside the limit. The profile refuses them (EPERM).
var btrfsSubvolumeIoctls = []uint32{
	0x50009401, // BTRFS_IOC_SNAP_CREATE
	0x5000940e, // BTRFS_IOC_SUBVOL_CREATE
	0x50009417, // BTRFS_IOC_SNAP_CREATE_V2
	0x50009418, // BTRFS_IOC_SUBVOL_CREATE_V2
}

// withoutIoctls returns rules with ioctl allowed for every request but refused.
// libseccomp ignores a conditional rule for a system call that an unconditional one
// allows, and runc turns several conditions on one argument into rules that any may
// match, so "allow unless" is said as allow rules that together match every other
// request: one masked comparison per branch off the refused values' binary prefixes.
// Only the low 32 bits are compared, as the kernel reads them (the request is an
// unsigned int): higher bits cannot smuggle a refused request past the filter.
func withoutIoctls(rules []specs.LinuxSyscall, refused []uint32) []specs.LinuxSyscall {
	out := make([]specs.LinuxSyscall, 0, len(rules)+64)
	for _, r := range rules {
		if r.Action == specs.ActAllow && len(r.Args) == 0 && slices.Contains(r.Names, "ioctl") {
			r.Names = slices.DeleteFunc(slices.Clone(r.Names), func(n string) bool { return n == "ioctl" })
		}
		if len(r.Names) > 0 {
			out = append(out, r)
		}
	}
	for _, m := range complementPatterns(refused, 31, 0) {
		out = append(out, specs.LinuxSyscall{Names: []string{"ioctl"}, Action: specs.ActAllow,
			Args: []specs.LinuxSeccompArg{{Index: 1, Value: m[0], ValueTwo: m[1], Op: specs.OpMaskedEqual}}})
	}
	return out
}

// complementPatterns returns (mask, value) pairs whose matches (x&mask == value) are
// exactly the 32-bit values that agree with prefix in the bits above bit and are not
// in vals (which all agree with it there).
func complementPatterns(vals []uint32, bit int, prefix uint32) [][2]uint64 {
	if bit < 0 {
		return nil // a refused value itself
	}
	mask := uint32(0xffffffff) << bit
	var out [][2]uint64
	for _, b := range []uint32{0, 1} {
		p := prefix | b<<bit
		var sub []uint32
		for _, v := range vals {
			if (v>>bit)&1 == b {
				sub = append(sub, v)
			}
		}
		if len(sub) == 0 {
			out = append(out, [2]uint64{uint64(mask), uint64(p)})
		} else {
			out = append(out, complementPatterns(sub, bit-1, p)...)
		}
	}
	return out
}

// readOnlyTmpfsBytes is the size of each writable tmpfs under a read-only root.
const readOnlyTmpfsBytes = 256 << 20

// agentCaps are what the agent (PID 1, root) needs to run commands as another user:
// switch to it, hand it the files it writes, reach into its dirs, signal its processes.
var agentCaps = []string{"CAP_SETUID", "CAP_SETGID", "CAP_KILL", "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER"}

// capSet is the capability set of a sandbox: defaultCaps, minus sec's drops ("ALL"
// drops every one), plus its adds. When commands run as a user other than root
// (nonRoot), agentCaps stay: the kernel clears a process's capabilities when the agent
// switches it to that user, and no_new_privs keeps it from regaining them, so the
// commands still run with none of them (only allow_privilege_escalation and a setuid-root
// binary could bring them back, up to this set).
func capSet(sec *runtime.Security, nonRoot bool) []string {
	caps := slices.Clone(defaultCaps)
	if sec == nil {
		return caps
	}
	if slices.Contains(sec.CapDrop, "ALL") {
		caps = nil
	} else {
		caps = slices.DeleteFunc(caps, func(c string) bool { return slices.Contains(sec.CapDrop, c) })
	}
	add := sec.CapAdd
	if nonRoot {
		add = append(slices.Clone(add), agentCaps...)
	}
	for _, c := range add {
		if !slices.Contains(caps, c) {
			caps = append(caps, c)
		}
	}
	return caps
}

// noFileLimit is min(host hard RLIMIT_NOFILE, 1048576): a container cannot get more than
// the runtime's own hard limit without CAP_SYS_RESOURCE.
func noFileLimit() uint64 {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil || rl.Max > maxNoFile {
		return maxNoFile
	}
	return rl.Max
}

// netSysctls are the sysctls of a sandbox's network namespace. Without CAP_NET_RAW,
// ping needs ICMP datagram sockets: allow them to every group.
var netSysctls = map[string]string{"net.ipv4.ping_group_range": "0 2147483647"}

// rlimits are a sandbox's resource limits. Processes and threads are bounded by the pids
// cgroup (DefaultPidsLimit), not RLIMIT_NPROC: that one counts per host uid, so without
// user namespaces one sandbox's uid 1000 would eat into every other's (and the host's),
// and with them it would only repeat the pids limit. Core dumps are off: the host's
// core_pattern would write them into the sandbox's disk (or, for a pipe pattern, hand
// them to a host helper), and nothing reads them.
func rlimits(noFile uint64) []specs.POSIXRlimit {
	return []specs.POSIXRlimit{
		{Type: "RLIMIT_NOFILE", Hard: noFile, Soft: noFile},
		{Type: "RLIMIT_CORE", Hard: 0, Soft: 0},
	}
}

// specParams is what varies between sandboxes in the OCI spec.
type specParams struct {
	ID        string
	RootFS    string // absolute
	NetNS     string // "" = a new, empty network namespace
	Cgroups   string
	Resources runtime.Resources
	Agent     string // host path of the agent binary
	Config    string // host path of agent-config.json
	RunDir    string // host dir mounted at agentconfig.StateDir
	EtcDir    string // host dir holding hosts, hostname, resolv.conf
	Seccomp   *specs.LinuxSeccomp
	// SeccompProgram, when set, is the host file of Seccomp compiled (seccompcache.go):
	// the agent installs it and config.json has no linux.seccomp (see agentFilter).
	SeccompProgram string
	// SeccompSHA256 is the hex SHA-256 of SeccompProgram's bytes: the agent checks it.
	SeccompSHA256 string
	NoFile        uint64
	// GVisor adapts the spec to runsc: the agent listens itself (no fd 3) and there is
	// no OCI seccomp profile (see gvisor.go).
	GVisor bool
	// IDs, when set, runs the container in a user namespace of its own mapping its IDs
	// 0..Size-1 to this host range (see userns.go).
	IDs *idRange
	// Security is the sandbox's security context (nil: the defaults).
	Security *runtime.Security
	// NonRoot: the agent runs commands as a user other than root (see capSet).
	NonRoot bool
	// Volumes are the bind mounts of the sandbox's scratch volumes (volumes.go).
	Volumes []specs.Mount
	// Sysfs, when set, is a host dir holding the sandbox's sysfs, bind-mounted at /sys
	// instead of a sysfs the runtime mounts (see mountNetNSSysfs).
	Sysfs string
	// CPUs is the sandbox's cpuset ("" none) and Limits the bind mounts of the files
	// showing its limits (see limits.go).
	CPUs   string
	Limits []specs.Mount
	// UserNS and UTSNS, when set, are the namespaces (/proc/<pid>/ns/…) of a group's
	// primary that this container joins (group.go): the same root and mapped IDs (ports
	// below 1024 in a network namespace that user namespace owns, shared file ownership)
	// and the same hostname.
	UserNS, UTSNS string
	// Tmpfs are paths where the container gets an empty, private tmpfs.
	Tmpfs []string
	// Engine, for a container-engine sandbox (gVisor only, engine.go), is the host dir
	// mounted read-only at engineMount; the process then has every capability (inside
	// gVisor), no_new_privs off and no cgroup mount (cws-engine makes its own).
	Engine string
	// EgressCA, when set, is the host dir of the sandbox's egress CA certificate, mounted
	// read-only at EgressCAMount (egresssecrets.go).
	EgressCA string
}

// agentFilter: the agent installs p's seccomp filter (p.SeccompProgram) instead of the
// runtime compiling p.Seccomp — only runc, and only with no_new_privs, which runc sets
// before it executes the agent (without it, runc installs the filter before it drops
// the capabilities that need it: such a spec keeps runc's filter).
func agentFilter(p specParams) bool { return p.SeccompProgram != "" && agentFilterable(p) }

// agentFilterable: p's filter may be installed by the agent (agentFilter) once compiled.
// Not with volumes: runc resolves mount destinations inside the root filesystem following
// its symlinks, so an image symlink (/data -> /.sandboxd) could put a volume — content
// the organization's other sandboxes write, and may change while runc resolves a nested
// one — over /.sandboxd after the agent's files are mounted, and runc would execute a
// planted "agent" as pid 1: under runc's own filter that is the sandbox's own code, under
// none it would escape the profile. Every other mount's source is the backend's (fresh
// tmpfs, the host's etc files, sysfs, the egress CA), which holds no agent: a redirected
// one fails the start, and the agent checks the program's SHA-256.
func agentFilterable(p specParams) bool {
	return p.Seccomp != nil && !p.GVisor && p.Engine == "" && len(p.Volumes) == 0 &&
		(p.Security == nil || !p.Security.AllowPrivilegeEscalation)
}

func ociSpec(p specParams) *specs.Spec {
	hostname := runtime.Hostname(p.ID)
	caps := capSet(p.Security, p.NonRoot)
	ro := func(src, dst string) specs.Mount {
		return specs.Mount{Destination: dst, Type: "bind", Source: src, Options: []string{"bind", "ro", "nosuid", "nodev"}}
	}
	mounts := []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
		{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"}},
		{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
		{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
		{Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup", Options: []string{"nosuid", "noexec", "nodev", "relatime", "ro"}},
		ro(p.Agent, agentconfig.BinaryPath),
		ro(p.Config, agentconfig.ConfigPath),
	}
	if agentFilter(p) {
		mounts = append(mounts, ro(p.SeccompProgram, agentconfig.SeccompPath))
	}
	mounts = append(mounts, []specs.Mount{
		{Destination: agentconfig.StateDir, Type: "bind", Source: p.RunDir, Options: []string{"rbind", "rw", "nosuid", "nodev", "noexec"}},
		ro(p.EtcDir+"/hosts", "/etc/hosts"),
		ro(p.EtcDir+"/hostname", "/etc/hostname"),
		ro(p.EtcDir+"/resolv.conf", "/etc/resolv.conf"),
	}...)

	if p.Sysfs != "" {
		for i := range mounts {
			if mounts[i].Destination == "/sys" {
				mounts[i] = specs.Mount{Destination: "/sys", Type: "bind", Source: p.Sysfs,
					Options: []string{"rbind", "ro", "nosuid", "nodev", "noexec"}}
			}
		}
	}

	if p.EgressCA != "" {
		mounts = append(mounts, specs.Mount{Destination: EgressCAMount, Type: "bind", Source: p.EgressCA,
			Options: []string{"rbind", "ro", "nosuid", "nodev", "noexec"}})
	}

	mounts = append(mounts, p.Limits...) // over /proc and /sys files

	readOnly := p.Security != nil && p.Security.ReadOnlyRootFS
	if readOnly {
		// What stays writable: empty tmpfs mounts, whose pages count against the
		// sandbox's memory limit (like Kubernetes' memory-backed emptyDir), unless a
		// volume is mounted there.
		for _, d := range runtime.ReadOnlyWritablePaths {
			if slices.ContainsFunc(p.Volumes, func(m specs.Mount) bool { return m.Destination == d }) {
				continue
			}
			mounts = append(mounts, specs.Mount{Destination: d, Type: "tmpfs", Source: "tmpfs",
				Options: []string{"nosuid", "nodev", "mode=1777", "size=" + strconv.FormatInt(readOnlyTmpfsBytes, 10)}})
		}
	}
	for _, d := range p.Tmpfs {
		// Pages count against the container's memory limit, as for a read-only root's.
		mounts = append(mounts, specs.Mount{Destination: d, Type: "tmpfs", Source: "tmpfs",
			Options: []string{"nosuid", "nodev", "mode=1777", "size=" + strconv.FormatInt(readOnlyTmpfsBytes, 10)}})
	}
	mounts = append(mounts, p.Volumes...) // last: a volume may sit in a tmpfs above
	noNewPrivs := p.Security == nil || !p.Security.AllowPrivilegeEscalation
	if p.Engine != "" {
		caps, noNewPrivs = slices.Clone(allCaps), false
		mounts = slices.DeleteFunc(mounts, func(m specs.Mount) bool { return m.Destination == "/sys/fs/cgroup" })
		mounts = append(mounts, specs.Mount{Destination: engineMount, Type: "bind", Source: p.Engine,
			Options: []string{"rbind", "ro", "nosuid", "nodev", "noexec"}})
	}

	res := &specs.LinuxResources{
		Devices: []specs.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}},
	}
	pids := p.Resources.Pids
	if pids <= 0 {
		pids = defaultPidsLimit
	}
	res.Pids = &specs.LinuxPids{Limit: &pids}
	if m := p.Resources.MemoryBytes; m > 0 {
		res.Memory = &specs.LinuxMemory{Limit: &m, Swap: &m}
	}
	if mc := p.Resources.MilliCPU; mc > 0 {
		q := mc * cpuPeriod / 1000
		if q < minCPUQuota {
			q = minCPUQuota
		}
		period := uint64(cpuPeriod)
		res.CPU = &specs.LinuxCPU{Quota: &q, Period: &period}
	}
	if p.CPUs != "" {
		if res.CPU == nil {
			res.CPU = &specs.LinuxCPU{}
		}
		res.CPU.Cpus = p.CPUs
	}

	netns := specs.LinuxNamespace{Type: specs.NetworkNamespace, Path: p.NetNS}
	args := []string{agentconfig.BinaryPath}
	seccomp := p.Seccomp
	// Without CAP_NET_RAW, ping needs ICMP datagram sockets: allow them to every group.
	// The sysctl belongs to the sandbox's own network namespace.
	sysctl := maps.Clone(netSysctls)
	if p.GVisor {
		args = append(args, "--listen-fd=-1")
		seccomp, sysctl = nil, nil
	}
	if agentFilter(p) {
		args = append(args, "--seccomp-filter="+agentconfig.SeccompPath, "--seccomp-filter-sha256="+p.SeccompSHA256)
		seccomp = nil
	}
	// The cgroup namespace roots /sys/fs/cgroup and /proc/self/cgroup at the sandbox's
	// own cgroup: no host path, no sibling sandbox (on cgroup v2 without it a sandbox
	// outside a user namespace would mount the whole hierarchy).
	namespaces := []specs.LinuxNamespace{
		{Type: specs.PIDNamespace}, {Type: specs.MountNamespace}, netns,
		{Type: specs.IPCNamespace}, {Type: specs.UTSNamespace, Path: p.UTSNS}, {Type: specs.CgroupNamespace},
	}
	if p.UTSNS != "" {
		hostname = "" // the primary's UTS namespace has it; runc may not set it in one joined
	}
	var uids, gids []specs.LinuxIDMapping
	if p.IDs != nil {
		namespaces = append(namespaces, specs.LinuxNamespace{Type: specs.UserNamespace, Path: p.UserNS})
		m := []specs.LinuxIDMapping{{ContainerID: 0, HostID: p.IDs.HostID, Size: p.IDs.Size}}
		uids, gids = m, m
		if p.NetNS != "" {
			// A network namespace made by the host belongs to the host's user namespace:
			// the container's root may not write its sysctls; the backend sets them.
			sysctl = nil
		} else if sysctl != nil {
			// The new network namespace belongs to the new user namespace, where only the
			// mapped group IDs exist.
			sysctl["net.ipv4.ping_group_range"] = fmt.Sprintf("0 %d", p.IDs.Size-1)
		}
	}
	return &specs.Spec{
		Version: specs.Version,
		Process: &specs.Process{
			User: specs.User{UID: 0, GID: 0},
			Args: args,
			Env:  []string{"PATH=" + agentPath, "HOME=/root"},
			Cwd:  "/",
			Capabilities: &specs.LinuxCapabilities{
				Bounding: caps, Effective: caps, Permitted: caps,
			},
			Rlimits:         rlimits(p.NoFile),
			NoNewPrivileges: noNewPrivs,
		},
		Root:     &specs.Root{Path: p.RootFS, Readonly: readOnly},
		Hostname: hostname,
		Mounts:   mounts,
		Linux: &specs.Linux{
			Namespaces:    namespaces,
			UIDMappings:   uids,
			GIDMappings:   gids,
			Resources:     res,
			CgroupsPath:   p.Cgroups,
			Seccomp:       seccomp,
			MaskedPaths:   maskedPaths,
			ReadonlyPaths: readonlyPaths,
			Sysctl:        sysctl,
		},
	}
}

// nonRootUser reports whether an agent user string ("uid[:gid]", "name[:group]", "")
// names a user other than root.
func nonRootUser(user string) bool {
	u, _, _ := strings.Cut(user, ":")
	return u != "" && u != "0" && u != "root"
}

func agentConfig(spec *runtime.Spec, img *Image) (*agentconfig.Config, error) {
	return containerAgentConfig(&spec.Container, spec.ID, img)
}

// containerAgentConfig is the agent config of container spec (of sandbox id) on img.
func containerAgentConfig(spec *runtime.Container, id string, img *Image) (*agentconfig.Config, error) {
	ic := img.Config
	argv, err := image.Config{Entrypoint: ic.Entrypoint, Cmd: ic.Cmd}.Argv(spec.Command, spec.Args)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", runtime.ErrInvalidSpec, err)
	}
	wd := spec.WorkingDir
	if wd == "" {
		wd = img.Config.WorkingDir
	}
	if wd == "" {
		wd = "/"
	}
	c := &agentconfig.Config{
		Argv:         argv,
		Env:          agentconfig.MergeEnv(img.Config.Env, spec.Env),
		WorkingDir:   wd,
		User:         spec.Security.RunAs(img.Config.User),
		RestartLimit: spec.RestartLimit,
		Hostname:     runtime.Hostname(id),
	}
	for _, f := range spec.Files {
		c.Files = append(c.Files, agentconfig.File{Path: f.Path, Content: f.Content, Mode: f.Mode})
	}
	return c, nil
}
