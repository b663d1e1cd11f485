// Package runner drives sandboxes on one backend: it creates them, follows their main
// command through the agent, enforces their lifetime, stops and destroys them, and
// re-adopts them after its own restart.
package runner

import (
	"context"
	"crypto/rand"
	"encoding/base32"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1/agentv1connect"
	"github.com/sandboxd/sandboxd/internal/agent"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/blob"
	"github.com/sandboxd/sandboxd/internal/blob/blobconfig"
	"github.com/sandboxd/sandboxd/internal/logstore"
	"github.com/sandboxd/sandboxd/internal/progress"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/startseq"
	"github.com/sandboxd/sandboxd/internal/tracing"
)

// Config configures a Runner.
type Config struct {
	Backend runtime.Backend
	// DataDir holds the runner's own files: logs of ended sandboxes.
	DataDir string
	// Retention is how long ended sandboxes stay readable; default 1 h.
	Retention time.Duration
	// ExpiryGrace is the stop grace period when a lifetime runs out; default 10 s.
	ExpiryGrace time.Duration
	Logger      *slog.Logger
	// Blobs is where file-system snapshots go and are restored from; nil: the runner
	// takes and restores none (Support.NoSnapshots).
	Blobs blob.Store
	// BlobConfig is what Blobs was opened from (optional): with an S3 store, a snapshot
	// naming another bucket (an organization's own) is written to and read from that
	// bucket on the same endpoint with the same credentials. Without it (or with a
	// directory store) such a snapshot is refused CWSANDBOX_FSS_BUCKET_UNAVAILABLE.
	BlobConfig blobconfig.Config
	// SnapshotsPerSandbox and SnapshotsPerRunner bound the snapshots in flight (captured,
	// not yet uploaded) of one sandbox and of the whole runner; defaults
	// DefaultSnapshotsPerSandbox and DefaultSnapshotsPerRunner.
	SnapshotsPerSandbox, SnapshotsPerRunner int
	// IdleCheck is how often the runner looks for sandboxes to pause when idle
	// (runtime.MetaIdlePause); default 5 s.
	IdleCheck time.Duration
	// ExportMaxAge is how old a complete checkpoint export of one of its sandboxes
	// (ExportCheckpoint) gets before the runner deletes it (DefaultExportMaxAge); an
	// export lives for one move or fork, which deletes it, so one this old was left by a
	// gateway that died in between. ExportSweep is how often it looks (default 30 min).
	ExportMaxAge, ExportSweep time.Duration
}

// DefaultExportMaxAge: see Config.ExportMaxAge.
const DefaultExportMaxAge = time.Hour

// Runner owns the sandboxes of one backend.
type Runner struct {
	cfg     Config
	backend runtime.Backend
	log     *slog.Logger

	// ctx ends with Close: the runner then lets go of its sandboxes without touching them.
	ctx    context.Context
	cancel context.CancelFunc

	mu        sync.Mutex
	sandboxes map[string]*entry
	changed   chan struct{} // closed and replaced on every change of any sandbox
	closed    bool
	wg        sync.WaitGroup

	snaps         *snapJobs
	buckets       *blobconfig.Buckets // Blobs and the stores of other buckets
	restoreFlight flights             // PrepareSnapshot calls in flight, by digest

	// admitResume, when set (NewLocal), checks that the runner has room for a
	// checkpointed sandbox before it is resumed (its CPU and memory were released).
	admitResume func(ctx context.Context, sb Sandbox) error

	// exporting are the prefixes of this process's exports in progress (under mu);
	// started is when it started (sweepExports).
	exporting map[string]bool
	started   time.Time

	// progressInterval replaces ProgressInterval when set (tests).
	progressInterval time.Duration
}

// entry is the runner's live record of one sandbox. sb and the stop fields are guarded by
// Runner.mu; changed is closed and replaced on every change of sb.
type entry struct {
	sb      Sandbox
	changed chan struct{}

	// creds are the pull credentials of each container, in runtime.Spec.AllContainers
	// order: used for the pull only, never kept in sb.Spec or snapshots.
	creds []*runtime.Credentials
	// engineCreds are the engine's pull credentials by image (runtime.Engine), likewise.
	engineCreds map[string]*runtime.Credentials
	// secretEnv is each container's runtime.Container.SecretEnv, in AllContainers order:
	// handed to the backend's Create and dropped once it returns, never kept in sb.Spec,
	// the state dir or snapshots, never logged.
	secretEnv []map[string]string
	// egressSecretValues is runtime.Spec.EgressSecretValues, likewise: handed to the
	// backend's Create (whose egress proxy keeps them in memory), then dropped.
	egressSecretValues map[string]string
	// startedAt is when the backend started the container: the StartedAt reported once
	// the agent says the main command runs, and the one a restarted runner recovers.
	startedAt time.Time
	// lateInfo, when set, is closed once the backend's late Info (runtime.LateInfoWaiter:
	// the image digest) has been taken or given up on (awaitLateInfo).
	lateInfo chan struct{}
	// start is what its start is doing (WatchProgress); nil for a re-adopted sandbox.
	start        *progress.Tracker
	cancelCreate context.CancelFunc
	stopCh       chan struct{} // closed once a stop is requested
	stopReason   string
	stopGrace    time.Duration
	movedTo      string // the runner it moved to (stopReason ReasonMoved)

	done   chan struct{}                     // closed once the sandbox is terminal and its resources are gone
	client agentv1connect.AgentServiceClient // the primary's agent, set while the sandbox runs
	// agents are the agents of the other containers, made on first use (by name).
	agents map[string]agentv1connect.AgentServiceClient
	// statusAt is when the containers' statuses were last asked of the backend;
	// statusBusy that one ask is under way; statusFinal that finish recorded the last
	// statuses (no later ask may replace them).
	statusAt    time.Time
	statusBusy  bool
	statusAgain bool // an ask under way began before a change: ask again after it
	statusFinal bool
	// usageAt and usageUsec are the previous CPU sample (Runner.usage), usageRate the
	// rate last computed; guarded by Runner.mu.
	usageAt   time.Time
	usageUsec int64
	usageRate int64
	expiry    *time.Timer
	forget    *time.Timer

	// restores are the snapshots the sandbox's volumes start from (by volume name).
	restores map[string]SnapshotSource
	// captures are a delete's snapshot targets, taken by finish before the destroy;
	// capturesTaken once finish took them (no later target can be captured).
	captures      []pendingCapture
	capturesTaken bool

	// op serializes what changes the sandbox's run state in the backend: Pause, Resume,
	// Fork (of it as the source) and the stop a delete or expiry asks for.
	op sync.Mutex
	// pausing is set while a Pause is under way (the agent's Watch may end with it);
	// rewatch is closed and replaced when the agent is to be watched again (a resume, a
	// pause that failed). Guarded by Runner.mu.
	pausing bool
	rewatch chan struct{}
	// holds are the exports of a checkpointed sandbox's checkpoint that may be moving it
	// to another runner (manifest key → when the hold lapses): Resume waits while one
	// is held (porting.go). Guarded by Runner.mu.
	holds map[string]time.Time
	// lastActive is when the sandbox last served exec, files or endpoint traffic, active
	// how many such calls are under way, idlePausing that an idle pause is (idle pause).
	// Guarded by Runner.mu.
	lastActive  time.Time
	active      int
	idlePausing bool
}

