package local

import (
	"context"
	"slices"
	"sync"
	"testing"
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
