package local

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// forkOf is a single-container gVisor fork of org from fp.
func forkOf(id, org string, fp *forkParams) *sandbox {
	return &sandbox{id: id, fork: fp, rt: &ociRuntime{gvisor: true, class: GVisorClass},
		spec: runtime.Spec{ID: id, Meta: map[string]string{runtime.MetaOrg: org}}}
}

// TestForkSentryGated: which launches take a fork-sentry slot, and whose.
func TestForkSentryGated(t *testing.T) {
	fp := &forkParams{}
	b := &Backend{forks: newColdGate(2)}
	ctx := withColdStart(context.Background(), "org-a")
	group := forkOf("g", "org-a", fp)
	group.spec.Sidecars = []runtime.Container{{Name: "db"}}
	member := forkOf("m", "org-a", fp)
	member.member = true
	for _, tc := range []struct {
		name  string
		b     *Backend
		ctx   context.Context
		s     *sandbox
		gated bool
		org   string
	}{
		{"a fork", b, ctx, forkOf("f", "org-b", fp), true, "org-a"},
		{"a fork, no mark", b, context.Background(), forkOf("f", "org-b", fp), true, "org-b"},
		{"not a fork", b, ctx, &sandbox{id: "c", rt: &ociRuntime{}}, false, "org-a"},
		{"a group's fork (made by runsc restore, after the wait)", b, ctx, group, false, "org-a"},
		{"a group member's fork", b, ctx, member, false, "org-a"},
		{"no bound", &Backend{}, ctx, forkOf("f", "org-a", fp), false, "org-a"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.b.forkSentry(tc.ctx, tc.s)
			if c.gated != tc.gated || c.org != tc.org {
				t.Errorf("gated %v org %q, want %v %q", c.gated, c.org, tc.gated, tc.org)
			}
		})
	}
}

// forkRun plays launch's order for fork s: its fork-sentry slot, then a cold-start slot,
// `runsc create` (made is told), the wait for the source's checkpoint (forkReady: the
// cold-start slot given back meanwhile), the restore, both slots given back.
func forkRun(ctx context.Context, b *Backend, s *sandbox, made chan<- string) error {
	ctx = withColdStart(ctx, s.spec.Meta[runtime.MetaOrg])
	sentry := b.forkSentry(ctx, s)
	defer sentry.leave()
	if _, err := sentry.enter(ctx); err != nil {
		return err
	}
	slot := b.coldStart(ctx)
	defer slot.leave()
	if _, err := slot.enter(ctx); err != nil {
		return err
	}
	made <- s.id // runsc create
	return slot.forkReady(ctx, s.fork)
}

// TestForkSentriesBounded: one organization's forks waiting for a slow checkpoint hold at
// most ForkSentries sandboxes; the rest wait before `runsc create`, holding no cold-start
// slot, so another organization's cold starts go on; and another organization's fork
// takes the next sentry slot freed, ahead of the first one's queue.
func TestForkSentriesBounded(t *testing.T) {
	const sentries, burst = 3, 20
	b := &Backend{cold: newColdGate(2), forks: newColdGate(sentries)}
	slowA := &forkParams{ready: make(chan struct{})} // org-a's source: its checkpoint takes long
	made := make(chan string, 2*burst)
	errs := make(chan error, 2*burst)
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		cancels = map[string]context.CancelFunc{}
	)
	start := func(s *sandbox) {
		ctx, cancel := context.WithCancel(context.Background())
		mu.Lock()
		cancels[s.id] = cancel
		mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := forkRun(ctx, b, s, made); err != nil {
				errs <- err
			}
		}()
	}
	defer func() {
		mu.Lock()
		for _, c := range cancels {
			c()
		}
		mu.Unlock()
		wg.Wait()
		close(errs)
		for err := range errs {
			if !errors.Is(err, context.Canceled) {
				t.Errorf("fork: %v", err)
			}
		}
	}()
	for i := range burst {
		start(forkOf("a"+strconv.Itoa(i), "org-a", slowA))
	}
	var holding []string
	for range sentries {
		holding = append(holding, <-made)
	}
	waitFor(t, func() bool { return b.forks.waiting() == burst-sentries })
	select {
	case id := <-made:
		t.Fatalf("fork %s made a sandbox beyond the bound of %d", id, sentries)
	default:
	}
	// The forks waiting for their source or a sentry slot hold no cold-start slot:
	// another organization's cold starts are admitted at once, to every slot.
	var coldB []func()
	for range 2 {
		actx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		release, err := b.cold.acquire(actx, "org-b")
		cancel()
		if err != nil {
			t.Fatalf("org-b's cold start beside org-a's waiting forks: %v", err)
		}
		coldB = append(coldB, release)
	}
	for _, release := range coldB {
		release()
	}
	// org-b's fork (its source already checkpointed) queues behind org-a's 17; when one
	// of org-a's sandboxes goes (that fork ended), org-b's fork is admitted.
	start(forkOf("b0", "org-b", &forkParams{}))
	waitFor(t, func() bool { return b.forks.waiting() == burst-sentries+1 })
	mu.Lock()
	cancels[holding[0]]()
	mu.Unlock()
	select {
	case id := <-made:
		if id != "b0" {
			t.Fatalf("fork %s took the freed sentry slot, want org-b's b0 ahead of org-a's queue", id)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("org-b's fork was not admitted to the freed sentry slot")
	}
}