// New starts a runner and re-adopts the sandboxes its backend still has.
func New(ctx context.Context, cfg Config) (*Runner, error) {
	if cfg.Backend == nil {
		return nil, errors.New("runner: no backend")
	}
	if cfg.Retention <= 0 {
		cfg.Retention = time.Hour
	}
	if cfg.ExpiryGrace <= 0 {
		cfg.ExpiryGrace = 10 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.SnapshotsPerSandbox <= 0 {
		cfg.SnapshotsPerSandbox = DefaultSnapshotsPerSandbox
	}
	if cfg.SnapshotsPerRunner <= 0 {
		cfg.SnapshotsPerRunner = DefaultSnapshotsPerRunner
	}
	if cfg.IdleCheck <= 0 {
		cfg.IdleCheck = 5 * time.Second
	}
	if cfg.ExportMaxAge <= 0 {
		cfg.ExportMaxAge = DefaultExportMaxAge
	}
	if cfg.ExportSweep <= 0 {
		cfg.ExportSweep = 30 * time.Minute
	}
	for _, d := range []string{"logs", containerLogs, "ended", lifetimesDir, pausedDir, movedDir} {
		if err := os.MkdirAll(filepath.Join(cfg.DataDir, d), 0o700); err != nil {
			return nil, fmt.Errorf("runner: create data dir: %w", err)
		}
	}
	snaps, orphans, err := openSnapJobs(filepath.Join(cfg.DataDir, "snapshots"))
	if err != nil {
		return nil, err
	}
	r := &Runner{cfg: cfg, backend: cfg.Backend, log: cfg.Logger, sandboxes: map[string]*entry{}, changed: make(chan struct{}), snaps: snaps,
		buckets: blobconfig.NewBuckets(cfg.BlobConfig, cfg.Blobs, 0)}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	r.started, r.exporting = time.Now(), map[string]bool{}
	r.deleteOrphans(orphans)
	r.recoverEnded()
	if err := r.recover(ctx); err != nil {
		r.cancel()
		return nil, err
	}
	r.removeStrayLogs()
	r.wg.Add(2)
	go func() {
		defer r.wg.Done()
		r.idlePauses()
	}()
	go func() {
		defer r.wg.Done()
		r.exportSweeps()
	}()
	return r, nil
}

// Create accepts a sandbox and starts it in the background; the snapshot it returns is in
// CREATING. Validation problems come back as *ValidationError before anything starts.
func (r *Runner) Create(ctx context.Context, req CreateRequest) (Sandbox, error) {
	return r.create(ctx, req, nil)
}

// create is Create with keep: kept volume names by volume name (runtime.Volume.Keep),
// which only the runner's own image builds give (a caller's Keep is cleared).
func (r *Runner) create(ctx context.Context, req CreateRequest, keep map[string]string) (Sandbox, error) {
	var creds []*runtime.Credentials
	var secretEnv []map[string]string
	orig := req.Spec
	for _, c := range orig.AllContainers() {
		creds = append(creds, c.PullCredentials)
		secretEnv = append(secretEnv, c.SecretEnv)
	}
	if err := validateSecretEnv(orig.AllContainers()); err != nil {
		return Sandbox{}, err
	}
	if err := r.checkSecretRefs(ctx, &orig); err != nil {
		return Sandbox{}, err
	}
	egressValues := orig.EgressSecretValues
	if err := checkEgressSecrets(&orig); err != nil {
		return Sandbox{}, err
	}
	var engineCreds map[string]*runtime.Credentials
	if orig.Engine != nil {
		engineCreds = orig.Engine.PullCredentials
	}
	req.Spec = cloneSpec(req.Spec)
	if err := validate(&req); err != nil {
		return Sandbox{}, err
	}
	if err := validateRestores(&req); err != nil {
		return Sandbox{}, err
	}
	if err := r.checkGlobals(&req.Spec); err != nil {
		return Sandbox{}, err
	}
	if err := applyKeep(&req, keep); err != nil {
		return Sandbox{}, err
	}
	if len(req.Restores) > 0 {
		if _, why := r.restoreSupport(); why != "" {
			return Sandbox{}, fssNotSupported(why)
		}
	}
	if err := supported(req.Spec.Network, r.Support()); err != nil {
		return Sandbox{}, err
	}
	if err := r.checkUnreserved(req.Spec.Network); err != nil {
		return Sandbox{}, err
	}
	for _, c := range req.Spec.AllContainers() {
		if c.RestartLimit == 0 {
			c.RestartLimit = runtime.DefaultRestartLimit
		}
		if c.Resources.Pids == 0 {
			// No container goes without a process limit: a fork bomb must hit it, not
			// the host's.
			c.Resources.Pids = runtime.DefaultPidsLimit
		}
	}
	reservedWarm := r.assignID(&req.Spec, orig.PullCredentials) // warm pools (warmid.go)
	now := time.Now()
	if req.Spec.Meta == nil {
		req.Spec.Meta = map[string]string{}
	}
	req.Spec.Meta[runtime.MetaCreatedAt] = now.UTC().Format(time.RFC3339Nano)
	req.Spec.Meta[runtime.MetaLifetime] = req.Lifetime.String()

	e := newEntry(Sandbox{
		ID:        req.Spec.ID,
		Spec:      req.Spec,
		State:     StateCreating,
		CreatedAt: now,
		Lifetime:  req.Lifetime,
		Deadline:  now.Add(req.Lifetime),
	})
	e.creds, e.engineCreds = creds, engineCreds
	if slices.ContainsFunc(secretEnv, func(m map[string]string) bool { return len(m) > 0 }) {
		e.secretEnv = secretEnv
	}
	if len(egressValues) > 0 {
		e.egressSecretValues = egressValues
	}
	if len(req.Restores) > 0 {
		e.restores = maps.Clone(req.Restores)
	}
	createCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	e.cancelCreate = cancel
	e.start = progress.NewTracker(progress.PhaseStartingContainer)
	createCtx = progress.With(createCtx, e.start)

	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		cancel()
		if reservedWarm {
			r.releaseWarm(req.Spec.ID)
		}
		return Sandbox{}, errors.New("runner: shutting down")
	}
	if _, ok := r.sandboxes[req.Spec.ID]; ok {
		r.mu.Unlock()
		cancel()
		if reservedWarm {
			r.releaseWarm(req.Spec.ID)
		}
		return Sandbox{}, fmt.Errorf("%w: %s", ErrAlreadyExists, req.Spec.ID)
	}
	r.sandboxes[req.Spec.ID] = e
	r.armExpiry(e)
	r.notifyLocked(e) // a new sandbox is a change of List
	snap := e.snapshot()
	r.wg.Add(1)
	r.mu.Unlock()

	go func() {
		defer r.wg.Done()
		defer cancel()
		r.lifecycle(createCtx, e, true)
	}()
	return snap, nil
}

// Get returns a snapshot of one sandbox. It never waits for the backend's container
// statuses: it reports the last ones and has them refreshed in the background.
func (r *Runner) Get(id string) (Sandbox, error) {
	r.mu.Lock()
	e, ok := r.sandboxes[id]
	if !ok {
		r.mu.Unlock()
		return Sandbox{}, fmt.Errorf("%w: %s", runtime.ErrNotFound, id)
	}
	r.refreshSoonLocked(e)
	sb := e.snapshot()
	r.mu.Unlock()
	if sb.State == StateRunning {
		// Exec'd processes can be OOM-killed without the sandbox ending; the cgroup counts.
		if n, ok := r.oomKills(id); ok && n > sb.OOMKills {
			r.update(e, func(s *Sandbox) { s.OOMKills = max(s.OOMKills, n) })
			sb.OOMKills = n
		}
		sb.Usage = r.usage(e, id, sb.StartedAt)
	}
	return sb, nil
}

// oomKills asks the backend, when it can tell, how many processes the memory limit
// killed.
func (r *Runner) oomKills(id string) (int, bool) {
	b, ok := r.backend.(runtime.OOMCounter)
	if !ok {
		return 0, false
	}
	n, err := b.OOMKills(id)
	return n, err == nil
}

