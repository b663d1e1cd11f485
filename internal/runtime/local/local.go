// Package local is the single-host backend: one OCI container per sandbox, started with an
// OCI runtime CLI (runc by default) over a per-sandbox overlayfs root, with sandbox-agent
// as PID 1 listening on a unix socket the backend creates on the host. A multi-container
// sandbox (sidecars, init containers) is a group of such containers sharing the
// group's network, UTS and user namespaces under runc (group.go, groupns.go), and one
// runsc sandbox (one sentry) under gVisor (gvisor_group.go).
//
// Runtime classes: "runc" (the default) and "gvisor" (runsc on the systrap platform,
// offered when FindRunsc finds a static runsc; scripts/build-runsc.sh builds it). The
// agent channel is the same unix socket, <dir>/run/agent.sock, for both: under runc the
// backend makes it and passes it as fd 3; under gVisor a host socket cannot be accepted
// on inside the sandbox, so the agent binds it itself and runsc's gofer creates it on
// the host (--host-uds=create). No TCP channel and no new credentials are needed, and
// sandboxes without a network work under both. gvisor.go has the details and the other
// differences (no OCI seccomp profile, SIGTERM via `runsc kill`, runc-only warm pool).
//
// Pause, resume and fork (runtime.Pauser, runtime.Forker): a freeze for every class, a
// checkpoint (resources released) and forks for single-container gVisor sandboxes with
// `runsc checkpoint`/`runsc restore`; see pause.go and fork.go.
//
// Everything about a sandbox lives in <StateDir>/<id>/ (see the file names below) and in
// the OCI runtime's state under <StateDir>/.oci/<runtime class>/, so a new Backend on the
// same StateDir recovers what an earlier one started.
package local

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	goruntime "runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/internal/agent"
	"github.com/sandboxd/sandboxd/internal/agentconfig"
	"github.com/sandboxd/sandboxd/internal/ckptspace"
	"github.com/sandboxd/sandboxd/internal/egress"
	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/failpoint"
	"github.com/sandboxd/sandboxd/internal/image"
	"github.com/sandboxd/sandboxd/internal/progress"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/local/network"
	"github.com/sandboxd/sandboxd/internal/runtime/startseq"
	"github.com/sandboxd/sandboxd/internal/span"
	"github.com/sandboxd/sandboxd/internal/tracing"
)

// Files and dirs in a sandbox's dir.
const (
	fileSpec        = "spec.json"         // the runtime.Spec, minus credentials
	fileInfo        = "info.json"         // what Create learned: Info, init pid + start time
	fileExit        = "exit.json"         // the Exit, once the container has ended
	fileAgentConfig = "agent-config.json" // agentconfig.Config, mounted read-only
	fileAgentOut    = "agent.out"         // the runtime's and the agent's stdout/stderr
	filePid         = "init.pid"
	dirBundle       = "bundle" // config.json + rootfs (overlay mount point)
	dirUpper        = "upper"
	dirWork         = "work"
	dirRun          = "run" // agent state (gVisor: agent.sock); mounted at agentconfig.StateDir
	dirEtc          = "etc" // hosts, hostname, resolv.conf
	// dirShown, on a sandbox's own disk filesystem, holds what is mounted into the sandbox
	// from the host: run, etc and the agent config (see shownDir).
	dirShown    = dirDisk + "/.sandboxd"
	agentSocket = "agent.sock"
	ociRootDir  = ".oci" // ids cannot start with a dot
	// dirRootfs holds root filesystem mount points (see rootfsBase in userns.go).
	dirRootfs = ".rootfs"
	// diskTemplatesDir holds formatted disk images to copy (disk.go).
	diskTemplatesDir = ".disk"
	// poolBundles holds the bundles of pooled containers, <cid>/{config.json,rootfs}: the
	// OCI runtime keeps the bundle path (`runc exec` changes into it), and a claim renames
	// the container's dir, so their bundle lives outside it.
	poolBundles = ".pool"
)

// Config configures a Backend.
type Config struct {
	StateDir    string // one dir per sandbox; must be absolute
	AgentBinary string // host path of the static sandbox-agent
	// Runtimes maps runtime class -> OCI runtime binary; default DefaultRuntimes(): runc
	// at /usr/sbin/runc, plus gvisor when FindRunsc finds runsc.
	Runtimes map[string]string
	// DefaultRuntime is the class for specs without one; default "runc".
	DefaultRuntime string
	// OCIRuntime is the OCI runtime CLI of the runc class: "runc" (or "", the default:
	// Runtimes' binary) or "crun" (FindCrun's binary replaces it). See ocichoice.go.
	OCIRuntime string
	// CgroupParent names the cgroup every sandbox's cgroup is made under: cgroupsPath is
	// /<CgroupParent>/<id> (cgroupfs). Default "sandboxd".
	CgroupParent string
	Images       Images
	// Network gives each sandbox a network namespace on the host bridge. nil: every
	// sandbox gets a new, empty network namespace (loopback only).
	Network Network
	// EgressRootsFile is the host CA bundle a sandbox with egress secrets trusts besides
	// its own CA (bundle.pem); "": the first of egress.DefaultRootsFiles.
	EgressRootsFile string
	Logger          *slog.Logger
	// Pool keeps pre-started containers for images recently created (see pool.go).
	// The zero value disables it.
	Pool PoolConfig
	// MaxPrepull bounds the images pre-pulled for warm targets (prepull.go); 0 means
	// DefaultMaxPrepull, negative disables pre-pull.
	MaxPrepull int
	// DiskBytes is the default size limit of a sandbox's writable layer (see disk.go);
	// 0 means none. A spec's Resources.DiskBytes overrides it.
	DiskBytes int64
	// NoUserNS runs runc sandboxes without a user namespace of their own (root in the
	// sandbox is then root on the host, confined by capabilities, seccomp and the other
	// namespaces only). See userns.go; gVisor sandboxes are not affected.
	NoUserNS bool
	// NoVolumePool keeps disk volumes out of the btrfs volume pool (volpool.go), as on a
	// host without btrfs: no file-system snapshots then.
	NoVolumePool bool
	// SnapshotCacheBytes bounds the snapshots kept for restores (snapshot.go); 0 means a
	// tenth of the volume pool's size, at most 20 GiB.
	SnapshotCacheBytes int64
	// ColdStarts bounds the Creates starting a new container (not served by the warm
	// pool) in the CPU-heavy part of the start at once: root filesystem mount, bundle,
	// `runc run`/`runsc`, the gVisor agent's handshake (the image pull, volumes, the
	// network and a fork's wait for its source run before, unbounded). More wait, served
	// round robin over organizations, one organization holding at most ColdStarts-1
	// while another waits (coldgate.go). 0 means max(4, 2×GOMAXPROCS); negative: no bound.
	ColdStarts int
	// ForkSentries bounds the forks holding a sandbox of their own that is not restored
	// yet: a fork's `runsc create` (its sentry and gofer) is made while its source is
	// checkpointed, and it waits for the checkpoint with its cold-start slot given back,
	// so without this bound such sandboxes are bounded only by capacity. More forks wait
	// before `runsc create`, holding no cold-start slot, served round robin over
	// organizations, one organization holding at most ForkSentries-1 while another waits
	// (coldgate.go, forkSentry). 0 means max(4, 2×GOMAXPROCS); negative: no bound; at
	// most MaxForkSentries.
	ForkSentries int
	// CheckpointQuotaBytes bounds the bytes of the gVisor checkpoint images in StateDir
	// (paused sandboxes' and those being written, a pause's or a fork's): a checkpoint
	// whose estimate does not fit is refused with runtime.ErrCheckpointSpaceExhausted
	// before the sandbox is touched (ckptspace.go). 0: no quota.
	CheckpointQuotaBytes int64
	// CheckpointMinFreeBytes is what a checkpoint must leave free on StateDir's file
	// system after the checkpoints in flight. With CheckpointQuotaBytes 0 too, free
	// space is not checked; otherwise an estimate must at least fit it.
	CheckpointMinFreeBytes int64
}

// MaxForkSentries is the largest Config.ForkSentries.
const MaxForkSentries = 4096

// validateForkSentries checks Config.ForkSentries.
func validateForkSentries(n int) error {
	if n > MaxForkSentries {
		return fmt.Errorf("local backend: ForkSentries %d: at most %d (0: the default, negative: no bound)", n, MaxForkSentries)
	}
	return nil
}