func TestForkSentriesConfig(t *testing.T) {
	for _, n := range []int{-1, 0, 1, MaxForkSentries} {
		if err := validateForkSentries(n); err != nil {
			t.Errorf("ForkSentries %d: %v", n, err)
		}
	}
	if err := validateForkSentries(MaxForkSentries + 1); err == nil {
		t.Errorf("ForkSentries %d accepted", MaxForkSentries+1)
	}
	if defaultForkSentries(1) != 4 || defaultForkSentries(8) != 16 {
		t.Errorf("defaults %d %d", defaultForkSentries(1), defaultForkSentries(8))
	}
}

// TestForkSentriesOneSlot (root, runsc): with one fork-sentry slot and one cold-start
// slot, three forks of a running gVisor sandbox are all made (no deadlock between the
// two gates: the sentry slot is taken first, the cold-start one given back while a fork
// waits), never more than one fork's sandbox made and not yet restored at a time, and
// both gates are empty after.
func TestForkSentriesOneSlot(t *testing.T) {
	e := newEnvWith(t, func(c *Config) { c.ForkSentries, c.ColdStarts = 1, 1 })
	if e.b.runtimes[GVisorClass] == nil {
		t.Skip("runsc not found")
	}
	ctx := context.Background()
	const id = "fs1"
	sp := runtime.Spec{ID: id, RuntimeClass: GVisorClass, Container: runtime.Container{Image: "busybox", Command: "sh", Args: []string{"-c", counterLoop}},
		Meta: map[string]string{runtime.MetaOrg: "org-a"}}
	e.create(sp)
	waitCount(t, e.b, id, 2)
	var (
		mu            sync.Mutex
		inFlight, top int
	)
	e.b.trace = func(step string, _ time.Duration) {
		mu.Lock()
		defer mu.Unlock()
		switch step {
		case "fork: runsc create":
			inFlight++
			top = max(top, inFlight)
		case "runtime": // restored
			inFlight--
		}
	}
	specs := make([]*runtime.Spec, 3)
	for i := range specs {
		f := sp.Clone()
		f.ID = id + "-" + strconv.Itoa(i)
		specs[i] = &f
	}
	_, errs := e.b.Fork(ctx, id, specs)
	for i, err := range errs {
		if err != nil {
			t.Fatalf("fork %d: %v", i, err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if top != 1 || inFlight != 0 {
		t.Errorf("at most %d fork sandboxes made and not restored at once (%d left), want 1", top, inFlight)
	}
	for name, g := range map[string]*coldGate{"fork-sentry": e.b.forks, "cold-start": e.b.cold} {
		g.mu.Lock()
		running, held := g.running, len(g.held)
		g.mu.Unlock()
		if running != 0 || held != 0 || g.waiting() != 0 {
			t.Errorf("%s gate after the forks: %d running, %d organizations holding, %d waiting", name, running, held, g.waiting())
		}
	}
}