// ServiceOf is, for the edge's route lookups, what a running or paused sandbox publishes
// on port: a Sandbox holding only its ID, state, address, organization, share-token hash
// and that one service (false: no such sandbox, not running or paused, or no service on
// port). It refreshes and deep-copies nothing: the edge calls it for names any client
// sends, before authentication.
func (r *Runner) ServiceOf(id string, port int) (Sandbox, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.sandboxes[id]
	if !ok || (e.sb.State != StateRunning && e.sb.State != StatePaused) {
		return Sandbox{}, false
	}
	for _, svc := range e.sb.Spec.Services {
		if svc.Port == port {
			return Sandbox{ID: e.sb.ID, State: e.sb.State, IP: e.sb.IP, Spec: runtime.Spec{
				Services:       []runtime.Service{svc},
				ShareTokenHash: e.sb.Spec.ShareTokenHash,
				Meta:           map[string]string{runtime.MetaOrg: e.sb.Spec.Meta[runtime.MetaOrg]},
			}}, true
		}
	}
	return Sandbox{}, false
}

// List returns snapshots of every sandbox, oldest first. Like Get, it never waits for
// the backend's container statuses.
func (r *Runner) List() []Sandbox {
	r.mu.Lock()
	out := make([]Sandbox, 0, len(r.sandboxes))
	for _, e := range r.sandboxes {
		r.refreshSoonLocked(e)
		out = append(out, e.snapshot())
	}
	r.mu.Unlock()
	slices.SortFunc(out, func(a, b Sandbox) int {
		if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	return out
}

// Delete stops a sandbox: SIGTERM to its main command, SIGKILL after grace. It returns at
// once with the sandbox TERMINATING (or as it is, when already terminal); WaitTerminal
// follows it to TERMINATED.
func (r *Runner) Delete(id string, grace time.Duration) (Sandbox, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.sandboxes[id]
	if !ok {
		return Sandbox{}, fmt.Errorf("%w: %s", runtime.ErrNotFound, id)
	}
	if !e.sb.State.Terminal() {
		r.requestStopLocked(e, ReasonDeleted, max(grace, 0))
		if e.sb.State != StateTerminating {
			e.sb.State = StateTerminating
			r.notifyLocked(e)
		}
	}
	return e.snapshot(), nil
}

// WaitTerminal blocks until the sandbox is terminal and its resources are released.
func (r *Runner) WaitTerminal(ctx context.Context, id string) (Sandbox, error) {
	r.mu.Lock()
	e, ok := r.sandboxes[id]
	r.mu.Unlock()
	if !ok {
		return Sandbox{}, fmt.Errorf("%w: %s", runtime.ErrNotFound, id)
	}
	select {
	case <-e.done:
	case <-ctx.Done():
		return Sandbox{}, ctx.Err()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return e.snapshot(), nil
}

// Agent returns a client of the agent of the sandbox's container ("" = the primary),
// waiting while the sandbox is still starting. A sandbox that is terminating or terminal
// gives ErrNotRunning, as does a container other than the primary that has exited (a
// *ContainerNotRunningError); a name the sandbox's spec does not have is a
// *ContainerNotFoundError. The agent of each container is made on first use.
func (r *Runner) Agent(ctx context.Context, id, container string) (agentv1connect.AgentServiceClient, error) {
	for {
		r.mu.Lock()
		e, ok := r.sandboxes[id]
		if !ok {
			r.mu.Unlock()
			return nil, fmt.Errorf("%w: %s", runtime.ErrNotFound, id)
		}
		name, primary, init, err := e.container(container)
		st, ch, client := e.sb.State, e.changed, e.client
		autoResume := e.sb.Pause != nil && e.sb.Pause.AutoResume
		pausing := e.pausing
		if err == nil {
			e.lastActive = time.Now()
		}
		r.mu.Unlock()
		switch {
		case err != nil:
			return nil, err
		case st == StatePaused && !autoResume:
			return nil, fmt.Errorf("%w: %s", ErrPaused, id)
		case st == StatePaused:
			if _, err := r.Resume(ctx, id); err != nil {
				return nil, err
			}
			continue
		case pausing:
			// A pause is under way: it is PAUSED (and resumed) or RUNNING again shortly.
		case st == StateRunning && client != nil && primary:
			return r.tracked(e, client), nil
		case st == StateRunning && client != nil:
			a, err := r.containerAgent(e, name, init)
			if err != nil {
				return nil, err
			}
			return r.tracked(e, a), nil
		case st == StateTerminating || st.Terminal():
			return nil, fmt.Errorf("%w: %s is %s", ErrNotRunning, id, st)
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, fmt.Errorf("wait for sandbox %s to run: %w", id, ctx.Err())
		}
	}
}

// lateInfoWait bounds how long the runner waits for a backend's late Info in the
// background (the Kubernetes backend's comes with the kubelet's next relist, ≤ ~1 s); a
// fork or export waits for that wait to end, or for its own ctx.
const lateInfoWait = 30 * time.Second

// awaitLateInfo takes, in the background, what a backend's Create returned without (its
// image digest): from runtime.LateInfoWaiter, bounded by lateInfoWait.
func (r *Runner) awaitLateInfo(e *entry, info runtime.Info) {
	w, ok := r.backend.(runtime.LateInfoWaiter)
	if !ok || info.ImageDigest != "" {
		return
	}
	done := make(chan struct{})
	r.mu.Lock()
	e.lateInfo = done
	id := e.sb.ID
	r.mu.Unlock()
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		defer close(done)
		ctx, cancel := context.WithTimeout(r.ctx, lateInfoWait)
		defer cancel()
		late, err := w.WaitInfo(ctx, id)
		if err != nil || late.ImageDigest == "" {
			return
		}
		r.update(e, func(sb *Sandbox) {
			if sb.ImageDigest == "" {
				sb.ImageDigest = late.ImageDigest
			}
		})
	}()
}

// holdForLateInfo waits for e's late Info, if one is awaited (until the background wait
// has it or gave up, at most lateInfoWait, or ctx ends), and returns e's snapshot then:
// a fork or export records the image digest rather than going on without it.
func (r *Runner) holdForLateInfo(ctx context.Context, e *entry) (Sandbox, error) {
	r.mu.Lock()
	ch := e.lateInfo
	r.mu.Unlock()
	if ch != nil {
		select {
		case <-ch:
		case <-ctx.Done():
			return Sandbox{}, ctx.Err()
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return e.snapshot(), nil
}

// container resolves a container name of e's sandbox ("" = the primary): its name, and
// whether it is the primary or an init container. Called with Runner.mu held.
func (e *entry) container(name string) (string, bool, bool, error) {
	c, init := e.sb.Spec.Find(name)
	if c == nil {
		return "", false, false, &ContainerNotFoundError{Sandbox: e.sb.ID, Container: name}
	}
	return c.ContainerName(), c == &e.sb.Spec.Container, init, nil
}

// containerAgent is the agent of container name (not the primary) of the running sandbox
// e, once its status says it has not exited.
func (r *Runner) containerAgent(e *entry, name string, init bool) (agentv1connect.AgentServiceClient, error) {
	r.refreshContainers(e, false)
	r.mu.Lock()
	defer r.mu.Unlock()
	if e.exitedLocked(name, init) {
		return nil, &ContainerNotRunningError{Sandbox: e.sb.ID, Container: name}
	}
	return r.agentLocked(e, name), nil
}

// exitedLocked tells whether container name (not the primary; init: an init container)
// of the running sandbox e has exited, by its last known status. Called with Runner.mu
// held.
func (e *entry) exitedLocked(name string, init bool) bool {
	exited := init // an init container has exited for good once the sandbox runs
	for _, c := range e.sb.Containers {
		if c.Name == name {
			exited = c.State == runtime.ContainerExited
		}
	}
	return exited
}

// agentLocked returns the agent of e's container name (not the primary), making it on
// first use; nil once the sandbox no longer runs. Called with Runner.mu held.
func (r *Runner) agentLocked(e *entry, name string) agentv1connect.AgentServiceClient {
	if e.client == nil {
		return nil
	}
	if a := e.agents[name]; a != nil {
		return a
	}
	if e.agents == nil {
		e.agents = map[string]agentv1connect.AgentServiceClient{}
	}
	id := e.sb.ID
	a := agent.NewClient(func(ctx context.Context) (net.Conn, error) { return r.backend.DialAgent(ctx, id, name) }, agentTracing)
	e.agents[name] = a
	return a
}

// containerStatusEvery bounds how often the runner asks its backend for the statuses of
// one sandbox's containers (on Get, List and what it notices itself).
const containerStatusEvery = time.Second

// refreshContainers updates e's container statuses from the backend (when it reports
// them and the sandbox has more than one container): at most once per
// containerStatusEvery and one ask at a time, unless final (finish's last look, which
// no later ask replaces).
func (r *Runner) refreshContainers(e *entry, final bool) {
	rep, ok := r.backend.(runtime.ContainerStatusReporter)
	if !ok {
		return
	}
	r.mu.Lock()
	if !e.sb.Spec.Multi() || e.statusFinal || !final && (e.statusBusy || time.Since(e.statusAt) < containerStatusEvery) {
		r.mu.Unlock()
		return
	}
	e.statusBusy, e.statusAt = true, time.Now()
	id := e.sb.ID
	r.mu.Unlock()
	ctx, cancel := context.WithTimeout(r.ctx, 5*time.Second)
	cs, err := rep.ContainerStatuses(ctx, id)
	cancel()
	r.mu.Lock()
	e.statusBusy = false
	again := e.statusAgain && !e.statusFinal && !final
	e.statusAgain = false
	if !e.statusFinal {
		e.statusFinal = final
		if err != nil {
			r.log.Debug("container statuses", "sandbox", id, "err", err)
		} else if !slices.EqualFunc(cs, e.sb.Containers, equalStatus) {
			e.sb.Containers = cs
			r.notifyLocked(e)
		}
	}
	r.mu.Unlock()
	if again {
		r.refreshContainersNow(e)
	}
}

// refreshContainersNow asks at once, whatever the rate: after a change the runner knows
// of (Create returned, so every container has started), the statuses must show it. An
// ask already under way may have been answered before the change, so it asks again
// when it is done.
func (r *Runner) refreshContainersNow(e *entry) {
	r.mu.Lock()
	e.statusAt = time.Time{}
	if e.statusBusy {
		e.statusAgain = true
		r.mu.Unlock()
		return
	}
	r.mu.Unlock()
	r.refreshContainers(e, false)
}

// refreshSoonLocked has e's container statuses asked of the backend in the background,
// when they are due (refreshContainers' rate) and no ask is under way: Get and List
// answer from what the runner has and never wait for the backend, so a sandbox whose
// backend is slow to answer (an agent that never replies) slows nobody's reads. Called
// with Runner.mu held.
func (r *Runner) refreshSoonLocked(e *entry) {
	if r.closed || e.sb.State.Terminal() || !e.sb.Spec.Multi() || e.statusFinal || e.statusBusy ||
		time.Since(e.statusAt) < containerStatusEvery {
		return
	}
	if _, ok := r.backend.(runtime.ContainerStatusReporter); !ok {
		return
	}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		r.refreshContainers(e, false)
	}()
}

func equalStatus(a, b runtime.ContainerStatus) bool {
	if (a.ExitCode == nil) != (b.ExitCode == nil) || a.ExitCode != nil && *a.ExitCode != *b.ExitCode {
		return false
	}
	a.ExitCode, b.ExitCode = nil, nil
	return a == b
}

// LogDir returns the directory holding the archived logs of an ended sandbox's container
// ("" = the primary), or "" while its agent serves them live.
func (r *Runner) LogDir(id, container string) (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.sandboxes[id]
	if !ok {
		return "", fmt.Errorf("%w: %s", runtime.ErrNotFound, id)
	}
	name, primary, _, err := e.container(container)
	if err != nil {
		return "", err
	}
	select {
	case <-e.done:
		return r.archiveDir(id, name, primary), nil
	default:
		return "", nil
	}
}

// errLogReplaced: the log dir of an exited container is not a directory the runner reads.
var errLogReplaced = errors.New("log dir replaced")

// Logs passes the main command's log of a container of sandbox id ("" = the primary;
// a name it does not have is a *ContainerNotFoundError) to send, as the agent's Logs call
// does: from its agent while the sandbox runs, and from the copy the runner keeps once it
// ended (for Config.Retention, across runner restarts). A read that outlives the agent
// (the sandbox ends under a follow) goes on in that copy where the agent stopped, so a
// follow ends at the end of the log instead of breaking off. While the sandbox is still
// being created, Logs waits for it to start (or end). The log of an init container, or
// of a sidecar that exited for good, while the sandbox runs is read at once where its
// agent left it, through the backend's runtime.ContainerLogOpener, which follows no
// symlink the container planted there (a backend without one: *ContainerNotRunningError
// until the sandbox ends). Errors from the agent and the reader are connect errors; an
// error from send is returned as it is.
func (r *Runner) Logs(ctx context.Context, id, container string, req *agentv1.LogsRequest, send func(*agentv1.LogsResponse) error) error {
	r.mu.Lock()
	e, ok := r.sandboxes[id]
	if !ok {
		r.mu.Unlock()
		return fmt.Errorf("%w: %s", runtime.ErrNotFound, id)
	}
	name, primary, init, err := e.container(container)
	r.mu.Unlock()
	if err != nil {
		return err
	}
	var (
		next     uint64 // offset after the last byte passed on
		passed   bool
		sendErr  error
		failures int
	)
	pass := func(m *agentv1.LogsResponse) error {
		if sendErr = send(m); sendErr != nil {
			return sendErr
		}
		next, passed, failures = m.GetNextOffset(), true, 0
		return nil
	}
	// rest is what is left to read once something was passed on: from where it stopped.
	rest := func() *agentv1.LogsRequest {
		if !passed {
			return req
		}
		return &agentv1.LogsRequest{Follow: req.GetFollow(), Offset: next, FromOffset: true}
	}
	for {
		r.mu.Lock()
		st, client, changed := e.sb.State, e.client, e.changed
		exited := !primary && st == StateRunning && client != nil && e.exitedLocked(name, init)
		if !primary && client != nil {
			client = r.agentLocked(e, name)
		}
		r.mu.Unlock()
		select {
		case <-e.done:
			return agent.ReadLogs(ctx, r.archiveDir(id, name, primary), nil, rest(), pass)
		default:
		}
		if exited {
			// Its agent is gone with it: its log is read where that agent left it, which
			// the container could write (the backend's opener follows no symlink it
			// planted there), or, from a backend that keeps no such log, not at all until
			// the sandbox ends and the runner has its copy.
			lo, ok := r.backend.(runtime.ContainerLogOpener)
			if !ok {
				return &ContainerNotRunningError{Sandbox: id, Container: name, Logs: true}
			}
			// The log is complete, so a follow ends at its end.
			open := func() (*logstore.Reader, error) {
				lr, err := lo.OpenContainerLog(id, name)
				if err != nil && !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, errors.ErrUnsupported) {
					// Replaced by the container (a symlink, no directory): the error names
					// host paths, which the caller is not shown.
					r.log.Warn("log of an exited container not read (replaced by the container?)", "sandbox", id, "container", name, "err", err)
					return nil, errLogReplaced
				}
				return lr, err
			}
			err := agent.ReadLogsFrom(ctx, open, nil, rest(), pass)
			if errors.Is(err, errors.ErrUnsupported) && sendErr == nil {
				return &ContainerNotRunningError{Sandbox: id, Container: name, Logs: true} // no log of it kept
			}
			if errors.Is(err, errLogReplaced) && sendErr == nil {
				return apierr.New(apierr.FileNotRegular, fmt.Sprintf("the log of container %q of sandbox %s cannot be read: the container replaced its log directory, which is not followed", name, id),
					map[string]string{"sandbox_id": id, "container": name})
			}
			return err
		}
		if st == StatePaused {
			// Its agent is paused with it: the log is read where the agent left it, as an
			// exited container's (a follow ends at its end), without resuming the sandbox.
			lo, ok := r.backend.(runtime.ContainerLogOpener)
			if !ok {
				return fmt.Errorf("%w: %s (this runner reads no log of a paused sandbox)", ErrPaused, id)
			}
			from := name
			if primary {
				from = ""
			}
			open := func() (*logstore.Reader, error) {
				lr, err := lo.OpenContainerLog(id, from)
				if err != nil && !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, errors.ErrUnsupported) {
					r.log.Warn("log of a paused sandbox not read (replaced by the sandbox?)", "sandbox", id, "container", name, "err", err)
					return nil, errLogReplaced
				}
				return lr, err
			}
			err := agent.ReadLogsFrom(ctx, open, nil, rest(), pass)
			if errors.Is(err, errors.ErrUnsupported) && sendErr == nil {
				return fmt.Errorf("%w: %s (its log is not kept where the runner reads it)", ErrPaused, id)
			}
			if errors.Is(err, errLogReplaced) && sendErr == nil {
				return apierr.New(apierr.FileNotRegular, fmt.Sprintf("the log of container %q of sandbox %s cannot be read: the container replaced its log directory, which is not followed", name, id),
					map[string]string{"sandbox_id": id, "container": name})
			}
			return err
		}
		if client == nil || st == StateCreating || st == StatePending {
			select {
			case <-changed:
			case <-e.done:
			case <-ctx.Done():
				return ctx.Err()
			}
			continue
		}
		err := agent.ForwardLogs(ctx, client, rest(), pass)
		if err == nil || sendErr != nil || ctx.Err() != nil || connect.CodeOf(err) == connect.CodeInvalidArgument {
			return err
		}
		// The agent went away under the read: the sandbox is ending (its copy of the log
		// follows), or the agent could not be reached for a moment (try it again).
		if failures++; failures > 3 {
			return err
		}
		if !primary {
			r.refreshContainers(e, false) // has it exited? (checked above)
		}
		select {
		case <-e.done:
		case <-time.After(time.Second):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Close stops following sandboxes without touching them: they keep running and the next
// runner re-adopts them. It returns once no goroutine of the runner acts on them any more.
func (r *Runner) Close() {
	r.mu.Lock()
	r.closed = true
	for _, e := range r.sandboxes {
		if e.expiry != nil {
			e.expiry.Stop()
		}
		if e.forget != nil {
			e.forget.Stop()
		}
	}
	r.mu.Unlock()
	r.cancel()
	r.wg.Wait()
}

func newEntry(sb Sandbox) *entry {
	return &entry{
		sb:         sb,
		changed:    make(chan struct{}),
		stopCh:     make(chan struct{}),
		done:       make(chan struct{}),
		rewatch:    make(chan struct{}),
		lastActive: time.Now(),
	}
}

func (e *entry) snapshot() Sandbox {
	s := e.sb
	s.Spec = cloneSpec(e.sb.Spec)
	if e.sb.ExitCode != nil {
		c := *e.sb.ExitCode
		s.ExitCode = &c
	}
	if e.sb.Pause != nil {
		p := *e.sb.Pause
		s.Pause = &p
	}
	return s
}

func (e *entry) notifyLocked() {
	close(e.changed)
	e.changed = make(chan struct{})
}

// requestStopLocked records why the sandbox stops; the first reason wins.
func (r *Runner) requestStopLocked(e *entry, reason string, grace time.Duration) {
	select {
	case <-e.stopCh:
		return
	default:
	}
	e.stopReason, e.stopGrace = reason, grace
	close(e.stopCh)
	if e.cancelCreate != nil {
		e.cancelCreate()
	}
}

func (r *Runner) armExpiry(e *entry) {
	id := e.sb.ID
	if lifetimeHeld(e) {
		return // armed again at resume, with the deadline moved on
	}
	e.expiry = time.AfterFunc(time.Until(e.sb.Deadline), func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		if !e.sb.State.Terminal() && !r.closed && !lifetimeHeld(e) {
			r.log.Info("sandbox lifetime exceeded", "sandbox", id, "lifetime", e.sb.Lifetime)
			r.requestStopLocked(e, ReasonLifetimeExceeded, r.cfg.ExpiryGrace)
			if e.sb.State != StateTerminating {
				e.sb.State = StateTerminating // draining through the grace period
				r.notifyLocked(e)
			}
		}
	})
}

// lifecycle follows one sandbox from creation (when create is set) or re-adoption to its
// end, then releases its resources.
func (r *Runner) lifecycle(ctx context.Context, e *entry, create bool) {
	id := e.sb.ID
	if create {
		r.mu.Lock() // a Delete may be changing its state meanwhile
		spec := e.snapshot().Spec
		r.mu.Unlock()
		for i, c := range spec.AllContainers() {
			if i < len(e.creds) {
				c.PullCredentials = e.creds[i]
			}
			if i < len(e.secretEnv) {
				c.SecretEnv = e.secretEnv[i]
			}
		}
		spec.EgressSecretValues = e.egressSecretValues
		if spec.Engine != nil && e.engineCreds != nil {
			spec.Engine = spec.Engine.Clone()
			spec.Engine.PullCredentials = e.engineCreds
		}
		// The start continues the create's trace (ctx keeps the call's values).
		sctx, sp := tracing.Child(ctx, "runner.start", tracing.KeySandboxID.String(id))
		if len(e.restores) > 0 {
			e.start.SetPhase(progress.PhaseRestoringVolumes)
		}
		if err := r.prepareRestores(sctx, e); err != nil {
			tracing.End(sp, err)
			reason := apierr.FSSRestoreFailed
			if ctx.Err() != nil {
				reason = ReasonDeleted
			}
			r.finish(e, runtime.Exit{Reason: reason, Message: apierr.FSSRestoreFailed + ": restore " + err.Error(), At: time.Now()}, false)
			return
		}
		e.start.SetPhase(progress.PhaseStartingContainer)
		info, err := r.backend.Create(sctx, &spec)
		tracing.End(sp, err)
		e.start.SetPhase(progress.PhaseStartingCommand)
		r.mu.Lock()
		e.secretEnv = nil // the backend has handed them to the containers
		e.egressSecretValues = nil
		r.mu.Unlock()
		if err != nil {
			r.finish(e, runtime.Exit{Reason: createFailureReason(err), Message: err.Error(), At: time.Now()}, false)
			return
		}
		r.update(e, func(sb *Sandbox) {
			sb.IP, sb.RuntimeClass, sb.ImageDigest = info.IP, info.RuntimeClass, info.ImageDigest
			e.startedAt = info.StartedAt
		})
		r.awaitLateInfo(e, info)
		r.refreshContainersNow(e)
	}
	client := agent.NewClient(func(ctx context.Context) (net.Conn, error) { return r.backend.DialAgent(ctx, id, "") }, agentTracing)
	r.mu.Lock()
	e.client = client
	r.mu.Unlock()

	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		select {
		case <-e.stopCh:
			e.op.Lock() // after a pause, resume or fork under way (Stop ends a paused sandbox too)
			r.mu.Lock()
			grace := e.stopGrace
			r.mu.Unlock()
			if err := r.backend.Stop(context.Background(), id, grace); err != nil {
				r.log.Warn("stop sandbox", "sandbox", id, "err", err)
			}
			e.op.Unlock()
		case <-e.done:
		case <-r.ctx.Done():
		}
	}()

	r.follow(e, client)
	exit, err := r.backend.Wait(r.ctx, id)
	if r.ctx.Err() != nil {
		// Closed: the sandbox is left as it is, for the next runner to re-adopt.
		<-stopped
		return
	}
	if err != nil {
		exit = runtime.Exit{Reason: ReasonBackendError, Message: fmt.Sprintf("wait for sandbox: %v", err), At: time.Now()}
	}
	r.finish(e, exit, true)
	<-stopped
}

// follow watches the agent until the sandbox's processes end: again after each resume of
// a sandbox whose agent went away with a pause (a checkpoint ends every process; the
// backend's Wait goes on blocking meanwhile), until a stop is asked for.
func (r *Runner) follow(e *entry, client agentv1connect.AgentServiceClient) {
	for {
		r.mu.Lock()
		rewatch := e.rewatch
		r.mu.Unlock()
		r.watch(e, client)
		r.mu.Lock()
		paused := e.pausing || e.sb.State == StatePaused
		r.mu.Unlock()
		select {
		case <-rewatch: // resumed (or a pause failed) since the watch began: watch again
			paused = true
		default:
		}
		if !paused {
			return
		}
		select {
		case <-rewatch:
			r.mu.Lock()
			client = e.client
			r.mu.Unlock()
		case <-e.stopCh:
			return
		case <-r.ctx.Done():
			return
		}
	}
}

// watch follows the agent's status stream until the agent exits, so RUNNING and restart
// counts show without polling.
func (r *Runner) watch(e *entry, client agentv1connect.AgentServiceClient) {
	ctx, cancel := context.WithCancel(r.ctx)
	defer cancel()
	go func() {
		select {
		case <-e.done:
		case <-ctx.Done():
		}
		cancel()
	}()
	stream, err := client.Watch(ctx, connect.NewRequest(&agentv1.WatchRequest{}))
	if err != nil {
		r.log.Warn("watch agent", "sandbox", e.sb.ID, "err", err)
		return
	}
	defer func() { _ = stream.Close() }()
	for stream.Receive() {
		st := stream.Msg()
		r.update(e, func(sb *Sandbox) {
			sb.Restarts = int(st.GetRestartCount())
			if st.ExitCode != nil {
				c := st.GetExitCode()
				sb.ExitCode = &c
			}
			// RUNNING once the main command runs, not while the agent is STARTING it: the
			// agent writes the spec's files first, and an exec right after RUNNING must
			// find them all.
			switch st.GetState() {
			case agentv1.MainState_MAIN_STATE_RUNNING, agentv1.MainState_MAIN_STATE_RESTARTING:
				if sb.State == StateCreating || sb.State == StatePending {
					sb.State = StateRunning
					sb.StartedAt = e.startedAt
					if sb.StartedAt.IsZero() {
						sb.StartedAt = time.Now()
					}
				}
			}
		})
		r.refreshContainers(e, false) // the primary changed: the others may have too
	}
}

// finish records the end of a sandbox, archives its logs and releases its resources.
func (r *Runner) finish(e *entry, exit runtime.Exit, created bool) {
	id := e.sb.ID
	if n, ok := r.oomKills(id); ok && created {
		r.update(e, func(sb *Sandbox) { sb.OOMKills = max(sb.OOMKills, n) })
	}
	if created {
		r.refreshContainers(e, true) // the last word on each container, before they go
		r.mu.Lock()
		spec := cloneSpec(e.sb.Spec)
		moved := e.stopReason == ReasonMoved
		r.mu.Unlock()
		if !moved { // a moved sandbox goes on elsewhere and commits there
			r.commitGlobals(id, spec) // a GLOBAL volume's writer: uploaded before it is reported ended
		}
		r.takeCaptures(e, true) // a delete's snapshots: stopped, not yet destroyed
		r.archiveLogs(&spec)
		r.destroy(id)
	} else {
		r.takeCaptures(e, false)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	sb := &e.sb
	if exit.ExitCode != nil {
		c := *exit.ExitCode
		sb.ExitCode = &c
	}
	sb.Restarts = max(sb.Restarts, exit.Restarts)
	sb.EndedAt = exit.At
	if sb.EndedAt.IsZero() {
		sb.EndedAt = time.Now()
	}
	switch {
	case e.stopReason == ReasonDeleted:
		sb.State, sb.Reason, sb.Message = StateTerminated, ReasonDeleted, "deleted"
	case e.stopReason == ReasonMoved:
		sb.State, sb.Reason, sb.ExitCode = StateTerminated, ReasonMoved, nil
		sb.Message = "moved to runner " + e.movedTo
		if e.movedTo == "" {
			sb.Message = "moved to another runner"
		}
	case e.stopReason == ReasonCheckpointLost:
		sb.State, sb.Reason, sb.ExitCode = StateFailed, ReasonCheckpointLost, nil
		sb.Message = "the sandbox's checkpoint is lost: it cannot be resumed"
	case e.stopReason == ReasonLifetimeExceeded:
		// As the target system does: a sandbox that ran until its lifetime ends COMPLETED,
		// one that never started FAILED; either way with no exit code, since the main
		// command did not exit by itself.
		sb.State, sb.Reason, sb.ExitCode = StateCompleted, ReasonLifetimeExceeded, nil
		sb.Message = fmt.Sprintf("lifetime of %s exceeded", sb.Lifetime)
		if sb.StartedAt.IsZero() {
			sb.State = StateFailed
			sb.Message += " before the sandbox started"
		}
	case exit.Reason == ReasonCompleted:
		sb.State, sb.Reason, sb.Message = StateCompleted, ReasonCompleted, exit.Message
	default:
		sb.State, sb.Reason, sb.Message = StateFailed, exit.Reason, exit.Message
		if sb.Reason == "" {
			sb.Reason = "Error"
		}
	}
	// The files a create wrote are in the sandbox's root filesystem by now: an ended
	// sandbox keeps their paths and modes, not their contents (a spec may carry
	// runtime.MaxFilesBytes of them), neither in memory for the retention window nor in
	// its record on disk.
	for _, c := range sb.Spec.AllContainers() {
		c.Files = withoutContents(c.Files)
	}
	if e.expiry != nil {
		e.expiry.Stop()
	}
	e.client, e.agents = nil, nil
	sb.Pause = nil
	r.notifyLocked(e)
	close(e.done)
	r.log.Info("sandbox ended", "sandbox", id, "state", sb.State, "reason", sb.Reason, "message", sb.Message)
	if err := r.recordEnded(e.snapshot()); err != nil {
		r.log.Warn("record ended sandbox", "sandbox", id, "err", err)
	}
	_ = os.Remove(r.lifetimePath(id)) // the ended record keeps the lifetime now
	_ = os.Remove(r.pausedPath(id))
	if !r.closed {
		e.forget = time.AfterFunc(r.cfg.Retention, func() { r.forget(id, e) })
	}
}

// withoutContents is files without their contents (a new slice: the spec's may be shared).
func withoutContents(files []runtime.File) []runtime.File {
	if len(files) == 0 {
		return files
	}
	out := make([]runtime.File, len(files))
	for i, f := range files {
		f.Content = nil
		out[i] = f
	}
	return out
}

// destroy releases what the backend holds of sandbox id. A teardown step can fail for a
// moment (a cgroup the kernel has not let go of, a mount still busy): it is tried again,
// a few times over about half a minute, so one bad moment leaves nothing on the host. What
// still fails is logged; the next runner start finds it again (Recover).
func (r *Runner) destroy(id string) {
	delay := 250 * time.Millisecond
	for attempt := 1; ; attempt++ {
		err := r.backend.Destroy(context.Background(), id)
		if err == nil {
			return
		}
		if attempt == 6 {
			r.log.Error("destroy sandbox", "sandbox", id, "attempts", attempt, "err", err)
			return
		}
		r.log.Warn("destroy sandbox: retrying", "sandbox", id, "attempt", attempt, "err", err)
		select {
		case <-time.After(delay):
		case <-r.ctx.Done():
			r.log.Error("destroy sandbox", "sandbox", id, "err", err)
			return
		}
		delay *= 2
	}
}

// forget drops an ended sandbox and its files once its retention window has passed.
func (r *Runner) forget(id string, e *entry) {
	r.mu.Lock()
	current := r.sandboxes[id] == e
	if current {
		delete(r.sandboxes, id)
		r.notifyLocked(e) // gone from List
	}
	r.mu.Unlock()
	if current {
		r.forgetFiles(id)
	}
}

func (r *Runner) update(e *entry, fn func(*Sandbox)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	fn(&e.sb)
	r.notifyLocked(e)
}

// notifyLocked tells the watchers of e and of the whole runner that e changed.
func (r *Runner) notifyLocked(e *entry) {
	e.notifyLocked()
	close(r.changed)
	r.changed = make(chan struct{})
}

// Changed returns a channel closed at the next change of any sandbox: take it, read
// List, and wait on it to follow every change without polling.
func (r *Runner) Changed() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.changed
}

// containerLogs is the directory (in DataDir) of the archived logs of containers other
// than the primary: containerLogs/<sandbox>/<container>. The primary's stay in
// logs/<sandbox>, where they were before sandboxes had more than one container.
const containerLogs = "container-logs"

// archiveDir is where the logs of sandbox id's container name (primary: the primary's)
// are kept once it has ended. name is a container name of the sandbox's validated spec
// (a DNS label), never a caller's string that the spec does not have.
func (r *Runner) archiveDir(id, name string, primary bool) string {
	if primary {
		return filepath.Join(r.cfg.DataDir, "logs", id)
	}
	return filepath.Join(r.cfg.DataDir, containerLogs, id, name)
}

// endedPath is where the runner records an ended sandbox, so that it (and its log) stays
// readable across a runner restart until the retention window has passed.
func (r *Runner) endedPath(id string) string {
	return filepath.Join(r.cfg.DataDir, "ended", id+".json")
}

func (r *Runner) recordEnded(sb Sandbox) error {
	b, err := json.Marshal(sb)
	if err != nil {
		return err
	}
	return writeFileAtomic(r.endedPath(sb.ID), b)
}

// writeFileAtomic writes b to p through a temporary file and a rename, so a crash leaves
// the old file or the new one.
func writeFileAtomic(p string, b []byte) error {
	f, err := os.CreateTemp(filepath.Dir(p), ".tmp-*")
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), p)
	}
	if err != nil {
		_ = os.Remove(f.Name())
	}
	return err
}

