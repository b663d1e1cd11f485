package local

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/internal/failpoint"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1/agentv1connect"
	"github.com/sandboxd/sandboxd/internal/agent"
	"github.com/sandboxd/sandboxd/internal/agentconfig"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// The warm pool: after a Create of image X with runtime class C, the backend keeps up to
// PoolConfig.Size containers of (X, C) started in standby — root filesystem mounted,
// network set up, the agent serving but running nothing — so the next Create of (X, C)
// only configures one: cgroup limits, UTS hostname, etc files, then the agent's Start
// with the main command's config (env, files, user, working dir, argv, restart limit),
// exactly the config a cold Create would have written.
//
// A pooled container lives in <StateDir>/pool_<hex> (a name no sandbox id can have) under
// that container id (runtime id, cgroup, network attachment). A claim writes the
// sandbox's spec.json and info.json (with container_id) into it, starts the main command,
// then renames the dir over the sandbox's own, so every later call by sandbox id finds it,
// also after a restart; Recover destroys pool_ dirs it finds.
//
// Sizing (demand.go): a set is kept at PoolConfig.Size at least, and at what its recent
// demand asks for: the most Creates of the set seen within demandWindow (a burst), held
// for demandHold and then decaying by half every demandHalfLife, at most PoolConfig.Max.
// So after a burst of 50 the set refills to 50 for the next one, and it shrinks back
// (the excess destroyed) as demand stays low; idle sets go as before. What sets keep
// beyond Size comes out of one budget for the whole pool, PoolConfig.MemoryBytes counted
// at PooledContainerBytes per container, shared fairly (max-min: shareDemand) among the
// sets that want more.
//
// Refills start only while no Create is in flight, so they never compete with real
// Creates for long; up to PoolConfig.Refills (default GOMAXPROCS) run at once, spread
// round robin over the sets that want more. A refill already running when a Create
// comes finishes; no new one starts until no Create is in flight.
//
// Warm targets (SetWarmPools, templates' sandboxd.warmPool): the runner names specs the
// pool keeps at least a given number of containers ready for, before any Create of them
// (the first pull of the image happens then). A targeted (image, class) is kept at
// max(Size, its demand share, target), is exempt from idle expiry while targeted, and counts against
// PoolConfig.MaxTargeted for the whole backend; a target no longer sent returns to the
// idle rules (its idle time counts from then).
//
// Pull credentials (images of the platform registry, which the gateway mints per
// organization): a target whose spec carries them is kept in a set of its own keyed by
// the organization as well (Spec.Meta[runtime.MetaOrg]), refilled with the target's
// credentials (the latest sent: the gateway resends fresh ones every WarmInterval; they
// live in memory only). A Create that brings credentials claims only from the set of
// its own organization, and the claim still pulls the image with the Create's
// credentials and checks the digest (claim), so a claim never hands an organization a
// container of an image it cannot pull itself. A set keyed by an organization is never
// made by a Create (it would have no credentials to refill with), only by a target.

// PoolConfig configures the warm pool.
type PoolConfig struct {
	// Size is how many ready containers are kept per (image, runtime class); 0 disables
	// the pool.
	Size int
	// Idle is how long the containers of an (image, class) are kept after its last Create
	// (default 10 min).
	Idle time.Duration
	// MaxTargeted bounds the containers kept for warm targets (SetWarmPools) in total;
	// 0 disables warm targets (SetWarmPools then keeps nothing).
	MaxTargeted int
	// Max bounds the containers one (image, class) is kept at for its recent demand
	// (default DefaultPoolMax; never below Size).
	Max int
	// MemoryBytes is the budget of the containers kept beyond Size for demand, for the
	// whole pool, counted at PooledContainerBytes each (default DefaultPoolMemory;
	// negative: none, the pool keeps Size per set as before). With Size 0 nothing is
	// kept for demand (the pool serves warm targets only).
	MemoryBytes int64
	// Refills bounds the refills running at once (default GOMAXPROCS).
	Refills int

	now func() time.Time // tests: the pool's clock (default time.Now)
}

// Defaults of PoolConfig.
const (
	DefaultPoolMax    = 128
	DefaultPoolMemory = 512 << 20
	// PooledContainerBytes is what one ready pooled container is counted at against
	// PoolConfig.MemoryBytes: host memory of an idle busybox sandbox measured 3.2 MiB
	// (issue 25), rounded up. A pooled container has no memory limit of its own until
	// it is claimed, so its spec cannot say.
	PooledContainerBytes = 4 << 20
)

// DefaultMaxTargeted is a runner's default PoolConfig.MaxTargeted.
const DefaultMaxTargeted = 32

// PoolStats counts the pool's work since the Backend was made.
type PoolStats struct {
	Ready   int // pooled containers ready now
	Claims  int // Creates served from the pool
	Misses  int // Creates that found no usable pooled container
	Refills int // pooled containers started
	Dropped int // pooled containers destroyed unclaimed (idle, stale, drained, broken)
	// Targeted is how many ready containers the warm targets ask for now (after
	// MaxTargeted).
	Targeted int
	// Want is how many ready containers the pool aims at now, over all sets: each set's
	// Size, demand share and target (PoolSetStats.Want summed).
	Want int
	// Sets are the pool's sets now, in key order.
	Sets []PoolSetStats
	// ClaimTime is the time the Creates served from the pool spent in each step of the
	// claim, summed over Claims (for benchmarks' breakdowns).
	ClaimTime ClaimTimes
	// RecentClaims are the whole times (every step) of the last claims, oldest first, at
	// most recentClaims of them: benchmarks' percentiles of the claim itself.
	RecentClaims []time.Duration
}