// Backend is the local runtime.Backend.
type Backend struct {
	cfg      Config
	runtimes map[string]*ociRuntime
	seccomp  *specs.LinuxSeccomp
	scache   *seccompCache // seccomp filters compiled (seccompcache.go)
	noFile   uint64
	log      *slog.Logger

	mu        sync.Mutex
	sandboxes map[string]*sandbox

	ckpt    *ckptspace.Gate // checkpoint space (ckptspace.go); nil: no bound
	pool    *pool           // nil: no warm pool
	cold    *coldGate       // cold starts' admission (nil: no bound)
	forks   *coldGate       // forks' sandboxes not restored yet (nil: no bound)
	prepull *prepuller      // nil: no image pre-pull (Config.MaxPrepull < 0)

	ids *idAllocator // user namespace ranges; nil with Config.NoUserNS

	disks *diskTemplates // formatted images for disk limits and volumes (disk.go)
	// managedMu serializes making, mounting and removing managed volumes (managed.go).
	managedMu sync.Mutex
	vols      *volPool   // disk volumes' btrfs pool (volpool.go); nil with Config.NoVolumePool
	snaps     *snapCache // snapshots ready for restores (snapshot.go)
	// rootfsBase, when set, is where containers' root filesystems are mounted, as
	// <rootfsBase>/<cid>, instead of in their bundles (see rootfsBase in userns.go).
	rootfsBase string

	// hostCPUs are the CPUs sandboxes' cpusets are taken from (see limits.go).
	hostCPUs []int
	// crunCgroupDirs are the cgroup hierarchy dirs a crun container's spec keeps
	// read-only (ocichoice.go, crunSpec).
	crunCgroupDirs []string

	// trace, when set (tests, benchmarks), receives the duration of each Create step.
	trace func(step string, d time.Duration)
}

// Backend is a runtime.Backend with these optional interfaces (runtime/capabilities.go;
// EgressReserver is asserted next to ReservedEgress; VolumeCapturer, SnapshotCache and
// SupportReporter in snapshot.go). It enforces every network rule; it reports
// NoSnapshots when it has no volume pool.
var (
	_ runtime.Backend            = (*Backend)(nil)
	_ runtime.LogDirProvider     = (*Backend)(nil)
	_ runtime.ContainerLogOpener = (*Backend)(nil)
	_ runtime.OOMCounter         = (*Backend)(nil)
	_ runtime.RuntimeClassLister = (*Backend)(nil)

	_ runtime.ContainerStatusReporter = (*Backend)(nil)
)

// sandbox is a container this Backend tracks.
type sandbox struct {
	id string
	// egress and egressCADir: the sandbox's egress secrets and the host dir of its CA
	// certificate (egresssecrets.go); nil and "" for a sandbox without.
	egress      *egress.SandboxSecrets
	egressCADir string
	// cid is the container's own id: the OCI runtime's container id, the cgroup name and
	// the network attachment id. It is id, except for a sandbox that claimed a pooled
	// container (set under Backend.mu).
	cid  string
	dir  string
	rt   *ociRuntime
	spec runtime.Spec
	// engineCreds are spec.Engine's pull credentials (kept out of spec), for the engine
	// images' pull at create only.
	engineCreds map[string]*runtime.Credentials
	info        persistedInfo
	proc        *proc // nil once known to be gone
	// ident is what the sandbox's agent must prove on every connection (identity.go in
	// internal/agent; set under Backend.mu); nil for sandboxes made before agents had one.
	ident *agentconfig.Identity
	// cpus is the sandbox's cpuset (nil: none; see limits.go; set under Backend.mu).
	cpus []int

	// cgroup is the container's cgroup below CgroupParent; "" means cid. A group's
	// containers have <id>/<name>: one cgroup per sandbox with one per container in it,
	// so no process sits in a cgroup that has children (see group.go).
	cgroup string
	// name is the container's name in a group ("" for a single-container sandbox).
	name string
	// members are a group's other containers, init containers then sidecars (nil for a
	// single-container sandbox); member marks one of them (no network of its own).
	members []*sandbox
	member  bool
	// join, set while a member launches, is what of its primary it shares (group.go).
	join *joinParams
	// held is the agent config a group's container gets with Start (its agent starts in
	// standby); volumeRoots are a group primary's volumes by name, for its members.
	held        *agentconfig.Config
	volumeRoots map[string]string
	// secretEnv is the container's runtime.Container.SecretEnv until Start has sent it
	// (with held) to the agent: memory only, never in a file of the data dir.
	secretEnv map[string]string

	// Pausing (pause.go). opMu serializes Pause, Resume, Fork's checkpoint and Stop of a
	// paused sandbox; paused (under Backend.mu) is set while it is paused; ck (under
	// Backend.mu) while it is being or has been checkpointed: its watcher then waits for
	// what follows the sentry's end instead of recording an exit.
	opMu   sync.Mutex
	paused *pauseMarker
	ck     *ckWait
	// fork, while a fork is created (fork.go): what of its source it starts from.
	fork *forkParams

	ready  chan struct{} // closed when Create has finished (at once for loaded sandboxes)
	failed bool          // Create failed and undid everything; set before ready closes
	done   chan struct{} // closed when exit is set
	exit   runtime.Exit
}

// persistedInfo is info.json.
type persistedInfo struct {
	IP           string    `json:"ip,omitempty"`
	RuntimeClass string    `json:"runtime_class"`
	ImageDigest  string    `json:"image_digest,omitempty"`
	StartedAt    time.Time `json:"started_at"`
	Pid          int       `json:"pid"`
	PidStart     uint64    `json:"pid_start"`
	// ContainerID is the container's id when it is not the sandbox id (a claimed pooled
	// container): the mapping survives a restart in the sandbox's own dir.
	ContainerID string `json:"container_id,omitempty"`
	// Agent is the identity the container's agent proves (host-only: info.json is in the
	// sandbox's dir, which the sandbox never sees).
	Agent *agentconfig.Identity `json:"agent_identity,omitempty"`
	// CPUs is the container's cpuset (see limits.go), so a restarted backend places new
	// sandboxes around it.
	CPUs []int `json:"cpus,omitempty"`
	// Cgroup is the container's cgroup below the backend's CgroupParent when it is not
	// the container id (a group's containers: <id>/<name>).
	Cgroup string `json:"cgroup,omitempty"`
}

func (p persistedInfo) toInfo(id string) runtime.Info {
	return runtime.Info{ID: id, IP: p.IP, RuntimeClass: p.RuntimeClass, ImageDigest: p.ImageDigest, StartedAt: p.StartedAt}
}