// recoverEnded takes back the sandboxes an earlier runner recorded as ended while their
// retention window lasts, and deletes the records and logs of those whose window has
// passed. It runs before recover: a sandbox the backend still has (its destroy failed)
// is followed from what the backend says instead.
func (r *Runner) recoverEnded() {
	dir := filepath.Dir(r.endedPath("x"))
	ents, _ := os.ReadDir(dir)
	for _, ent := range ents {
		id, ok := strings.CutSuffix(ent.Name(), ".json")
		if !ok || !ent.Type().IsRegular() {
			_ = os.Remove(filepath.Join(dir, ent.Name())) // a temporary file a crash left
			continue
		}
		var sb Sandbox
		b, err := os.ReadFile(filepath.Join(dir, ent.Name()))
		if err == nil {
			err = json.Unmarshal(b, &sb)
		}
		left := time.Until(sb.EndedAt.Add(r.cfg.Retention))
		if err != nil || sb.ID != id || !sb.State.Terminal() || left <= 0 {
			r.forgetFiles(id)
			continue
		}
		e := newEntry(sb)
		close(e.done)
		r.mu.Lock()
		r.sandboxes[id] = e
		e.forget = time.AfterFunc(left, func() { r.forget(id, e) })
		r.mu.Unlock()
	}
}