// recentClaims bounds PoolStats.RecentClaims.
const recentClaims = 256

// PoolSetStats is one (image, class[, organization]) set of the pool.
type PoolSetStats struct {
	Image, Class, Org string
	Ready             int     // ready now
	Starting          int     // refills running
	Demand            float64 // its recent demand (demand.at)
	Want              int     // what it is kept at now: max(Size, its share of the demand budget, its target)
}

// ClaimTimes are the steps of a claim: the image check (Pull), limits, hostname, etc
// files and records (Setup), the sandbox's network rules (Rules), the agent's Start
// (Start) and the config file and the rename into place (Finish).
type ClaimTimes struct {
	Pull, Setup, Rules, Start, Finish time.Duration
}

// Total is the claim's whole time.
func (c ClaimTimes) Total() time.Duration {
	return c.Pull + c.Setup + c.Rules + c.Start + c.Finish
}

func (c *ClaimTimes) add(d ClaimTimes) {
	c.Pull += d.Pull
	c.Setup += d.Setup
	c.Rules += d.Rules
	c.Start += d.Start
	c.Finish += d.Finish
}

const poolPrefix = "pool_"

var _ runtime.WarmPooler = (*Backend)(nil)

// isPoolID reports whether a dir name is a pooled container's.
func isPoolID(name string) bool {
	rest, ok := strings.CutPrefix(name, poolPrefix)
	return ok && rest != "" && validID(rest)
}

type poolKey struct {
	image string // the reference as given
	class string
	// org is the organization the image is pulled for when pulled with credentials
	// ("" without credentials: such containers serve every organization).
	org string
}

// poolKeyOf is the pool key of spec (runtime class class), ok false when a pooled
// container may not serve it: credentials without an organization to key them by.
func poolKeyOf(spec *runtime.Spec, class string) (poolKey, bool) {
	k := poolKey{image: spec.Image, class: class}
	if spec.PullCredentials != nil {
		k.org = spec.Meta[runtime.MetaOrg]
		if k.org == "" {
			return poolKey{}, false
		}
	}
	return k, true
}

type pooled struct {
	s      *sandbox // id == cid == dir name
	digest string
	att    *Attachment
	// agent is a client of the standby agent whose connection startPooled opened (and
	// verified) with a Status call: the container is ready only once its agent answers,
	// and the claim's Start then needs no dial or handshake.
	agent *http.Client
}

// destroy tears the unclaimed container down.
func (pc *pooled) destroy(ctx context.Context, b *Backend) error {
	if pc.agent != nil {
		pc.agent.CloseIdleConnections()
	}
	return b.teardown(ctx, pc.s)
}

type poolSet struct {
	ready    []*pooled
	lastUse  time.Time
	failures int
	retryAt  time.Time
	// pullFailed: the image's last pull failed (a Create's or a refill's); no refill
	// pulls it again until a Create asks for the image again.
	pullFailed bool
	demand     demand
}

type pool struct {
	b           *Backend
	size        int
	idle        time.Duration
	maxTargeted int
	max         int // PoolConfig.Max
	budget      int // containers kept beyond Size for demand, in total
	maxRefills  int
	now         func() time.Time

	mu        sync.Mutex
	sets      map[poolKey]*poolSet
	targets   map[poolKey]int                  // warm targets: at least this many ready
	creds     map[poolKey]*runtime.Credentials // the targets' pull credentials (keys with an org)
	creating  int                              // real Creates in flight
	refilling chan struct{}                    // non-nil while refills run; closed when the last is done
	refills   map[string]poolKey               // refills running: container id → set
	starting  map[poolKey]int                  // refills running per set
	alloc     map[poolKey]int                  // sizes by demand (resize): at least size
	closed    bool
	stats     PoolStats
	recent    [recentClaims]time.Duration // the last claims' times, a ring (stats.Claims is its count)
	dropping  int                         // background teardowns of dropped containers running

	wake chan struct{}
	stop chan struct{}
	done chan struct{}
}

func newPool(b *Backend, cfg PoolConfig) *pool {
	p := makePool(b, cfg)
	go p.run()
	return p
}

