package local

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/textclip"
)

// Image pre-pull (issue 22): every warm target the runner is sent (a live template its
// policy accepts; Size 0 when the template has no warm pool) has the images of all its
// containers — primary, init containers, sidecars — pulled into the image store before
// any Create of it, with the target's pull credentials (the platform registry's token
// of the template's organization, or the template's own), whatever its runtime class
// or shape. Targets the warm pool keeps containers of are left to the pool (its refill
// pulls them; pool.go).
//
// The pre-puller runs in one goroutine of its own, one pull at a time, never on a
// Create's path (a Create of the same image meanwhile pulls on its own; the image store
// joins identical pulls). The images are deduplicated by reference and bounded: the
// first Config.MaxPrepull references in the order the targets were sent (the gateway
// sends the oldest templates first); the rest are not pre-pulled (logged). A pulled
// reference is pulled again (a tag re-resolved, credentials checked, mostly a HEAD
// request) every prepullRefresh, not more often, also when it leaves the set and comes
// back; a failing pull is logged and retried after a backoff (prepullRetryMin doubling
// to prepullRetryMax), never an error of SetWarmPools.
//
// Image garbage collection spares the images of the current set (PrepulledImages, used
// by internal/stack's GC): at most MaxPrepull images per runner. An image whose
// template is gone (deleted, or no longer sent) returns to the store's normal rules and
// is removed by the next GC when no sandbox uses it.

// DefaultMaxPrepull is Config.MaxPrepull's default.
const DefaultMaxPrepull = 64

const (
	prepullRefresh  = 5 * time.Minute
	prepullRetryMin = 30 * time.Second
	prepullRetryMax = 10 * time.Minute
	prepullTimeout  = 15 * time.Minute // one pull
)

// prepullWant is an image to keep pulled.
type prepullWant struct {
	ref   string
	creds *runtime.Credentials
	key   string // the target that wants it first (for logs)
}

type prepullState struct {
	digest   string    // of the last successful pull; "" before one
	due      time.Time // next pull
	failures int
	lastErr  string    // of the last failed pull (clipped); "" after a success
	lastAt   time.Time // the last pull started
}

type prepuller struct {
	pull func(ctx context.Context, ref string, creds *runtime.Credentials) (*Image, error)
	log  *slog.Logger
	max  int

	refresh, retryMin, retryMax time.Duration

	mu      sync.Mutex
	want    []prepullWant
	dropped int                      // wanted references beyond max (not pre-pulled)
	state   map[string]*prepullState // by reference
	pulling string                   // the reference being pulled; "" none
	started bool
	closed  bool
	pulls   int // finished pulls, successful or not (tests)

	wake   chan struct{}
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
}

func newPrepuller(pull func(context.Context, string, *runtime.Credentials) (*Image, error), log *slog.Logger, maxImages int) *prepuller {
	ctx, cancel := context.WithCancel(context.Background())
	return &prepuller{
		pull: pull, log: log, max: maxImages,
		refresh: prepullRefresh, retryMin: prepullRetryMin, retryMax: prepullRetryMax,
		state: map[string]*prepullState{},
		wake:  make(chan struct{}, 1),
		ctx:   ctx, cancel: cancel,
		done: make(chan struct{}),
	}
}

// prepullWants lists the images of targets (all but those skip marks), deduplicated by
// reference, in target order (each target's primary container, then its init
// containers, then its sidecars), at most maxImages; dropped counts the references left
// out by the bound.
func prepullWants(targets []runtime.WarmTarget, skip map[int]bool, maxImages int) (out []prepullWant, dropped int) {
	seen := map[string]bool{}
	add := func(key string, c *runtime.Container) {
		if c.Image == "" || seen[c.Image] {
			return
		}
		seen[c.Image] = true
		if len(out) >= maxImages {
			dropped++
			return
		}
		var cr *runtime.Credentials
		if c.PullCredentials != nil {
			cc := *c.PullCredentials
			cr = &cc
		}
		out = append(out, prepullWant{ref: c.Image, creds: cr, key: key})
	}
	for i := range targets {
		if skip[i] {
			continue
		}
		t := &targets[i]
		add(t.Key, &t.Spec.Container)
		for j := range t.Spec.InitContainers {
			add(t.Key, &t.Spec.InitContainers[j])
		}
		for j := range t.Spec.Sidecars {
			add(t.Key, &t.Spec.Sidecars[j])
		}
	}
	return out, dropped
}

// set replaces the images to keep pulled; dropped counts those left out by the bound.
func (p *prepuller) set(want []prepullWant, dropped int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	p.want, p.dropped = want, dropped
	wanted := map[string]bool{}
	for _, w := range want {
		wanted[w.ref] = true
	}
	now := time.Now()
	for ref, st := range p.state {
		// A reference no longer wanted is forgotten once it would be due anyway, so one
		// that comes back soon is not pulled again before its time.
		if !wanted[ref] && !now.Before(st.due) {
			delete(p.state, ref)
		}
	}
	if len(want) > 0 && !p.started {
		p.started = true
		go p.run()
	}
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// images returns the digests of the wanted images pulled so far.
func (p *prepuller) images() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for _, w := range p.want {
		if st := p.state[w.ref]; st != nil && st.digest != "" {
			out = append(out, st.digest)
		}
	}
	return out
}

