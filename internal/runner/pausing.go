package runner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"connectrpc.com/connect"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1/agentv1connect"
	"github.com/sandboxd/sandboxd/internal/agent"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/span"
)

// pausedDir (in DataDir) holds one file per paused sandbox: its PauseStatus as JSON, so
// a restarted runner re-adopts it PAUSED as it was paused. The backend is the truth of
// whether it is paused (runtime.Recovered.Paused); the file keeps what only the runner
// knows (auto-resume, when it was paused).
const pausedDir = "paused"

// MaxForks bounds the targets of one Fork.
const MaxForks = 100

func (r *Runner) pausedPath(id string) string {
	return filepath.Join(r.cfg.DataDir, pausedDir, id)
}

// lifetimeHeld: e is paused and its lifetime does not count meanwhile. Called with
// Runner.mu held.
func lifetimeHeld(e *entry) bool {
	return e.sb.State == StatePaused && e.sb.Pause != nil && e.sb.Pause.LifetimeHeld
}

// metaLifetimeHeld: the sandbox's lifetime does not count while it is paused.
func metaLifetimeHeld(meta map[string]string) bool {
	return meta[runtime.MetaPauseLifetime] == "held"
}

// metaAutoResume: exec, files and endpoint traffic resume the sandbox by default.
func metaAutoResume(meta map[string]string) bool {
	return meta[runtime.MetaAutoResume] != "false"
}

// recoveredPause is how a sandbox the backend recovered paused is paused: from the file
// the earlier runner wrote, with the backend's word on whether it is checkpointed; from
// the spec's Meta when there is no (readable) file.
func (r *Runner) recoveredPause(rec runtime.Recovered) *PauseStatus {
	ps := PauseStatus{AutoResume: metaAutoResume(rec.Spec.Meta), PausedAt: time.Now()}
	if b, err := os.ReadFile(r.pausedPath(rec.Spec.ID)); err == nil && len(b) < 4096 {
		var saved PauseStatus
		if json.Unmarshal(b, &saved) == nil && !saved.PausedAt.IsZero() {
			ps = saved
		}
	}
	ps.Released = rec.Released
	ps.LifetimeHeld = metaLifetimeHeld(rec.Spec.Meta)
	return &ps
}

// pauseClass is the runtime class PauseSupport is asked about for e's sandbox. Called
// with Runner.mu held.
func pauseClass(sb *Sandbox) string {
	if sb.RuntimeClass != "" {
		return sb.RuntimeClass
	}
	return sb.Spec.RuntimeClass
}

// pauseSupport is what the backend can do for runtime class class, and why it cannot
// pause at all ("" when it can).
func (r *Runner) pauseSupport(class string) (runtime.PauseSupport, runtime.Pauser, string) {
	p, ok := r.backend.(runtime.Pauser)
	if !ok {
		return runtime.PauseSupport{Why: "this runner's backend cannot pause sandboxes"}, nil, "this runner's backend cannot pause sandboxes"
	}
	return p.PauseSupport(class), p, ""
}

// CheckpointClasses are those of classes whose sandboxes the backend can checkpoint.
func (r *Runner) CheckpointClasses(classes []string) []string {
	var out []string
	for _, c := range classes {
		if s, p, _ := r.pauseSupport(c); p != nil && s.Checkpoint {
			out = append(out, c)
		}
	}
	return out
}

func cannotCheckpoint(class string, s runtime.PauseSupport) error {
	why := s.Why
	if why == "" {
		why = "the backend cannot checkpoint it"
	}
	return fmt.Errorf("%w sandboxes of runtime class %q: %s", ErrCannotCheckpoint, class, why)
}

// lookup is the entry of sandbox id.
func (r *Runner) lookup(id string) (*entry, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.sandboxes[id]
	if !ok {
		return nil, fmt.Errorf("%w: %s", runtime.ErrNotFound, id)
	}
	return e, nil
}

// Pause implements PauseHandle for the runner.
func (r *Runner) Pause(ctx context.Context, id string, opts PauseOptions) (Sandbox, error) {
	return r.pause(ctx, id, opts, 0)
}