// makePool is newPool without its goroutine (tests of the sizing).
func makePool(b *Backend, cfg PoolConfig) *pool {
	if cfg.Idle <= 0 {
		cfg.Idle = 10 * time.Minute
	}
	if cfg.Max <= 0 {
		cfg.Max = DefaultPoolMax
	}
	if cfg.MemoryBytes == 0 {
		cfg.MemoryBytes = DefaultPoolMemory
	}
	if cfg.Refills <= 0 {
		cfg.Refills = goruntime.GOMAXPROCS(0)
	}
	if cfg.now == nil {
		cfg.now = time.Now
	}
	if cfg.Size <= 0 {
		cfg.MemoryBytes = -1 // templates' warm pools only: nothing is kept for demand
	}
	p := &pool{
		b: b, size: cfg.Size, idle: cfg.Idle, maxTargeted: max(cfg.MaxTargeted, 0),
		max: max(cfg.Max, cfg.Size), budget: int(max(cfg.MemoryBytes, 0) / PooledContainerBytes),
		maxRefills: cfg.Refills, now: cfg.now,
		sets: map[poolKey]*poolSet{}, targets: map[poolKey]int{},
		refills: map[string]poolKey{}, starting: map[poolKey]int{}, alloc: map[poolKey]int{},
		wake: make(chan struct{}, 1),
		stop: make(chan struct{}),
		done: make(chan struct{}),
	}
	return p
}

func (p *pool) kick() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// createStarted notes a Create of key; poolable keys get (or keep) a pool.
func (p *pool) createStarted(key poolKey, poolable bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.creating++
	if !poolable || p.closed {
		return
	}
	set := p.sets[key]
	if set == nil && key.org != "" {
		return // only a target (with its credentials) makes such a set
	}
	if set == nil {
		set = &poolSet{}
		p.sets[key] = set
	}
	now := p.now()
	set.lastUse = now
	set.pullFailed = false
	set.demand.note(now, p.max)
	p.resizeLocked(now)
}

// pullFailed notes that a pull of key's image failed: no refill retries it before the
// next Create of key.
func (p *pool) pullFailed(key poolKey) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if set := p.sets[key]; set != nil {
		set.pullFailed = true
	}
}

func (p *pool) createEnded() {
	p.mu.Lock()
	p.creating--
	p.mu.Unlock()
	p.kick()
}

// take removes a ready container of key from the pool.
func (p *pool) take(key poolKey) *pooled {
	p.mu.Lock()
	defer p.mu.Unlock()
	set := p.sets[key]
	if set == nil || len(set.ready) == 0 {
		p.stats.Misses++
		return nil
	}
	pc := set.ready[0]
	set.ready = set.ready[1:]
	return pc
}

// giveBack returns an unused container to the pool (or destroys it if the pool is gone).
func (p *pool) giveBack(key poolKey, pc *pooled) {
	p.mu.Lock()
	set := p.sets[key]
	if set != nil && !p.closed && len(set.ready) < p.want(key) {
		set.ready = append([]*pooled{pc}, set.ready...)
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	p.drop(pc)
}

// drop destroys an unclaimed pooled container in the background.
func (p *pool) drop(pc *pooled) {
	p.mu.Lock()
	p.stats.Dropped++
	p.dropping++
	p.mu.Unlock()
	go func() {
		defer func() {
			p.mu.Lock()
			p.dropping--
			p.mu.Unlock()
		}()
		if err := pc.destroy(context.Background(), p.b); err != nil {
			p.b.log.Warn("destroy pooled container", "container", pc.s.cid, "err", err)
		}
	}()
}

// owns reports whether cid is one of this pool's containers (ready or being started).
func (p *pool) owns(cid string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.refills[cid]; ok {
		return true
	}
	for _, set := range p.sets {
		for _, pc := range set.ready {
			if pc.s.cid == cid {
				return true
			}
		}
	}
	return false
}

// run is the pool's goroutine: it drops idle sets and excess containers, and starts
// refills (up to maxRefills at once) while no Create is in flight.
func (p *pool) run() {
	defer close(p.done)
	tick := time.NewTicker(min(max(p.idle/4, 50*time.Millisecond), time.Second))
	defer tick.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-p.wake:
		case <-tick.C:
		}
		p.expire()
		for cid, key := range p.next() {
			go func() {
				p.refill(cid, key)
				p.kick() // there may be more to do
			}()
		}
	}
}

// expire destroys the containers of sets unused for longer than idle, and those beyond
// what a set is kept at now (its demand decayed, or the budget went to other sets).
func (p *pool) expire() {
	now := p.now()
	var gone []*pooled
	p.mu.Lock()
	for k, set := range p.sets {
		if p.targets[k] == 0 && now.Sub(set.lastUse) > p.idle {
			gone = append(gone, set.ready...)
			delete(p.sets, k)
		}
	}
	p.resizeLocked(now)
	for k, set := range p.sets {
		if w := p.want(k); len(set.ready) > w {
			gone = append(gone, set.ready[w:]...)
			set.ready = slices.Clip(set.ready[:w])
		}
	}
	p.mu.Unlock()
	for _, pc := range gone {
		p.drop(pc)
	}
}

