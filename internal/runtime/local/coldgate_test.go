package local

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// TestColdGateFair: while one organization's burst waits, another's start is admitted
// after at most one of the burst's, not after all of them.
func TestColdGateFair(t *testing.T) {
	g := newColdGate(1)
	ctx := context.Background()
	hold, err := g.acquire(ctx, "a") // the one slot
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		order []string
		wg    sync.WaitGroup
	)
	queue := func(name, org string) {
		n := g.waiting()
		wg.Add(1)
		go func() {
			defer wg.Done()
			release, err := g.acquire(ctx, org)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			order = append(order, name)
			mu.Unlock()
			release()
		}()
		waitFor(t, func() bool { return g.waiting() == n+1 })
	}
	for _, n := range []string{"a1", "a2", "a3", "a4", "a5"} {
		queue(n, "a")
	}
	queue("b1", "b")
	queue("a6", "a")
	queue("b2", "b")
	queue("c1", "c")
	hold()
	wg.Wait()
	want := []string{"a1", "b1", "c1", "a2", "b2", "a3", "a4", "a5", "a6"}
	if !slices.Equal(order, want) {
		t.Fatalf("admission order %v, want %v", order, want)
	}
}

// TestColdGateCancel: a waiter whose context ends before its turn leaves the queue
// (TestColdGateCancelAdmitted: one admitted meanwhile hands its slot on).
func TestColdGateCancel(t *testing.T) {
	g := newColdGate(1)
	hold, err := g.acquire(context.Background(), "a")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := g.acquire(ctx, "b")
		errc <- err
	}()
	waitFor(t, func() bool { return g.waiting() == 1 })
	cancel()
	if err := <-errc; err == nil {
		t.Fatal("acquire after its context ended: no error")
	}
	if n := g.waiting(); n != 0 {
		t.Fatalf("%d waiting after the cancel", n)
	}
	hold()
	release, err := g.acquire(context.Background(), "c") // the slot is free again
	if err != nil {
		t.Fatal(err)
	}
	release()
	if g.running != 0 {
		t.Fatalf("running %d after every release", g.running)
	}
}

// TestColdGateCancelAdmitted: a waiter admitted just as its context ended (abandon after
// the admission) hands its slot on to the next waiter, not back to nobody.
func TestColdGateCancelAdmitted(t *testing.T) {
	g := newColdGate(1)
	hold, err := g.acquire(context.Background(), "a")
	if err != nil {
		t.Fatal(err)
	}
	wb, wc := g.enqueue("b"), g.enqueue("c")
	hold() // b's turn
	if !admitted(wb) || admitted(wc) {
		t.Fatalf("after the release: b admitted %v, c admitted %v; want b only", admitted(wb), admitted(wc))
	}
	g.abandon(wb) // b's context ended as it was admitted
	if !admitted(wc) {
		t.Fatal("the slot of an admitted, then cancelled waiter did not go on to the next")
	}
	if g.running != 1 || g.held["b"] != 0 || g.held["c"] != 1 {
		t.Fatalf("running %d, held %v; want 1, c only", g.running, g.held)
	}
	g.release("c")
	if g.running != 0 || len(g.held) != 0 || g.waiting() != 0 {
		t.Fatalf("running %d, held %v, waiting %d after every release", g.running, g.held, g.waiting())
	}
}

// TestColdGateOrgCap: an organization holding every slot (nobody waited) gets back at
// most max-1 while another organization waits: the freed slot goes to the other one,
// even when the first one's waiter came first; with nobody else waiting it may take all.
func TestColdGateOrgCap(t *testing.T) {
	g := newColdGate(3)
	for range 3 { // nobody waits: a takes every slot
		if w := g.enqueue("a"); w != nil {
			t.Fatal("a start waited with a free slot and nobody waiting")
		}
	}
	wa1, wb1, wa2, wb2 := g.enqueue("a"), g.enqueue("b"), g.enqueue("a"), g.enqueue("b")
	check := func(step string, want ...*coldWaiter) {
		t.Helper()
		for i, w := range []*coldWaiter{wa1, wb1, wa2, wb2} {
			if got := admitted(w); got != slices.Contains(want, w) {
				t.Fatalf("%s: waiter %d (a1 b1 a2 b2) admitted %v", step, i, got)
			}
		}
		if g.running > g.max {
			t.Fatalf("%s: %d running, max %d", step, g.running, g.max)
		}
	}
	check("all held")
	g.release("a") // a holds 2 = max-1 while b waits: b1, though a1 came first
	check("first release", wb1)
	g.release("a") // a holds 1: a1 (a is first in the order)
	check("second release", wb1, wa1)
	g.release("a") // round robin: b2
	check("third release", wb1, wa1, wb2)
	g.release("b") // only a waits: a2, uncapped
	check("fourth release", wb1, wa1, wb2, wa2)
	if g.held["a"] != 2 || g.held["b"] != 1 {
		t.Fatalf("held %v, want a 2, b 1", g.held)
	}
	g.release("a")
	g.release("a")
	g.release("b")
	if g.running != 0 || len(g.held) != 0 || g.waiting() != 0 {
		t.Fatalf("running %d, held %v, waiting %d after every release", g.running, g.held, g.waiting())
	}
	// With nobody else waiting, one organization's waiters fill every slot.
	g = newColdGate(2)
	g.enqueue("a")
	g.enqueue("b")
	w1, w2 := g.enqueue("a"), g.enqueue("a")
	g.release("b")
	g.release("a")
	if !admitted(w1) || !admitted(w2) || g.held["a"] != 2 {
		t.Fatalf("a alone waiting: admitted %v %v, held %v; want both, a 2", admitted(w1), admitted(w2), g.held)
	}
}

