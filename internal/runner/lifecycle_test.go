package runner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/runtimetest"
)

// gone stands, in a recorded state sequence, for a sandbox the runner no longer knows.
const gone State = -1

// recorder follows a runner's change notifications and keeps, per sandbox, the states
// it passed through.
type recorder struct {
	stop chan struct{}
	done chan struct{}

	mu     sync.Mutex
	seq    map[string][]State
	looked chan struct{} // closed and replaced after every look at the runner
}

func newRecorder() *recorder {
	return &recorder{seq: map[string][]State{}, looked: make(chan struct{})}
}

// follow records r's changes until stopFollowing.
func (rec *recorder) follow(r *Runner) {
	rec.stop, rec.done = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(rec.done)
		for {
			changed := r.Changed()
			rec.look(r.List())
			select {
			case <-changed:
			case <-rec.stop:
				return
			}
		}
	}()
}

func (rec *recorder) stopFollowing() {
	close(rec.stop)
	<-rec.done
}

func (rec *recorder) look(list []Sandbox) {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	now := map[string]State{}
	for _, sb := range list {
		now[sb.ID] = sb.State
	}
	for id, seq := range rec.seq {
		if _, ok := now[id]; !ok && seq[len(seq)-1] != gone {
			rec.seq[id] = append(seq, gone)
		}
	}
	for id, st := range now {
		if seq := rec.seq[id]; len(seq) == 0 || seq[len(seq)-1] != st {
			rec.seq[id] = append(seq, st)
		}
	}
	close(rec.looked)
	rec.looked = make(chan struct{})
}

// caughtUp reports whether the last state recorded of every sandbox in list is its
// state in list.
func (rec *recorder) caughtUp(list []Sandbox) bool {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for _, sb := range list {
		if seq := rec.seq[sb.ID]; len(seq) == 0 || seq[len(seq)-1] != sb.State {
			return false
		}
	}
	return true
}

// nextLook is closed after the recorder's next look.
func (rec *recorder) nextLook() <-chan struct{} {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return rec.looked
}

func (rec *recorder) states(id string) []State {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return slices.Clone(rec.seq[id])
}

// harness drives one runner (and its successors, across restarts) over a Fake backend
// and records every state its sandbox passes through. The Fake settles before each
// outcome reaches the runner: it waits until the recorder has seen the runner's state,
// so a state the runner holds only until the backend answers is never missed.
type harness struct {
	t    *testing.T
	f    *runtimetest.Fake
	cfg  Config
	id   string
	rec  *recorder
	sess sync.Mutex
	r    *Runner
	// ready is closed once r is followed; nil while no runner is (being) started.
	ready chan struct{}
}

const waitLimit = 10 * time.Second

func newHarness(t *testing.T, f *runtimetest.Fake) *harness {
	h := &harness{t: t, f: f, rec: newRecorder(), id: "sbx-1",
		cfg: Config{Backend: f, DataDir: t.TempDir(), ExpiryGrace: 10 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)}}
	f.Settle = h.settle
	t.Cleanup(func() {
		h.closeRunner()
		f.Close()
	})
	return h
}

// start starts a runner on the harness's data dir and backend, changed by cfg.
func (h *harness) start(cfg func(*Config)) {
	h.t.Helper()
	c := h.cfg
	if cfg != nil {
		cfg(&c)
	}
	ready := make(chan struct{})
	h.sess.Lock()
	h.ready = ready
	h.sess.Unlock()
	r, err := New(context.Background(), c)
	if err != nil {
		h.t.Fatal(err)
	}
	h.sess.Lock()
	h.r = r
	h.sess.Unlock()
	h.rec.follow(r)
	close(ready)
}

// closeRunner closes the runner, which lets its sandboxes be.
func (h *harness) closeRunner() {
	h.sess.Lock()
	r := h.r
	h.r, h.ready = nil, nil
	h.sess.Unlock()
	if r != nil {
		r.Close()
		h.rec.stopFollowing()
	}
}