// next picks the refills to start now (container id → set), round robin over the sets
// that want more, and marks them running.
func (p *pool) next() map[string]poolKey {
	p.mu.Lock()
	defer p.mu.Unlock()
	free := p.maxRefills - len(p.refills)
	if p.closed || p.creating > 0 || free <= 0 {
		return nil
	}
	now := p.now()
	for k := range p.targets { // a drain removed its set
		if p.sets[k] == nil {
			p.sets[k] = &poolSet{lastUse: now}
		}
	}
	p.resizeLocked(now)
	var keys []poolKey
	for k, set := range p.sets {
		if k.org != "" && p.creds[k] == nil {
			continue // no credentials to pull with (its target is gone)
		}
		if now.After(set.retryAt) && !set.pullFailed {
			keys = append(keys, k)
		}
	}
	slices.SortFunc(keys, comparePoolKeys)
	out := map[string]poolKey{}
	for free > 0 {
		picked := false
		for _, k := range keys {
			if free > 0 && len(p.sets[k].ready)+p.starting[k] < p.want(k) {
				cid := poolPrefix + randomHex(6)
				out[cid] = k
				p.refills[cid] = k
				p.starting[k]++
				free--
				picked = true
			}
		}
		if !picked {
			break
		}
	}
	if len(out) > 0 && p.refilling == nil {
		p.refilling = make(chan struct{})
	}
	return out
}

// refill starts one standby container cid for key (marked running by next).
func (p *pool) refill(cid string, key poolKey) {
	p.mu.Lock()
	creds := p.creds[key]
	p.mu.Unlock()
	pc, err := p.b.startPooled(context.Background(), cid, key, creds)
	p.mu.Lock()
	set := p.sets[key]
	keep := err == nil && set != nil && !p.closed && len(set.ready)+p.starting[key]-1 < p.want(key)
	if err != nil {
		if set != nil {
			set.failures++
			set.retryAt = time.Now().Add(min(time.Second<<min(set.failures, 6), time.Minute))
			var pe *pullError
			set.pullFailed = set.pullFailed || errors.As(err, &pe)
		}
	} else {
		p.stats.Refills++
		if set != nil {
			set.failures = 0
		}
	}
	if keep {
		set.ready = append(set.ready, pc)
	}
	if p.starting[key]--; p.starting[key] <= 0 {
		delete(p.starting, key)
	}
	p.mu.Unlock()
	if err != nil {
		p.b.log.Warn("warm pool: start container", "image", key.image, "class", key.class, "err", err)
	} else if !keep {
		p.mu.Lock()
		p.stats.Dropped++
		p.mu.Unlock()
		if err := pc.destroy(context.Background(), p.b); err != nil {
			p.b.log.Warn("destroy pooled container", "container", pc.s.cid, "err", err)
		}
	}
	// Only now, with a container not kept destroyed, is the refill done (drain waits
	// for the last one).
	p.mu.Lock()
	delete(p.refills, cid)
	if len(p.refills) == 0 && p.refilling != nil {
		close(p.refilling)
		p.refilling = nil
	}
	p.mu.Unlock()
}

// want is how many ready containers key's set is kept at: Size, its share of the demand
// budget (resizeLocked), its target. The caller holds p.mu.
func (p *pool) want(key poolKey) int {
	return max(p.size, p.alloc[key], p.targets[key])
}

// resizeLocked shares the demand budget among the sets by their demand at now. The
// caller holds p.mu.
func (p *pool) resizeLocked(now time.Time) {
	keys := make([]poolKey, 0, len(p.sets))
	for k := range p.sets {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, comparePoolKeys)
	wants := make([]int, len(keys))
	for i, k := range keys {
		wants[i] = sizeFor(p.sets[k].demand.at(now), p.size, p.max)
	}
	clear(p.alloc)
	for i, n := range shareDemand(wants, p.size, p.budget) {
		p.alloc[keys[i]] = n
	}
}

func comparePoolKeys(a, b poolKey) int {
	if c := strings.Compare(a.image, b.image); c != 0 {
		return c
	}
	if c := strings.Compare(a.class, b.class); c != 0 {
		return c
	}
	return strings.Compare(a.org, b.org)
}

// setTargets replaces the warm targets (sizes already bounded) and their pull
// credentials (for keys with an org).
func (p *pool) setTargets(targets map[poolKey]int, creds map[poolKey]*runtime.Credentials) {
	p.mu.Lock()
	p.creds = creds
	now := time.Now()
	for k := range p.targets {
		if targets[k] == 0 {
			if set := p.sets[k]; set != nil {
				set.lastUse = now // back to the idle rules, counted from now
			}
		}
	}
	for k, n := range targets {
		set := p.sets[k]
		if set == nil {
			set = &poolSet{}
			p.sets[k] = set
		}
		set.lastUse = now
		if p.targets[k] < n {
			set.pullFailed = false // a new (or larger) target tries the image again
		}
	}
	p.targets = targets
	p.mu.Unlock()
	p.kick()
}

// SetWarmPools implements runtime.WarmPooler: it replaces the warm targets. A target
// is kept only when a Create of its spec would claim from the pool (runc class, one
// container, default security, no volumes, the default disk limit; pull credentials
// only with the organization in Spec.Meta, which keys its set: poolKeyOf);
// sizes are bounded by runtime.MaxWarmSize each and PoolConfig.MaxTargeted in total,
// shared fairly (allocateWarm). Without a pool or with MaxTargeted 0 it keeps nothing.
// The images of every target the pool keeps no container of (Size 0, not poolable,
// beyond the bound) are pre-pulled (prepull.go).
func (b *Backend) SetWarmPools(_ context.Context, targets []runtime.WarmTarget) error {
	pooled := map[int]bool{} // targets (by index) the pool keeps containers of
	if b.pool != nil {
		b.setPoolTargets(targets, pooled)
	}
	if b.prepull != nil {
		want, dropped := prepullWants(targets, pooled, b.prepull.max)
		if dropped > 0 {
			b.log.Warn("image pre-pull: more images than the bound; pre-pulling the first", "max", b.prepull.max, "left_out", dropped)
		}
		b.prepull.set(want, dropped)
	}
	return nil
}