// removeStrayLogs deletes archived logs of sandboxes the runner does not know (their
// record is gone or was never written).
func (r *Runner) removeStrayLogs() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, dir := range []string{filepath.Join(r.cfg.DataDir, "logs"), filepath.Join(r.cfg.DataDir, containerLogs), filepath.Join(r.cfg.DataDir, lifetimesDir), filepath.Join(r.cfg.DataDir, pausedDir)} {
		ents, _ := os.ReadDir(dir)
		for _, ent := range ents {
			if _, ok := r.sandboxes[ent.Name()]; !ok {
				_ = os.RemoveAll(filepath.Join(dir, ent.Name()))
			}
		}
	}
}

func (r *Runner) forgetFiles(id string) {
	_ = os.RemoveAll(r.archiveDir(id, "", true))
	_ = os.RemoveAll(filepath.Join(r.cfg.DataDir, containerLogs, id))
	_ = os.Remove(r.endedPath(id))
	_ = os.Remove(r.lifetimePath(id))
	_ = os.Remove(r.pausedPath(id))
}

// archiveLogs moves the agents' log files out of the sandbox, every container's, before
// the backend removes it.
func (r *Runner) archiveLogs(spec *runtime.Spec) {
	src, ok := r.backend.(runtime.LogDirProvider)
	if !ok {
		return
	}
	for _, c := range spec.AllContainers() {
		primary := c == &spec.Container
		name := c.ContainerName()
		from := name
		if primary {
			from = "" // what a backend has always answered for the primary
		}
		r.archiveLog(spec.ID, src.LogDir(spec.ID, from), r.archiveDir(spec.ID, name, primary))
	}
}