// errNotIdle: an idle pause found the sandbox busy.
var errNotIdle = errors.New("the sandbox is not idle")

// pause is Pause; with idle > 0 only while the sandbox has had no activity for that long
// (else errNotIdle), checked as the pause begins.
func (r *Runner) pause(ctx context.Context, id string, opts PauseOptions, idle time.Duration) (Sandbox, error) {
	e, err := r.lookup(id)
	if err != nil {
		return Sandbox{}, err
	}
	e.op.Lock()
	defer e.op.Unlock()
	r.mu.Lock()
	st, stop, class := e.sb.State, stopRequested(e), pauseClass(&e.sb)
	r.mu.Unlock()
	switch {
	case st == StatePaused && !stop:
		return Sandbox{}, fmt.Errorf("%w: %s", ErrAlreadyPaused, id)
	case st != StateRunning || stop:
		return Sandbox{}, fmt.Errorf("%w: %s is %s", ErrNotRunning, id, st)
	}
	sup, p, why := r.pauseSupport(class)
	if p == nil {
		return Sandbox{}, fmt.Errorf("%w: %s", ErrCannotCheckpoint, why)
	}
	var release bool
	switch {
	case opts.Release == nil:
		release = sup.Checkpoint
		if !release && !sup.Freeze {
			return Sandbox{}, fmt.Errorf("%w: sandboxes of runtime class %q can be neither checkpointed nor frozen here: %s", ErrCannotCheckpoint, class, sup.Why)
		}
	case *opts.Release:
		if !sup.Checkpoint {
			return Sandbox{}, cannotCheckpoint(class, sup)
		}
		release = true
	default:
		if !sup.Freeze {
			return Sandbox{}, fmt.Errorf("%w: sandboxes of runtime class %q cannot be frozen here (pause them releasing resources)", ErrCannotCheckpoint, class)
		}
	}

	r.mu.Lock()
	if idle > 0 && (e.active > 0 || time.Since(e.lastActive) < idle) {
		r.mu.Unlock()
		return Sandbox{}, errNotIdle
	}
	e.pausing = true
	r.mu.Unlock()
	info, err := p.Pause(ctx, id, release)
	r.mu.Lock()
	defer r.mu.Unlock()
	e.pausing = false
	if err != nil {
		r.rewatchLocked(e) // it runs on as it was: its agent is watched again
		r.notifyLocked(e)  // for Agent calls that wait for the pause
		if errors.Is(err, runtime.ErrAlreadyPaused) {
			return Sandbox{}, fmt.Errorf("%w: %s", ErrAlreadyPaused, id)
		}
		if errors.Is(err, errdefs.ErrNotImplemented) { // the backend refuses this sandbox, with its reason
			return Sandbox{}, fmt.Errorf("%w: sandbox %s: %w", ErrCannotCheckpoint, id, err)
		}
		return Sandbox{}, fmt.Errorf("pause sandbox %s: %w", id, err)
	}
	if stopRequested(e) || e.sb.State != StateRunning {
		// A delete or an expiry came meanwhile: the stop under way ends it paused.
		return Sandbox{}, fmt.Errorf("%w: %s is %s", ErrNotRunning, id, e.sb.State)
	}
	ps := &PauseStatus{Released: info.Released, AutoResume: opts.AutoResume, LifetimeHeld: metaLifetimeHeld(e.sb.Spec.Meta),
		PausedAt: time.Now(), CheckpointBytes: info.CheckpointBytes}
	e.sb.State, e.sb.Pause = StatePaused, ps
	if ps.LifetimeHeld && e.expiry != nil {
		e.expiry.Stop()
	}
	if b, err := json.Marshal(ps); err == nil {
		if err := writeFileAtomic(r.pausedPath(id), b); err != nil {
			r.log.Warn("persist pause status (a restarted runner takes it from the spec)", "sandbox", id, "err", err)
		}
	}
	r.log.Info("sandbox paused", "sandbox", id, "released", info.Released, "took", info.Took, "checkpoint_bytes", info.CheckpointBytes)
	r.notifyLocked(e)
	return e.snapshot(), nil
}