// setPoolTargets hands the poolable targets to the pool, noting in pooled the indexes
// of those it keeps containers of.
func (b *Backend) setPoolTargets(targets []runtime.WarmTarget, pooled map[int]bool) {
	var (
		ok   []runtime.WarmTarget
		keys []poolKey
		idx  []int
	)
	for i, t := range targets {
		if t.Size <= 0 {
			continue
		}
		rt, class, err := b.runtimeFor(t.Spec.RuntimeClass)
		key, keyed := poolKeyOf(&t.Spec, class)
		if err != nil || !keyed || rt.gvisor || t.Spec.Multi() || t.Spec.Image == "" || !b.poolServes(&t.Spec) {
			b.log.Debug("warm pool: target not poolable here", "target", t.Key, "image", t.Spec.Image, "class", t.Spec.RuntimeClass)
			continue
		}
		ok = append(ok, t)
		keys = append(keys, key)
		idx = append(idx, i)
	}
	want := map[poolKey]int{}
	creds := map[poolKey]*runtime.Credentials{}
	for i, n := range allocateWarm(ok, b.pool.maxTargeted) {
		if n > 0 {
			pooled[idx[i]] = true
			want[keys[i]] += n
			if c := ok[i].Spec.PullCredentials; c != nil {
				cc := *c
				creds[keys[i]] = &cc
			}
		}
	}
	b.pool.setTargets(want, creds)
}

// allocateWarm shares budget containers among targets (each at most its Size, at most
// runtime.MaxWarmSize): one at a time, round robin over the organizations (a Key's part
// before its first "/"), and within an organization over its targets, both in Key
// order, so one organization's templates cannot take a runner's whole budget while
// another's get none. It returns each target's share, by index.
func allocateWarm(targets []runtime.WarmTarget, budget int) []int {
	out := make([]int, len(targets))
	type org struct {
		name string
		idx  []int // targets, in Key order
		next int   // round-robin position in idx
	}
	byName := map[string]*org{}
	var orgs []*org
	order := make([]int, len(targets))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, c int) int { return strings.Compare(targets[a].Key, targets[c].Key) })
	for _, i := range order {
		name, _, _ := strings.Cut(targets[i].Key, "/")
		o := byName[name]
		if o == nil {
			o = &org{name: name}
			byName[name] = o
			orgs = append(orgs, o)
		}
		o.idx = append(o.idx, i)
	}
	wants := func(i int) bool { return out[i] < min(max(targets[i].Size, 0), runtime.MaxWarmSize) }
	for budget > 0 {
		gave := false
		for _, o := range orgs {
			if budget == 0 {
				break
			}
			for k := 0; k < len(o.idx); k++ { // its next target that wants more
				i := o.idx[(o.next+k)%len(o.idx)]
				if wants(i) {
					out[i]++
					budget--
					gave = true
					o.next = (o.next + k + 1) % len(o.idx)
					break
				}
			}
		}
		if !gave {
			break
		}
	}
	return out
}