// settle waits until the recorder has seen the state of every sandbox of the runner.
func (h *harness) settle() {
	h.sess.Lock()
	ready := h.ready
	h.sess.Unlock()
	if ready == nil {
		return // closing
	}
	select {
	case <-ready:
	case <-time.After(waitLimit):
		h.t.Error("settle: the runner did not start")
		return
	}
	h.sess.Lock()
	r, rec := h.r, h.rec
	h.sess.Unlock()
	if r == nil {
		return
	}
	deadline := time.After(waitLimit)
	for {
		looked := rec.nextLook() // before the list: a look after it is not missed
		if rec.caughtUp(r.List()) {
			return
		}
		select {
		case <-looked:
		case <-deadline:
			h.t.Errorf("settle: the recorder did not see the runner's state (recorded %v)", rec.states(h.id))
			return
		}
	}
}

func (h *harness) runner() *Runner {
	h.sess.Lock()
	defer h.sess.Unlock()
	return h.r
}

// await waits until the recorder has seen the sandbox in state st.
func (h *harness) await(st State) {
	h.t.Helper()
	deadline := time.After(waitLimit)
	for {
		h.rec.mu.Lock()
		seq, looked := h.rec.seq[h.id], h.rec.looked
		h.rec.mu.Unlock()
		if len(seq) > 0 && seq[len(seq)-1] == st {
			return
		}
		select {
		case <-looked:
		case <-deadline:
			h.t.Fatalf("sandbox %s: states %v, still not %s", h.id, seq, st)
		}
	}
}

// sandbox is the Fake's record of the harness's sandbox.
func (h *harness) sandbox() *runtimetest.FakeSandbox {
	h.t.Helper()
	sb := h.f.Sandbox(h.id, waitLimit)
	if sb == nil {
		h.t.Fatalf("the backend never got sandbox %s", h.id)
	}
	return sb
}

// step is one event of a row's script.
type step func(h *harness)

// create asks the runner for the sandbox, with lifetime (0: the default).
func create(lifetime time.Duration) step {
	return func(h *harness) {
		sb, err := h.runner().Create(context.Background(), CreateRequest{Spec: runtime.Spec{ID: h.id, Container: runtime.Container{Image: "busybox"}}, Lifetime: lifetime})
		if err != nil {
			h.t.Fatal(err)
		}
		if sb.State != StateCreating {
			h.t.Errorf("create: %s, want CREATING", sb.State)
		}
	}
}

// report has the sandbox's agent report its main command in state, after restarts, its
// last run having exited with code (when given).
func report(state agentv1.MainState, restarts int32, code ...int32) step {
	return func(h *harness) {
		st := &agentv1.StatusResponse{State: state, RestartCount: restarts}
		if len(code) > 0 {
			st.ExitCode = &code[0]
		}
		h.sandbox().Report(st)
	}
}

// exit ends the sandbox's container.
func exit(ex runtime.Exit) step {
	return func(h *harness) { h.sandbox().Exit(ex) }
}

// await waits until the sandbox is in state st.
func await(st State) step {
	return func(h *harness) { h.await(st) }
}

// awaitSandbox waits until the runner's snapshot of the sandbox satisfies ok.
func awaitSandbox(what string, ok func(Sandbox) bool) step {
	return func(h *harness) {
		h.t.Helper()
		r := h.runner()
		deadline := time.After(waitLimit)
		for {
			changed := r.Changed()
			sb, err := r.Get(h.id)
			if err == nil && ok(sb) {
				return
			}
			select {
			case <-changed:
			case <-deadline:
				h.t.Fatalf("sandbox %s: %+v, %v: still not %s", h.id, sb, err, what)
			}
		}
	}
}

// del deletes the sandbox with grace; the runner answers want at once.
func del(grace time.Duration, want State) step {
	return func(h *harness) {
		sb, err := h.runner().Delete(h.id, grace)
		if err != nil || sb.State != want {
			h.t.Errorf("delete: %s, %v; want %s", sb.State, err, want)
		}
	}
}

// closeRunner closes the runner; start starts the next one (changed by cfg).
func closeRunner() step { return func(h *harness) { h.closeRunner() } }
func start(cfg func(*Config)) step {
	return func(h *harness) { h.start(cfg) }
}

// alive checks whether the sandbox's container runs.
func alive(want bool) step {
	return func(h *harness) {
		if got := h.sandbox().Alive(); got != want {
			h.t.Errorf("container alive: %v, want %v", got, want)
		}
	}
}