// rewatchLocked has the agent of e watched again (follow). Called with Runner.mu held.
func (r *Runner) rewatchLocked(e *entry) {
	close(e.rewatch)
	e.rewatch = make(chan struct{})
}

// Resume implements PauseHandle for the runner. Concurrent resumes of one sandbox share
// the first one's work: the others find it RUNNING.
func (r *Runner) Resume(ctx context.Context, id string) (Sandbox, error) {
	ctx, rec := span.New(ctx)
	t := time.Now()
	e, err := r.lookup(id)
	if err != nil {
		return Sandbox{}, err
	}
	if err := r.waitHolds(ctx, e); err != nil { // it may be moving elsewhere
		return Sandbox{}, err
	}
	e.op.Lock()
	defer e.op.Unlock()
	span.Mark(ctx, "runner: lock", &t)
	r.mu.Lock()
	st, stop := e.sb.State, stopRequested(e)
	sb := e.snapshot()
	r.mu.Unlock()
	switch {
	case st == StateRunning && !stop:
		return sb, nil
	case st != StatePaused || stop:
		return Sandbox{}, fmt.Errorf("%w: %s is %s", ErrNotRunning, id, st)
	}
	p, ok := r.backend.(runtime.Pauser)
	if !ok {
		return Sandbox{}, fmt.Errorf("%w: this runner's backend cannot resume sandboxes", ErrCannotCheckpoint)
	}
	if sb.Pause != nil && sb.Pause.Released && r.admitResume != nil {
		if err := r.admitResume(ctx, sb); err != nil {
			return Sandbox{}, err
		}
		span.Mark(ctx, "runner: admit", &t)
	}
	info, err := p.Resume(ctx, id)
	span.Mark(ctx, "runner: backend", &t)
	if err != nil {
		if errors.Is(err, runtime.ErrCheckpointLost) {
			r.mu.Lock()
			r.log.Warn("paused sandbox cannot be resumed: ending it", "sandbox", id, "err", err)
			r.requestStopLocked(e, ReasonCheckpointLost, 0)
			e.sb.State = StateTerminating
			r.notifyLocked(e)
			r.mu.Unlock()
			return Sandbox{}, fmt.Errorf("%w: %s cannot be resumed: %w", ErrNotRunning, id, err)
		}
		if !errors.Is(err, runtime.ErrNotPaused) {
			return Sandbox{}, fmt.Errorf("resume sandbox %s: %w", id, err)
		}
		// The backend says it runs (a runner that lost track): take its word.
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if stopRequested(e) || e.sb.State != StatePaused {
		return Sandbox{}, fmt.Errorf("%w: %s is %s", ErrNotRunning, id, e.sb.State)
	}
	ps := e.sb.Pause
	e.sb.State, e.sb.Pause = StateRunning, nil
	if info.IP != "" {
		e.sb.IP = info.IP
	}
	if ps != nil && ps.LifetimeHeld {
		// The lifetime did not count while paused: it is longer by that time.
		paused := max(time.Since(ps.PausedAt), 0)
		e.sb.Lifetime += paused
		e.sb.Deadline = e.sb.CreatedAt.Add(e.sb.Lifetime)
		if err := writeFileAtomic(r.lifetimePath(id), []byte(e.sb.Lifetime.String())); err != nil {
			r.log.Warn("persist lifetime", "sandbox", id, "err", err)
		}
		if e.expiry != nil {
			e.expiry.Stop()
		}
		r.armExpiry(e)
	}
	if ps == nil || ps.Released {
		// Its processes were restored: connections to its agents start afresh.
		e.client = agent.NewClient(func(ctx context.Context) (net.Conn, error) { return r.backend.DialAgent(ctx, id, "") }, agentTracing)
		e.agents = nil
	}
	e.lastActive = time.Now()
	_ = os.Remove(r.pausedPath(id))
	r.rewatchLocked(e)
	span.Mark(ctx, "runner: state", &t)
	r.log.Info("sandbox resumed", "sandbox", id, "steps", rec.String())
	r.notifyLocked(e)
	return e.snapshot(), nil
}

// Fork implements PauseHandle for the runner.
func (r *Runner) Fork(ctx context.Context, id string, targets []ForkTarget) ([]ForkResult, error) {
	ctx, rec := span.New(ctx)
	if err := r.validateForks(targets); err != nil {
		return nil, err
	}
	e, err := r.lookup(id)
	if err != nil {
		return nil, err
	}
	e.op.Lock() // the source keeps its state through the fork
	defer e.op.Unlock()
	r.mu.Lock()
	st, stop, class := e.sb.State, stopRequested(e), pauseClass(&e.sb)
	src := e.snapshot()
	r.mu.Unlock()
	if stop || st != StateRunning && st != StatePaused {
		return nil, fmt.Errorf("%w: %s is %s", ErrNotRunning, id, st)
	}
	if src.ImageDigest == "" {
		// A backend that reports the digest after RUNNING (runtime.LateInfoWaiter).
		late, err := r.holdForLateInfo(ctx, e)
		if err != nil {
			return nil, err
		}
		src.ImageDigest = late.ImageDigest
	}
	sup, _, why := r.pauseSupport(class)
	fk, ok := r.backend.(runtime.Forker)
	switch {
	case why != "":
		return nil, fmt.Errorf("%w: %s", ErrCannotCheckpoint, why)
	case !sup.Checkpoint:
		return nil, cannotCheckpoint(class, sup)
	case !ok:
		return nil, fmt.Errorf("%w: this runner's backend cannot fork sandboxes", ErrCannotCheckpoint)
	}

	now := time.Now()
	// A fork keeps its source's egress CA (docs/secrets.md, "Forks and moves"), whose
	// expiry counts from the source's create: a fork that would outlive it is refused.
	var caExpiry time.Time
	if ex, ok := r.backend.(runtime.EgressCAExpirer); ok && len(src.Spec.Network.EgressSecrets()) > 0 {
		caExpiry, _ = ex.EgressCAExpiry(id)
	}
	var outlive []apierr.Violation
	for i, t := range targets {
		lifetime := t.Lifetime
		if lifetime <= 0 {
			lifetime = src.Lifetime
		}
		if end := now.Add(lifetime); !caExpiry.IsZero() && caExpiry.Before(end) {
			outlive = append(outlive, apierr.Violation{Field: fmt.Sprintf("targets[%d].lifetime", i),
				Description: fmt.Sprintf("the fork's lifetime (%s, the source's when not given) ends at %s, after the source's egress CA, which the fork keeps, expires at %s",
					lifetime, end.UTC().Format(time.RFC3339), caExpiry.UTC().Format(time.RFC3339))})
		}
	}
	if len(outlive) > 0 {
		return nil, egressCAExpiresError(id, caExpiry, outlive)
	}
	specs := make([]*runtime.Spec, len(targets))
	entries := make([]*entry, len(targets))
	for i, t := range targets {
		spec := cloneSpec(src.Spec)
		spec.ID = t.ID
		spec.ShareTokenHash = t.ShareTokenHash
		lifetime := t.Lifetime
		if lifetime <= 0 {
			lifetime = src.Lifetime
		}
		spec.Meta = maps.Clone(t.Meta)
		if spec.Meta == nil {
			spec.Meta = map[string]string{}
		}
		spec.Meta[runtime.MetaForkedFrom] = id
		spec.Meta[runtime.MetaCreatedAt] = now.UTC().Format(time.RFC3339Nano)
		spec.Meta[runtime.MetaLifetime] = lifetime.String()
		// The egress secrets' values, as a create's: checked here, kept by no record
		// (cloneSpec drops them), handed to the backend only.
		spec.EgressSecretValues = maps.Clone(t.EgressSecretValues)
		if len(spec.EgressSecretValues) > 0 || len(spec.Network.EgressSecrets()) > 0 {
			if err := checkEgressSecrets(&spec); err != nil {
				return nil, err
			}
		}
		specs[i] = &spec
		entries[i] = newEntry(Sandbox{ID: t.ID, Spec: cloneSpec(spec), State: StateCreating, CreatedAt: now,
			Lifetime: lifetime, Deadline: now.Add(lifetime), RuntimeClass: src.RuntimeClass, ImageDigest: src.ImageDigest})
	}
	if err := r.addForks(entries); err != nil {
		return nil, err
	}

	t := time.Now()
	infos, errs := fk.Fork(context.WithoutCancel(ctx), id, specs)
	span.Mark(ctx, "runner: backend fork", &t)
	out := r.startForks(id, "fork", entries, infos, errs)
	span.Mark(ctx, "runner: start forks", &t)
	r.log.Info("sandbox fork steps", "sandbox", id, "count", len(targets), "steps", rec.String())
	return out, nil
}

// egressCAExpiresError refuses a fork of sandbox id that would outlive its egress CA
// (expiring at notAfter; vs: a violation per target): FAILED_PRECONDITION
// CWSANDBOX_CHECKPOINT_NOT_SUPPORTED (as a fork refused for its egress secrets
// elsewhere), ErrCannotCheckpoint to errors.Is.
func egressCAExpiresError(id string, notAfter time.Time, vs []apierr.Violation) error {
	ce := apierr.WithViolations(apierr.New(apierr.CheckpointNotSupported,
		fmt.Sprintf("sandbox %s cannot be forked: its egress CA, which a fork keeps (the fork's processes are restored trusting it), expires at %s, before the fork's lifetime ends (%s): "+
			"its intercepted HTTPS would fail from then on: recreate the sandbox instead (a new sandbox gets a CA of its own)",
			id, notAfter.UTC().Format(time.RFC3339), apierr.Describe(vs)),
		map[string]string{"sandbox_id": id}), vs)
	return &refusal{sentinel: ErrCannotCheckpoint, wire: ce}
}

// refusal is an API error (wire, with its details) that errors.Is finds sentinel in.
type refusal struct {
	sentinel error
	wire     *connect.Error
}

func (e *refusal) Error() string   { return e.wire.Message() }
func (e *refusal) Unwrap() []error { return []error{e.sentinel, e.wire} }

// startForks completes entries (registered, CREATING) with the backend's outcome of each
// (what: "fork" or "move", for messages): a failed one ends FAILED (ReasonForkFailed), a
// made one runs (RUNNING, its expiry armed, followed).
func (r *Runner) startForks(id, what string, entries []*entry, infos []runtime.Info, errs []error) []ForkResult {
	out := make([]ForkResult, len(entries))
	for i, fe := range entries {
		var ferr error
		switch {
		case i < len(errs) && errs[i] != nil:
			ferr = errs[i]
		case i >= len(infos):
			ferr = errors.New("the backend reported no outcome of this " + what)
		}
		if ferr != nil {
			r.log.Warn(what+" failed", "sandbox", id, "fork", fe.sb.ID, "err", ferr)
			r.finish(fe, runtime.Exit{Reason: ReasonForkFailed, Message: what + " of " + id + " failed: " + ferr.Error(), At: time.Now()}, false)
			out[i] = ForkResult{Sandbox: r.snapshotOf(fe), Err: fmt.Errorf("%s %s of %s: %w", what, fe.sb.ID, id, ferr)}
			continue
		}
		info := infos[i]
		r.mu.Lock()
		if info.IP != "" {
			fe.sb.IP = info.IP
		}
		if info.RuntimeClass != "" {
			fe.sb.RuntimeClass = info.RuntimeClass
		}
		if info.ImageDigest != "" {
			fe.sb.ImageDigest = info.ImageDigest
		}
		fe.startedAt = info.StartedAt
		if fe.startedAt.IsZero() {
			fe.startedAt = time.Now()
		}
		if fe.sb.State == StateCreating {
			fe.sb.State, fe.sb.StartedAt = StateRunning, fe.startedAt
		}
		start := !r.closed
		if start {
			r.armExpiry(fe)
			r.wg.Add(1)
		}
		r.notifyLocked(fe)
		snap := fe.snapshot()
		r.mu.Unlock()
		if start {
			go func() {
				defer r.wg.Done()
				r.lifecycle(context.Background(), fe, false)
			}()
		}
		r.log.Info("sandbox forked", "sandbox", id, "fork", fe.sb.ID, "as", what)
		out[i] = ForkResult{Sandbox: snap}
	}
	return out
}

// addForks adds the entries of forks about to be made (CREATING), unless the runner is
// closing or has one of their IDs.
func (r *Runner) addForks(entries []*entry) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return errors.New("runner: shutting down")
	}
	for _, fe := range entries {
		if _, ok := r.sandboxes[fe.sb.ID]; ok {
			return fmt.Errorf("%w: %s", ErrAlreadyExists, fe.sb.ID)
		}
	}
	for _, fe := range entries {
		r.sandboxes[fe.sb.ID] = fe
		r.notifyLocked(fe)
	}
	return nil
}

