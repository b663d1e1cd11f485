package rollout_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/rollout"
	"github.com/sandboxd/sandboxd/internal/store"
)

// bed is a real SQLite store, a fake clock and channel targets the test sets.
type bed struct {
	t       *testing.T
	st      store.Store
	dsn     string
	now     time.Time
	mu      sync.Mutex
	targets map[string]string
}

func newBed(t *testing.T) *bed {
	t.Helper()
	dsn := "sqlite://" + filepath.Join(t.TempDir(), "store.db")
	st, err := store.Open(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if _, err := st.Orgs().Create(t.Context(), store.Org{ID: "o1"}); err != nil {
		t.Fatal(err)
	}
	// A Tuesday, 10:00 UTC.
	return &bed{t: t, st: st, dsn: dsn, now: time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC), targets: map[string]string{}}
}

func (b *bed) clock() time.Time {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.now
}

func (b *bed) advance(d time.Duration) {
	b.mu.Lock()
	b.now = b.now.Add(d)
	b.mu.Unlock()
}

func (b *bed) target(ch, v string) {
	b.mu.Lock()
	b.targets[ch] = v
	b.mu.Unlock()
}

func (b *bed) controller(st store.Store, holder string, batch int, deadline time.Duration) *rollout.Controller {
	b.t.Helper()
	c, err := rollout.New(rollout.Config{
		Store: rollout.FromStore(st), Holder: holder, Batch: batch, Deadline: deadline, HeartbeatInterval: 5 * time.Second,
		Now: b.clock, Logger: slog.New(slog.DiscardHandler),
		Targets: func(context.Context) (map[string]string, error) {
			b.mu.Lock()
			defer b.mu.Unlock()
			out := map[string]string{}
			for k, v := range b.targets {
				out[k] = v
			}
			return out, nil
		},
	})
	if err != nil {
		b.t.Fatal(err)
	}
	return c
}

type runnerOpt func(*store.Runner)

func group(g string) runnerOpt   { return func(r *store.Runner) { r.RunnerGroupID = g } }
func channel(c string) runnerOpt { return func(r *store.Runner) { r.ReleaseChannel = c } }
func maint(p string) runnerOpt {
	return func(r *store.Runner) { r.MaintenancePolicy = json.RawMessage(p) }
}

// orgOf splits a test runner name into organization and runner_id: "o2:b" is o2's runner
// b, a plain "b" o1's.
func orgOf(id string) (string, string) {
	if org, rid, ok := strings.Cut(id, ":"); ok {
		return org, rid
	}
	return "o1", id
}

func (b *bed) runner(id string, opts ...runnerOpt) {
	b.t.Helper()
	org, rid := orgOf(id)
	if _, err := b.st.Orgs().Get(b.t.Context(), org); err != nil {
		if _, err := b.st.Orgs().Create(b.t.Context(), store.Org{ID: org}); err != nil {
			b.t.Fatal(err)
		}
	}
	r := store.Runner{Org: org, RunnerID: rid, ClusterID: "c-" + rid, Zone: "z", ReleaseChannel: store.ChannelRapid}
	for _, o := range opts {
		o(&r)
	}
	if _, err := b.st.Runners().Create(b.t.Context(), r); err != nil {
		b.t.Fatal(err)
	}
	b.beat(id, "v1.0.0", true, true)
}

// beat records a heartbeat at the fake clock's now.
func (b *bed) beat(id, version string, ready, selfUpdate bool) {
	b.t.Helper()
	now := b.clock()
	org, rid := orgOf(id)
	if err := b.st.Runners().RecordHeartbeat(b.t.Context(), org, rid, store.RunnerStatus{LastHeartbeatAt: &now, Version: version,
		Ready: ready, SelfUpdate: selfUpdate}); err != nil {
		b.t.Fatal(err)
	}
}

func (b *bed) get(id string) store.Runner {
	b.t.Helper()
	org, rid := orgOf(id)
	r, err := b.st.Runners().Get(b.t.Context(), org, rid)
	if err != nil {
		b.t.Fatal(err)
	}
	return r
}

