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

// TestColdGateCancel: a waiter whose context ends leaves the queue; a slot it was
// handed meanwhile goes on to the next.
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