// New checks cfg and returns a Backend. It starts nothing; call Recover to adopt
// sandboxes from an earlier run.
func New(cfg Config) (*Backend, error) {
	if cfg.StateDir == "" || !filepath.IsAbs(cfg.StateDir) {
		return nil, fmt.Errorf("local backend: StateDir %q must be an absolute path", cfg.StateDir)
	}
	if strings.ContainsAny(cfg.StateDir, ",:\\") {
		return nil, fmt.Errorf("local backend: StateDir %q must not contain ',', ':' or '\\' (overlayfs options)", cfg.StateDir)
	}
	cfg.StateDir = filepath.Clean(cfg.StateDir)
	if cfg.AgentBinary == "" {
		return nil, errors.New("local backend: AgentBinary is required")
	}
	abs, err := filepath.Abs(cfg.AgentBinary)
	if err != nil {
		return nil, err
	}
	cfg.AgentBinary = abs
	if st, err := os.Stat(cfg.AgentBinary); err != nil {
		return nil, fmt.Errorf("local backend: agent binary: %w", err)
	} else if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("local backend: agent binary %s: not a regular file", cfg.AgentBinary)
	}
	if err := checkStaticExecutable(cfg.AgentBinary); err != nil {
		return nil, fmt.Errorf("local backend: agent binary %s: %w", cfg.AgentBinary, err)
	}
	if cfg.Images == nil {
		return nil, errors.New("local backend: Images is required")
	}
	if err := validateForkSentries(cfg.ForkSentries); err != nil {
		return nil, err
	}
	ckpt, err := newCheckpointGate(cfg)
	if err != nil {
		return nil, err
	}
	if len(cfg.Runtimes) == 0 {
		cfg.Runtimes = DefaultRuntimes()
	}
	if cfg.Runtimes, err = applyOCIRuntime(cfg.Runtimes, cfg.OCIRuntime); err != nil {
		return nil, err
	}
	if cfg.DefaultRuntime == "" {
		cfg.DefaultRuntime = "runc"
	}
	if _, ok := cfg.Runtimes[cfg.DefaultRuntime]; !ok {
		return nil, fmt.Errorf("local backend: default runtime %q is not in Runtimes", cfg.DefaultRuntime)
	}
	if cfg.CgroupParent == "" {
		cfg.CgroupParent = "sandboxd"
	}
	cfg.CgroupParent = strings.Trim(cfg.CgroupParent, "/")
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	sc, err := defaultSeccomp()
	if err != nil {
		return nil, fmt.Errorf("local backend: seccomp profile: %w", err)
	}
	b := &Backend{
		cfg:       cfg,
		ckpt:      ckpt,
		runtimes:  map[string]*ociRuntime{},
		seccomp:   sc,
		scache:    newSeccompCache(cfg.StateDir),
		noFile:    noFileLimit(),
		log:       cfg.Logger,
		sandboxes: map[string]*sandbox{},
		hostCPUs:  hostCPUs(),
	}
	for class, bin := range cfg.Runtimes {
		if class == "" || strings.ContainsAny(class, "/.") {
			return nil, fmt.Errorf("local backend: bad runtime class name %q", class)
		}
		if !filepath.IsAbs(bin) {
			return nil, fmt.Errorf("local backend: runtime %q binary %q must be an absolute path", class, bin)
		}
		rt := newOCIRuntime(class, bin, filepath.Join(cfg.StateDir, ociRootDir, class))
		if !rt.gvisor {
			// runc and crun keep their states apart and cannot read each other's.
			want := OCIRunc
			if rt.crun {
				want = OCICrun
			}
			if got := ociStateOf(rt.root); got != "" && got != want {
				return nil, fmt.Errorf("local backend: runtime %q: %s holds containers started by %s, not %s: destroy them first, or keep the OCI runtime %s", class, rt.root, got, want, got)
			}
		}
		if !rt.gvisor && usesSealedCopy(bin) {
			exe, err := sealedExe(bin)
			if err == nil {
				exe, err = linkExe(filepath.Join(cfg.StateDir, ociRootDir, ".exe-"+class), filepath.Base(bin), exe)
			}
			if err != nil {
				cfg.Logger.Warn("the OCI runtime runs from its path: each run copies or bind-mounts it", "runtime", class, "binary", bin, "err", err)
			} else {
				rt.exe = exe
			}
		}
		b.runtimes[class] = rt
	}
	self, _ := os.ReadFile("/proc/self/cgroup")
	b.crunCgroupDirs = crunCgroupDirs(string(self))
	if err := os.MkdirAll(cfg.StateDir, 0o711); err != nil {
		return nil, fmt.Errorf("local backend: %w", err)
	}
	b.disks = &diskTemplates{dir: filepath.Join(cfg.StateDir, diskTemplatesDir)}
	if !cfg.NoVolumePool {
		b.vols = &volPool{dir: filepath.Join(cfg.StateDir, dirVolumePool)}
	}
	b.snaps = &snapCache{b: b}
	if !cfg.NoUserNS {
		b.ids = &idAllocator{stateDir: cfg.StateDir}
		if b.rootfsBase, err = rootfsBase(cfg.StateDir); err != nil {
			return nil, fmt.Errorf("local backend: root filesystems for user namespaces: %w (or disable user namespaces)", err)
		}
	}
	if cfg.Pool.Size > 0 || cfg.Pool.MaxTargeted > 0 {
		b.pool = newPool(b, cfg.Pool)
	}
	if n := cfg.ColdStarts; n >= 0 {
		if n == 0 {
			n = defaultColdStarts(goruntime.GOMAXPROCS(0))
		}
		b.cold = newColdGate(n)
	}
	if n := cfg.ForkSentries; n >= 0 {
		if n == 0 {
			n = defaultForkSentries(goruntime.GOMAXPROCS(0))
		}
		b.forks = newColdGate(n)
	}
	if cfg.MaxPrepull >= 0 {
		n := cfg.MaxPrepull
		if n == 0 {
			n = DefaultMaxPrepull
		}
		b.prepull = newPrepuller(cfg.Images.Pull, cfg.Logger, n)
	}
	b.logCgroupHint() // cgrouphint.go
	return b, nil
}

func (b *Backend) dir(id string) string { return filepath.Join(b.cfg.StateDir, id) }

// bundle is the OCI bundle dir of s's container.
func (b *Backend) bundle(s *sandbox) string {
	if isPoolID(s.cid) {
		return filepath.Join(b.cfg.StateDir, poolBundles, s.cid)
	}
	return filepath.Join(s.dir, dirBundle)
}

// rootfs is where the root filesystem of the container cid (bundle bundle) is mounted.
func (b *Backend) rootfs(bundle, cid string) string {
	if b.rootfsBase != "" {
		return filepath.Join(b.rootfsBase, cid)
	}
	return filepath.Join(bundle, "rootfs")
}

// RootfsDir is where root filesystems are mounted when not in their bundles ("" if
// they all are), for leak checks.
func (b *Backend) RootfsDir() string { return b.rootfsBase }

func (b *Backend) cgroupsPath(id string) string { return "/" + b.cfg.CgroupParent + "/" + id }

// cgroupRel is s's container's cgroup below CgroupParent.
func (s *sandbox) cgroupRel() string {
	if s.cgroup != "" {
		return s.cgroup
	}
	return s.cid
}

func (b *Backend) runtimeFor(class string) (*ociRuntime, string, error) {
	if class == "" {
		class = b.cfg.DefaultRuntime
	}
	rt, ok := b.runtimes[class]
	if !ok {
		known := make([]string, 0, len(b.runtimes))
		for k := range b.runtimes {
			known = append(known, k)
		}
		sort.Strings(known)
		return nil, class, fmt.Errorf("%w %q (known: %s)", runtime.ErrUnknownRuntime, class, strings.Join(known, ", "))
	}
	return rt, class, nil
}

// step ends step name begun at *t (which it sets to now): in b.trace (tests) and in
// ctx's span record (logged by the runner).
func (b *Backend) step(ctx context.Context, name string, t *time.Time) {
	now := time.Now()
	if b.trace != nil {
		b.trace(name, now.Sub(*t))
	}
	span.From(ctx).Add(name, now.Sub(*t))
	tracing.Step(ctx, "local."+name, *t, now)
	*t = now
}

// Create implements runtime.Backend.
func (b *Backend) Create(ctx context.Context, spec *runtime.Spec) (runtime.Info, error) {
	return b.create(ctx, spec, nil)
}

