package gateway

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/internal/placement"
	"github.com/sandboxd/sandboxd/internal/policy"
	"github.com/sandboxd/sandboxd/internal/runner"
)

// Defaults of the runner views.
const (
	// DefaultViewInterval is how often the gateway asks every runner for its capacity and
	// usage (its heartbeat with the runner) and re-reads the runners' policies.
	DefaultViewInterval = time.Second
	// DefaultDisconnectAfter is how long a runner may go unheard before it is marked
	// disconnected when its probes time out rather than fail outright.
	DefaultDisconnectAfter = 3 * time.Second
)

// view is the gateway's last-known picture of one runner. Placement reads it instead of
// asking every runner on every create: the picture is at most one interval old, and the
// creates this gateway made since it was taken are added on top (see confirmed), so
// capacity is never handed out twice by one gateway.
type view struct {
	connected bool
	why       string    // why not connected
	heardAt   time.Time // last successful probe
	capacity  runner.Capacity
	// policy is the last policy read (parsed from policyDoc, revision policyRev).
	policy    *policy.Policy
	policyDoc []byte
	policyRev int64
	// recent are creates confirmed by the runner after the probe behind capacity started.
	recent []confirmedCreate
}

type confirmedCreate struct {
	need placement.Resources
	at   time.Time
}

// runnerViews keeps one view per runner, refreshed by probe.
type runnerViews struct {
	s               *Server
	disconnectAfter time.Duration

	mu      sync.Mutex
	views   []view
	loaded  bool
	refresh sync.Mutex    // one probe round at a time
	poked   chan struct{} // asks run for a probe now
}

func newRunnerViews(s *Server, disconnectAfter time.Duration) *runnerViews {
	if disconnectAfter <= 0 {
		disconnectAfter = DefaultDisconnectAfter
	}
	return &runnerViews{s: s, disconnectAfter: disconnectAfter, views: make([]view, len(s.runners)), poked: make(chan struct{}, 1)}
}

// run refreshes the views every interval until ctx ends.
func (v *runnerViews) run(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		v.probe(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-v.poked:
		}
	}
}

// poke asks for a probe soon, e.g. after a delete freed capacity.
func (v *runnerViews) poke() {
	select {
	case v.poked <- struct{}{}:
	default:
	}
}

// probe asks every runner for its capacity and usage, in parallel. A runner that fails
// outright (refused, reset, TLS) is disconnected at once; one that only times out keeps
// its last view for disconnectAfter.
func (v *runnerViews) probe(ctx context.Context) {
	v.refresh.Lock()
	defer v.refresh.Unlock()
	type result struct {
		started time.Time
		c       runner.Capacity
		err     error
	}
	res := make([]result, len(v.s.runners))
	var wg sync.WaitGroup
	for i, r := range v.s.runners {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(ctx, viewTimeout)
			defer cancel()
			res[i].started = time.Now()
			res[i].c, res[i].err = r.Capacity(ctx)
		})
	}
	wg.Wait()
	if ctx.Err() != nil {
		return
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	for i, r := range res {
		w := &v.views[i]
		switch {
		case r.err == nil:
			if !w.connected && v.loaded {
				v.s.log.Info("runner connected", "runner", v.s.runners[i].ID())
			}
			w.connected, w.why, w.heardAt, w.capacity = true, "", time.Now(), r.c
			w.recent = keepAfter(w.recent, r.started)
		case w.connected && isTimeout(r.err) && time.Since(w.heardAt) < v.disconnectAfter:
			// Slow, not gone: keep the last view a little longer.
		default:
			v.disconnect(i, w, r.err.Error())
		}
	}
	v.loaded = true
}

// disconnect marks view w (of runner i) disconnected; the caller holds v.mu.
func (v *runnerViews) disconnect(i int, w *view, why string) {
	if w.connected {
		v.s.log.Warn("runner disconnected: no new sandboxes go to it", "runner", v.s.runners[i].ID(), "err", why)
	}
	w.connected, w.why = false, why
	w.recent = nil
}

