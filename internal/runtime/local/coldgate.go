package local

import (
	"context"
	"sync"
)

// coldGate admits cold starts (Creates the warm pool does not serve: a new container,
// ~70 ms of CPU each on a 2-core host): at most max run at once, and when more wait,
// the organizations (Spec.Meta[runtime.MetaOrg]) are served round robin, each in
// arrival order. So one organization's burst of 50 does not starve another's create:
// that create waits for about one start per organization ahead of it, not for the
// whole burst. Claims from the warm pool are cheap and not gated.
type coldGate struct {
	max int

	mu      sync.Mutex
	running int
	queues  map[string][]*coldWaiter // waiters by organization, in arrival order
	order   []string                 // organizations with waiters, next served first
}

type coldWaiter struct {
	admitted chan struct{} // closed when admitted
	done     bool          // admitted (or gone), under coldGate.mu
}

// defaultColdStarts is the default Config.ColdStarts for n CPUs: enough to keep them
// busy through a start's waits (mounts, runc, the agent's handshake), few enough that
// the first starts of a burst finish first instead of all finishing late.
func defaultColdStarts(n int) int { return max(4, 2*n) }

func newColdGate(n int) *coldGate {
	return &coldGate{max: n, queues: map[string][]*coldWaiter{}}
}

// acquire waits until org may start a container; release must be called once the start
// is done. It fails only when ctx ends first.
func (g *coldGate) acquire(ctx context.Context, org string) (release func(), err error) {
	if g == nil {
		return func() {}, nil
	}
	g.mu.Lock()
	if g.running < g.max && len(g.order) == 0 {
		g.running++
		g.mu.Unlock()
		return g.release, nil
	}
	w := &coldWaiter{admitted: make(chan struct{})}
	if len(g.queues[org]) == 0 {
		g.order = append(g.order, org)
	}
	g.queues[org] = append(g.queues[org], w)
	g.mu.Unlock()
	select {
	case <-w.admitted:
		return g.release, nil
	case <-ctx.Done():
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if w.done { // admitted meanwhile: hand the slot on
		g.running--
		g.admitLocked()
		return nil, ctx.Err()
	}
	w.done = true
	q := g.queues[org]
	for i, x := range q {
		if x == w {
			q = append(q[:i], q[i+1:]...)
			break
		}
	}
	if len(q) == 0 {
		delete(g.queues, org)
		for i, o := range g.order {
			if o == org {
				g.order = append(g.order[:i], g.order[i+1:]...)
				break
			}
		}
	} else {
		g.queues[org] = q
	}
	return nil, ctx.Err()
}

func (g *coldGate) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.running--
	g.admitLocked()
}

// admitLocked admits waiters while there is room: the first waiter of the organization
// at the head of the order, which then goes to the back if it has more.
func (g *coldGate) admitLocked() {
	for g.running < g.max && len(g.order) > 0 {
		org := g.order[0]
		g.order = g.order[1:]
		q := g.queues[org]
		w := q[0]
		if len(q) > 1 {
			g.queues[org] = q[1:]
			g.order = append(g.order, org)
		} else {
			delete(g.queues, org)
		}
		w.done = true
		g.running++
		close(w.admitted)
	}
}

// waiting is how many starts wait (tests).
func (g *coldGate) waiting() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for _, q := range g.queues {
		n += len(q)
	}
	return n
}