// archiveLog moves one container's log dir (on the sandbox's side, so written by it) to
// dst.
func (r *Runner) archiveLog(id, dir, dst string) {
	if dir == "" {
		return
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return // nothing (left) to archive: keep what an earlier finish archived
	}
	if !fi.IsDir() {
		// The sandbox replaced its log dir (it can write the dir above it), e.g. with a
		// symlink to another sandbox's logs: moved into the archive, that would have the
		// runner serve whatever it points to as this sandbox's log. The sandbox has
		// ended, so it cannot swap a directory back in before the rename.
		r.log.Warn("archive sandbox logs: the log dir is no directory (replaced by the sandbox?): nothing archived", "sandbox", id, "type", fi.Mode().Type().String())
		return
	}
	_ = os.RemoveAll(dst)
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		r.log.Warn("archive sandbox logs", "sandbox", id, "err", err)
		return
	}
	err = os.Rename(dir, dst)
	switch {
	case errors.Is(err, syscall.EXDEV):
		// The logs live on the sandbox's own filesystem (its disk limit): copy what is
		// logs, and nothing else.
		err = copyRegularTree(dir, dst)
	case err == nil:
		if n := keepRegularFiles(dst); n > 0 {
			r.log.Warn("archive sandbox logs: removed entries that are no regular files (planted by the sandbox?)", "sandbox", id, "removed", n)
		}
	}
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		r.log.Warn("archive sandbox logs", "sandbox", id, "err", err)
	}
}