// markDown disconnects runner i at once: a call to it failed as if it were gone. The next
// successful probe reconnects it.
func (v *runnerViews) markDown(i int, err error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.disconnect(i, &v.views[i], err.Error())
}

// confirmed records that runner i took a sandbox needing need: its usage counts it until
// a probe started afterwards reports it.
func (v *runnerViews) confirmed(i int, need placement.Resources) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.views[i].recent = append(v.views[i].recent, confirmedCreate{need: need, at: time.Now()})
}

// snapshot returns the placement view of every runner: capacity and usage as last
// probed (probing first when no probe has completed yet, in a gateway that just started)
// and each runner's current policy. Policies are read on every placement so an
// administrator's change applies to the next create; the policy source answers with the
// last policy it read while the store is unreachable.
func (v *runnerViews) snapshot(ctx context.Context) []placement.Runner {
	v.ensureLoaded(ctx)
	type pol struct {
		p   *policy.Policy
		rev string
		err error
	}
	pols := make([]pol, len(v.s.runners))
	var wg sync.WaitGroup
	for i, r := range v.s.runners {
		wg.Go(func() { pols[i].p, pols[i].rev, pols[i].err = v.policyOf(ctx, i, r.ID()) })
	}
	wg.Wait()

	v.mu.Lock()
	defer v.mu.Unlock()
	out := make([]placement.Runner, len(v.views))
	for i, w := range v.views {
		r := v.s.runners[i]
		out[i] = placement.Runner{ID: r.ID(), Group: r.Group(), NotReady: w.why}
		owner, known := v.s.runnerOwner(r)
		out[i].Owner = owner
		switch {
		case !known:
			// Not verified yet: it takes nothing, and is nobody's to see.
			out[i].OwnerUnknown, out[i].NotReady = true, "its owner is not known yet"
			continue
		case !w.connected:
			if out[i].NotReady == "" {
				out[i].NotReady = "not heard from yet"
			}
			continue
		case pols[i].err != nil:
			out[i].NotReady = pols[i].err.Error()
			continue
		}
		used, n := w.usage()
		c := w.capacity
		out[i].Ready = true
		out[i].Policy, out[i].PolicyRevision = pols[i].p, pols[i].rev
		out[i].Room = c.Room(used, n)
		out[i].Defaults = policy.DefaultsOf(c.Defaults)
		out[i].RuntimeClasses = c.RuntimeClasses
		out[i].Support = c.Support
		out[i].EngineImage, out[i].EngineRuntimeClass, out[i].EngineUnavailable = c.EngineImage, c.EngineRuntimeClass, c.EngineUnavailable
		out[i].CachedSnapshots = c.CachedSnapshots
	}
	return out
}

// usage is what the runner's live sandboxes request as last probed plus the creates
// confirmed since, and how many sandboxes that is.
func (w *view) usage() (placement.Resources, int) {
	used, n := w.capacity.Used(), w.capacity.Running
	for _, cc := range w.recent {
		used.MilliCPU += cc.need.MilliCPU
		used.MemoryBytes += cc.need.MemoryBytes
		used.GPUs += cc.need.GPUs
		n++
	}
	return used, n
}

// policyOf reads runner i's policy, parsing it only when its revision changed.
func (v *runnerViews) policyOf(ctx context.Context, i int, id string) (*policy.Policy, string, error) {
	var (
		doc []byte
		rev int64
	)
	if v.s.policies != nil {
		var err error
		// A tenant's runner has its policy in its organization's record (the control
		// plane's), when the source knows other organizations' runners.
		read := v.s.policies.Policy
		if owner, known := v.s.runnerOwner(v.s.runners[i]); known && owner != "" {
			if os, ok := v.s.policies.(policy.OrgSource); ok {
				read = func(ctx context.Context, id string) ([]byte, int64, error) { return os.PolicyOf(ctx, owner, id) }
			}
		}
		if doc, rev, err = read(ctx, id); err != nil {
			return nil, "", fmt.Errorf("policy of runner %s unavailable: %w", id, err)
		}
	}
	v.mu.Lock()
	w := &v.views[i]
	if w.policy != nil && w.policyRev == rev && bytes.Equal(w.policyDoc, doc) {
		p := w.policy
		v.mu.Unlock()
		return p, strconv.FormatInt(rev, 10), nil
	}
	v.mu.Unlock()
	p := &policy.Policy{}
	if len(doc) > 0 {
		parsed, err := policy.Parse(doc)
		if err != nil {
			return nil, "", fmt.Errorf("policy of runner %s: %w", id, err)
		}
		p = parsed
	}
	v.mu.Lock()
	w.policy, w.policyRev, w.policyDoc = p, rev, doc
	v.mu.Unlock()
	return p, strconv.FormatInt(rev, 10), nil
}

