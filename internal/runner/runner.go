// Package runner drives sandboxes on one backend: it creates them, follows their main
// command through the agent, enforces their lifetime, stops and destroys them, and
// re-adopts them after its own restart.
package runner

import (
	"context"
	"crypto/rand"
	"encoding/base32"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
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
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// Meta keys the runner keeps in runtime.Spec.Meta; the backend persists them for
// recovery.
const (
	metaCreatedAt = "sandboxd.created_at"
	metaLifetime  = "sandboxd.lifetime"
)

// MetaOrg is the Spec.Meta key of the organization that owns a sandbox (set by the
// gateway that created it).
const MetaOrg = runtime.MetaOrg

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
}

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
}

// entry is the runner's live record of one sandbox. sb and the stop fields are guarded by
// Runner.mu; changed is closed and replaced on every change of sb.
type entry struct {
	sb      Sandbox
	changed chan struct{}

	creds *runtime.Credentials // used for the pull only; never kept in snapshots
	// startedAt is when the backend started the container: the StartedAt reported once
	// the agent says the main command runs, and the one a restarted runner recovers.
	startedAt    time.Time
	cancelCreate context.CancelFunc
	stopCh       chan struct{} // closed once a stop is requested
	stopReason   string
	stopGrace    time.Duration

	done   chan struct{} // closed once the sandbox is terminal and its resources are gone
	client agentv1connect.AgentServiceClient
	expiry *time.Timer
	forget *time.Timer
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
	if err := os.MkdirAll(filepath.Join(cfg.DataDir, "logs"), 0o700); err != nil {
		return nil, fmt.Errorf("runner: create data dir: %w", err)
	}
	r := &Runner{cfg: cfg, backend: cfg.Backend, log: cfg.Logger, sandboxes: map[string]*entry{}, changed: make(chan struct{})}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	if err := r.recover(ctx); err != nil {
		r.cancel()
		return nil, err
	}
	return r, nil
}

// Create accepts a sandbox and starts it in the background; the snapshot it returns is in
// CREATING. Validation problems come back as *ValidationError before anything starts.
func (r *Runner) Create(ctx context.Context, req CreateRequest) (Sandbox, error) {
	creds := req.Spec.PullCredentials
	req.Spec = cloneSpec(req.Spec)
	if err := validate(&req); err != nil {
		return Sandbox{}, err
	}
	if err := supported(req.Spec.Network, r.NetworkSupport()); err != nil {
		return Sandbox{}, err
	}
	if rb, ok := r.backend.(runtime.EgressReserver); ok {
		if err := unreserved(req.Spec.Network, rb.ReservedEgress()); err != nil {
			return Sandbox{}, err
		}
	}
	if req.Spec.ID == "" {
		req.Spec.ID = NewID()
	}
	if req.Spec.RestartLimit == 0 {
		req.Spec.RestartLimit = runtime.DefaultRestartLimit
	}
	if req.Spec.Resources.Pids == 0 {
		// No sandbox goes without a process limit: a fork bomb must hit it, not the host's.
		req.Spec.Resources.Pids = runtime.DefaultPidsLimit
	}
	now := time.Now()
	if req.Spec.Meta == nil {
		req.Spec.Meta = map[string]string{}
	}
	req.Spec.Meta[metaCreatedAt] = now.UTC().Format(time.RFC3339Nano)
	req.Spec.Meta[metaLifetime] = req.Lifetime.String()

	e := newEntry(Sandbox{
		ID:        req.Spec.ID,
		Spec:      req.Spec,
		State:     StateCreating,
		CreatedAt: now,
		Lifetime:  req.Lifetime,
		Deadline:  now.Add(req.Lifetime),
	})
	e.creds = creds
	createCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	e.cancelCreate = cancel

	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		cancel()
		return Sandbox{}, errors.New("runner: shutting down")
	}
	if _, ok := r.sandboxes[req.Spec.ID]; ok {
		r.mu.Unlock()
		cancel()
		return Sandbox{}, fmt.Errorf("%w: %s", ErrAlreadyExists, req.Spec.ID)
	}
	r.sandboxes[req.Spec.ID] = e
	r.armExpiry(e)
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