func (r *Runner) snapshotOf(e *entry) Sandbox {
	r.mu.Lock()
	defer r.mu.Unlock()
	return e.snapshot()
}

// validateForks checks a Fork's targets: 1..MaxForks, each a valid ID no other target
// and no sandbox of the runner has.
func (r *Runner) validateForks(targets []ForkTarget) error {
	var vs violations
	if len(targets) == 0 || len(targets) > MaxForks {
		vs.add("targets", "must be 1 to %d forks, got %d", MaxForks, len(targets))
		return vs.err()
	}
	seen := map[string]bool{}
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, t := range targets {
		field := fmt.Sprintf("targets[%d].id", i)
		switch {
		case !idPattern.MatchString(t.ID):
			vs.add(field, "must be a valid sandbox ID (a DNS label of lower-case letters, digits and '-')")
		case seen[t.ID]:
			vs.add(field, "%s is another target's too", t.ID)
		case r.sandboxes[t.ID] != nil:
			vs.add(field, "sandbox %s exists", t.ID)
		}
		seen[t.ID] = true
		if t.Lifetime < 0 || t.Lifetime > MaxLifetime {
			vs.add(fmt.Sprintf("targets[%d].lifetime", i), "must be between 0 (the source's) and 30 days")
		}
		// Bounded whatever the caller sends (each one is matched to a rule later).
		n := 0
		for k, v := range t.EgressSecretValues {
			n += len(k) + len(v)
		}
		if len(t.EgressSecretValues) > runtime.MaxSecretEnvVars || n > maxForkSecretBytes {
			vs.add(fmt.Sprintf("targets[%d].egress_secret_values", i), "%d values of %d bytes in all: at most %d values and %d bytes",
				len(t.EgressSecretValues), n, runtime.MaxSecretEnvVars, maxForkSecretBytes)
		}
	}
	return vs.err()
}