// create is Create, or with fork set the creation of a fork (fork.go): the same steps,
// but restored from fork's checkpoint, with fork's volumes.
func (b *Backend) create(ctx context.Context, spec *runtime.Spec, fork *forkParams) (info runtime.Info, err error) {
	t := time.Now()
	if err := runtime.ValidateSpec(spec, maxIDLen); err != nil {
		return runtime.Info{}, err
	}
	if spec.Engine != nil {
		// Docker Engine under gVisor only (engine.go).
		if why := b.EngineUnavailable(spec.RuntimeClass); why != "" {
			return runtime.Info{}, fmt.Errorf("%w by the local backend: %s", runtime.ErrEngineUnsupported, why)
		}
	}
	rt, class, err := b.runtimeFor(spec.RuntimeClass)
	if err != nil {
		return runtime.Info{}, err
	}
	if spec.Engine != nil {
		ert := *rt
		ert.extra = engineRunscFlags
		rt = &ert
	}
	for _, c := range spec.AllContainers() {
		if sec := c.Security; sec != nil && b.ids != nil && !rt.gvisor {
			for _, v := range []*uint32{sec.RunAsUser, sec.RunAsGroup} {
				if v != nil && *v >= idRangeSize {
					return runtime.Info{}, fmt.Errorf("%w: user and group IDs must be below %d (the IDs a sandbox's user namespace maps), got %d", runtime.ErrInvalidSpec, idRangeSize, *v)
				}
			}
		}
	}
	if spec.Multi() {
		sp := spec.Clone()
		b.shareDisk(&sp)
		spec = &sp
	}
	for _, c := range spec.AllContainers() {
		if d := b.diskBytes(c.Resources); d > 0 && d < minDiskBytes {
			return runtime.Info{}, fmt.Errorf("%w: container %q: disk limit %d bytes is below the minimum of %d", runtime.ErrInvalidSpec, c.ContainerName(), d, minDiskBytes)
		}
	}
	if d := b.diskBytes(spec.Resources); d > 0 && d < minDiskBytes {
		return runtime.Info{}, fmt.Errorf("%w: disk limit %d bytes is below the minimum of %d", runtime.ErrInvalidSpec, d, minDiskBytes)
	}
	for _, v := range spec.Volumes {
		if v.Medium == runtime.MediumDisk && v.SizeBytes > 0 && v.SizeBytes < minDiskBytes {
			return runtime.Info{}, fmt.Errorf("%w: volume %q: disk volumes need at least %d bytes", runtime.ErrInvalidSpec, v.Name, minDiskBytes)
		}
	}
	hasEgressSecrets := len(spec.Network.EgressSecrets()) > 0
	if hasEgressSecrets {
		if why := b.egressSecretsUnsupported(spec, fork); why != "" {
			return runtime.Info{}, fmt.Errorf("%w: %s", runtime.ErrInvalidSpec, why)
		}
		sp := spec.Clone()
		spec = &sp // prepareEgressSecrets changes it
	}
	// A pooled container was started with the default runtime configuration; only the
	// user commands run as can still change.
	key, keyed := poolKeyOf(spec, class)
	poolable := keyed && !rt.gvisor && !spec.Multi() && b.poolServes(spec) && !hasEgressSecrets
	if fork != nil && (!rt.gvisor || spec.Engine != nil) {
		return runtime.Info{}, fmt.Errorf("%w: a fork is a gVisor sandbox without a Docker Engine", errdefs.ErrNotImplemented)
	}
	id := spec.ID
	dir := b.dir(id)
	// The sandbox dir is the claim on the id; everything else happens inside it (or, for
	// a pooled container, in the container's dir, renamed over this one).
	if err := os.Mkdir(dir, 0o700); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return runtime.Info{}, fmt.Errorf("%w: sandbox %s already exists", runtime.ErrInvalidSpec, id)
		}
		return runtime.Info{}, fmt.Errorf("create sandbox %s: %w", id, err)
	}
	failpoint.Hit("local.create.dir")
	persisted := *spec
	// Neither the pull credentials nor the secret environment stay past the start: the
	// record (spec.json, memory) has none (docs/secrets.md).
	persisted.PullCredentials, persisted.SecretEnv, persisted.EgressSecretValues = nil, nil, nil
	persisted.Sidecars, persisted.InitContainers = withoutSecretEnv(spec.Sidecars), withoutSecretEnv(spec.InitContainers)
	var engineCreds map[string]*runtime.Credentials
	if e := persisted.Engine; e != nil && e.PullCredentials != nil {
		ec := *e
		engineCreds, ec.PullCredentials = e.PullCredentials, nil
		persisted.Engine = &ec
	}
	persisted.RuntimeClass = class
	s := &sandbox{id: id, cid: id, dir: dir, rt: rt, spec: persisted, engineCreds: engineCreds, ready: make(chan struct{}), done: make(chan struct{}), fork: fork}
	// Registered at once, so Wait, Stop and Destroy during Create find it (and wait).
	b.mu.Lock()
	b.sandboxes[id] = s
	b.mu.Unlock()
	if b.pool != nil {
		// The warm pool is runc-only (see gvisor.go); a gVisor Create still counts as a
		// Create in flight, so refills keep out of its way.
		b.pool.createStarted(key, poolable)
		defer b.pool.createEnded()
	}
	defer func() {
		if err != nil {
			if derr := b.teardown(context.WithoutCancel(ctx), s); derr != nil {
				b.log.Warn("undo failed create", "sandbox", id, "err", derr)
				// derr is context only and deliberately not wrapped: callers classify the failure
				// with errors.Is on err, and a wrapped cleanup error could change that.
				err = fmt.Errorf("%w (and cleaning up: %v)", err, derr) //nolint:errorlint // derr must not be matched by errors.Is
			}
			b.mu.Lock()
			delete(b.sandboxes, id)
			b.mu.Unlock()
			s.failed = true
			s.exit = runtime.Exit{Reason: "StartError", Message: err.Error(), At: time.Now().UTC()}
			close(s.done)
		} else {
			go b.watch(s, "Killed")
		}
		close(s.ready)
	}()

	if hasEgressSecrets {
		var from *egress.SandboxSecrets
		if fork != nil {
			from = fork.egress
		}
		if err := b.prepareEgressSecrets(s, spec, from); err != nil {
			return runtime.Info{}, err
		}
	}
	// A cold start's launches take a slot of the gate for their CPU-heavy part only
	// (coldgate.go); a pooled container's claim takes none.
	cold := withColdStart(ctx, spec.Meta[runtime.MetaOrg])
	if spec.Multi() {
		if err := b.createGroup(cold, s, spec, &t); err != nil {
			return runtime.Info{}, err
		}
		return s.info.toInfo(id), nil
	}
	claimed := false
	if b.pool != nil && poolable {
		if claimed = b.claim(ctx, s, spec, key); claimed {
			b.step(ctx, "claim", &t)
		}
	}
	if !claimed {
		acfg := func(img *Image) (*agentconfig.Config, error) {
			if spec.Engine != nil && spec.Container.Command == "" {
				c := spec.Container
				c.Command, c.Args = engineEntry, nil // dockerd (engine.go)
				return containerAgentConfig(&c, spec.ID, img)
			}
			return agentConfig(spec, img)
		}
		if len(spec.Container.SecretEnv) > 0 {
			// Secret environment (docs/secrets.md): never in the agent config file. The
			// agent starts held, like a group's containers, and Start hands it the config
			// with the secrets over its channel (startHeld).
			real := acfg
			acfg = func(img *Image) (*agentconfig.Config, error) {
				cfg, err := real(img)
				if err != nil {
					return nil, err
				}
				s.held, s.secretEnv = cfg, spec.Container.SecretEnv
				return &agentconfig.Config{Standby: true, Hostname: cfg.Hostname}, nil
			}
		}
		if _, _, err := b.launch(cold, s, spec.PullCredentials, runtime.Hostname(id), spec.Resources, acfg, &t); err != nil {
			var pe *pullError
			if b.pool != nil && errors.As(err, &pe) {
				b.pool.pullFailed(key)
			}
			return runtime.Info{}, err
		}
		if s.held != nil {
			if err := b.startHeld(ctx, s); err != nil {
				return runtime.Info{}, fmt.Errorf("sandbox %s: %w", id, err)
			}
			if err := writeJSONAtomic(filepath.Join(s.dir, fileInfo), &s.info); err != nil {
				return runtime.Info{}, err
			}
			b.step(ctx, "start", &t)
		}
	}
	if p := spec.StartupProbe; p != nil && fork == nil { // a fork continues its source's state
		// As in a group (startseq.Run): Create returns, and the sandbox runs, once the
		// probe has passed; a *startseq.Failure names the container.
		if err := startseq.Probe(ctx, &groupOps{b: b, s: s}, spec.ContainerName(), p); err != nil {
			return runtime.Info{}, fmt.Errorf("sandbox %s: %w", id, err)
		}
	}
	if spec.Engine != nil {
		// RUNNING only once the Compose file is up (engine.go).
		if err := b.engineUp(ctx, id); err != nil {
			return runtime.Info{}, fmt.Errorf("sandbox %s: %w", id, err)
		}
		b.step(ctx, "engine", &t)
	}
	return s.info.toInfo(id), nil
}

// rulesFor is what the network enforces for a sandbox with spec: its organization and
// caller, the ports of its "private" services (open to that organization) and "custom"
// ones (open as its ingress rules say), and its egress and ingress rules.
func rulesFor(spec *runtime.Spec) Rules {
	r := Rules{Org: spec.Meta[runtime.MetaOrg], Caller: spec.Meta[runtime.MetaCaller], Network: spec.Network}
	for _, svc := range spec.Services {
		switch svc.Visibility {
		case "private":
			r.Private = append(r.Private, Port{Proto: "tcp", Port: uint16(svc.Port)})
		case "custom":
			r.Custom = append(r.Custom, Port{Proto: "tcp", Port: uint16(svc.Port)})
		}
	}
	return r
}

