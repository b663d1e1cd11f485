package runner

import (
	"bufio"
	"context"
	"fmt"
	"os"
	goruntime "runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1/agentv1connect"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/placement"
	"github.com/sandboxd/sandboxd/internal/policy"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// Handle is the gateway's view of one runner (what a gateway holds of each runner it
// places on). The in-process runner of `sandboxd dev` implements it directly (Local); a
// runner in another process implements it over mTLS (runnerapi.Client).
type Handle interface {
	ID() string
	Group() string
	Create(ctx context.Context, req CreateRequest) (Sandbox, error)
	Get(ctx context.Context, id string) (Sandbox, error)
	Delete(ctx context.Context, id string, grace time.Duration) (Sandbox, error)
	// Agent returns the agent of the sandbox's container ("" = the primary), waiting
	// while the sandbox starts (Runner.Agent).
	Agent(ctx context.Context, id, container string) (agentv1connect.AgentServiceClient, error)
	// Logs reads the log of the sandbox's container ("" = the primary) as the agent's
	// Logs call does, also once the sandbox has ended (Runner.Logs).
	Logs(ctx context.Context, id, container string, req *agentv1.LogsRequest, send func(*agentv1.LogsResponse) error) error
	Capacity(ctx context.Context) (Capacity, error)
}

// Capacity is what a runner offers and what its live sandboxes take.
type Capacity struct {
	MilliCPU, MemoryBytes int64 // allocatable; 0 = not reported
	GPUs                  int64 // allocatable
	// CPUOvercommit: the CPU requests of live sandboxes may add up to this many times
	// MilliCPU; below 1 (0: not reported) means 1.
	CPUOvercommit float64
	// Used* are the requests of the live sandboxes (what they are admitted by).
	UsedMilliCPU, UsedMemoryBytes int64
	UsedGPUs                      int64
	Running                       int
	// Paused counts the paused sandboxes: a frozen one is also in Running and Used*
	// (its memory is kept), a checkpointed one only here (its CPU and memory released).
	Paused int
	// CheckpointClasses are the runtime classes whose sandboxes the runner can
	// checkpoint (PauseSandbox releasing resources, ForkSandbox); none: it forks none.
	CheckpointClasses []string
	// CheckpointPlatforms maps each class of CheckpointClasses whose checkpoints the
	// runner moves through the blob store (PortHandle) to the platform they need
	// (runtime.CheckpointPorter.CheckpointPlatform); a checkpoint moves only between
	// runners with the same platform for its class.
	CheckpointPlatforms map[string]string
	// Defaults are the runner's default requests and limits (runtime.Resources' request
	// and limit fields) for sandboxes that ask for none; zero fields: none.
	Defaults runtime.Resources
	// MaxSandboxes limits the live sandboxes on the runner; 0 = no limit.
	MaxSandboxes  int
	ConnectedAt   time.Time
	Architectures []string
	// RuntimeClasses the runner can run, its default first.
	RuntimeClasses []string
	// EdgeDomain and EdgePort are where the runner's edge publishes endpoints
	// (<port>-<sandbox>.<runner>.<EdgeDomain>:<EdgePort>); "" when it has no edge.
	EdgeDomain string
	EdgePort   int
	// DataPlaneURI is where clients reach the runner's direct data plane
	// (https://HOST:PORT); "" when it serves none.
	DataPlaneURI string
	// EngineImage and EngineRuntimeClass are what the runner runs container-engine
	// sandboxes (runtime.Spec.Engine) with; "" when it runs none (Support.NoContainerEngine).
	EngineImage        string
	EngineRuntimeClass string
	// EngineUnavailable says why the runner runs no container-engine sandboxes ("" when
	// it does); for messages.
	EngineUnavailable string
	// BuilderImage is the image the runner's image builds run in ("" when it runs none;
	// BuildUnavailable then says why, for messages).
	BuilderImage, BuildUnavailable string
	// VolumeNamespace is the namespace the runner's registered volumes are in
	// (Runner.VolumeNamespace); "" (an older runner): VolumeNamespace.
	VolumeNamespace string
	// CachedSnapshots are the digests of snapshot archives the runner has cached, most
	// recently used first (at most MaxCachedSnapshotsReported): placement prefers a runner
	// that has the snapshot a sandbox restores.
	CachedSnapshots []string
	// Support is what the runner cannot do, so placement sends sandboxes that need it
	// elsewhere; its NoEndpoints is EdgeDomain == "".
	runtime.Support
}

// Used is what c's live sandboxes request, as placement counts it.
func (c Capacity) Used() placement.Resources {
	return placement.Resources{MilliCPU: c.UsedMilliCPU, MemoryBytes: c.UsedMemoryBytes, GPUs: c.UsedGPUs}
}

// Room is c as placement measures it, with used (requests) and n live sandboxes.
func (c Capacity) Room(used placement.Resources, n int) placement.Room {
	return placement.Room{
		Allocatable:   placement.Resources{MilliCPU: c.MilliCPU, MemoryBytes: c.MemoryBytes, GPUs: c.GPUs},
		CPUOvercommit: c.CPUOvercommit,
		MaxSandboxes:  c.MaxSandboxes,
		Used:          used,
		Sandboxes:     n,
	}
}

// Defaults of a local runner unless configured.
const (
	// DefaultMaxSandboxes is its sandbox count limit.
	DefaultMaxSandboxes = 200
	// DefaultCPUOvercommit: the CPU requests of its sandboxes may add up to four times its
	// CPUs. Sandboxes are mostly idle, and each is held to its limit anyway.
	DefaultCPUOvercommit = 4
)

// DefaultResources are a local runner's default requests and limits unless configured:
// a sandbox that asks for no CPU or memory is admitted by 100m CPU and 128 MiB and
// limited to 1 CPU and 1 GiB.
var DefaultResources = runtime.Resources{RequestMilliCPU: 100, RequestMemoryBytes: 128 << 20, MilliCPU: 1000, MemoryBytes: 1 << 30}

// Local serves the gateway from a runner in the same process, and admits sandboxes by
// its capacity (Create): the runner's own admission, whoever placed the sandbox.
type Local struct {
	RunnerID string
	GroupID  string
	R        *Runner
	// MilliCPU, MemoryBytes and MaxSandboxes override what the runner offers (default:
	// the host's CPUs and memory, DefaultMaxSandboxes).
	MilliCPU, MemoryBytes int64
	MaxSandboxes          int
	// CPUOvercommit and Defaults: see Capacity (NewLocal sets DefaultCPUOvercommit
	// and DefaultResources). Create completes every spec with Defaults.
	CPUOvercommit float64
	Defaults      runtime.Resources
	// RuntimeClasses override what the runner's backend offers (its default first).
	RuntimeClasses []string
	// EdgeDomain and EdgePort: see Capacity.
	EdgeDomain string
	EdgePort   int
	// DataPlaneURI: see Capacity.
	DataPlaneURI string
	// EngineImage and EngineRuntimeClass are what container-engine sandboxes
	// (runtime.Spec.Engine) run with: the image holding Docker Engine, under a runtime
	// class the runner offers (DefaultEngineRuntimeClass when empty). Without an image,
	// or when the backend cannot host an engine (its Support), the runner runs none.
	EngineImage        string
	EngineRuntimeClass string
	// BuilderImage is the image builders run (Buildah; docs/builds.md) and BuildImages
	// writes their base images; without either the runner builds none (build.go).
	BuilderImage string
	BuildImages  BaseArchiver
	// BuildEgress is where builders (their RUN steps) may connect: nothing when empty.
	// The backend keeps the host's addresses, the sandbox subnet and the reserved ranges
	// out of reach whatever it says (docs/builds.md, Network).
	BuildEgress []runtime.EgressRule
	// BuildCacheBytes is the quota of each organization's layer cache (0:
	// DefaultBuildCacheBytes; negative: builds keep no cache) and BuildCaches how many
	// organizations' caches the runner keeps (0: DefaultBuildCaches), buildcache.go.
	BuildCacheBytes int64
	BuildCaches     int
	buildLocks      keyedLock
	connectedAt     time.Time
	admit           sync.Mutex // one capacity check and create at a time
}

var (
	_ SnapshotHandle = (*Local)(nil)
	_ LifetimeHandle = (*Local)(nil)
	_ PauseHandle    = (*Local)(nil)
	_ PortHandle     = (*Local)(nil)
)

// NewLocal wraps r.
func NewLocal(id string, r *Runner) *Local {
	l := &Local{RunnerID: id, GroupID: "default", R: r, MaxSandboxes: DefaultMaxSandboxes,
		CPUOvercommit: DefaultCPUOvercommit, Defaults: DefaultResources, connectedAt: time.Now()}
	r.admitResume = l.admitResume
	return l
}

// admitResume checks that the runner has room for checkpointed sandbox sb to run again,
// as Create does for a new one: RESOURCE_EXHAUSTED CWSANDBOX_RUNNER_CAPACITY_EXHAUSTED
// when it has none now.
func (l *Local) admitResume(ctx context.Context, sb Sandbox) error {
	spec := withDefaults(sb.Spec, l.Defaults)
	need := requested(spec.TotalResources())
	l.admit.Lock()
	defer l.admit.Unlock()
	c, err := l.Capacity(ctx)
	if err != nil {
		return err
	}
	if why := c.Room(c.Used(), c.Running).Misfit(need, placement.Resources{}, 0); why != "" {
		return apierr.WithRetry(apierr.New(apierr.RunnerCapacityExhausted,
			fmt.Sprintf("runner %s has no room to resume sandbox %s: %s", l.RunnerID, sb.ID, why), map[string]string{"runner_id": l.RunnerID, "sandbox_id": sb.ID}), placement.RetryAfter)
	}
	return nil
}

// Pause implements PauseHandle.
func (l *Local) Pause(ctx context.Context, id string, opts PauseOptions) (Sandbox, error) {
	return l.R.Pause(ctx, id, opts)
}

// Resume implements PauseHandle.
func (l *Local) Resume(ctx context.Context, id string) (Sandbox, error) {
	return l.R.Resume(ctx, id)
}

// Fork implements PauseHandle.
func (l *Local) Fork(ctx context.Context, id string, targets []ForkTarget) ([]ForkResult, error) {
	return l.R.Fork(ctx, id, targets)
}

// ExportCheckpoint implements PortHandle.
func (l *Local) ExportCheckpoint(ctx context.Context, id string) (CheckpointRef, Sandbox, error) {
	return l.R.ExportCheckpoint(ctx, id)
}

// ImportFork implements PortHandle: the runner must have room for every target (their
// requests, as Create's), else RESOURCE_EXHAUSTED CWSANDBOX_RUNNER_CAPACITY_EXHAUSTED
// (FAILED_PRECONDITION CWSANDBOX_NO_SUITABLE_RUNNER when they never fit).
func (l *Local) ImportFork(ctx context.Context, req ImportRequest) ([]ForkResult, error) {
	spec := req.Source.Spec
	if l.support().NoShareTokens && NeedsShareTokens(spec) {
		return nil, shareTokensUnsupported(l.RunnerID)
	}
	if spec.Engine != nil {
		if why := l.engineUnavailable(); why != "" {
			return nil, apierr.New(apierr.NoSuitableRunner,
				fmt.Sprintf("runner %s runs no container-engine sandboxes (control CONTROL_CONTAINER_ENGINE): %s", l.RunnerID, why),
				map[string]string{"runner_id": l.RunnerID})
		}
	}
	withDef := withDefaults(spec, l.Defaults)
	one := requested(withDef.TotalResources())
	n := int64(max(len(req.Targets), 1))
	need := placement.Resources{MilliCPU: one.MilliCPU * n, MemoryBytes: one.MemoryBytes * n, GPUs: one.GPUs * n}
	l.admit.Lock()
	unlock := sync.OnceFunc(l.admit.Unlock)
	defer unlock()
	c, err := l.Capacity(ctx)
	if err != nil {
		return nil, err
	}
	room := c.Room(c.Used(), c.Running)
	if never := room.Never(one); len(never) > 0 {
		vs := make([]apierr.Violation, len(never))
		for i, sf := range never {
			vs[i] = sf.Violation(l.RunnerID, placement.RequestField(nil, sf.Quantity))
		}
		return nil, placement.NoSuitableRunner([]string{l.RunnerID}, vs)
	}
	if why := room.Misfit(need, placement.Resources{}, int(n)-1); why != "" {
		return nil, apierr.WithRetry(apierr.New(apierr.RunnerCapacityExhausted,
			fmt.Sprintf("runner %s has no room for %d sandboxes from checkpoint %s: %s", l.RunnerID, n, req.Ref.Key, why),
			map[string]string{"runner_id": l.RunnerID, "sandbox_id": req.Source.ID}), placement.RetryAfter)
	}
	return l.R.importFork(ctx, req, unlock)
}

// DeleteCheckpoint implements PortHandle.
func (l *Local) DeleteCheckpoint(ctx context.Context, key string) error {
	return l.R.DeleteCheckpoint(ctx, key)
}

// EnsureVolume implements VolumeHandle.
func (l *Local) EnsureVolume(ctx context.Context, v RegisteredVolume) (VolumeState, error) {
	return l.R.EnsureVolume(ctx, v)
}

// DeleteVolume implements VolumeHandle.
func (l *Local) DeleteVolume(ctx context.Context, v RegisteredVolume, force bool) error {
	return l.R.DeleteVolume(ctx, v, force)
}

// Moved implements PortHandle.
func (l *Local) Moved(ctx context.Context, id, to string) error {
	return l.R.Moved(ctx, id, to)
}

func (l *Local) ID() string    { return l.RunnerID }
func (l *Local) Group() string { return l.GroupID }

// Create completes every container's requests and limits with the runner's defaults and
// starts the sandbox if the runner has room for its requests (the sum over its
// containers, runtime.Spec.TotalResources): a gateway only reserves what it
// placed itself, so two gateways (or a stale view) can send more than fits, and the
// runner is the one that knows. A sandbox that needs more than the runner's whole
// capacity is FAILED_PRECONDITION CWSANDBOX_NO_SUITABLE_RUNNER (no wait helps); one
// without room now is RESOURCE_EXHAUSTED CWSANDBOX_RUNNER_CAPACITY_EXHAUSTED. Either
// sends the gateway to its next candidate. A SHARE_TOKEN endpoint on a runner whose edge
// cannot check share tokens is FAILED_PRECONDITION CWSANDBOX_HTTPS_SHARE_TOKEN_NOT_SUPPORTED.
func (l *Local) Create(ctx context.Context, req CreateRequest) (Sandbox, error) {
	if l.support().NoShareTokens && NeedsShareTokens(req.Spec) {
		return Sandbox{}, shareTokensUnsupported(l.RunnerID)
	}
	if req.Spec.Engine != nil {
		if err := l.engineSpec(&req.Spec); err != nil {
			return Sandbox{}, err
		}
	}
	req.Spec = withDefaults(req.Spec, l.Defaults)
	need := requested(req.Spec.TotalResources())
	l.admit.Lock()
	defer l.admit.Unlock()
	c, err := l.Capacity(ctx)
	if err != nil {
		return Sandbox{}, err
	}
	room := c.Room(c.Used(), c.Running)
	if never := room.Never(need); len(never) > 0 {
		vs := make([]apierr.Violation, len(never))
		for i, sf := range never {
			vs[i] = sf.Violation(l.RunnerID, placement.RequestField(nil, sf.Quantity))
		}
		return Sandbox{}, placement.NoSuitableRunner([]string{l.RunnerID}, vs)
	}
	if why := room.Misfit(need, placement.Resources{}, 0); why != "" {
		return Sandbox{}, apierr.WithRetry(apierr.New(apierr.RunnerCapacityExhausted,
			fmt.Sprintf("runner %s is full: %s", l.RunnerID, why), map[string]string{"runner_id": l.RunnerID}), placement.RetryAfter)
	}
	return l.R.Create(ctx, req)
}

// support is what the runner cannot do: what its backend cannot, and what needs an edge
// when it has none (every edge checks share tokens: stack.StartEdge).
func (l *Local) support() runtime.Support {
	s := l.R.Support()
	s.NoEndpoints = s.NoEndpoints || l.EdgeDomain == ""
	s.NoShareTokens = s.NoShareTokens || l.EdgeDomain == ""
	s.NoContainerEngine = s.NoContainerEngine || l.engineUnavailable() != ""
	return s
}

// withDefaults is s with every container's requests and limits completed with d. Its
// containers are copies: s's slices may be the caller's.
func withDefaults(s runtime.Spec, d runtime.Resources) runtime.Spec {
	s.Sidecars, s.InitContainers = slices.Clone(s.Sidecars), slices.Clone(s.InitContainers)
	for _, c := range s.AllContainers() {
		c.Resources = c.Resources.WithDefaults(d)
	}
	return s
}

// requested is what a sandbox with resources r (completed with the runner's defaults)
// is admitted by: its requests.
func requested(r runtime.Resources) placement.Resources {
	return placement.Resources{MilliCPU: r.RequestMilliCPU, MemoryBytes: r.RequestMemoryBytes}
}

func (l *Local) Get(_ context.Context, id string) (Sandbox, error) {
	return l.R.Get(id)
}

func (l *Local) Delete(_ context.Context, id string, grace time.Duration) (Sandbox, error) {
	return l.R.Delete(id, grace)
}

// UpdateLifetime implements LifetimeHandle.
func (l *Local) UpdateLifetime(ctx context.Context, id string, lifetime time.Duration) (Sandbox, error) {
	return l.R.UpdateLifetime(ctx, id, lifetime)
}

func (l *Local) SnapshotVolume(ctx context.Context, sandboxID string, t SnapshotTarget) (SnapshotJob, error) {
	return l.R.SnapshotVolume(ctx, sandboxID, t)
}

func (l *Local) GetSnapshotJob(_ context.Context, snapshotID string) (SnapshotJob, error) {
	return l.R.GetSnapshotJob(snapshotID), nil
}

func (l *Local) DeleteWithSnapshots(_ context.Context, id string, grace time.Duration, targets []SnapshotTarget) (Sandbox, []SnapshotJob, error) {
	return l.R.DeleteWithSnapshots(id, grace, targets)
}

// List returns the runner's sandboxes (for the gateway's reconciler).
func (l *Local) List(context.Context) ([]Sandbox, error) {
	return l.R.List(), nil
}

func (l *Local) Agent(ctx context.Context, id, container string) (agentv1connect.AgentServiceClient, error) {
	return l.R.Agent(ctx, id, container)
}

func (l *Local) Logs(ctx context.Context, id, container string, req *agentv1.LogsRequest, send func(*agentv1.LogsResponse) error) error {
	return l.R.Logs(ctx, id, container, req, send)
}

// Capacity reports the host's CPUs and memory (or the configured amounts) as allocatable
// and sums the requests of live sandboxes, each completed with the runner's defaults as
// Create does (so a sandbox re-adopted from before it had requests counts alike).
func (l *Local) Capacity(context.Context) (Capacity, error) {
	c := Capacity{
		MilliCPU:       l.MilliCPU,
		MemoryBytes:    l.MemoryBytes,
		CPUOvercommit:  max(l.CPUOvercommit, 1),
		Defaults:       l.Defaults,
		MaxSandboxes:   l.MaxSandboxes,
		ConnectedAt:    l.connectedAt,
		Architectures:  []string{goruntime.GOARCH},
		RuntimeClasses: l.Classes(),
		EdgeDomain:     l.EdgeDomain, EdgePort: l.EdgePort,
		DataPlaneURI:    l.DataPlaneURI,
		Support:         l.support(),
		VolumeNamespace: l.R.VolumeNamespace(),
	}
	c.CheckpointClasses = l.R.CheckpointClasses(c.RuntimeClasses)
	c.CheckpointPlatforms = l.R.CheckpointPlatforms(c.CheckpointClasses)
	if !c.NoSnapshots {
		c.CachedSnapshots = l.R.CachedSnapshots()
	}
	if !c.NoContainerEngine {
		c.EngineImage, c.EngineRuntimeClass = l.EngineImage, l.engineRuntimeClass()
	} else {
		c.EngineUnavailable = l.engineUnavailable()
	}
	if why := l.buildUnavailable(); why == "" {
		c.BuilderImage = l.BuilderImage
	} else {
		c.BuildUnavailable = why
	}

	if c.MilliCPU <= 0 {
		c.MilliCPU = int64(goruntime.NumCPU()) * 1000
	}
	if c.MemoryBytes <= 0 {
		c.MemoryBytes = hostMemory()
	}
	for _, sb := range l.R.List() {
		if sb.State.Terminal() {
			continue
		}
		if sb.State == StatePaused {
			c.Paused++
			if sb.Pause != nil && sb.Pause.Released {
				continue // its CPU and memory are released
			}
		}
		c.Running++
		spec := withDefaults(sb.Spec, l.Defaults)
		need := requested(spec.TotalResources())
		c.UsedMilliCPU += need.MilliCPU
		c.UsedMemoryBytes += need.MemoryBytes
	}
	// Warm sandboxes that hold their requests where sandboxes run (Kubernetes warm Pods)
	// are used capacity too: placement must not count their room twice.
	if wh, ok := l.R.backend.(runtime.WarmHolder); ok {
		for _, ws := range wh.WarmHeld() {
			spec := withDefaults(ws, l.Defaults)
			need := requested(spec.TotalResources())
			c.UsedMilliCPU += need.MilliCPU
			c.UsedMemoryBytes += need.MemoryBytes
		}
	}
	return c, nil
}

// hostMemory is MemTotal from /proc/meminfo, in bytes.
func hostMemory() int64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer func() { _ = f.Close() }()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "MemTotal:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// Platform is what the runner supports whatever its policy says (Platform of its classes,
// what its backend enforces, its default resources): what it resolves its own policy
// against, as gateways do from its Capacity. Only its backend's Support is in it: the
// edge's share tokens Create checks itself (with an error of its own).
func (l *Local) Platform() policy.Platform {
	p := policy.RunnerPlatform(l.Classes())
	p.Support = l.R.Support()
	p.NoContainerEngine = p.NoContainerEngine || l.engineUnavailable() != ""
	if !p.NoContainerEngine {
		p.EngineImage, p.EngineRuntimeClass = l.EngineImage, l.engineRuntimeClass()
	} else {
		p.EngineUnavailable = l.engineUnavailable()
	}
	if d := policy.DefaultsOf(l.Defaults); d != (policy.ResourceDefaults{}) {
		p.DefaultResources = &d
	}
	return p
}

// Classes are the runtime classes the runner offers, its default first: the configured
// ones, else its backend's, else DefaultRuntimeClasses.
func (l *Local) Classes() []string {
	switch {
	case len(l.RuntimeClasses) > 0:
		return l.RuntimeClasses
	case len(l.R.RuntimeClasses()) > 0:
		return l.R.RuntimeClasses()
	}
	return policy.DefaultRuntimeClasses
}

// NeedsShareTokens reports whether s has an HTTPS endpoint with SHARE_TOKEN auth: a
// runner whose edge cannot check share tokens refuses it (Local.Create), and the gateway
// gives it a share token (its hash in s.ShareTokenHash).
func NeedsShareTokens(s runtime.Spec) bool {
	for _, svc := range s.Services {
		if svc.Endpoint == runtime.EndpointHTTPS && svc.TokenAuth {
			return true
		}
	}
	return false
}

// shareTokensUnsupported is a runner's refusal of a SHARE_TOKEN endpoint it cannot check.
func shareTokensUnsupported(runnerID string) error {
	return apierr.New(apierr.HTTPSShareTokenNotSupported,
		fmt.Sprintf("runner %s cannot check endpoint share tokens: use auth OPEN or another runner", runnerID),
		map[string]string{"runner_id": runnerID})
}

// LiveOf counts the sandboxes of org in sbs that have not ended: what a runner may tell an
// organization of itself (never the sandboxes of others).
func LiveOf(sbs []Sandbox, org string) int {
	n := 0
	for _, sb := range sbs {
		if sb.Spec.Meta[runtime.MetaOrg] == org && !sb.State.Terminal() {
			n++
		}
	}
	return n
}

// AwaitStart implements AwaitHandle.
func (l *Local) AwaitStart(ctx context.Context, id string, wait time.Duration) (Sandbox, error) {
	return l.R.AwaitStart(ctx, id, wait)
}