// drain destroys every ready container and waits for a running refill; with stop, the
// pool also stops for good.
func (p *pool) drain(ctx context.Context, stop bool) error {
	p.mu.Lock()
	if stop && !p.closed {
		p.closed = true
		close(p.stop)
	}
	var gone []*pooled
	for k, set := range p.sets {
		gone = append(gone, set.ready...)
		delete(p.sets, k)
	}
	p.stats.Dropped += len(gone)
	refilling := p.refilling // refills whose set is gone destroy their containers themselves
	p.mu.Unlock()
	var errs []error
	for _, pc := range gone {
		if err := pc.destroy(ctx, p.b); err != nil {
			errs = append(errs, err)
		}
	}
	if refilling != nil {
		select {
		case <-refilling: // a refill whose set is gone destroys its container itself
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if stop {
		select {
		case <-p.done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	for { // background drops (rare: stale or broken containers, idle sets)
		p.mu.Lock()
		n := p.dropping
		p.mu.Unlock()
		if n == 0 {
			break
		}
		select {
		case <-time.After(5 * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return errors.Join(errs...)
}

// DrainPool destroys every idle pooled container (and one being started). The pool stays
// configured: the next Create refills it.
func (b *Backend) DrainPool(ctx context.Context) error {
	if b.pool == nil {
		return nil
	}
	return b.pool.drain(ctx, false)
}

// Close stops the warm pool and destroys its containers, and unmounts the volume pool
// when no sandbox volume or capture is in it (its snapshot cache stays in its image for
// the next Backend). Sandboxes are not touched: they keep running for the next Backend
// to recover.
func (b *Backend) Close(ctx context.Context) error {
	var err error
	if b.prepull != nil {
		b.prepull.close()
	}
	if b.pool != nil {
		err = b.pool.drain(ctx, true)
	}
	if b.ids != nil {
		b.ids.close()
	}
	// A dir of its own under /run/sandboxd (rootfsBase) goes once no mount point is left
	// in it (sandboxes kept running keep theirs, and the next start makes it again).
	if b.rootfsBase != "" && filepath.Dir(b.rootfsBase) == "/run/sandboxd" {
		_ = os.Remove(b.rootfsBase)
	}
	return errors.Join(err, b.vols.close())
}

// PoolStats returns the pool's counters (zero without a pool).
func (b *Backend) PoolStats() PoolStats {
	if b.pool == nil {
		return PoolStats{}
	}
	p := b.pool
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.stats
	now := p.now()
	keys := make([]poolKey, 0, len(p.sets))
	for k, set := range p.sets {
		st.Ready += len(set.ready)
		keys = append(keys, k)
	}
	slices.SortFunc(keys, comparePoolKeys)
	for _, k := range keys {
		set := p.sets[k]
		ss := PoolSetStats{Image: k.image, Class: k.class, Org: k.org, Ready: len(set.ready),
			Starting: p.starting[k], Demand: set.demand.at(now), Want: p.want(k)}
		st.Want += ss.Want
		st.Sets = append(st.Sets, ss)
	}
	for _, n := range p.targets {
		st.Targeted += n
	}
	n := min(st.Claims, recentClaims)
	st.RecentClaims = make([]time.Duration, 0, n)
	for i := st.Claims - n; i < st.Claims; i++ {
		st.RecentClaims = append(st.RecentClaims, p.recent[i%recentClaims])
	}
	return st
}

// PoolImages returns the image digests of the pooled containers (ready or starting), which
// image garbage collection must spare.
func (b *Backend) PoolImages() []string {
	if b.pool == nil {
		return nil
	}
	p := b.pool
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for _, set := range p.sets {
		for _, pc := range set.ready {
			out = append(out, pc.digest)
		}
	}
	return out
}

// destroyPooled removes a pooled container found on disk (Recover).
func (b *Backend) destroyPooled(ctx context.Context, cid string) error {
	if b.pool != nil && b.pool.owns(cid) {
		return nil
	}
	var spec runtime.Spec
	_ = readJSON(filepath.Join(b.dir(cid), fileSpec), &spec)
	rt, _, err := b.runtimeFor(spec.RuntimeClass)
	if err != nil {
		rt, _, _ = b.runtimeFor("")
	}
	return b.teardown(ctx, &sandbox{id: cid, cid: cid, dir: b.dir(cid), rt: rt})
}

// startPooled starts a standby container for key, pulling its image with creds (nil:
// the image store's own).
func (b *Backend) startPooled(ctx context.Context, cid string, key poolKey, creds *runtime.Credentials) (pc *pooled, err error) {
	rt, class, err := b.runtimeFor(key.class)
	if err != nil {
		return nil, err
	}
	dir := b.dir(cid)
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, err
	}
	s := &sandbox{
		id: cid, cid: cid, dir: dir, rt: rt,
		spec:  runtime.Spec{ID: cid, Container: runtime.Container{Image: key.image}, RuntimeClass: class},
		ready: make(chan struct{}), done: make(chan struct{}),
	}
	close(s.ready)
	defer func() {
		if err != nil {
			if derr := b.teardown(context.WithoutCancel(ctx), s); derr != nil {
				b.log.Warn("undo pooled container", "container", cid, "err", derr)
			}
		}
	}()
	standby := func(*Image) (*agentconfig.Config, error) { return &agentconfig.Config{Standby: true}, nil }
	var t time.Time
	img, att, err := b.launch(ctx, s, creds, cid, runtime.Resources{}, standby, &t)
	if err != nil {
		return nil, err
	}
	hc := agent.NewHTTPClient(func(ctx context.Context) (net.Conn, error) { return dialVerified(ctx, dir, s.ident) })
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := agentv1connect.NewAgentServiceClient(hc, "http://sandbox-agent", connect.WithGRPC()).Status(sctx, connect.NewRequest(&agentv1.StatusRequest{})); err != nil {
		hc.CloseIdleConnections()
		return nil, fmt.Errorf("standby agent: %w", err)
	}
	return &pooled{s: s, digest: img.Digest, att: att, agent: hc}, nil
}

// claim tries to give s (registered, its dir made and empty) a pooled container. It
// reports whether it did; on false nothing of s has changed and the caller creates it
// cold.
func (b *Backend) claim(ctx context.Context, s *sandbox, spec *runtime.Spec, key poolKey) bool {
	pc := b.pool.take(key)
	if pc == nil {
		return false
	}
	if pc.s.proc == nil || pc.s.proc.exited() {
		b.pool.drop(pc)
		return false
	}
	// The image must be the one a cold Create would run now (a tag may have moved), and
	// the caller must be allowed to pull it: pull as a cold Create would. (A cached
	// digest-pinned reference is served without asking the registry: what keeps an
	// organization from another's image there is the set's key, poolKey.org.)
	var ct ClaimTimes
	t0 := time.Now()
	img, err := b.cfg.Images.Pull(ctx, spec.Image, spec.PullCredentials)
	ct.Pull = time.Since(t0)
	if err != nil || img.Digest != pc.digest {
		if err == nil {
			b.pool.drop(pc) // stale
		} else {
			b.pool.giveBack(key, pc) // the cold path reports the error
		}
		b.pool.miss()
		return false
	}
	acfg, err := agentConfig(spec, img)
	if err != nil {
		b.pool.giveBack(key, pc) // the cold path reports the error
		b.pool.miss()
		return false
	}
	if err := b.configurePooled(ctx, pc, s, acfg, spec.SecretEnv, &ct); err != nil {
		b.log.Warn("warm pool: claim failed, creating cold", "sandbox", s.id, "container", pc.s.cid, "err", err)
		b.pool.drop(pc)
		b.pool.miss()
		return false
	}
	b.mu.Lock()
	s.cid = pc.s.cid
	s.proc = pc.s.proc
	s.info = pc.s.info
	s.ident = pc.s.ident
	b.mu.Unlock()
	b.pool.claimed(ct)
	return true
}

func (p *pool) miss() {
	p.mu.Lock()
	p.stats.Misses++
	p.mu.Unlock()
}

func (p *pool) claimed(ct ClaimTimes) {
	p.mu.Lock()
	p.recent[p.stats.Claims%recentClaims] = ct.Total()
	p.stats.Claims++
	p.stats.ClaimTime.add(ct)
	p.mu.Unlock()
	p.kick()
}

// configurePooled turns pooled container pc into sandbox s: limits, hostname, etc files,
// spec and info (with the container id), the agent's Start, and finally the rename of
// pc's dir over s's. On error pc is to be destroyed.
func (b *Backend) configurePooled(ctx context.Context, pc *pooled, s *sandbox, acfg *agentconfig.Config, secretEnv map[string]string, ct *ClaimTimes) error {
	t := time.Now()
	step := func(d *time.Duration) {
		now := time.Now()
		*d, t = now.Sub(t), now
	}
	dir := pc.s.dir
	shown := shownDir(dir)
	cpus := b.placeCPUs(s, s.spec.Resources.MilliCPU)
	host := runtime.Hostname(s.id)
	// Start gets the secret environment too; the config file never does (docs/secrets.md).
	startJSON, cfgJSON, err := startConfigs(acfg, secretEnv)
	if err != nil {
		return err
	}
	info := pc.s.info
	info.StartedAt = time.Now().UTC()
	info.ContainerID = pc.s.cid
	info.CPUs = cpus
	// What must hold before the command starts touches disjoint things (the cgroup and
	// the limit files; the UTS namespace and the etc files; the network rules): done at
	// once. The spec and info records are needed only by the rename that ends the claim
	// (a crash before it leaves a pooled container, which Recover removes).
	var g errgroup.Group
	g.Go(func() error {
		if err := b.applyResources(pc.s.cid, s.spec.Resources, cpus); err != nil {
			return fmt.Errorf("resources: %w", err)
		}
		// A pooled container has every limit file mounted: they become the sandbox's.
		files, err := limitFiles(cpus, s.spec.Resources.MemoryBytes, true)
		if err == nil {
			err = rewriteLimitFiles(filepath.Join(shown, dirLimits), files)
		}
		if err != nil {
			return fmt.Errorf("limit files: %w", err)
		}
		return nil
	})
	g.Go(func() error {
		if err := setHostname(pc.s.info.Pid, host); err != nil {
			return fmt.Errorf("hostname: %w", err)
		}
		// hosts and hostname are bind-mounted files: rewrite them in place (same inode).
		tmp := filepath.Join(dir, "etc.claim")
		defer os.RemoveAll(tmp)
		if err := b.writeEtcFiles(tmp, host, pc.att); err != nil {
			return fmt.Errorf("etc files: %w", err)
		}
		for _, name := range []string{"hosts", "hostname"} {
			data, err := os.ReadFile(filepath.Join(tmp, name))
			if err == nil {
				err = writeInPlace(filepath.Join(shown, dirEtc, name), data)
			}
			if err != nil {
				return fmt.Errorf("etc files: %w", err)
			}
		}
		return nil
	})
	var rules time.Duration
	g.Go(func() error {
		t0 := time.Now()
		err := b.applyRules(s, pc.s.cid)
		rules = time.Since(t0)
		return err
	})
	var records errgroup.Group
	records.Go(func() error {
		if err := writeJSONAtomic(filepath.Join(dir, fileSpec), &s.spec); err != nil {
			return err
		}
		return writeJSONAtomic(filepath.Join(dir, fileInfo), &info)
	})
	if err := g.Wait(); err != nil {
		_ = records.Wait() // the claim fails anyway
		return err
	}
	step(&ct.Setup)
	ct.Rules = rules // within Setup: the steps overlap
	failpoint.Hit("local.claim.rules")
	if err := startAgent(ctx, pc.agent, dir, pc.s.ident, startJSON); err != nil {
		_ = records.Wait() // the claim fails anyway
		return fmt.Errorf("start: %w (agent output: %s)", err, tailOf(filepath.Join(dir, fileAgentOut), 512))
	}
	step(&ct.Start)
	failpoint.Hit("local.claim.started")
	if err := records.Wait(); err != nil {
		return err
	}
	failpoint.Hit("local.claim.info")
	// What /.sandboxd/config.json shows inside (bind-mounted: rewritten in place). Only
	// now: `runc run` returns before the agent has read it, and Start has answered.
	if err := writeInPlace(filepath.Join(shown, fileAgentConfig), cfgJSON); err != nil {
		return err
	}
	// The sandbox's dir is empty (Create's claim on the id): rename(2) replaces it
	// atomically (os.Rename refuses an existing directory as the target).
	if err := unix.Rename(dir, s.dir); err != nil {
		return fmt.Errorf("rename %s over %s: %w", dir, s.dir, err)
	}
	failpoint.Hit("local.claim.renamed")
	step(&ct.Finish)
	pc.s.info = info
	return nil
}

// startAgent sends Start to the standby agent of the container in dir (identity ident).
// hc (nil: a new one) is a client of that agent, closed when Start has answered.
func startAgent(ctx context.Context, hc *http.Client, dir string, ident *agentconfig.Identity, cfg []byte) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if hc == nil {
		hc = agent.NewHTTPClient(func(ctx context.Context) (net.Conn, error) {
			return dialVerified(ctx, dir, ident)
		})
	}
	defer hc.CloseIdleConnections()
	c := agentv1connect.NewAgentServiceClient(hc, "http://sandbox-agent", connect.WithGRPC())
	_, err := c.Start(ctx, connect.NewRequest(&agentv1.StartRequest{Config: cfg}))
	return err
}

// writeInPlace overwrites a file's content keeping its inode (bind mounts see it).
func writeInPlace(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// setHostname sets the UTS hostname of pid's namespace.
func setHostname(pid int, name string) error {
	return inNamespace("/proc/"+strconv.Itoa(pid)+"/ns/uts", unix.CLONE_NEWUTS, func() error {
		return unix.Sethostname([]byte(name))
	})
}

// applyResources sets a running container's limits as the OCI spec would have at create:
// memory (and memory+swap) limit, CPU quota, pids limit, cpuset (nil: left as it is).
func (b *Backend) applyResources(cid string, r runtime.Resources, cpus []int) error {
	rel := filepath.Join(b.cfg.CgroupParent, cid)
	write := func(path, v string) error {
		if err := os.WriteFile(path, []byte(v), 0o644); err != nil {
			return err
		}
		return nil
	}
	var quota int64
	if r.MilliCPU > 0 {
		quota = max(r.MilliCPU*cpuPeriod/1000, minCPUQuota)
	}
	if _, err := os.Stat(filepath.Join(cgroupRoot, "memory", rel)); err == nil { // cgroup v1
		if m := r.MemoryBytes; m > 0 {
			mem := filepath.Join(cgroupRoot, "memory", rel)
			// From unlimited: the memory limit first, memory+swap (never below it) next.
			if err := write(filepath.Join(mem, "memory.limit_in_bytes"), strconv.FormatInt(m, 10)); err != nil {
				return err
			}
			if _, err := os.Stat(filepath.Join(mem, "memory.memsw.limit_in_bytes")); err == nil {
				if err := write(filepath.Join(mem, "memory.memsw.limit_in_bytes"), strconv.FormatInt(m, 10)); err != nil {
					return err
				}
			}
		}
		if len(cpus) > 0 {
			if err := write(filepath.Join(cgroupRoot, "cpuset", rel, "cpuset.cpus"), cpuList(cpus)); err != nil {
				return err
			}
		}
		if quota > 0 {
			cpu := filepath.Join(cgroupRoot, "cpu", rel)
			if err := write(filepath.Join(cpu, "cpu.cfs_period_us"), strconv.Itoa(cpuPeriod)); err != nil {
				return err
			}
			if err := write(filepath.Join(cpu, "cpu.cfs_quota_us"), strconv.FormatInt(quota, 10)); err != nil {
				return err
			}
		}
		if r.Pids > 0 {
			return write(filepath.Join(cgroupRoot, "pids", rel, "pids.max"), strconv.FormatInt(r.Pids, 10))
		}
		return nil
	}
	cg := filepath.Join(cgroupRoot, rel) // cgroup v2
	if m := r.MemoryBytes; m > 0 {
		if err := write(filepath.Join(cg, "memory.max"), strconv.FormatInt(m, 10)); err != nil {
			return err
		}
		if _, err := os.Stat(filepath.Join(cg, "memory.swap.max")); err == nil {
			if err := write(filepath.Join(cg, "memory.swap.max"), "0"); err != nil {
				return err
			}
		}
	}
	if len(cpus) > 0 {
		if err := write(filepath.Join(cg, "cpuset.cpus"), cpuList(cpus)); err != nil {
			return err
		}
	}
	if quota > 0 {
		if err := write(filepath.Join(cg, "cpu.max"), fmt.Sprintf("%d %d", quota, cpuPeriod)); err != nil {
			return err
		}
	}
	if r.Pids > 0 {
		return write(filepath.Join(cg, "pids.max"), strconv.FormatInt(r.Pids, 10))
	}
	return nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