// applyRules makes the network enforce s's rules on its container's attachment. It runs
// before anything of the sandbox's own starts (and again on Recover).
func (b *Backend) applyRules(s *sandbox, cid string) error {
	if b.cfg.Network == nil {
		return nil
	}
	if err := b.cfg.Network.SetRules(cid, rulesFor(&s.spec)); err != nil {
		return fmt.Errorf("sandbox %s: network rules: %w", s.id, err)
	}
	return nil
}

// launch builds and starts s's container (id s.cid, in s.dir, which exists): network,
// image, overlay root, etc files, agent config (from acfg), bundle, `runc run`. It fills
// s.info and s.proc. On error the caller tears s down. For a cold start (ctx marked by
// withColdStart) the part from the overlay root on holds a slot of the cold-start gate
// (coldgate.go), taken once the image, volumes and network are ready.
func (b *Backend) launch(ctx context.Context, s *sandbox, creds *runtime.Credentials, host string, res runtime.Resources,
	acfgFor func(*Image) (*agentconfig.Config, error), t *time.Time) (*Image, *Attachment, error) {
	id, cid, dir, rt := s.id, s.cid, s.dir, s.rt
	// The network namespace and the image are independent: set them up concurrently.
	type netResult struct {
		a   *Attachment
		err error
	}
	var netc chan netResult
	if b.cfg.Network != nil && s.join == nil {
		netc = make(chan netResult, 1)
		go func() {
			nctx, sp := tracing.Child(ctx, "network.setup")
			a, err := b.cfg.Network.Setup(nctx, cid)
			tracing.End(sp, err)
			netc <- netResult{a, err}
		}()
	}
	var (
		img     *Image
		pullErr error
		pulled  = make(chan struct{})
	)
	progress.From(ctx).SetPhase(progress.PhasePullingImage)
	go func() {
		defer close(pulled)
		pctx, sp := tracing.Child(ctx, "image.pull")
		img, pullErr = b.cfg.Images.Pull(pctx, s.spec.Image, creds)
		tracing.End(sp, pullErr)
	}()
	// Wait for both before returning, so the caller's teardown sees their results.
	var att *Attachment
	var netErr error
	waitNet := func() {
		if netc != nil {
			r := <-netc
			netc = nil
			att, netErr = r.a, r.err
		}
	}
	defer waitNet()
	defer func() { <-pulled }()

	bundle := b.bundle(s)
	if err := os.MkdirAll(bundle, 0o755); err != nil {
		return nil, nil, fmt.Errorf("create sandbox %s: %w", id, err)
	}
	failpoint.Hit("local.create.subdirs")
	upper, work := filepath.Join(dir, dirUpper), filepath.Join(dir, dirWork)
	disk := b.diskBytes(s.spec.Resources)
	if disk > 0 {
		var err error
		if upper, work, err = b.disks.setupDisk(dir, disk); err != nil {
			return nil, nil, fmt.Errorf("sandbox %s: disk limit: %w", id, err)
		}
		b.step(ctx, "disk", t)
		failpoint.Hit("local.create.disk")
		if err := os.Mkdir(filepath.Join(dir, dirShown), 0o711); err != nil {
			return nil, nil, fmt.Errorf("create sandbox %s: %w", id, err)
		}
	} else {
		for _, d := range []string{upper, work} {
			if err := os.Mkdir(d, 0o755); err != nil {
				return nil, nil, fmt.Errorf("create sandbox %s: %w", id, err)
			}
		}
	}
	shown := dir // what is mounted into the sandbox: see shownDir
	if disk > 0 {
		shown = filepath.Join(dir, dirShown)
	}
	for _, d := range []string{dirRun, dirEtc} {
		if err := os.Mkdir(filepath.Join(shown, d), 0o755); err != nil {
			return nil, nil, fmt.Errorf("create sandbox %s: %w", id, err)
		}
	}
	if err := writeJSONAtomic(filepath.Join(dir, fileSpec), &s.spec); err != nil {
		return nil, nil, err
	}
	failpoint.Hit("local.create.spec")
	var ids *idRange
	if s.join != nil {
		// A member shares its primary's user namespace, so its ID range.
		if ids = s.join.ids; ids != nil {
			if err := chownToRoot(*ids, upper, work, filepath.Join(shown, dirRun)); err != nil {
				return nil, nil, fmt.Errorf("sandbox %s: %w", id, err)
			}
		}
	} else if b.ids != nil && !rt.gvisor {
		r, err := b.ids.alloc(dir)
		if err != nil {
			return nil, nil, fmt.Errorf("sandbox %s: %w", id, err)
		}
		ids = &r
		failpoint.Hit("local.create.idrange")
		// The mapped root owns what it writes to.
		if err := chownToRoot(r, upper, work, filepath.Join(shown, dirRun)); err != nil {
			return nil, nil, fmt.Errorf("sandbox %s: %w", id, err)
		}
	}
	// Only the mapped root of a user namespace needs its root filesystem elsewhere.
	rootfs := filepath.Join(bundle, "rootfs")
	if ids != nil {
		rootfs = b.rootfs(bundle, cid)
	}
	if err := os.MkdirAll(rootfs, 0o755); err != nil {
		return nil, nil, fmt.Errorf("create sandbox %s: %w", id, err)
	}
	var vols []specs.Mount
	var err error
	if s.join != nil && s.member {
		// The group's volumes are the primary's: nothing of the sandbox runs yet (every
		// agent is held), but a restored (or GLOBAL, or forked) one holds what a sandbox
		// wrote before.
		var roots map[string]string
		if roots, err = s.join.waitVolumes(ctx); err == nil {
			vols, err = volumeMounts(roots, s.spec.VolumeMounts, ids, filepath.Join(dir, dirVolumes), sandboxWritten(&s.spec, s.fork != nil), managedVolumes(&s.spec))
		}
	} else if s.join != nil {
		// A group's primary makes the group's volumes, for its members too.
		var roots map[string]string
		vols, roots, err = b.setupVolumes(id, dir, &s.spec, disk, ids, s.fork)
		s.volumeRoots = roots
		s.join.setVolumes(roots, err)
	} else {
		if s.fork != nil && hasDiskVolume(&s.spec) {
			err = s.fork.wait(ctx) // the source's volume snapshots
		}
		var roots map[string]string
		if err == nil {
			vols, roots, err = b.setupVolumes(id, dir, &s.spec, disk, ids, s.fork)
		}
		s.volumeRoots = roots
	}
	if err != nil {
		return nil, nil, fmt.Errorf("sandbox %s: %w", id, err)
	}
	failpoint.Hit("local.create.volumes")
	b.step(ctx, "dirs", t)

	<-pulled
	progress.From(ctx).SetPhase(progress.PhaseStartingContainer)
	if pullErr != nil {
		return nil, nil, b.mapPullError(s.spec.Image, pullErr)
	}
	b.step(ctx, "pull", t)
	if s.fork != nil && s.forkDigest() != "" && img.Digest != s.forkDigest() {
		// The checkpoint's root filesystem is this image's layers and its writes: on
		// other layers the restored sandbox's files would be corrupt.
		return nil, nil, fmt.Errorf("%w: sandbox %s: image %s is at digest %s, not at %s, the image the checkpoint was taken on", runtime.ErrInvalidSpec, id, s.spec.Image, img.Digest, s.forkDigest())
	}
	engineDir := ""
	if s.spec.Engine != nil && s.join == nil {
		e := *s.spec.Engine
		e.PullCredentials, s.engineCreds = s.engineCreds, nil
		if err := b.writeEngineDir(ctx, dir, &e); err != nil {
			return nil, nil, fmt.Errorf("sandbox %s: %w", id, err)
		}
		engineDir = filepath.Join(dir, dirEngine)
		b.step(ctx, "engine images", t)
	}
	if s.join != nil {
		if err := s.join.wait(ctx); err != nil {
			return nil, nil, fmt.Errorf("sandbox %s: the group's namespaces: %w", id, err)
		}
		att = s.join.att
	} else if b.cfg.Network != nil {
		waitNet()
		if netErr != nil {
			return nil, nil, fmt.Errorf("sandbox %s: network setup: %w", id, netErr)
		}
		failpoint.Hit("local.create.network")
		if err := b.applyRules(s, cid); err != nil {
			return nil, nil, err
		}
		if err := b.registerEgressSecrets(s, cid); err != nil {
			return nil, nil, err
		}
		failpoint.Hit("local.create.rules")
		b.step(ctx, "network", t)
	}
	// A fork holds a sandbox of its own (`runsc create` below) while it waits for its
	// source's checkpoint, with its cold-start slot given back: such sandboxes are
	// bounded by the fork-sentry gate (coldgate.go). Its slot is taken before the
	// cold-start one, so a fork waiting for it holds no cold-start slot. (A group's fork
	// makes its sandbox only by `runsc restore`, after the wait.)
	sentry := b.forkSentry(ctx, s)
	defer sentry.leave()
	if sentry.gated {
		if _, err := sentry.enter(ctx); err != nil {
			return nil, nil, fmt.Errorf("sandbox %s: %w", id, err)
		}
		b.step(ctx, "fork: admit its sandbox", t)
	}
	// The CPU-heavy part of a cold start, from the root filesystem's mount to the
	// started container (and its agent, under gVisor), waits for the gate's slot
	// (coldgate.go); all the waits on others are above.
	slot := b.coldStart(ctx)
	defer slot.leave()
	if gated, err := slot.enter(ctx); err != nil {
		return nil, nil, fmt.Errorf("sandbox %s: %w", id, err)
	} else if gated {
		b.step(ctx, "admit", t)
	}

	acfg, err := acfgFor(img)
	if err != nil {
		return nil, nil, err
	}
	if rt.gvisor {
		acfg.Listen = agentListenAddr // see gvisor.go
	}
	ident := agent.NewIdentity(cid)
	acfg.Identity = ident
	b.mu.Lock() // DialAgent reads it under the lock
	s.ident = ident
	b.mu.Unlock()
	if err := b.mountRoot(rootfs, dir, img.Layers, upper, work, ids, s.join.idmapUserNS()); err != nil {
		return nil, nil, fmt.Errorf("sandbox %s: %w", id, err)
	}
	// /.sandboxd, where the agent's files are mounted, is the backend's whatever the
	// image or the upper layer has there (sandboxddir.go).
	if err := freshSandboxdDir(rootfs, ids); err != nil {
		return nil, nil, fmt.Errorf("sandbox %s: %w", id, err)
	}
	b.step(ctx, "overlay", t)
	failpoint.Hit("local.create.overlay")

	etc := filepath.Join(shown, dirEtc)
	if err := b.writeEtcFiles(etc, host, att); err != nil {
		return nil, nil, fmt.Errorf("sandbox %s: etc files: %w", id, err)
	}
	if err := addHostAliases(filepath.Join(etc, "hosts"), s.spec.HostAliases); err != nil {
		return nil, nil, fmt.Errorf("sandbox %s: etc files: %w", id, err)
	}
	if err := writeJSON(filepath.Join(shown, fileAgentConfig), acfg); err != nil {
		return nil, nil, err
	}
	failpoint.Hit("local.create.files")
	p := specParams{
		ID: host, RootFS: rootfs, Cgroups: b.cgroupsPath(s.cgroupRel()), Resources: res,
		Agent: b.cfg.AgentBinary, Config: filepath.Join(shown, fileAgentConfig),
		RunDir: filepath.Join(shown, dirRun), EtcDir: etc, Seccomp: b.seccomp, NoFile: b.noFile,
		GVisor: rt.gvisor, IDs: ids, Security: s.spec.Security, Volumes: vols, NonRoot: nonRootUser(acfg.User),
		Tmpfs: s.spec.Tmpfs, Engine: engineDir, EgressCA: s.egressCADir,
	}
	if s.join != nil {
		var userns string
		p.NetNS, p.UTSNS, userns = s.join.nsPaths()
		p.Sysfs = s.join.sysfs
		if ids != nil {
			p.UserNS = userns
		}
	}
	if s.held != nil {
		// Held (group.go): the agent serves in standby until Start sends the config.
		p.NonRoot = nonRootUser(s.held.User)
	}
	if !s.spec.Security.OCIDefault() {
		if p.Seccomp, err = seccompFor(capSet(s.spec.Security, p.NonRoot)); err != nil {
			return nil, nil, fmt.Errorf("sandbox %s: seccomp profile: %w", id, err)
		}
	}
	if att != nil && s.join == nil {
		p.NetNS = att.NetNSPath
		if ids != nil {
			// A root mapped into a user namespace that does not own this network
			// namespace can neither set its sysctls nor mount its sysfs (see ociSpec):
			// the backend does both.
			fresh := b.freshProcSysctl()
			for k, v := range netSysctls {
				if err := setNetNSSysctl(att.NetNSPath, k, v, fresh, b.log); err != nil {
					return nil, nil, fmt.Errorf("sandbox %s: %w", id, err)
				}
			}
			p.Sysfs = filepath.Join(dir, dirSysfs)
			if err := mountNetNSSysfs(att.NetNSPath, p.Sysfs); err != nil {
				return nil, nil, fmt.Errorf("sandbox %s: %w", id, err)
			}
			failpoint.Hit("local.create.sysfs")
		}
	}
	// What the sandbox sees of its limits (limits.go).
	cpus := b.placeCPUs(s, res.MilliCPU)
	p.CPUs = cpuList(cpus)
	if !rt.gvisor {
		files, err := limitFiles(cpus, res.MemoryBytes, isPoolID(cid))
		if err == nil {
			p.Limits, err = writeLimitFiles(filepath.Join(shown, dirLimits), files)
		}
		if err != nil {
			return nil, nil, fmt.Errorf("sandbox %s: limit files: %w", id, err)
		}
	}
	// The profile's filter, compiled by runc for an earlier sandbox: the agent installs
	// it (seccompcache.go). Else runc compiles it, and this sandbox's is kept.
	var scKey string
	if agentFilterable(p) && s.fork == nil {
		if scKey, err = seccompKey(rt.binary, p.Seccomp); err != nil {
			return nil, nil, fmt.Errorf("sandbox %s: seccomp profile: %w", id, err)
		}
		if prog, ok := b.scache.program(scKey); ok {
			// A copy in the sandbox's shown dir is mounted (shownDir): the sandbox's
			// mountinfo then names no host path of the state dir.
			dst := filepath.Join(shown, fileSeccomp)
			sum, err := copyProgram(prog, dst)
			if err != nil {
				return nil, nil, fmt.Errorf("sandbox %s: seccomp program: %w", id, err)
			}
			p.SeccompProgram, p.SeccompSHA256, scKey = dst, sum, ""
		}
	}
	oci := ociSpec(p)
	if rt.crun {
		crunSpec(oci, b.crunCgroupDirs) // ociVersion, /sys/fs/cgroup read-only (ocichoice.go)
	}
	b.gvisorGroupSpec(s, oci) // a gVisor group's containers share one sentry (gvisor_group.go)
	if err := writeJSON(filepath.Join(bundle, "config.json"), oci); err != nil {
		return nil, nil, err
	}
	b.step(ctx, "bundle", t)

	// The agent's listening socket is made here so connections queue in its backlog
	// before the agent runs: Create can return as soon as the runtime has started it.
	// (Under gVisor the agent listens itself; see gvisor.go.)
	var lnFile *os.File
	if !rt.gvisor {
		ln, err := listenUnix(dir, agentSocket) // host-only: see agentdial.go
		if err != nil {
			return nil, nil, fmt.Errorf("sandbox %s: agent socket: %w", id, err)
		}
		lnFile, err = ln.File()
		_ = ln.Close() // unlink-on-close is off; lnFile keeps the socket open
		if err != nil {
			return nil, nil, fmt.Errorf("sandbox %s: agent socket: %w", id, err)
		}
		defer lnFile.Close()
	}
	out, err := os.OpenFile(filepath.Join(dir, fileAgentOut), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, nil, err
	}
	defer out.Close()
	b.step(ctx, "socket", t)
	failpoint.Hit("local.create.socket")

	if rt.gvisor && len(cpus) > 0 {
		if err := ensureCpusetParents(b.cfg.CgroupParent); err != nil {
			return nil, nil, fmt.Errorf("sandbox %s: %w", id, err)
		}
	}
	pidFile := filepath.Join(dir, filePid)
	if s.fork != nil && s.inGVisorGroup() {
		// A container of a fork of a group (gvisor_group_pause.go): restored into the
		// fork's sentry; its proc and agent follow once every container is (createGroup).
		var mu *sync.Mutex
		if s.join != nil {
			mu = &s.join.forkMu
		}
		if err := slot.forkReady(ctx, s.fork); err != nil {
			return nil, nil, err
		}
		if err := b.restoreGroupFork(ctx, s, bundle, pidFile, filepath.Join(shown, dirRun), out, mu); err != nil {
			return nil, nil, fmt.Errorf("sandbox %s: %w", id, err)
		}
		b.step(ctx, "fork: runsc restore", t)
		s.info = persistedInfo{RuntimeClass: rt.class, ImageDigest: img.Digest, StartedAt: time.Now().UTC(), Agent: s.ident, CPUs: cpus, Cgroup: s.cgroup}
		if cid != id {
			s.info.ContainerID = cid
		}
		if att != nil && att.IP.IsValid() {
			s.info.IP = att.IP.String()
		}
		return img, att, nil
	}
	if s.fork != nil {
		// A fork (fork.go): the source's checkpoint, restored into this sandbox. All
		// above, and the sandbox itself (`runsc create`: its sentry and gofer, waiting
		// for a start or a restore), is made while the source is checkpointed; then
		// `runsc restore` loads the checkpoint into it.
		rbundle, limits, err := restoreBundle(bundle, filepath.Join(dir, restoreBundleDir)) // restorecpu.go
		if err != nil {
			return nil, nil, fmt.Errorf("sandbox %s: %w", id, err)
		}
		if err := b.bootRuntime(rt).create(ctx, cid, rbundle, pidFile, out); err != nil {
			return nil, nil, fmt.Errorf("sandbox %s: %w", id, err)
		}
		b.step(ctx, "fork: runsc create", t)
		if err := b.restoreFork(ctx, s, rt, slot, rbundle, pidFile, filepath.Join(shown, dirRun), out, t); err != nil {
			// Its sandbox is gone before its fork-sentry slot is given back (the
			// caller's teardown removes the rest).
			killSentry(ctx, pidFile)
			return nil, nil, err
		}
		if err := applyCPULimits(limits); err != nil {
			return nil, nil, fmt.Errorf("sandbox %s: %w", id, err)
		}
	} else if err := b.startHooked(ctx, s, rt, cid, bundle, pidFile, lnFile, out); err != nil {
		return nil, nil, fmt.Errorf("sandbox %s: %w", id, err)
	} else if !rt.gvisor {
		// The container has its own copies of its root filesystem and sysfs now (runc
		// has made its mounts and left the host's tree before it returns); the host's
		// are of no further use to runc's class (no checkpoint, nothing reads the root
		// from the host; teardown finds them gone). Left, they would be two more mounts
		// per sandbox in the host's table, which every later create pays for: runc
		// reads the whole /proc/self/mountinfo four times a create and copies every
		// mount into the new container's namespace (issue 25). The overlay lives on
		// in the container's mount namespace, and goes with it.
		// A group's sysfs is shared by all its containers, some of which may still be
		// starting: it stays (teardown unmounts it).
		drop := []string{rootfs}
		if own := filepath.Join(dir, dirSysfs); p.Sysfs == own && s.join == nil {
			drop = append(drop, own)
		}
		for _, m := range drop {
			if err := unmountAll(m); err != nil {
				// The sandbox runs: the mount stays until teardown, which unmounts it.
				b.log.Warn("drop the host's mount of a started sandbox", "sandbox", id, "mount", m, "err", err)
			}
		}
		if testHookStarted != nil {
			testHookStarted(s)
		}
	}
	b.step(ctx, "runtime", t)
	failpoint.Hit("local.create.started")

	pid, err := readPid(pidFile)
	if err != nil {
		return nil, nil, fmt.Errorf("sandbox %s: %w", id, err)
	}
	pr, err := openProc(pid, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("sandbox %s: %w", id, err)
	}
	if scKey != "" && pr != nil && b.scache.startCapture(scKey) {
		if err := b.scache.capture(scKey, pid, pr.start); err != nil {
			b.log.Warn("seccomp filter not captured; runc keeps compiling it", "sandbox", id, "err", err)
		} else {
			b.step(ctx, "seccomp capture", t)
		}
	}
	s.info = persistedInfo{RuntimeClass: rt.class, ImageDigest: img.Digest, StartedAt: time.Now().UTC(), Pid: pid, Agent: s.ident, CPUs: cpus, Cgroup: s.cgroup}
	if cid != id {
		s.info.ContainerID = cid
	}
	if att != nil && att.IP.IsValid() {
		s.info.IP = att.IP.String()
	}
	if pr != nil {
		s.info.PidStart = pr.start
	}
	s.proc = gvisorProc(s, pr) // in a gVisor group the pid is the sentry's
	if rt.gvisor {
		wait := b.waitAgent
		if s.fork != nil {
			wait = b.waitRestoredAgent
		}
		if err := wait(ctx, s); err != nil {
			return nil, nil, fmt.Errorf("sandbox %s: %w", id, err)
		}
		b.step(ctx, "agent", t)
	}
	failpoint.Hit("local.create.proc")
	if s.held != nil && !s.member {
		// A group's primary: info.json, which makes a restarted backend adopt the sandbox
		// as live, waits until its start sequence has finished (createGroup).
		b.step(ctx, "finish", t)
		return img, att, nil
	}
	if err := writeJSONAtomic(filepath.Join(dir, fileInfo), &s.info); err != nil {
		return nil, nil, err // teardown kills the container and closes the pidfd
	}
	failpoint.Hit("local.create.info")
	b.step(ctx, "finish", t)
	return img, att, nil
}