// maxForkSecretBytes bounds a fork target's egress secret values (names and values), as
// the gateway bounds a create's resolved secrets.
const maxForkSecretBytes = 1 << 20

// Activity and idle pause (runtime.MetaIdlePause): a sandbox is busy while a call
// through an agent client Runner.Agent returned is under way, and while an endpoint
// request or connection the edge admitted (Wake) lasts; it is idle once it has been
// neither for its idle time. Streams end with their context (relayed calls, the data
// plane's, the edge's requests: each ends with its handler).

// idlePauseOf is the idle time after which the sandbox is paused; 0: never.
func idlePauseOf(meta map[string]string) time.Duration {
	d, err := time.ParseDuration(meta[runtime.MetaIdlePause])
	if err != nil || d <= 0 {
		return 0
	}
	return d
}

// busy marks e busy until the func it returns is called (once).
func (r *Runner) busy(e *entry) func() {
	r.mu.Lock()
	e.active++
	e.lastActive = time.Now()
	r.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			r.mu.Lock()
			e.active--
			e.lastActive = time.Now()
			r.mu.Unlock()
		})
	}
}

// tracked is a of e's sandbox, counting its calls as activity when the sandbox pauses
// when idle.
func (r *Runner) tracked(e *entry, a agentv1connect.AgentServiceClient) agentv1connect.AgentServiceClient {
	if idlePauseOf(e.sb.Spec.Meta) <= 0 {
		return a
	}
	return &activeAgent{AgentServiceClient: a, busy: func() func() { return r.busy(e) }}
}