func (v *runnerViews) ensureLoaded(ctx context.Context) {
	v.mu.Lock()
	loaded := v.loaded
	v.mu.Unlock()
	if !loaded {
		v.probe(ctx)
	}
}

// runner returns runner i's view (a copy) as last probed.
func (v *runnerViews) runner(ctx context.Context, i int) view {
	v.ensureLoaded(ctx)
	_, _, _ = v.policyOf(ctx, i, v.s.runners[i].ID())
	v.mu.Lock()
	defer v.mu.Unlock()
	w := v.views[i]
	w.recent = append([]confirmedCreate(nil), w.recent...)
	return w
}

func keepAfter(cs []confirmedCreate, t time.Time) []confirmedCreate {
	out := cs[:0]
	for _, c := range cs {
		if c.at.After(t) {
			out = append(out, c)
		}
	}
	return out
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}

// edgeOf is where runner id publishes endpoints, as it last said ("" when it has no edge
// or is unknown).
// dataPlaneOf is runner id's data-plane URI as last probed ("" when it serves none).
func (v *runnerViews) dataPlaneOf(ctx context.Context, id string) string {
	v.ensureLoaded(ctx)
	v.mu.Lock()
	defer v.mu.Unlock()
	for i, r := range v.s.runners {
		if r.ID() == id && v.views[i].connected {
			return v.views[i].capacity.DataPlaneURI
		}
	}
	return ""
}

func (v *runnerViews) edgeOf(id string) (domain string, port int) {
	v.mu.Lock()
	defer v.mu.Unlock()
	for i, r := range v.s.runners {
		if r.ID() == id {
			c := v.views[i].capacity
			return c.EdgeDomain, c.EdgePort
		}
	}
	return "", 0
}

// builderView is what build placement (buildsvc.go) needs of one runner.
type builderView struct {
	id string
	// buildable: connected, reporting a builder image, and its handle carries builds;
	// else unavailable says why, and mayBuild whether it may still (not heard from yet,
	// or disconnected after reporting a builder image).
	buildable, mayBuild bool
	unavailable         string
	room                placement.Room
	// owner and ownerKnown: Server.runnerOwner's; a build runs only on a runner that
	// serves its organization.
	owner      string
	ownerKnown bool
}

// serves reports whether the runner may run a build of organization org.
func (b builderView) serves(org string) bool { return b.ownerKnown && placement.Serves(b.owner, org) }

// builders returns the runners as builds see them, and whether a probe has completed.
func (v *runnerViews) builders() ([]builderView, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	out := make([]builderView, len(v.views))
	for i, w := range v.views {
		r := v.s.runners[i]
		b := builderView{id: r.ID()}
		b.owner, b.ownerKnown = v.s.runnerOwner(r)
		_, carries := r.(buildRunner)
		switch {
		case !carries:
			b.unavailable = "its connection carries no builds"
		case !w.connected && w.heardAt.IsZero():
			b.unavailable, b.mayBuild = "not heard from yet", true
		case !w.connected:
			b.unavailable, b.mayBuild = "not connected: "+w.why, w.capacity.BuilderImage != ""
		case w.capacity.BuilderImage == "":
			b.unavailable = w.capacity.BuildUnavailable
			if b.unavailable == "" {
				b.unavailable = "it reports no builder image"
			}
		default:
			b.buildable = true
			used, n := w.usage()
			b.room = w.capacity.Room(used, n)
		}
		out[i] = b
	}
	return out, v.loaded
}