// restoreFork restores fork s into its sandbox (made by `runsc create` from rbundle):
// it waits for its source's checkpoint (its cold-start slot given back meanwhile), copies
// the source's run dir into run and loads the checkpoint.
func (b *Backend) restoreFork(ctx context.Context, s *sandbox, rt *ociRuntime, slot *coldSlot, rbundle, pidFile, run string, out *os.File, t *time.Time) error {
	if err := slot.forkReady(ctx, s.fork); err != nil { // the slot is given back while it waits
		return err
	}
	b.step(ctx, "fork: wait for the source's checkpoint", t)
	if err := copyRunDir(ctx, s.fork.run, run); err != nil {
		return fmt.Errorf("sandbox %s: %w", s.id, err)
	}
	markResume(run) // restored suspended (pause.go); it re-reads its identity
	b.step(ctx, "fork: run dir", t)
	if err := b.bootRuntime(rt).restore(ctx, s.cid, rbundle, s.fork.image, pidFile, out); err != nil {
		return fmt.Errorf("sandbox %s: %w", s.id, err)
	}
	return nil
}

// mountRoot mounts the overlay root of a sandbox (dir) at rootfs: over the image's
// layers, idmapped when ids is set (see userns.go), through the user namespace userns
// when it is a descriptor (a group's, mapping ids), else the range's kept one.
func (b *Backend) mountRoot(rootfs, dir string, layers []string, upper, work string, ids *idRange, userns int) error {
	if ids != nil {
		if userns < 0 && b.ids != nil {
			// The range's kept namespace (userns.go); without one idmappedLowers makes its own.
			fd, ok, err := b.ids.userns(*ids)
			if err != nil {
				return err
			}
			if ok {
				userns = fd
				defer unix.Close(fd)
			}
		}
		var err error
		if layers, err = idmappedLowers(layers, dir, *ids, userns); err != nil {
			return err
		}
		defer func() { _ = detachLowers(dir) }()
	}
	// The overlay's options are what the sandbox's mountinfo shows of its root: name
	// the dirs by descriptor (/proc/self/fd/N), so that no host path of the state dir or
	// the image store appears in it. The kernel resolves them at mount time.
	var fds []int
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	byFD := func(p string) (string, error) {
		fd, err := unix.Open(p, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return "", fmt.Errorf("open %s: %w", p, err)
		}
		fds = append(fds, fd)
		return "/proc/self/fd/" + strconv.Itoa(fd), nil
	}
	named := make([]string, len(layers))
	for i, l := range layers {
		var err error
		if named[i], err = byFD(l); err != nil {
			return err
		}
	}
	u, err := byFD(upper)
	if err != nil {
		return err
	}
	w, err := byFD(work)
	if err != nil {
		return err
	}
	opts, err := overlayOptions(named, u, w)
	if err != nil {
		return err
	}
	return mountOverlay(rootfs, opts)
}

