package local

import (
	"context"
	"sync"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// coldGate admits cold starts (Creates the warm pool does not serve: a new container,
// ~70 ms of CPU each on a 2-core host) to their CPU-heavy part only: the root filesystem
// mount, the bundle, `runc run` / `runsc` and (gVisor) the agent's handshake. What
// waits on others — the image pull, the volumes and snapshot restores, the network
// setup, a fork's wait for its source's checkpoint — runs before a start is admitted
// (or, for a fork, with its slot given back), so a slow registry or a huge image holds
// no slot. At most max starts are admitted at once, and when more wait:
//   - the organizations (Spec.Meta[runtime.MetaOrg]) are served round robin, each in
//     arrival order, so one organization's burst of 50 does not starve another's
//     create: that create waits for about one start per organization ahead of it, not
//     for the whole burst;
//   - one organization holds at most max-1 slots while another organization waits, so
//     it can never hold every slot then.
//
// Claims from the warm pool and the pool's refills are cheap or yield and are not gated.
//
// The fork-sentry gate (forkSentry, Config.ForkSentries) is a coldGate too: it bounds,
// with the same fairness, the forks' sandboxes made and waiting for their source's
// checkpoint, which hold no cold-start slot while they wait.
type coldGate struct {
	max int

	mu      sync.Mutex
	running int
	held    map[string]int           // admitted starts by organization
	queues  map[string][]*coldWaiter // waiters by organization, in arrival order
	order   []string                 // organizations with waiters, next served first
}

type coldWaiter struct {
	org      string
	admitted chan struct{} // closed when admitted
	done     bool          // admitted (or gone), under coldGate.mu
}

// defaultForkSentries is the default Config.ForkSentries for n CPUs: a fork's sandbox
// waiting for its source's checkpoint costs memory (its sentry and gofer), not CPU; as
// many as cold starts keep the forks of a burst going while bounding what they hold.
func defaultForkSentries(n int) int { return max(4, 2*n) }

// defaultColdStarts is the default Config.ColdStarts for n CPUs: enough to keep them
// busy through a start's waits (mounts, runc, the agent's handshake), few enough that
// the first starts of a burst finish first instead of all finishing late.
func defaultColdStarts(n int) int { return max(4, 2*n) }

func newColdGate(n int) *coldGate {
	return &coldGate{max: n, held: map[string]int{}, queues: map[string][]*coldWaiter{}}
}

// acquire waits until org may start a container; release must be called once the start
// is done. It fails only when ctx ends first.
func (g *coldGate) acquire(ctx context.Context, org string) (release func(), err error) {
	if g == nil {
		return func() {}, nil
	}
	w := g.enqueue(org)
	if w == nil {
		return func() { g.release(org) }, nil
	}
	select {
	case <-w.admitted:
		return func() { g.release(org) }, nil
	case <-ctx.Done():
	}
	g.abandon(w)
	return nil, ctx.Err()
}

// enqueue admits org at once (nil) when a slot is free and nobody waits, else queues a
// waiter for it.
func (g *coldGate) enqueue(org string) *coldWaiter {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.running < g.max && len(g.order) == 0 {
		g.running++
		g.held[org]++
		return nil
	}
	w := &coldWaiter{org: org, admitted: make(chan struct{})}
	if len(g.queues[org]) == 0 {
		g.order = append(g.order, org)
	}
	g.queues[org] = append(g.queues[org], w)
	return w
}

// abandon takes back waiter w, whose context ended: out of its queue, or, when it was
// admitted meanwhile, its slot goes on to the next waiter.
func (g *coldGate) abandon(w *coldWaiter) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if w.done { // admitted meanwhile: hand the slot on
		g.releaseLocked(w.org)
		return
	}
	w.done = true
	q := g.queues[w.org]
	for i, x := range q {
		if x == w {
			q = append(q[:i], q[i+1:]...)
			break
		}
	}
	if len(q) == 0 {
		delete(g.queues, w.org)
		g.dropOrderLocked(w.org)
	} else {
		g.queues[w.org] = q
	}
}