// next returns the first wanted image that is due, or how long until one is.
func (p *prepuller) next() (prepullWant, time.Duration, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	wait := time.Duration(-1)
	for _, w := range p.want {
		st := p.state[w.ref]
		if st == nil || !now.Before(st.due) {
			return w, 0, true
		}
		if d := st.due.Sub(now); wait < 0 || d < wait {
			wait = d
		}
	}
	return prepullWant{}, wait, false
}

func (p *prepuller) run() {
	defer close(p.done)
	for {
		w, wait, ok := p.next()
		if ok {
			p.pullOne(w)
			if p.ctx.Err() != nil {
				return
			}
			continue
		}
		var (
			timer <-chan time.Time
			t     *time.Timer
		)
		if wait >= 0 {
			t = time.NewTimer(wait)
			timer = t.C
		}
		select {
		case <-p.ctx.Done():
		case <-p.wake:
		case <-timer:
		}
		if t != nil {
			t.Stop()
		}
		if p.ctx.Err() != nil {
			return
		}
	}
}

func (p *prepuller) pullOne(w prepullWant) {
	ctx, cancel := context.WithTimeout(p.ctx, prepullTimeout)
	start := time.Now()
	p.mu.Lock()
	p.pulling = w.ref
	p.mu.Unlock()
	img, err := p.pull(ctx, w.ref, w.creds)
	cancel()
	p.mu.Lock()
	p.pulling = ""
	p.mu.Unlock()
	if p.ctx.Err() != nil {
		return
	}
	p.mu.Lock()
	p.pulls++
	st := p.state[w.ref]
	if st == nil {
		st = &prepullState{}
		p.state[w.ref] = st
	}
	prev := st.digest
	st.lastAt = start
	if err != nil {
		st.failures++
		st.lastErr = textclip.Clip(err.Error(), runtime.MaxPrepullErrorLen)
		st.due = time.Now().Add(min(p.retryMin<<min(st.failures-1, 16), p.retryMax))
	} else {
		st.failures, st.digest, st.lastErr = 0, img.Digest, ""
		st.due = time.Now().Add(p.refresh)
	}
	due := st.due
	p.mu.Unlock()
	switch {
	case err != nil:
		p.log.Warn("image pre-pull failed; retrying later", "image", w.ref, "target", w.key, "retry_at", due.Format(time.RFC3339), "err", err)
	case prev != img.Digest:
		p.log.Info("image pre-pulled", "image", w.ref, "digest", img.Digest, "target", w.key, "took", time.Since(start).Round(time.Millisecond))
	default:
		p.log.Debug("image pre-pull refreshed", "image", w.ref, "digest", img.Digest)
	}
}

// close stops the pre-puller (a running pull is cancelled) and waits for it.
func (p *prepuller) close() {
	p.mu.Lock()
	p.closed = true
	started := p.started
	p.mu.Unlock()
	p.cancel()
	if started {
		<-p.done
	}
}

// report is the pre-puller's state per wanted image, in want order, bounded.
func (p *prepuller) report() runtime.PrepullReport {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := runtime.PrepullReport{LeftOut: p.dropped}
	for _, w := range p.want {
		if len(out.Images) >= runtime.MaxPrepullReportImages {
			out.LeftOut++
			continue
		}
		img := runtime.PrepullImage{Image: w.ref, Target: w.key, State: runtime.PrepullPending}
		if st := p.state[w.ref]; st != nil {
			img.LastError, img.LastAttempt, img.NextAttempt = st.lastErr, st.lastAt, st.due
			switch {
			case st.digest != "":
				img.State = runtime.PrepullPresent
			case st.failures > 0:
				img.State = runtime.PrepullFailed
			}
		}
		if p.pulling == w.ref {
			img.NextAttempt = time.Time{}
			if img.State != runtime.PrepullPresent { // a refresh of a present image stays PRESENT
				img.State = runtime.PrepullPulling
			}
		}
		out.Images = append(out.Images, img)
	}
	return out
}

// PrepullReport implements runtime.PrepullReporter: the images pre-pulled for the warm
// targets the pool does not keep (those it keeps are pulled by its refill), per image.
func (b *Backend) PrepullReport() runtime.PrepullReport {
	if b.prepull == nil {
		return runtime.PrepullReport{}
	}
	return b.prepull.report()
}

// PrepulledImages returns the digests of the images pre-pulled for the current warm
// targets, which image garbage collection spares (at most Config.MaxPrepull).
func (b *Backend) PrepulledImages() []string {
	if b.prepull == nil {
		return nil
	}
	return b.prepull.images()
}