func admitted(w *coldWaiter) bool {
	select {
	case <-w.admitted:
		return true
	default:
		return false
	}
}

// slowImages is testImages with the pull of "slow" held until release is closed.
type slowImages struct {
	testImages
	pulling chan struct{} // closed once the slow pull has begun
	release chan struct{}
	once    sync.Once
}

func (si *slowImages) Pull(ctx context.Context, ref string, creds *runtime.Credentials) (*Image, error) {
	if ref != "slow" {
		return si.testImages.Pull(ctx, ref, creds)
	}
	si.once.Do(func() { close(si.pulling) })
	select {
	case <-si.release:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	img, err := si.testImages.Pull(ctx, "busybox", creds)
	if img != nil {
		img.Ref = ref
	}
	return img, err
}

// TestColdGatePullHoldsNoSlot: with one cold-start slot, a create whose image pull hangs
// (a registry trickling bytes) holds no slot: another organization's create of a cached
// image starts meanwhile, and its `admit` step comes after its pull and network, before
// its root filesystem's mount.
func TestColdGatePullHoldsNoSlot(t *testing.T) {
	si := &slowImages{pulling: make(chan struct{}), release: make(chan struct{})}
	e := newEnvWith(t, func(c *Config) {
		c.ColdStarts = 1
		si.testImages = c.Images.(testImages)
		c.Images = si
	})
	// Set before any create runs (step reads it); the slow create's steps come after
	// the fast one's: its pull ends only when let go.
	var (
		mu    sync.Mutex
		steps []string
	)
	e.b.trace = func(step string, _ time.Duration) {
		mu.Lock()
		steps = append(steps, step)
		mu.Unlock()
	}
	slow := make(chan error, 1)
	go func() {
		_, err := e.b.Create(context.Background(), &runtime.Spec{ID: "cold-slow",
			Container: runtime.Container{Image: "slow", Command: "sleep", Args: []string{"3600"}},
			Meta:      map[string]string{runtime.MetaOrg: "a"}})
		slow <- err
	}()
	<-si.pulling
	e.create(runtime.Spec{ID: "cold-fast", Container: runtime.Container{Command: "sleep", Args: []string{"3600"}},
		Meta: map[string]string{runtime.MetaOrg: "b"}})
	select {
	case err := <-slow:
		t.Fatalf("the slow create ended before its pull was let go: %v", err)
	default:
	}
	close(si.release)
	if err := <-slow; err != nil {
		t.Fatalf("slow create: %v", err)
	}
	mu.Lock()
	got := slices.Clone(steps)
	mu.Unlock()
	pull, admit, overlay := slices.Index(got, "pull"), slices.Index(got, "admit"), slices.Index(got, "overlay")
	if pull < 0 || admit < pull || overlay < admit {
		t.Fatalf("steps %v: want pull, then admit, then overlay", got)
	}
}

// TestColdGateGroupOneSlot: with one cold-start slot, a group's containers (each launch
// admitted on its own) take it in turn: the create neither deadlocks nor fails.
func TestColdGateGroupOneSlot(t *testing.T) {
	e := newEnvWith(t, func(c *Config) { c.ColdStarts = 1 })
	spec := groupSpec("cold-grp")
	spec.Meta = map[string]string{runtime.MetaOrg: "a"}
	e.create(spec)
	g := e.b.cold
	g.mu.Lock()
	running, held := g.running, len(g.held)
	g.mu.Unlock()
	if running != 0 || held != 0 || g.waiting() != 0 {
		t.Fatalf("after the create: %d running, %d organizations holding, %d waiting", running, held, g.waiting())
	}
}