// activeAgent counts every call of its client as activity: unary calls until they
// return, streams until their context ends.
type activeAgent struct {
	agentv1connect.AgentServiceClient
	busy func() func()
}

func (a *activeAgent) stream(ctx context.Context) {
	done := a.busy()
	context.AfterFunc(ctx, done)
}

func (a *activeAgent) Exec(ctx context.Context, req *connect.Request[agentv1.ExecRequest]) (*connect.Response[agentv1.ExecResponse], error) {
	defer a.busy()()
	return a.AgentServiceClient.Exec(ctx, req)
}

func (a *activeAgent) ReadFile(ctx context.Context, req *connect.Request[agentv1.ReadFileRequest]) (*connect.Response[agentv1.ReadFileResponse], error) {
	defer a.busy()()
	return a.AgentServiceClient.ReadFile(ctx, req)
}

func (a *activeAgent) WriteFile(ctx context.Context, req *connect.Request[agentv1.WriteFileRequest]) (*connect.Response[agentv1.WriteFileResponse], error) {
	defer a.busy()()
	return a.AgentServiceClient.WriteFile(ctx, req)
}

func (a *activeAgent) StreamExec(ctx context.Context) *connect.BidiStreamForClient[agentv1.StreamExecRequest, agentv1.StreamExecResponse] {
	a.stream(ctx)
	return a.AgentServiceClient.StreamExec(ctx)
}