// inBackend checks whether the backend has the sandbox (alive or not).
func inBackend(want bool) step {
	return func(h *harness) {
		if got := h.f.Sandbox(h.id, 0) != nil; got != want {
			h.t.Errorf("in the backend: %v, want %v", got, want)
		}
	}
}

// put gives the backend the sandbox as an earlier runner left it.
func put(alive bool, ex *runtime.Exit, meta map[string]string) step {
	return func(h *harness) {
		h.f.Put(runtime.Recovered{Spec: runtime.Spec{ID: h.id, Container: runtime.Container{Image: "busybox"}, Meta: meta},
			Info: runtime.Info{ID: h.id, StartedAt: time.Now().Add(-time.Minute)}, Alive: alive, Exit: ex})
	}
}

func ptr[T any](v T) *T { return &v }

// blockCreate is an OnCreate that holds the create until the runner gives it up.
func blockCreate(ctx context.Context, _ *runtimetest.FakeSandbox) error {
	<-ctx.Done()
	return fmt.Errorf("pull busybox: %w", ctx.Err())
}

// releaseCreate is an OnCreate that holds the create until release is closed (then it
// succeeds) or the runner gives it up.
func releaseCreate(release <-chan struct{}) func(context.Context, *runtimetest.FakeSandbox) error {
	return func(ctx context.Context, _ *runtimetest.FakeSandbox) error {
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// newQuietRunner is a runner on f with a fresh data dir and no log, closed at the end of
// the test.
func newQuietRunner(t *testing.T, f *runtimetest.Fake) *Runner {
	t.Helper()
	r, err := New(context.Background(), Config{Backend: f, DataDir: t.TempDir(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	return r
}

// failCreate is an OnCreate that fails with err.
func failCreate(err error) func(context.Context, *runtimetest.FakeSandbox) error {
	return func(context.Context, *runtimetest.FakeSandbox) error { return err }
}

// createThen is an OnCreate whose container does what fn does before Create returns.
func createThen(fn func(sb *runtimetest.FakeSandbox)) func(context.Context, *runtimetest.FakeSandbox) error {
	return func(_ context.Context, sb *runtimetest.FakeSandbox) error { fn(sb); return nil }
}

// exitsAtOnce is an OnCreate whose main command completes before Create returns.
var exitsAtOnce = createThen(func(sb *runtimetest.FakeSandbox) { sb.Exit(completed) })

// idle is an OnCreate whose agent has not started the main command (yet).
var idle = createThen(func(sb *runtimetest.FakeSandbox) { sb.Report(&agentv1.StatusResponse{}) })

var (
	completed = runtime.Exit{ExitCode: ptr(int32(0)), Reason: "Completed"}
	running   = []step{create(0), await(StateRunning)}
)

// created waits until the backend's Create has returned (the runner has its IP): what
// an OnCreate's agent reported is not reported after the row's own reports.
var created = awaitSandbox("created by the backend", func(sb Sandbox) bool { return sb.IP != "" })

func steps(groups ...[]step) []step { return slices.Concat(groups...) }

// TestLifecycle drives the runner through each sequence of backend and agent events a
// sandbox can meet, over a scripted backend (runtimetest.Fake): every state the sandbox
// passes through, how it ends (state, reason, message, exit code), and exactly which
// backend calls it took.
func TestLifecycle(t *testing.T) {
	tests := []struct {
		name  string
		fake  func(*runtimetest.Fake)
		steps []step // after the first runner started

		states   []State
		reason   string
		message  string // a part of the message
		exit     *int32
		restarts int
		oomKills int
		calls    runtimetest.Calls
		graces   []time.Duration // of the Stop calls
	}{
		{name: "start ok", steps: running,
			states: []State{StateCreating, StateRunning}, calls: runtimetest.Calls{Create: 1, Recover: 1}},

		// Each kind of create error fails the sandbox with its reason; the backend undid the create.
		{name: "image not found", fake: onCreate(failCreate(fmt.Errorf("pull x: %w", runtime.ErrImageNotFound))), steps: []step{create(0)},
			states: []State{StateCreating, StateFailed}, reason: ReasonImagePullFailed, message: "image not found", calls: runtimetest.Calls{Create: 1, Recover: 1}},
		{name: "image unauthorized", fake: onCreate(failCreate(fmt.Errorf("pull x: %w", runtime.ErrImageUnauthorized))), steps: []step{create(0)},
			states: []State{StateCreating, StateFailed}, reason: ReasonImagePullFailed, message: "unauthorized", calls: runtimetest.Calls{Create: 1, Recover: 1}},
		{name: "registry down", fake: onCreate(failCreate(fmt.Errorf("pull x: %w", runtime.ErrRegistry))), steps: []step{create(0)},
			states: []State{StateCreating, StateFailed}, reason: ReasonImagePullFailed, message: "registry", calls: runtimetest.Calls{Create: 1, Recover: 1}},
		{name: "invalid image reference", fake: onCreate(failCreate(fmt.Errorf("pull x: %w", runtime.ErrInvalidImageRef))), steps: []step{create(0)},
			states: []State{StateCreating, StateFailed}, reason: ReasonImagePullFailed, message: "invalid image reference", calls: runtimetest.Calls{Create: 1, Recover: 1}},
		{name: "registry not allowed", fake: onCreate(failCreate(fmt.Errorf("pull x: %w", runtime.ErrRegistryNotAllowed))), steps: []step{create(0)},
			states: []State{StateCreating, StateFailed}, reason: ReasonImagePullFailed, message: "not allowed", calls: runtimetest.Calls{Create: 1, Recover: 1}},
		{name: "invalid spec", fake: onCreate(failCreate(fmt.Errorf("%w: bad mount", runtime.ErrInvalidSpec))), steps: []step{create(0)},
			states: []State{StateCreating, StateFailed}, reason: ReasonStartError, message: "bad mount", calls: runtimetest.Calls{Create: 1, Recover: 1}},
		{name: "unknown runtime class", fake: onCreate(failCreate(fmt.Errorf("%w %q", runtime.ErrUnknownRuntime, "kata"))), steps: []step{create(0)},
			states: []State{StateCreating, StateFailed}, reason: ReasonStartError, message: "kata", calls: runtimetest.Calls{Create: 1, Recover: 1}},
		{name: "backend fails to create", fake: onCreate(failCreate(errors.New("disk full"))), steps: []step{create(0)},
			states: []State{StateCreating, StateFailed}, reason: ReasonBackendError, message: "disk full", calls: runtimetest.Calls{Create: 1, Recover: 1}},

		// How the container ends.
		{name: "exit 0 before RUNNING", fake: onCreate(exitsAtOnce), steps: []step{create(0)},
			states: []State{StateCreating, StateCompleted}, reason: ReasonCompleted, exit: ptr(int32(0)), calls: runtimetest.Calls{Create: 1, Wait: 1, Destroy: 1, Recover: 1}},
		{name: "exit 0", steps: steps(running, []step{exit(completed)}),
			states: []State{StateCreating, StateRunning, StateCompleted}, reason: ReasonCompleted, exit: ptr(int32(0)), calls: runtimetest.Calls{Create: 1, Wait: 1, Destroy: 1, Recover: 1}},
		{name: "no reason from the backend", steps: steps(running, []step{exit(runtime.Exit{ExitCode: ptr(int32(1))})}),
			states: []State{StateCreating, StateRunning, StateFailed}, reason: "Error", exit: ptr(int32(1)), calls: runtimetest.Calls{Create: 1, Wait: 1, Destroy: 1, Recover: 1}},
		{name: "crash loop", steps: steps(running, []step{
			report(agentv1.MainState_MAIN_STATE_RESTARTING, 1, 3),
			awaitSandbox("restarted once, last exit 3", func(sb Sandbox) bool {
				return sb.State == StateRunning && sb.Restarts == 1 && sb.ExitCode != nil && *sb.ExitCode == 3
			}),
			report(agentv1.MainState_MAIN_STATE_FAILED, 6, 3),
			exit(runtime.Exit{ExitCode: ptr(int32(3)), Restarts: 6, Reason: "RestartLimit", Message: "main command exited with code 3; restart limit 6 reached"}),
		}),
			states: []State{StateCreating, StateRunning, StateFailed}, reason: ReasonRestartLimit, message: "code 3", exit: ptr(int32(3)), restarts: 6,
			calls: runtimetest.Calls{Create: 1, Wait: 1, Destroy: 1, Recover: 1}},
		{name: "oom", steps: steps(running, []step{
			func(h *harness) { h.sandbox().SetOOMKills(1) },
			exit(runtime.Exit{Reason: "OOMKilled", Message: "memory limit exceeded"}),
		}),
			states: []State{StateCreating, StateRunning, StateFailed}, reason: ReasonOOMKilled, message: "memory", oomKills: 1,
			calls: runtimetest.Calls{Create: 1, Wait: 1, Destroy: 1, Recover: 1}},
		// The agent writes the spec's files while STARTING: not RUNNING before its main command runs.
		{name: "agent starting is not running", fake: onCreate(idle), steps: []step{create(0), created,
			report(agentv1.MainState_MAIN_STATE_STARTING, 1),
			awaitSandbox("seen STARTING and still CREATING", func(sb Sandbox) bool { return sb.Restarts == 1 && sb.State == StateCreating }),
			report(agentv1.MainState_MAIN_STATE_RUNNING, 1), await(StateRunning)},
			states: []State{StateCreating, StateRunning}, restarts: 1, calls: runtimetest.Calls{Create: 1, Recover: 1}},
		{name: "main command cannot start", fake: onCreate(idle), steps: []step{create(0), created,
			report(agentv1.MainState_MAIN_STATE_FAILED, 0, 127),
			exit(runtime.Exit{ExitCode: ptr(int32(127)), Reason: "StartError", Message: "exec: no such file"})},
			states: []State{StateCreating, StateFailed}, reason: ReasonStartError, message: "no such file", exit: ptr(int32(127)),
			calls: runtimetest.Calls{Create: 1, Wait: 1, Destroy: 1, Recover: 1}},
		{name: "vanished", steps: steps(running, []step{exit(runtime.Exit{Reason: "Vanished", Message: "the container is gone"})}),
			states: []State{StateCreating, StateRunning, StateFailed}, reason: ReasonVanished, message: "gone", calls: runtimetest.Calls{Create: 1, Wait: 1, Destroy: 1, Recover: 1}},
		{name: "wait fails", steps: steps(running, []step{func(h *harness) { h.sandbox().Lose(errors.New("runc state: broken")) }}),
			states: []State{StateCreating, StateRunning, StateFailed}, reason: ReasonBackendError, message: "broken", calls: runtimetest.Calls{Create: 1, Wait: 1, Destroy: 1, Recover: 1}},

		// Lifetime: a sandbox that ran completes at its end without an exit code; one
		// that never started fails.
		{name: "lifetime runs out while running", steps: []step{create(500 * time.Millisecond), await(StateRunning)},
			states: []State{StateCreating, StateRunning, StateTerminating, StateCompleted}, reason: ReasonLifetimeExceeded, message: "lifetime of 500ms exceeded",
			calls: runtimetest.Calls{Create: 1, Wait: 1, Stop: 1, Destroy: 1, Recover: 1}, graces: []time.Duration{10 * time.Millisecond}},
		{name: "lifetime runs out during the create", fake: onCreate(blockCreate), steps: []step{create(20 * time.Millisecond)},
			states: []State{StateCreating, StateTerminating, StateFailed}, reason: ReasonLifetimeExceeded, message: "before the sandbox started",
			calls: runtimetest.Calls{Create: 1, Recover: 1}},
		{name: "lifetime runs out before the main command starts", fake: onCreate(idle), steps: []step{create(20 * time.Millisecond)},
			states: []State{StateCreating, StateTerminating, StateFailed}, reason: ReasonLifetimeExceeded, message: "before the sandbox started",
			calls: runtimetest.Calls{Create: 1, Wait: 1, Stop: 1, Destroy: 1, Recover: 1}, graces: []time.Duration{10 * time.Millisecond}},

		// Delete.
		{name: "delete during the create", fake: onCreate(blockCreate), steps: []step{create(0), func(h *harness) { h.sandbox() }, del(time.Second, StateTerminating)},
			states: []State{StateCreating, StateTerminating, StateTerminated}, reason: ReasonDeleted, message: "deleted",
			calls: runtimetest.Calls{Create: 1, Recover: 1}},
		{name: "delete with grace", steps: steps(running, []step{del(50*time.Millisecond, StateTerminating)}),
			states: []State{StateCreating, StateRunning, StateTerminating, StateTerminated}, reason: ReasonDeleted, message: "deleted", exit: ptr(int32(143)),
			calls: runtimetest.Calls{Create: 1, Wait: 1, Stop: 1, Destroy: 1, Recover: 1}, graces: []time.Duration{50 * time.Millisecond}},
		{name: "delete before the main command starts", fake: func(f *runtimetest.Fake) {
			f.OnCreate = idle
			f.OnStop = func(sb *runtimetest.FakeSandbox, _ time.Duration) {
				sb.Exit(runtime.Exit{ExitCode: ptr(int32(0)), Reason: "Stopped"})
			}
		}, steps: []step{create(0), func(h *harness) { h.sandbox() }, del(time.Second, StateTerminating)},
			states: []State{StateCreating, StateTerminating, StateTerminated}, reason: ReasonDeleted, message: "deleted", exit: ptr(int32(0)),
			calls: runtimetest.Calls{Create: 1, Wait: 1, Stop: 1, Destroy: 1, Recover: 1}, graces: []time.Duration{time.Second}},
		{name: "delete of an ended sandbox", steps: steps(running, []step{exit(completed), await(StateCompleted), del(time.Second, StateCompleted)}),
			states: []State{StateCreating, StateRunning, StateCompleted}, reason: ReasonCompleted, exit: ptr(int32(0)),
			calls: runtimetest.Calls{Create: 1, Wait: 1, Destroy: 1, Recover: 1}},

		// A restarted runner: what it finds in the backend and in its records.
		{name: "recover alive", steps: []step{closeRunner(), put(true, nil, nil), start(nil), await(StateRunning), exit(completed)},
			states: []State{StateRunning, StateCompleted}, reason: ReasonCompleted, exit: ptr(int32(0)),
			calls: runtimetest.Calls{Wait: 1, Destroy: 1, Recover: 2}},
		// A sandbox whose container ended while no runner ran shows as it was (RUNNING)
		// until its teardown is done.
		{name: "recover vanished", steps: []step{closeRunner(), put(false, nil, nil), start(nil)},
			states: []State{StateRunning, StateFailed}, reason: ReasonVanished, message: "ended while the runner was down",
			calls: runtimetest.Calls{Destroy: 1, Recover: 2}},
		{name: "recover ended", steps: []step{closeRunner(), put(false, &completed, nil), start(nil)},
			states: []State{StateRunning, StateCompleted}, reason: ReasonCompleted, exit: ptr(int32(0)),
			calls: runtimetest.Calls{Destroy: 1, Recover: 2}},
		{name: "recover ended record within retention", steps: steps(running, []step{exit(completed), await(StateCompleted), closeRunner(), start(nil)}),
			states: []State{StateCreating, StateRunning, StateCompleted}, reason: ReasonCompleted, exit: ptr(int32(0)),
			calls: runtimetest.Calls{Create: 1, Wait: 1, Destroy: 1, Recover: 2}},
		{name: "recover ended record past retention", steps: steps(running, []step{exit(completed), await(StateCompleted), closeRunner(),
			start(func(c *Config) { c.Retention = time.Nanosecond })}),
			states: []State{StateCreating, StateRunning, StateCompleted, gone},
			calls:  runtimetest.Calls{Create: 1, Wait: 1, Destroy: 1, Recover: 2}},
		{name: "recover ended record whose teardown was cut short", steps: steps(running, []step{exit(completed), await(StateCompleted), closeRunner(),
			// The runner finishes the teardown in the background: Close waits for it.
			put(false, &runtime.Exit{Reason: "Killed"}, nil), start(nil), closeRunner(), inBackend(false), start(nil)}),
			states: []State{StateCreating, StateRunning, StateCompleted}, reason: ReasonCompleted, exit: ptr(int32(0)),
			calls: runtimetest.Calls{Create: 1, Wait: 1, Destroy: 2, Recover: 3}},
		{name: "recover ended record of a sandbox still alive", steps: steps(running, []step{exit(completed), await(StateCompleted), closeRunner(),
			put(true, nil, nil), start(nil), await(StateRunning)}),
			states: []State{StateCreating, StateRunning, StateCompleted, StateRunning},
			calls:  runtimetest.Calls{Create: 1, Wait: 1, Destroy: 1, Recover: 2}},
		{name: "retention passes", steps: steps([]step{closeRunner(), start(func(c *Config) { c.Retention = 20 * time.Millisecond })},
			running, []step{exit(completed), await(gone)}),
			states: []State{StateCreating, StateRunning, StateCompleted, gone},
			calls:  runtimetest.Calls{Create: 1, Wait: 1, Destroy: 1, Recover: 2}},

		// Close lets sandboxes run; the next runner follows them again.
		{name: "close lets sandboxes run", steps: steps(running, []step{closeRunner(), alive(true), start(nil), await(StateRunning)}),
			states: []State{StateCreating, StateRunning},
			calls:  runtimetest.Calls{Create: 1, Wait: 1, Recover: 2}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := runtimetest.NewFake()
			if tc.fake != nil {
				tc.fake(f)
			}
			h := newHarness(t, f)
			h.start(nil)
			for _, s := range tc.steps {
				h.settle() // what the last step did is seen before the next one acts
				s(h)
			}
			want := tc.states[len(tc.states)-1]
			h.await(want)
			r := h.runner()
			end, err := r.Get(h.id)
			switch {
			case want == gone:
				if !errors.Is(err, runtime.ErrNotFound) {
					t.Errorf("get: %v, want not found", err)
				}
			case err != nil:
				t.Fatal(err)
			case want.Terminal():
				if end, err = r.WaitTerminal(context.Background(), h.id); err != nil {
					t.Fatal(err)
				}
			}
			h.settle()
			if got := h.rec.states(h.id); !slices.Equal(got, tc.states) {
				t.Errorf("states %v, want %v", got, tc.states)
			}
			if end.Reason != tc.reason || !strings.Contains(end.Message, tc.message) {
				t.Errorf("ended %s %s: %q, want %s: …%s…", end.State, end.Reason, end.Message, tc.reason, tc.message)
			}
			if (end.ExitCode == nil) != (tc.exit == nil) || end.ExitCode != nil && *end.ExitCode != *tc.exit {
				t.Errorf("exit code %v, want %v", fmtCode(end.ExitCode), fmtCode(tc.exit))
			}
			if end.Restarts != tc.restarts || end.OOMKills != tc.oomKills {
				t.Errorf("restarts %d, OOM kills %d; want %d, %d", end.Restarts, end.OOMKills, tc.restarts, tc.oomKills)
			}
			if want.Terminal() && end.EndedAt.IsZero() {
				t.Error("ended without an end time")
			}
			if got := f.Calls(); got != tc.calls {
				t.Errorf("backend calls %+v, want %+v", got, tc.calls)
			}
			if got := f.StopGraces(h.id); !slices.Equal(got, tc.graces) {
				t.Errorf("stop graces %v, want %v", got, tc.graces)
			}
		})
	}
}

func onCreate(fn func(context.Context, *runtimetest.FakeSandbox) error) func(*runtimetest.Fake) {
	return func(f *runtimetest.Fake) { f.OnCreate = fn }
}

func fmtCode(c *int32) string {
	if c == nil {
		return "none"
	}
	return fmt.Sprint(*c)
}

// TestChangedTellsOfSandboxesComingAndGoing: Changed is closed when a sandbox is
// created and when one is forgotten after its retention window, not only when one
// changes state, so a follower of List sees every sandbox come and go.
func TestChangedTellsOfSandboxesComingAndGoing(t *testing.T) {
	f := runtimetest.NewFake()
	f.OnCreate = blockCreate // nothing else changes while it is created
	r, err := New(context.Background(), Config{Backend: f, DataDir: t.TempDir(), Retention: 20 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	changed := r.Changed()
	sb, err := r.Create(context.Background(), CreateRequest{Spec: runtime.Spec{Container: runtime.Container{Image: "busybox"}}})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-changed:
	default:
		t.Error("no change told of a new sandbox")
	}
	if _, err := r.Delete(sb.ID, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := r.WaitTerminal(context.Background(), sb.ID); err != nil {
		t.Fatal(err)
	}
	changed = r.Changed()
	select {
	case <-changed:
	case <-time.After(waitLimit):
		t.Fatal("no change told of a sandbox forgotten after its retention window")
	}
	if _, err := r.Get(sb.ID); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("get after the retention window: %v, want not found", err)
	}
}