// Get returns a snapshot of one sandbox.
func (r *Runner) Get(id string) (Sandbox, error) {
	r.mu.Lock()
	e, ok := r.sandboxes[id]
	if !ok {
		r.mu.Unlock()
		return Sandbox{}, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	sb := e.snapshot()
	r.mu.Unlock()
	if sb.State == StateRunning {
		// Exec'd processes can be OOM-killed without the sandbox ending; the cgroup counts.
		if n, ok := r.oomKills(id); ok && n > sb.OOMKills {
			r.update(e, func(s *Sandbox) { s.OOMKills = max(s.OOMKills, n) })
			sb.OOMKills = n
		}
	}
	return sb, nil
}

// oomKills asks the backend, when it can tell, how many processes the memory limit
// killed.
func (r *Runner) oomKills(id string) (int, bool) {
	b, ok := r.backend.(interface{ OOMKills(string) (int, error) })
	if !ok {
		return 0, false
	}
	n, err := b.OOMKills(id)
	return n, err == nil
}

// List returns snapshots of every sandbox, oldest first.
func (r *Runner) List() []Sandbox {
	r.mu.Lock()
	out := make([]Sandbox, 0, len(r.sandboxes))
	for _, e := range r.sandboxes {
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
		return Sandbox{}, fmt.Errorf("%w: %s", ErrNotFound, id)
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
		return Sandbox{}, fmt.Errorf("%w: %s", ErrNotFound, id)
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

// Agent returns a client of the sandbox's agent, waiting while the sandbox is still
// starting. A sandbox that is terminating or terminal gives ErrNotRunning.
func (r *Runner) Agent(ctx context.Context, id string) (agentv1connect.AgentServiceClient, error) {
	for {
		r.mu.Lock()
		e, ok := r.sandboxes[id]
		if !ok {
			r.mu.Unlock()
			return nil, fmt.Errorf("%w: %s", ErrNotFound, id)
		}
		st, ch, client := e.sb.State, e.changed, e.client
		r.mu.Unlock()
		switch {
		case st == StateRunning && client != nil:
			return client, nil
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

// LogDir returns the directory holding an ended sandbox's archived logs, or "" while its
// agent serves them live.
func (r *Runner) LogDir(id string) (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.sandboxes[id]
	if !ok {
		return "", fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	select {
	case <-e.done:
		return r.archiveDir(id), nil
	default:
		return "", nil
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
		sb:      sb,
		changed: make(chan struct{}),
		stopCh:  make(chan struct{}),
		done:    make(chan struct{}),
	}
}

func (e *entry) snapshot() Sandbox {
	s := e.sb
	s.Spec = cloneSpec(e.sb.Spec)
	if e.sb.ExitCode != nil {
		c := *e.sb.ExitCode
		s.ExitCode = &c
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
	e.expiry = time.AfterFunc(time.Until(e.sb.Deadline), func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		if !e.sb.State.Terminal() && !r.closed {
			r.log.Info("sandbox lifetime exceeded", "sandbox", id, "lifetime", e.sb.Lifetime)
			r.requestStopLocked(e, ReasonLifetimeExceeded, r.cfg.ExpiryGrace)
		}
	})
}

// lifecycle follows one sandbox from creation (when create is set) or re-adoption to its
// end, then releases its resources.
func (r *Runner) lifecycle(ctx context.Context, e *entry, create bool) {
	id := e.sb.ID
	if create {
		spec := e.snapshot().Spec
		spec.PullCredentials = e.creds
		info, err := r.backend.Create(ctx, &spec)
		if err != nil {
			r.finish(e, runtime.Exit{Reason: createFailureReason(err), Message: err.Error(), At: time.Now()}, false)
			return
		}
		r.update(e, func(sb *Sandbox) {
			sb.IP, sb.RuntimeClass, sb.ImageDigest = info.IP, info.RuntimeClass, info.ImageDigest
			e.startedAt = info.StartedAt
		})
	}
	client := agent.NewClient(func(ctx context.Context) (net.Conn, error) { return r.backend.DialAgent(ctx, id) })
	r.mu.Lock()
	e.client = client
	r.mu.Unlock()

	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		select {
		case <-e.stopCh:
			r.mu.Lock()
			grace := e.stopGrace
			r.mu.Unlock()
			if err := r.backend.Stop(context.Background(), id, grace); err != nil {
				r.log.Warn("stop sandbox", "sandbox", id, "err", err)
			}
		case <-e.done:
		case <-r.ctx.Done():
		}
	}()

	r.watch(e, client)
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
			switch st.GetState() {
			case agentv1.MainState_MAIN_STATE_STARTING, agentv1.MainState_MAIN_STATE_RUNNING, agentv1.MainState_MAIN_STATE_RESTARTING:
				if sb.State == StateCreating || sb.State == StatePending {
					sb.State = StateRunning
					sb.StartedAt = e.startedAt
					if sb.StartedAt.IsZero() {
						sb.StartedAt = time.Now()
					}
				}
			}
		})
	}
}

// finish records the end of a sandbox, archives its logs and releases its resources.
func (r *Runner) finish(e *entry, exit runtime.Exit, created bool) {
	id := e.sb.ID
	if n, ok := r.oomKills(id); ok && created {
		r.update(e, func(sb *Sandbox) { sb.OOMKills = max(sb.OOMKills, n) })
	}
	if created {
		r.archiveLogs(id)
		r.destroy(id)
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
	case e.stopReason == ReasonLifetimeExceeded:
		sb.State, sb.Reason = StateFailed, ReasonLifetimeExceeded
		sb.Message = fmt.Sprintf("lifetime of %s exceeded", sb.Lifetime)
	case exit.Reason == ReasonCompleted:
		sb.State, sb.Reason, sb.Message = StateCompleted, ReasonCompleted, exit.Message
	default:
		sb.State, sb.Reason, sb.Message = StateFailed, exit.Reason, exit.Message
		if sb.Reason == "" {
			sb.Reason = "Error"
		}
	}
	if e.expiry != nil {
		e.expiry.Stop()
	}
	e.client = nil
	r.notifyLocked(e)
	close(e.done)
	r.log.Info("sandbox ended", "sandbox", id, "state", sb.State, "reason", sb.Reason, "message", sb.Message)
	if !r.closed {
		e.forget = time.AfterFunc(r.cfg.Retention, func() { r.forget(id, e) })
	}
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

func (r *Runner) forget(id string, e *entry) {
	r.mu.Lock()
	if r.sandboxes[id] == e {
		delete(r.sandboxes, id)
	}
	r.mu.Unlock()
	_ = os.RemoveAll(r.archiveDir(id))
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

func (r *Runner) archiveDir(id string) string {
	return filepath.Join(r.cfg.DataDir, "logs", id)
}

// archiveLogs moves the agent's log files out of the sandbox before the backend removes it.
func (r *Runner) archiveLogs(id string) {
	src, ok := r.backend.(interface{ LogDir(string) string })
	if !ok {
		return
	}
	dir := src.LogDir(id)
	if dir == "" {
		return
	}
	dst := r.archiveDir(id)
	_ = os.RemoveAll(dst)
	err := os.Rename(dir, dst)
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
	for _, rec := range found {
		created, _ := time.Parse(time.RFC3339Nano, rec.Spec.Meta[metaCreatedAt])
		lifetime, _ := time.ParseDuration(rec.Spec.Meta[metaLifetime])
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
		r.mu.Lock()
		r.sandboxes[rec.Spec.ID] = e
		r.wg.Add(1)
		if rec.Alive {
			r.armExpiry(e)
		}
		r.mu.Unlock()
		if rec.Alive {
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
	return nil
}

// createFailureReason maps a backend error to the reason users see.
func createFailureReason(err error) string {
	switch {
	case errors.Is(err, context.Canceled):
		return ReasonDeleted
	case errors.Is(err, runtime.ErrImageNotFound), errors.Is(err, runtime.ErrImageUnauthorized),
		errors.Is(err, runtime.ErrRegistry), errors.Is(err, runtime.ErrInvalidImageRef):
		return ReasonImagePullFailed
	case errors.Is(err, runtime.ErrInvalidSpec), errors.Is(err, runtime.ErrUnknownRuntime):
		return ReasonStartError
	default:
		return ReasonBackendError
	}
}

// NewID returns a random sandbox ID (80 bits, base32 lower case) that is also a valid
// DNS label: what Create picks when the request names none.
func NewID() string {
	b := make([]byte, 10)
	_, _ = rand.Read(b)
	return strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(b))
}

func cloneSpec(s runtime.Spec) runtime.Spec {
	c := s
	c.Args = slices.Clone(s.Args)
	c.Files = slices.Clone(s.Files)
	if s.Env != nil {
		c.Env = make(map[string]string, len(s.Env))
		for k, v := range s.Env {
			c.Env[k] = v
		}
	}
	if s.Meta != nil {
		c.Meta = make(map[string]string, len(s.Meta))
		for k, v := range s.Meta {
			c.Meta[k] = v
		}
	}
	c.PullCredentials = nil
	c.Services = slices.Clone(s.Services)
	c.Network = cloneNetwork(s.Network)
	return c
}

// cloneNetwork deep-copies n, so a runner's record never shares rules with its caller.
func cloneNetwork(n *runtime.Network) *runtime.Network {
	if n == nil {
		return nil
	}
	c := *n
	c.Egress = slices.Clone(n.Egress)
	for i := range c.Egress {
		c.Egress[i].Except = slices.Clone(c.Egress[i].Except)
		c.Egress[i].Ports = slices.Clone(c.Egress[i].Ports)
	}
	c.Ingress = slices.Clone(n.Ingress)
	for i := range c.Ingress {
		c.Ingress[i].Except = slices.Clone(c.Ingress[i].Except)
		c.Ingress[i].Ports = slices.Clone(c.Ingress[i].Ports)
	}
	return &c
}

// NetworkSupport is which network rules the backend enforces (all, unless it says).
func (r *Runner) NetworkSupport() runtime.NetworkSupport {
	if b, ok := r.backend.(runtime.NetworkSupporter); ok {
		return b.NetworkSupport()
	}
	return runtime.NetworkSupport{}
}

// RuntimeClasses are the runtime classes the backend offers, its default first; nil when
// the backend does not say.
func (r *Runner) RuntimeClasses() []string {
	if b, ok := r.backend.(interface{ RuntimeClasses() []string }); ok {
		return b.RuntimeClasses()
	}
	return nil
}