func (a *activeAgent) Logs(ctx context.Context, req *connect.Request[agentv1.LogsRequest]) (*connect.ServerStreamForClient[agentv1.LogsResponse], error) {
	a.stream(ctx)
	return a.AgentServiceClient.Logs(ctx, req)
}

// Wake is what the edge calls before it connects to a port of sandbox id for a request
// or connection it admitted: the sandbox is busy until done is called, and a paused one
// is resumed first when it resumes by itself (ErrPaused when it does not).
func (r *Runner) Wake(ctx context.Context, id string) (done func(), err error) {
	e, err := r.lookup(id)
	if err != nil {
		return nil, err
	}
	done = r.busy(e)
	r.mu.Lock()
	st, auto := e.sb.State, e.sb.Pause != nil && e.sb.Pause.AutoResume
	r.mu.Unlock()
	if st == StatePaused {
		if !auto {
			done()
			return nil, fmt.Errorf("%w: %s", ErrPaused, id)
		}
		if _, err := r.Resume(ctx, id); err != nil {
			done()
			return nil, err
		}
	}
	return done, nil
}

// idlePauses pauses (checkpointing where it can) each running sandbox with an idle time
// that has been idle that long, every Config.IdleCheck, until the runner closes.
func (r *Runner) idlePauses() {
	if _, ok := r.backend.(runtime.Pauser); !ok {
		return
	}
	t := time.NewTicker(r.cfg.IdleCheck)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-r.ctx.Done():
			return
		}
		r.mu.Lock()
		for id, e := range r.sandboxes {
			idle := idlePauseOf(e.sb.Spec.Meta)
			if idle <= 0 || e.sb.State != StateRunning || e.pausing || e.idlePausing || e.active > 0 || time.Since(e.lastActive) < idle || stopRequested(e) {
				continue
			}
			e.idlePausing = true
			opts := PauseOptions{AutoResume: metaAutoResume(e.sb.Spec.Meta)}
			r.wg.Add(1)
			go func() {
				defer r.wg.Done()
				_, err := r.pause(r.ctx, id, opts, idle)
				r.mu.Lock()
				e.idlePausing = false
				if err != nil && !errors.Is(err, errNotIdle) {
					e.lastActive = time.Now() // try again after another idle time
				}
				r.mu.Unlock()
				switch {
				case err == nil:
					r.log.Info("sandbox paused when idle", "sandbox", id, "idle", idle)
				case !errors.Is(err, errNotIdle) && !errors.Is(err, ErrNotRunning):
					r.log.Warn("idle pause", "sandbox", id, "err", err)
				}
			}()
		}
		r.mu.Unlock()
	}
}