// copyRegularTree copies the directories and regular files of src to dst (new), never
// following a symlink: src was writable by the sandbox.
func copyRegularTree(src, dst string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		to := filepath.Join(dst, rel)
		switch t := d.Type(); {
		case t.IsDir():
			return os.Mkdir(to, 0o700)
		case t.IsRegular():
			in, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
			if err != nil {
				return err
			}
			defer in.Close()
			if fi, err := in.Stat(); err != nil || !fi.Mode().IsRegular() {
				return nil // replaced meanwhile: skip it
			}
			out, err := os.OpenFile(to, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
			if err != nil {
				return err
			}
			_, err = io.Copy(out, in)
			if cerr := out.Close(); err == nil {
				err = cerr
			}
			return err
		}
		return nil // symlinks, FIFOs, sockets, devices: not logs
	})
}

// keepRegularFiles removes from dir, recursively, everything but directories and regular
// files: the logs come from a dir the sandbox could write, and the host reads the
// archive later, so a symlink (to a host file) or a FIFO planted there must not survive.
// The sandbox has ended, so nothing changes dir meanwhile.
func keepRegularFiles(dir string) int {
	removed := 0
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return nil
		}
		if t := d.Type(); !t.IsDir() && !t.IsRegular() {
			if os.Remove(p) == nil {
				removed++
			}
		}
		return nil
	})
	return removed
}