// poolServes reports whether a pooled container (started with the default runtime
// configuration, disk limit and no volumes) can become spec's sandbox: only the user
// commands run as may differ.
func (b *Backend) poolServes(spec *runtime.Spec) bool {
	return spec.Security.OCIDefault() && b.diskBytes(spec.Resources) == b.cfg.DiskBytes && len(spec.Volumes) == 0
}

// shareDisk gives the containers of group spec that set no disk limit of their own an
// even share of the backend's default (at least the minimum), so that a group's
// writable layers together stay within what one sandbox gets, however many containers
// it has (the Kubernetes backend puts the sandbox's ephemeral-storage limit on the
// primary only, which bounds the Pod's total the same way). The shares are recorded
// in the spec the sandbox persists.
func (b *Backend) shareDisk(spec *runtime.Spec) {
	if b.cfg.DiskBytes <= 0 {
		return
	}
	var unset []*runtime.Container
	for _, c := range spec.AllContainers() {
		if c.Resources.DiskBytes == 0 {
			unset = append(unset, c)
		}
	}
	for _, c := range unset {
		c.Resources.DiskBytes = max(b.cfg.DiskBytes/int64(len(unset)), minDiskBytes)
	}
}

// diskBytes is the disk limit of a sandbox with resources r.
func (b *Backend) diskBytes(r runtime.Resources) int64 {
	if r.DiskBytes > 0 {
		return r.DiskBytes
	}
	return b.cfg.DiskBytes
}