func (g *coldGate) release(org string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.releaseLocked(org)
}

func (g *coldGate) releaseLocked(org string) {
	g.running--
	if g.held[org]--; g.held[org] <= 0 {
		delete(g.held, org)
	}
	g.admitLocked()
}

func (g *coldGate) dropOrderLocked(org string) {
	for i, o := range g.order {
		if o == org {
			g.order = append(g.order[:i], g.order[i+1:]...)
			return
		}
	}
}

// admitLocked admits waiters while there is room: the first waiter of the first
// organization in the order that may take one more slot (below max-1 held while other
// organizations wait), which then goes to the back if it has more. An organization
// passed over keeps its place. (Some organization may always go: two that each hold
// max-1 slots would hold more than max.)
func (g *coldGate) admitLocked() {
	perOrg := max(1, g.max-1)
	for g.running < g.max && len(g.order) > 0 {
		i := 0
		if len(g.order) > 1 {
			for i < len(g.order) && g.held[g.order[i]] >= perOrg {
				i++
			}
			if i == len(g.order) {
				return
			}
		}
		org := g.order[i]
		g.order = append(g.order[:i], g.order[i+1:]...)
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
		g.held[org]++
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

// coldStartKey marks a Create's context as a cold start of an organization: launch
// admits the start's CPU-heavy part through the gate (coldStart). A pool refill's
// context has no mark and is not gated.
type coldStartKey struct{}

// withColdStart marks ctx as a cold start of org (for launch, and a group's launches).
func withColdStart(ctx context.Context, org string) context.Context {
	return context.WithValue(ctx, coldStartKey{}, org)
}

// coldSlot is one launch's hold on the gate: enter takes a slot (once), leave gives it
// back (idempotent), and a launch defers leave.
type coldSlot struct {
	g       *coldGate
	org     string
	gated   bool
	release func()
}

// coldStart is launch's slot for a start with ctx (not gated: no gate, or no mark).
func (b *Backend) coldStart(ctx context.Context) *coldSlot {
	org, ok := ctx.Value(coldStartKey{}).(string)
	return &coldSlot{g: b.cold, org: org, gated: ok && b.cold != nil}
}

// forkSentry is fork s's slot of the fork-sentry gate (b.forks, also a coldGate: round
// robin over organizations, one holding at most max-1 slots while another waits): taken
// before the fork's `runsc create`, held until its sandbox is restored or gone (launch).
// Not gated: no gate, not a fork, or a group's fork (its sandbox is made only by `runsc
// restore`, after the wait).
func (b *Backend) forkSentry(ctx context.Context, s *sandbox) *coldSlot {
	org, _ := ctx.Value(coldStartKey{}).(string)
	if org == "" {
		org = s.spec.Meta[runtime.MetaOrg]
	}
	return &coldSlot{g: b.forks, org: org, gated: b.forks != nil && s.fork != nil && !s.inGVisorGroup()}
}

// enter waits for a slot; it reports whether it waited at all (a gated start).
func (c *coldSlot) enter(ctx context.Context) (bool, error) {
	if !c.gated || c.release != nil {
		return false, nil
	}
	release, err := c.g.acquire(ctx, c.org)
	if err != nil {
		return true, err
	}
	c.release = release
	return true, nil
}

func (c *coldSlot) leave() {
	if c.release != nil {
		c.release()
		c.release = nil
	}
}

// forkReady waits for fork source fp's checkpoint, with the slot given back while it
// waits (a checkpoint can take long) and taken again after.
func (c *coldSlot) forkReady(ctx context.Context, fp *forkParams) error {
	if fp.ready != nil {
		select {
		case <-fp.ready:
		default:
			held := c.release != nil
			c.leave()
			if err := fp.wait(ctx); err != nil {
				return err
			}
			if held {
				if _, err := c.enter(ctx); err != nil {
					return err
				}
			}
		}
	}
	return fp.wait(ctx)
}