func tick(t *testing.T, c *rollout.Controller) {
	t.Helper()
	if err := c.Tick(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// moving lists the runners (of ids) with a step in flight.
func (b *bed) moving(ids ...string) []string {
	b.t.Helper()
	var out []string
	for _, id := range ids {
		if lu := b.get(id).LastUpdate; lu != nil && lu.State == store.UpdateInProgress {
			out = append(out, id)
		}
	}
	return out
}

func wantMoving(t *testing.T, b *bed, want string, ids ...string) {
	t.Helper()
	if got := strings.Join(b.moving(ids...), ","); got != want {
		t.Fatalf("in flight: %q, want %q", got, want)
	}
}

func TestOneAtATimePerGroupAndSuccessClearsDesired(t *testing.T) {
	b := newBed(t)
	b.runner("a")
	b.runner("b")
	b.runner("c", group("other"))
	c := b.controller(b.st, "x", 0, time.Minute)
	tick(t, c) // no target: nothing
	wantMoving(t, b, "", "a", "b", "c")
	b.target(store.ChannelRapid, "v1.1.0")
	tick(t, c)
	wantMoving(t, b, "a,c", "a", "b", "c")
	a := b.get("a")
	if a.DesiredVersion != "v1.1.0" || a.LastUpdate.From != "v1.0.0" || a.LastUpdate.To != "v1.1.0" ||
		!a.LastUpdate.StartedAt.Equal(b.clock()) || !a.LastUpdate.Deadline.Equal(b.clock().Add(time.Minute)) {
		t.Fatalf("a started: %+v %+v", a, a.LastUpdate)
	}
	b.advance(10 * time.Second)
	b.beat("a", "v1.0.0", true, true)
	b.beat("b", "v1.0.0", true, true)
	b.beat("c", "v1.0.0", true, true)
	tick(t, c)
	wantMoving(t, b, "a,c", "a", "b", "c")
	// a comes back on the new version but not ready yet: still in flight.
	b.beat("a", "v1.1.0", false, true)
	tick(t, c)
	wantMoving(t, b, "a,c", "a", "b", "c")
	b.beat("a", "v1.1.0", true, true)
	tick(t, c) // a passes its gate: b starts in the same round
	a = b.get("a")
	if a.DesiredVersion != "" || a.LastUpdate.State != store.UpdateSucceeded || a.LastUpdate.EndedAt == nil || a.LastUpdate.Reason != "" {
		t.Fatalf("a succeeded: desired %q, %+v", a.DesiredVersion, a.LastUpdate)
	}
	wantMoving(t, b, "b,c", "a", "b", "c")
	b.beat("b", "v1.1.0", true, true)
	b.beat("c", "v1.1.0", true, true)
	tick(t, c)
	wantMoving(t, b, "", "a", "b", "c")
	tick(t, c) // everyone is on the target: nothing more
	for _, id := range []string{"a", "b", "c"} {
		if r := b.get(id); r.DesiredVersion != "" || r.LastUpdate.State != store.UpdateSucceeded {
			t.Fatalf("%s: %+v", id, r)
		}
	}
}

func TestBatch(t *testing.T) {
	b := newBed(t)
	for _, id := range []string{"a", "b", "c"} {
		b.runner(id)
	}
	b.target(store.ChannelRapid, "v1.1.0")
	tick(t, b.controller(b.st, "x", 2, time.Minute))
	wantMoving(t, b, "a,b", "a", "b", "c")
}

func TestMaintenanceWindowRespected(t *testing.T) {
	b := newBed(t)
	// 02:00-03:00 UTC every day; the clock is at 10:00.
	b.runner("a", maint(`{"windows":[{"cron":"0 2 * * *","duration_seconds":3600}]}`))
	b.runner("b", group("g2"), maint(`{"exclusions":[{"start_time":"2026-12-01T00:00:00Z","end_time":"2026-12-02T00:00:00Z","reason":"freeze"}]}`))
	b.target(store.ChannelRapid, "v1.1.0")
	c := b.controller(b.st, "x", 0, time.Minute)
	tick(t, c)
	wantMoving(t, b, "", "a", "b")
	if b.get("a").DesiredVersion != "" {
		t.Fatal("a told to move outside its window")
	}
	b.advance(16*time.Hour + 30*time.Minute) // 02:30 the next day: inside a's window, past b's exclusion
	b.beat("a", "v1.0.0", true, true)
	b.beat("b", "v1.0.0", true, true)
	tick(t, c)
	wantMoving(t, b, "a,b", "a", "b")
}

func TestSkipsRunnersThatCannotUpdateThemselvesOrAreDisconnected(t *testing.T) {
	b := newBed(t)
	b.runner("a")
	b.runner("b", group("g2"))
	b.runner("c", group("g3"))
	b.beat("a", "v1.0.0", true, false) // cannot update itself
	b.advance(time.Minute)
	b.beat("c", "v1.0.0", true, true) // b's last heartbeat is a minute old: disconnected
	b.target(store.ChannelRapid, "v1.1.0")
	tick(t, b.controller(b.st, "x", 0, time.Minute))
	wantMoving(t, b, "c", "a", "b", "c")
}

func TestDeadlineRollsBackAndHaltsTheChannelOnly(t *testing.T) {
	b := newBed(t)
	b.runner("a")
	b.runner("b")
	b.runner("s1", channel(store.ChannelStable), group("stable"))
	b.runner("s2", channel(store.ChannelStable), group("stable"))
	b.target(store.ChannelRapid, "v1.1.0")
	c := b.controller(b.st, "x", 0, 2*time.Minute)
	tick(t, c)
	wantMoving(t, b, "a", "a", "b", "s1", "s2")
	// a restarts on v1.1.0 but never becomes ready.
	for range 4 {
		b.advance(30 * time.Second)
		for _, id := range []string{"b", "s1", "s2"} {
			b.beat(id, "v1.0.0", true, true)
		}
		b.beat("a", "v1.1.0", false, true)
		tick(t, c)
	}
	a := b.get("a")
	want := "did not report ready on v1.1.0 within 2m0s (reports it, not ready)"
	if a.DesiredVersion != "v1.0.0" || a.LastUpdate.State != store.UpdateRolledBack || a.LastUpdate.Reason != want {
		t.Fatalf("a rolled back: desired %q, %+v", a.DesiredVersion, a.LastUpdate)
	}
	hs, err := b.st.Rollouts().Halts(t.Context(), "")
	if err != nil || len(hs) != 1 || hs[0].Channel != store.ChannelRapid || hs[0].Version != "v1.1.0" || hs[0].RunnerID != "a" ||
		!strings.Contains(hs[0].Reason, want) || !strings.Contains(hs[0].Reason, "rolled back to v1.0.0") {
		t.Fatalf("halts: %+v %v", hs, err)
	}
	wantMoving(t, b, "", "a", "b")
	// a comes back on v1.0.0: its rollback's desired version is cleared, and b stays put.
	b.advance(10 * time.Second)
	b.beat("a", "v1.0.0", true, true)
	b.beat("b", "v1.0.0", true, true)
	tick(t, c)
	if a := b.get("a"); a.DesiredVersion != "" || a.LastUpdate.State != store.UpdateRolledBack {
		t.Fatalf("a after rollback: %+v", a)
	}
	wantMoving(t, b, "", "a", "b")
	// STABLE is not halted: it rolls.
	b.target(store.ChannelStable, "v1.1.0")
	b.beat("s1", "v1.0.0", true, true)
	b.beat("s2", "v1.0.0", true, true)
	tick(t, c)
	wantMoving(t, b, "s1", "a", "b", "s1", "s2")
	// A new RAPID target ends the halt: RAPID rolls again.
	b.target(store.ChannelRapid, "v1.1.1")
	tick(t, c)
	if hs, _ := b.st.Rollouts().Halts(t.Context(), ""); len(hs) != 0 {
		t.Fatalf("halt outlived its target: %+v", hs)
	}
	wantMoving(t, b, "a,s1", "a", "b", "s1", "s2")
}

func TestResumeLiftsTheHalt(t *testing.T) {
	b := newBed(t)
	b.runner("a")
	b.runner("b")
	b.target(store.ChannelRapid, "v1.1.0")
	c := b.controller(b.st, "x", 0, time.Minute)
	tick(t, c)
	b.advance(2 * time.Minute)
	b.beat("a", "v1.0.0", true, true)
	b.beat("b", "v1.0.0", true, true)
	tick(t, c)
	if r := b.get("a").LastUpdate; r.State != store.UpdateRolledBack || !strings.HasSuffix(r.Reason, "(reports v1.0.0)") {
		t.Fatalf("a: %+v", r)
	}
	tick(t, c)
	wantMoving(t, b, "", "a", "b")
	if ok, err := b.st.Rollouts().Resume(t.Context(), "o1", store.ChannelRapid); ok != 1 || err != nil {
		t.Fatal(ok, err)
	}
	tick(t, c)
	wantMoving(t, b, "a", "a", "b")
}

func TestTwoControllersOnOneStoreDoNotDoubleStart(t *testing.T) {
	b := newBed(t)
	for _, id := range []string{"a", "b", "c", "d"} {
		b.runner(id)
	}
	b.target(store.ChannelRapid, "v1.1.0")
	st2, err := store.Open(t.Context(), b.dsn) // a second replica's connection
	if err != nil {
		t.Fatal(err)
	}
	defer st2.Close()
	c1, c2 := b.controller(b.st, "one", 0, time.Minute), b.controller(st2, "two", 0, time.Minute)
	for range 5 {
		var wg sync.WaitGroup
		for _, c := range []*rollout.Controller{c1, c2} {
			wg.Go(func() {
				if err := c.Tick(t.Context()); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		if got := b.moving("a", "b", "c", "d"); len(got) != 1 {
			t.Fatalf("in flight %v: want exactly one", got)
		}
	}
	// The lease holder dies (stops ticking): the other takes over once the lease expires.
	held := b.moving("a", "b", "c", "d")[0]
	b.beat(held, "v1.1.0", true, true)
	tick(t, c2) // c1 or c2 holds the lease; if c1, c2 does nothing yet
	b.advance(31 * time.Second)
	for _, id := range []string{"a", "b", "c", "d"} {
		if id != held {
			b.beat(id, "v1.0.0", true, true)
		}
	}
	b.beat(held, "v1.1.0", true, true)
	tick(t, c2)
	if r := b.get(held); r.LastUpdate.State != store.UpdateSucceeded {
		t.Fatalf("%s not ended by the other replica: %+v", held, r.LastUpdate)
	}
	if got := b.moving("a", "b", "c", "d"); len(got) != 1 || got[0] == held {
		t.Fatalf("in flight %v after take-over", got)
	}
}

func TestConfigValidate(t *testing.T) {
	if err := (rollout.Config{}).Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	err := rollout.Config{Tick: time.Nanosecond, Batch: -1, Deadline: 48 * time.Hour}.Validate()
	for _, want := range []string{"rollout tick must be between", "rollout batch must be between 1 and 1000 (got -1)", "rollout deadline must be between"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v does not say %q", err, want)
		}
	}
	if _, err := rollout.New(rollout.Config{Batch: 5000}); err == nil {
		t.Error("New accepted a config without a store")
	}
}

// A step of a runner that cannot move itself (ApplyAvailableUpdate on a runner updated by
// hand) that misses its deadline is rolled back and recorded but halts nothing.
func TestFailedStepOfARunnerThatCannotUpdateItselfDoesNotHalt(t *testing.T) {
	b := newBed(t)
	b.runner("a")
	b.runner("b", group("g2"))
	b.beat("a", "v1.0.0", true, false)
	b.target(store.ChannelRapid, "v1.1.0")
	r := b.get("a")
	att := rollout.Attempt("v1.0.0", "v1.1.0", b.clock(), time.Minute)
	desired := "v1.1.0"
	if _, err := b.st.Runners().Update(t.Context(), "o1", "a", r.Etag, store.RunnerUpdate{DesiredVersion: &desired, LastUpdate: &att}); err != nil {
		t.Fatal(err)
	}
	b.advance(2 * time.Minute)
	b.beat("a", "v1.0.0", true, false)
	b.beat("b", "v1.0.0", true, true)
	c := b.controller(b.st, "x", 0, time.Minute)
	tick(t, c)
	if lu := b.get("a").LastUpdate; lu.State != store.UpdateRolledBack || !strings.Contains(lu.Reason, "(reports v1.0.0)") {
		t.Fatalf("a: %+v", lu)
	}
	if hs, _ := b.st.Rollouts().Halts(t.Context(), ""); len(hs) != 0 {
		t.Fatalf("halted by a runner that could not move: %+v", hs)
	}
	wantMoving(t, b, "b", "a", "b")
}

// After a runner passed its gate, its old pod (a Deployment rolling) may still heartbeat
// the old version for a while: that does not start it again, until a deadline has passed.
func TestOldPodAfterSuccessDoesNotRestartTheStep(t *testing.T) {
	b := newBed(t)
	b.runner("a")
	b.target(store.ChannelRapid, "v1.1.0")
	c := b.controller(b.st, "x", 0, time.Minute)
	tick(t, c)
	b.beat("a", "v1.1.0", true, true)
	tick(t, c)
	if lu := b.get("a").LastUpdate; lu.State != store.UpdateSucceeded {
		t.Fatalf("a: %+v", lu)
	}
	b.advance(5 * time.Second)
	b.beat("a", "v1.0.0", true, true) // the terminating old pod
	tick(t, c)
	wantMoving(t, b, "", "a")
	b.advance(time.Minute)
	b.beat("a", "v1.0.0", true, true) // still on the old version a deadline later: moved again
	tick(t, c)
	wantMoving(t, b, "a", "a")
}

// TestStartedHook: Config.Starting is called before each step is written (the runner as
// read), Config.Started once per started step, with the runner as written (its desired
// version set), and neither for runners the tick leaves alone; Started's error fails the
// tick, the step stands.
func TestStartedHook(t *testing.T) {
	b := newBed(t)
	b.runner("a")
	b.runner("b")
	b.target(store.ChannelRapid, "v1.1.0")
	var started, starting []string
	undone := 0
	fail := errors.New("re-apply refused")
	c, err := rollout.New(rollout.Config{
		Store: rollout.FromStore(b.st), Holder: "x", Batch: 1, Deadline: time.Minute, HeartbeatInterval: 5 * time.Second,
		Now: b.clock, Logger: slog.New(slog.DiscardHandler),
		Targets: func(context.Context) (map[string]string, error) {
			return map[string]string{store.ChannelRapid: "v1.1.0"}, nil
		},
		Starting: func(_ context.Context, r store.Runner) (func(), error) {
			starting = append(starting, r.RunnerID+"@"+r.DesiredVersion)
			return func() { undone++ }, nil
		},
		Started: func(_ context.Context, r store.Runner) error {
			started = append(started, r.RunnerID+"@"+r.DesiredVersion)
			return fail
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Tick(t.Context()); !errors.Is(err, fail) {
		t.Fatalf("tick: %v, want the hook's error", err)
	}
	if !slices.Equal(started, []string{"a@v1.1.0"}) {
		t.Fatalf("started %v, want a's step only (batch 1)", started)
	}
	if !slices.Equal(starting, []string{"a@"}) || undone != 0 {
		t.Fatalf("starting %v (want a, before its desired version is written), undone %d", starting, undone)
	}
	wantMoving(t, b, "a", "a", "b")
	if err := c.Tick(t.Context()); err != nil || len(started) != 1 {
		t.Fatalf("a tick that starts nothing: %v, hook called for %v", err, started)
	}
}

// TestStartingHookRefuses: a Starting error skips the runner (no step written, the tick
// fails); a step that cannot be written (the runner changed since read) is undone.
func TestStartingHookRefuses(t *testing.T) {
	b := newBed(t)
	b.runner("a")
	b.target(store.ChannelRapid, "v1.1.0")
	fail := errors.New("install record unreadable")
	undone := 0
	starting := func(_ context.Context, r store.Runner) (func(), error) { return nil, fail }
	cfg := rollout.Config{
		Store: rollout.FromStore(b.st), Holder: "x", Batch: 1, Deadline: time.Minute, HeartbeatInterval: 5 * time.Second,
		Now: b.clock, Logger: slog.New(slog.DiscardHandler),
		Targets: func(context.Context) (map[string]string, error) {
			return map[string]string{store.ChannelRapid: "v1.1.0"}, nil
		},
		Starting: func(ctx context.Context, r store.Runner) (func(), error) { return starting(ctx, r) },
	}
	c, err := rollout.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Tick(t.Context()); !errors.Is(err, fail) {
		t.Fatalf("tick: %v, want the hook's error", err)
	}
	wantMoving(t, b, "", "a")
	// The runner changes between the read and the write: the step is not written, undone.
	starting = func(ctx context.Context, r store.Runner) (func(), error) {
		if err := b.st.Runners().RecordHeartbeat(ctx, r.Org, r.RunnerID, store.RunnerStatus{Version: "v1.0.0", Ready: true, SelfUpdate: true}); err != nil {
			t.Fatal(err)
		}
		v := "v0.9.0"
		if _, err := b.st.Runners().Update(ctx, r.Org, r.RunnerID, r.Etag, store.RunnerUpdate{DesiredVersion: &v}); err != nil {
			t.Fatal(err)
		}
		return func() { undone++ }, nil
	}
	if err := c.Tick(t.Context()); err != nil || undone != 1 {
		t.Fatalf("tick: %v, undone %d, want 1", err, undone)
	}
}