// writeEtcFiles writes hosts, hostname and resolv.conf for a sandbox into dir.
func (b *Backend) writeEtcFiles(dir, host string, att *Attachment) error {
	if b.cfg.Network != nil {
		return b.cfg.Network.WriteEtcFiles(dir, host, att)
	}
	return network.WriteEtcFiles(dir, host, nil, nil) // loopback only
}

// mapPullError turns an image error into what the caller sees: the image and a generic
// cause wrapping one of the runtime's image sentinels, never the network details of what
// answered (or did not) — "connection refused", "server gave HTTP response to HTTPS
// client", "x509: unknown authority" would make image references a probe of the host's
// ports. The details are logged here, on the host.
func (b *Backend) mapPullError(ref string, err error) error {
	pe := &pullError{ref: ref}
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		if errors.Is(err, context.Canceled) {
			pe.cause = context.Canceled
		} else {
			pe.cause = context.DeadlineExceeded
		}
	case errors.Is(err, runtime.ErrRegistryNotAllowed), errors.Is(err, image.ErrRegistryNotAllowed):
		pe.cause = runtime.ErrRegistryNotAllowed
	case errors.Is(err, runtime.ErrImageNotFound), errors.Is(err, image.ErrNotFound):
		pe.cause = runtime.ErrImageNotFound
	case errors.Is(err, runtime.ErrImageUnauthorized), errors.Is(err, image.ErrUnauthorized):
		pe.cause = runtime.ErrImageUnauthorized
	case errors.Is(err, runtime.ErrInvalidImageRef), errors.Is(err, image.ErrInvalidReference):
		pe.cause = runtime.ErrInvalidImageRef
	default:
		// Unreachable, refused, bad content, a full disk: the image could not be had.
		pe.cause = errPullFailed
	}
	b.log.Warn("image pull failed", "image", ref, "err", err)
	return pe
}

// errPullFailed is the generic cause of a pull that failed at the registry or here.
var errPullFailed = fmt.Errorf("%w or the pull failed", runtime.ErrRegistry)

// pullError is a failed pull as the caller sees it (mapPullError).
type pullError struct {
	ref   string
	cause error
}

func (e *pullError) Error() string { return fmt.Sprintf("pull %s: %v", e.ref, e.cause) }
func (e *pullError) Unwrap() error { return e.cause }

func writeJSON(path string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode %s: %w", filepath.Base(path), err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return err
	}
	return nil
}

// writeJSONAtomic replaces path with v's encoding (a crash leaves old or new, not half).
func writeJSONAtomic(path string, v any) error {
	tmp := path + ".tmp"
	if err := writeJSON(tmp, v); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func readJSON(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("parse %s: %w", path, err)
	}
	return nil
}

func readPid(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("read pid file: %w", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("bad pid file %s: %q", path, b)
	}
	return pid, nil
}

// unix socket paths are limited to 108 bytes; longer ones are reached through an O_PATH
// descriptor of their directory.
const maxSunPath = 107

func withSocketPath(dir, name string, fn func(path string) error) error {
	p := filepath.Join(dir, name)
	if len(p) <= maxSunPath {
		return fn(p)
	}
	d, err := os.OpenFile(dir, os.O_RDONLY|0x200000 /* O_PATH */, 0)
	if err != nil {
		return err
	}
	defer d.Close()
	return fn("/proc/self/fd/" + strconv.Itoa(int(d.Fd())) + "/" + name)
}

func listenUnix(dir, name string) (*net.UnixListener, error) {
	var ln *net.UnixListener
	err := withSocketPath(dir, name, func(p string) error {
		var err error
		ln, err = net.ListenUnix("unix", &net.UnixAddr{Name: p, Net: "unix"})
		return err
	})
	if err != nil {
		return nil, err
	}
	ln.SetUnlinkOnClose(false)
	return ln, nil
}

// DialAgent implements runtime.Backend: a connection to the agent's socket (see
// agentdial.go), which works as soon as Create returned (connections wait in the backlog)
// and after a restart, checked to reach this sandbox's agent.
func (b *Backend) DialAgent(ctx context.Context, id, container string) (net.Conn, error) {
	if !validID(id) {
		return nil, fmt.Errorf("%w: %q", runtime.ErrNotFound, id)
	}
	dir, ident := b.dir(id), (*agentconfig.Identity)(nil)
	if container != "" {
		var err error
		if dir, ident, err = b.memberOf(ctx, id, container); err != nil {
			return nil, err
		}
	} else {
		ident = b.identityOf(id)
	}
	if b.isPaused(id) {
		return nil, fmt.Errorf("dial agent of %s: %w", id, runtime.ErrPaused)
	}
	c, err := dialVerified(ctx, dir, ident)
	if errors.Is(err, agent.ErrIdentity) {
		b.log.Error("agent identity check failed: refusing the connection", "sandbox", id, "err", err)
		return nil, fmt.Errorf("dial agent of %s: %w", id, err)
	}
	if err != nil {
		if _, serr := os.Stat(filepath.Join(b.dir(id), fileSpec)); errors.Is(serr, fs.ErrNotExist) {
			return nil, fmt.Errorf("%w: %s", runtime.ErrNotFound, id)
		}
		return nil, fmt.Errorf("dial agent of %s: %w", id, err)
	}
	return c, nil
}

// withoutSecretEnv is a copy of cs without their secret environment (nil stays nil).
func withoutSecretEnv(cs []runtime.Container) []runtime.Container {
	if cs == nil {
		return nil
	}
	out := make([]runtime.Container, len(cs))
	for i, c := range cs {
		c.SecretEnv = nil
		out[i] = c
	}
	return out
}

// testHookBeforeStart and testHookStarted, when set (tests only), run in a runc-class
// launch just before the runtime starts the container and just after (once the host's
// mounts of the started container were dropped).
var testHookBeforeStart, testHookStarted func(s *sandbox)

// startHooked is the runtime's start of a container, after testHookBeforeStart.
func (b *Backend) startHooked(ctx context.Context, s *sandbox, rt *ociRuntime, cid, bundle, pidFile string, lnFile, out *os.File) error {
	if testHookBeforeStart != nil {
		testHookBeforeStart(s)
	}
	return b.bootRuntime(rt).start(ctx, cid, bundle, pidFile, lnFile, out)
}