// recover re-adopts the sandboxes the backend found: live ones are followed again, dead
// ones are recorded as ended and cleaned up.
func (r *Runner) recover(ctx context.Context) error {
	found, err := r.backend.Recover(ctx)
	if err != nil {
		return fmt.Errorf("runner: recover sandboxes: %w", err)
	}
	moved := r.movedAway()
	for _, rec := range found {
		id := rec.Spec.ID
		if moved[id] {
			// It moved to another runner before this one could forget it: it runs there.
			delete(moved, id)
			r.wg.Add(1)
			go func() {
				defer r.wg.Done()
				r.destroy(id)
				_ = os.Remove(r.movedPath(id))
			}()
			continue
		}
		r.mu.Lock()
		ended := r.sandboxes[id]
		r.mu.Unlock()
		live := rec.Alive || rec.Paused
		if ended != nil && !live {
			// Recorded as ended by an earlier runner whose teardown did not complete: keep
			// the record, finish the teardown.
			r.wg.Add(1)
			spec := rec.Spec
			go func() {
				defer r.wg.Done()
				r.archiveLogs(&spec)
				r.destroy(id)
			}()
			continue
		}
		created, _ := time.Parse(time.RFC3339Nano, rec.Spec.Meta[runtime.MetaCreatedAt])
		if created.IsZero() {
			// No record of its creation (a spec written before it was kept): its lifetime
			// counts from its start, or from now, never from the zero time (which would
			// end it at once).
			created = rec.Info.StartedAt
			if created.IsZero() {
				created = time.Now()
			}
		}
		lifetime, _ := time.ParseDuration(rec.Spec.Meta[runtime.MetaLifetime])
		if d, ok := r.persistedLifetime(id); ok {
			lifetime = d // changed by UpdateLifetime after the create
		}
		if lifetime <= 0 {
			lifetime = DefaultLifetime
		}
		e := newEntry(Sandbox{
			ID:           rec.Spec.ID,
			Spec:         rec.Spec,
			State:        StateRunning,
			CreatedAt:    created,
			StartedAt:    rec.Info.StartedAt,
			Lifetime:     lifetime,
			Deadline:     created.Add(lifetime),
			IP:           rec.Info.IP,
			RuntimeClass: rec.Info.RuntimeClass,
			ImageDigest:  rec.Info.ImageDigest,
		})
		if rec.Paused {
			e.sb.State, e.sb.Pause = StatePaused, r.recoveredPause(rec)
		} else {
			_ = os.Remove(r.pausedPath(id)) // not paused, whatever an earlier runner noted
		}
		r.mu.Lock()
		if ended != nil && ended.forget != nil {
			ended.forget.Stop() // recorded as ended, yet alive: follow what runs
		}
		r.sandboxes[rec.Spec.ID] = e
		r.wg.Add(1)
		if live {
			r.armExpiry(e)
		}
		r.mu.Unlock()
		if live {
			// A Create cut short after its agent answered, before the backend knew the
			// image digest (runtime.LateInfoWaiter): taken as for a new sandbox.
			r.awaitLateInfo(e, rec.Info)
			r.log.Info("re-adopted sandbox", "sandbox", rec.Spec.ID)
			go func() {
				defer r.wg.Done()
				r.lifecycle(context.Background(), e, false)
			}()
			continue
		}
		exit := runtime.Exit{Reason: ReasonVanished, Message: "the sandbox's container ended while the runner was down", At: time.Now()}
		if rec.Exit != nil {
			exit = *rec.Exit
		}
		go func() {
			defer r.wg.Done()
			r.finish(e, exit, true)
		}()
	}
	for id := range moved {
		_ = os.Remove(r.movedPath(id)) // gone from the backend too
	}
	return nil
}

// createFailureReason maps a backend error to the reason users see.
func createFailureReason(err error) string {
	var f *startseq.Failure
	switch {
	case errors.As(err, &f) && f.Reason != "":
		return f.Reason // the message (the error's text) names the container
	case errors.Is(err, context.Canceled):
		return ReasonDeleted
	default:
		// The one table, shared with a backend's re-adoption of a failed create.
		return runtime.CreateFailureReason(err)
	}
}

// NewID returns a random sandbox ID (80 bits, base32 lower case) that is also a valid
// DNS label: what Create picks when the request names none.
func NewID() string {
	b := make([]byte, 10)
	_, _ = rand.Read(b)
	return strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(b))
}

// cloneSpec is a deep copy of s (runtime.Spec.Clone) without the pull credentials of
// any of its containers: the runner's record of a sandbox shares nothing with its caller
// or its snapshots, and keeps no credentials.
func cloneSpec(s runtime.Spec) runtime.Spec {
	c := s.Clone()
	for _, ct := range c.AllContainers() {
		ct.PullCredentials, ct.SecretEnv = nil, nil
	}
	if c.Engine != nil {
		c.Engine.PullCredentials = nil // c's own copy
	}
	c.EgressSecretValues = nil
	return c
}

// Support is what the backend cannot do (nothing, unless it says): what the runner
// refuses at create and reports in its capacity.
func (r *Runner) Support() runtime.Support {
	var s runtime.Support
	if b, ok := r.backend.(runtime.SupportReporter); ok {
		s = b.Support()
	}
	_, noCapture := r.snapshotSupport()
	_, noRestore := r.restoreSupport()
	s.NoSnapshots = s.NoSnapshots || noCapture != "" || noRestore != ""
	_, refs := r.backend.(runtime.SecretRefChecker)
	s.NoSecretRefs = !refs
	// A GLOBAL volume's copy is restored from, and committed to, the blob store.
	s.NoGlobalVolumes = s.NoGlobalVolumes || r.cfg.Blobs == nil
	return s
}

// RuntimeClasses are the runtime classes the backend offers, its default first; nil when
// the backend does not say.
func (r *Runner) RuntimeClasses() []string {
	if b, ok := r.backend.(runtime.RuntimeClassLister); ok {
		return b.RuntimeClasses()
	}
	return nil
}
