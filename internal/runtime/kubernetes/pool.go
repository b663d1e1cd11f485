package kubernetes

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base32"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1/agentv1connect"
	"github.com/sandboxd/sandboxd/internal/agent"
	"github.com/sandboxd/sandboxd/internal/agentconfig"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// The warm pool. A warm target (SetWarmPools: a template with sandboxd.warmPool.size)
// is served by warm Pods: each a whole sandbox made ahead by Create under an ID of its
// own (hostname, Pod and Secret names, certificates and agent identity are that ID's),
// the target's NetworkPolicy with it, its agent held in standby (no main command), and
// one verified connection to that agent kept open. A Create of a matching spec is a
// claim: the runner asks ReserveWarm for an ID before it names the sandbox
// (runtime.WarmReserver; the gateway lets it, runtime.MetaAnyID), and the Create under
// that ID writes the real spec into the Secret and relabels the Pod for its caller (in
// parallel), then starts the main command with the caller's config (argv, env, files,
// user, working directory, restart limit) over the kept connection: RUNNING with no
// scheduling, no image pull, no kubelet sync on the path.
//
// Keying (warmKey): a warm Pod serves a spec only when every field that shapes the Pod,
// its Secret's volumes or its NetworkPolicy is the same, and the organization
// (Meta[runtime.MetaOrg]) is the same: a warm Pod never serves another organization
// (its pull credentials, its org label and the policies that select on it are that
// organization's). Specs that shape the Pod per create — several containers, volumes,
// secrets (SecretEnv, SecretRefs), startup probes, an engine, share tokens, SAME_USER
// network rules (the policy selects on the caller) — are not poolable: cold path.
//
// Bounds: a target's size is at most runtime.MaxWarmSize, and all targets together at
// most Config.MaxWarm (default DefaultMaxWarm), shared one at a time round robin over
// the organizations (allocateWarm). Each warm Pod holds its resource requests on a node
// while it waits. Refills run one at a time and start only while no other Create is in
// flight nor has returned within warmSettle (a refill under way when one comes finishes). A warm Pod that ends is
// dropped (an agent that stops answering is found at the claim: its Status, within
// warmStatusWait, comes before the Start); a reserved one no Create comes for within
// warmReserveTTL is destroyed, one given back (ReleaseWarm) is ready again. A claim that
// finds its warm Pod gone or not in standby, or a spec that does not match it after all,
// destroys it and creates the sandbox cold under the same ID; a Start that fails is
// judged by the agent's state (started: claimed; standby: cold; no answer: the Create
// fails, never a second run of the main command), and a Create whose caller is gone
// fails with its context's error (either way, and when the unusable warm Pod could not be
// removed before the cold create, the warm Pod is destroyed in the background).
// Recover destroys warm Pods never claimed (labelled LabelWarm, Secret too).

// LabelWarm marks a warm Pod and its Secret until the Pod is claimed (never its
// NetworkPolicy nor pull Secret: those keep the sandbox's labels); the value is a prefix
// of the pool key.
const LabelWarm = "sandboxd.io/warm"

// annotationWarmClaimed marks a Pod claimed from the warm pool: Recover asks its agent
// whether the main command was started (a claim cut short by a restart leaves it in
// standby: vanished, as a cold Create cut short). Its value is the claim's time
// (RFC 3339): the sandbox's StartedAt (infoOf); "true" from runners before that.
const annotationWarmClaimed = "sandboxd.io/warm-claimed"

// DefaultMaxWarm is Config.MaxWarm's default: warm Pods kept for all targets together.
const DefaultMaxWarm = 8

// Timings of the pool.
const (
	warmReserveTTL = time.Minute
	warmTick       = time.Second
	warmRetryMin   = 2 * time.Second
	warmRetryMax   = time.Minute
	warmStartWait  = 10 * time.Second // a claim's Start
	warmStatusWait = time.Second      // a claim's check that the kept connection answers
	// warmSettle: refills wait this long after the last other Create returned, so they
	// do not compete with what follows it (the runner's first connection to the agent,
	// the caller's first command).
	warmSettle = 300 * time.Millisecond
	// warmHoldMax bounds how long overlapping Creates hold refills back.
	warmHoldMax = 2 * time.Second
	// warmMaxAge: a ready warm Pod is replaced after this long.
	warmMaxAge = 10 * time.Minute
)

// WarmStats counts the pool's work since the Backend was made.
type WarmStats struct {
	Ready    int // warm Pods ready now
	Want     int // warm Pods the targets are allotted now (after MaxWarm)
	Claims   int // Creates served by a warm Pod
	Fallback int // reserved warm Pods found unusable at their Create (cold path)
	Refills  int // warm Pods made
	Failed   int // refills that failed
	Dropped  int // warm Pods destroyed unclaimed (dead, excess, expired reservation)
	// LastClaim is how long the last claim took (spec recorded, relabelled, started),
	// LastClaimEnd when it returned.
	LastClaim    time.Duration
	LastClaimEnd time.Time
}

type warmCtxKey struct{}

// isWarmCreate: ctx is a refill's (a warm Pod being made).
func isWarmCreate(ctx context.Context) bool { return ctx.Value(warmCtxKey{}) != nil }

type warmPod struct {
	id, key string
	s       *sandbox
	hc      *http.Client // holds the verified connection to the standby agent
	// dial makes a new connection to the agent (nil: the backend's dialAgent).
	dial       func(ctx context.Context) (net.Conn, error)
	reservedAt time.Time
	madeAt     time.Time // when it joined the ready set
}

func (w *warmPod) close() {
	if w.hc != nil {
		w.hc.CloseIdleConnections()
	}
}

func (w *warmPod) dead() bool {
	select {
	case <-w.s.done:
		return true
	default:
		return false
	}
}

type warmSet struct {
	key, target, org string
	spec             runtime.Spec // the target's (with its credentials: the latest sent)
	want             int
	ready            []*warmPod
	starting         int
	failures         int
	retryAt          time.Time
}

type warmPool struct {
	b   *Backend
	max int
	// refills bounds the warm Creates under way at once.
	refills int
	now     func() time.Time
	// makeFn makes one warm Pod (default make; tests replace it).
	makeFn func(spec *runtime.Spec, key string) (*warmPod, error)

	mu       sync.Mutex
	sets     map[string]*warmSet
	order    []string            // set keys, in the order last sent; refills go round robin
	next     int                 // round-robin position in order
	reserved map[string]*warmPod // by sandbox ID
	busy     int                 // other Creates in flight
	lastEnd  time.Time           // when the last other Create returned
	// heldSince: since when refills have been held back by Creates (now when not).
	heldSince time.Time
	starting  int
	stats     WarmStats
	started   bool
	closed    bool

	wake chan struct{}
	done chan struct{}
}

func newWarmPool(b *Backend) *warmPool {
	m := b.cfg.MaxWarm
	if m == 0 {
		m = DefaultMaxWarm
	}
	p := &warmPool{
		b: b, max: max(m, 0), refills: 1, now: time.Now,
		sets: map[string]*warmSet{}, reserved: map[string]*warmPod{},
		wake: make(chan struct{}, 1), done: make(chan struct{}),
	}
	p.makeFn = p.make
	return p
}

// warmKey is the pool key of spec: a hash of every field that shapes the Pod, its
// Secret's volumes and its NetworkPolicy, and of its organization. ok false: spec is
// not poolable (see above).
func warmKey(spec *runtime.Spec) (string, bool) {
	if spec.Multi() || spec.Engine != nil || len(spec.Volumes) > 0 || spec.ShareTokenHash != "" ||
		len(spec.Network.EgressSecrets()) > 0 { // a CA and placeholders of its own per sandbox
		return "", false
	}
	for _, svc := range spec.Services {
		if svc.Endpoint == runtime.EndpointHTTPS && svc.TokenAuth {
			// Its creates carry a share-token hash made for their ID (runner.NeedsShareTokens):
			// a target's spec has none yet, and a warm Pod of it would never be claimed.
			return "", false
		}
	}
	c := &spec.Container
	if len(c.SecretEnv) > 0 || len(c.SecretRefs) > 0 || c.StartupProbe != nil || len(c.DependsOn) > 0 || len(c.VolumeMounts) > 0 {
		return "", false
	}
	if spec.Network != nil {
		nj, err := json.Marshal(spec.Network)
		if err != nil || strings.Contains(string(nj), `"`+runtime.TenantSameUser+`"`) {
			return "", false
		}
	}
	k := spec.Clone()
	// What the claim gives the agent (Start), and what the runner adds per create.
	k.ID, k.ShareTokenHash, k.EgressSecretValues = "", "", nil
	k.Command, k.Args, k.Env, k.Files, k.RestartLimit = "", nil, nil, nil, 0
	k.PullCredentials = nil
	if k.Resources.Pids == 0 {
		k.Resources.Pids = runtime.DefaultPidsLimit
	}
	k.Meta = map[string]string{runtime.MetaOrg: spec.Meta[runtime.MetaOrg]}
	// Whether the image is pulled with credentials (which rotate: not their value): a
	// create without any never gets a Pod whose image needed them.
	j, err := json.Marshal(struct {
		Spec  *runtime.Spec `json:"spec"`
		Creds bool          `json:"creds"`
	}{&k, spec.PullCredentials != nil})
	if err != nil {
		return "", false
	}
	h := sha256.Sum256(j)
	return hex.EncodeToString(h[:20]), true
}

// newWarmID is a new sandbox ID, as the runner mints them (80 bits, base32 lower case).
func newWarmID() string {
	b := make([]byte, 10)
	_, _ = rand.Read(b)
	return strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(b))
}

// allocateWarm shares budget warm Pods among targets: one at a time, round robin over
// the organizations (the part of a Key before "/"), in the order the targets come within
// one organization, each up to its Size (at most runtime.MaxWarmSize).
func allocateWarm(targets []runtime.WarmTarget, budget int) []int {
	out := make([]int, len(targets))
	var orgs []string
	byOrg := map[string][]int{}
	for i, t := range targets {
		org, _, _ := strings.Cut(t.Key, "/")
		if _, ok := byOrg[org]; !ok {
			orgs = append(orgs, org)
		}
		byOrg[org] = append(byOrg[org], i)
	}
	wants := func(i int) bool { return out[i] < min(max(targets[i].Size, 0), runtime.MaxWarmSize) }
	pos := map[string]int{}
	for budget > 0 {
		gave := false
		for _, org := range orgs {
			if budget == 0 {
				break
			}
			idx := byOrg[org]
			for n := 0; n < len(idx); n++ {
				i := idx[(pos[org]+n)%len(idx)]
				if wants(i) {
					out[i]++
					budget--
					gave = true
					pos[org] = (pos[org] + n + 1) % len(idx)
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

// setWarmTargets replaces the targets (SetWarmPools).
func (b *Backend) setWarmTargets(targets []runtime.WarmTarget) {
	p := b.warm
	if p == nil {
		return
	}
	var ok []runtime.WarmTarget
	var keys []string
	for _, t := range targets {
		if t.Size <= 0 {
			continue
		}
		t.Spec = t.Spec.Clone() // with the target's credentials (the latest sent)
		for _, c := range t.Spec.AllContainers() {
			if c.RestartLimit == 0 {
				c.RestartLimit = runtime.DefaultRestartLimit
			}
			if c.Resources.Pids == 0 {
				c.Resources.Pids = runtime.DefaultPidsLimit
			}
		}
		key, poolable := warmKey(&t.Spec)
		if !poolable {
			b.log.Info("warm target not poolable on kubernetes: its images are pre-pulled only", "target", t.Key)
			continue
		}
		ok = append(ok, t)
		keys = append(keys, key)
	}
	alloc := allocateWarm(ok, p.max)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	for _, s := range p.sets {
		s.want = 0
	}
	p.order = p.order[:0]
	for i, t := range ok {
		s := p.sets[keys[i]]
		if s == nil {
			s = &warmSet{key: keys[i]}
			p.sets[keys[i]] = s
		}
		if !slices.Contains(p.order, keys[i]) {
			p.order = append(p.order, keys[i])
		}
		org, _, _ := strings.Cut(t.Key, "/")
		s.target, s.org, s.spec = t.Key, org, t.Spec
		s.want = min(s.want+alloc[i], runtime.MaxWarmSize)
	}
	if !p.started && len(ok) > 0 {
		p.started = true
		go p.run()
	}
	p.kick()
}

func (p *warmPool) kick() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

func (p *warmPool) close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	started := p.started
	p.mu.Unlock()
	p.kick()
	if started {
		<-p.done
	}
}

// owns: id is a warm Pod of this pool (ready or reserved; not one being made).
func (p *warmPool) owns(id string) bool {
	if p == nil {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.reserved[id] != nil {
		return true
	}
	for _, s := range p.sets {
		for _, w := range s.ready {
			if w.id == id {
				return true
			}
		}
	}
	return false
}

func (p *warmPool) run() {
	defer close(p.done)
	t := time.NewTicker(warmTick)
	defer t.Stop()
	for {
		p.step()
		select {
		case <-p.wake:
		case <-t.C:
		case <-p.b.ctx.Done():
		}
		p.mu.Lock()
		closed := p.closed
		p.mu.Unlock()
		if closed || p.b.ctx.Err() != nil {
			return
		}
	}
}

// step drops what is dead, in excess or reserved too long, and starts refills while no
// other Create is in flight nor reserved, and warmSettle after the last one returned.
func (p *warmPool) step() {
	now := p.now()
	var drop []*warmPod
	p.mu.Lock()
	for id, w := range p.reserved {
		if now.Sub(w.reservedAt) > warmReserveTTL {
			delete(p.reserved, id)
			drop = append(drop, w)
		}
	}
	for _, s := range p.sets {
		s.ready = slices.DeleteFunc(s.ready, func(w *warmPod) bool {
			// A warm Pod older than warmMaxAge is replaced: its image (a mutable tag
			// may have moved) and its node are the ones of when it was made.
			if w.dead() || (!w.madeAt.IsZero() && now.Sub(w.madeAt) > warmMaxAge) {
				drop = append(drop, w)
				return true
			}
			return false
		})
		for len(s.ready) > s.want {
			drop = append(drop, s.ready[0])
			s.ready = s.ready[1:]
		}
		if s.want == 0 && len(s.ready) == 0 && s.starting == 0 {
			delete(p.sets, s.key)
		}
	}
	p.stats.Dropped += len(drop)
	var start []*warmSet
	// A reservation is a Create on its way: no refill competes with its claim.
	settled := now.Sub(p.lastEnd) >= warmSettle
	// Held back by Creates that overlap: at most warmHoldMax, then one refill anyway
	// (and held back again from then), so a steady load never starves the pool.
	heldBack := p.busy > 0 || !settled || len(p.reserved) > 0
	if !heldBack || p.heldSince.IsZero() {
		p.heldSince = now
	}
	forced := heldBack && now.Sub(p.heldSince) >= warmHoldMax
	for (!heldBack || forced) && p.starting < p.refills && !p.closed {
		s := p.pickLocked(now)
		if s == nil {
			break
		}
		if forced {
			p.heldSince = now
		}
		s.starting++
		p.starting++
		start = append(start, s)
	}
	p.mu.Unlock()
	for _, w := range drop {
		go p.destroy(w)
	}
	for _, s := range start {
		go p.refill(s)
	}
}

// pickLocked is the next set that wants another warm Pod, round robin.
func (p *warmPool) pickLocked(now time.Time) *warmSet {
	for n := range len(p.order) {
		i := (p.next + n) % len(p.order)
		s := p.sets[p.order[i]]
		if s == nil || len(s.ready)+s.starting >= s.want || now.Before(s.retryAt) {
			continue
		}
		p.next = (i + 1) % len(p.order)
		return s
	}
	return nil
}

func (p *warmPool) destroy(w *warmPod) {
	w.close()
	ctx, cancel := context.WithTimeout(p.b.ctx, time.Minute)
	defer cancel()
	if err := p.b.Destroy(ctx, w.id); err != nil && p.b.ctx.Err() == nil {
		p.b.log.Warn("destroy warm pod", "sandbox", w.id, "err", err)
	}
}

// refill makes one warm Pod of s.
func (p *warmPool) refill(s *warmSet) {
	p.mu.Lock()
	spec := s.spec.Clone()
	key := s.key
	p.mu.Unlock()
	spec.ID = newWarmID()
	org := spec.Meta[runtime.MetaOrg]
	spec.Meta = map[string]string{}
	if org != "" {
		spec.Meta[runtime.MetaOrg] = org
	}
	w, err := p.makeFn(&spec, key)
	p.mu.Lock()
	s.starting--
	p.starting--
	keep := err == nil && !p.closed && p.sets[key] == s && len(s.ready) < s.want
	if err != nil {
		p.stats.Failed++
		s.failures++
		s.retryAt = p.now().Add(min(warmRetryMin<<min(s.failures-1, 8), warmRetryMax))
	} else {
		s.failures, s.retryAt = 0, time.Time{}
		p.stats.Refills++
		if keep {
			w.madeAt = p.now()
			s.ready = append(s.ready, w)
		} else {
			p.stats.Dropped++
		}
	}
	p.mu.Unlock()
	if err != nil {
		if p.b.ctx.Err() == nil {
			p.b.log.Warn("make a warm pod", "target", s.target, "err", err)
		}
	} else if !keep {
		p.destroy(w)
	}
	p.kick()
}

// make creates one warm Pod of spec (Create under a warm context) and opens and verifies
// the connection to its standby agent.
func (p *warmPool) make(spec *runtime.Spec, key string) (*warmPod, error) {
	b := p.b
	ctx, cancel := context.WithTimeout(context.WithValue(b.ctx, warmCtxKey{}, key), b.cfg.StartTimeout+time.Minute)
	defer cancel()
	if _, err := b.Create(ctx, spec); err != nil {
		return nil, err
	}
	s, err := b.get(spec.ID)
	if err != nil {
		return nil, err
	}
	w := &warmPod{id: spec.ID, key: key, s: s}
	w.hc = agent.NewHTTPClient(func(ctx context.Context) (net.Conn, error) { return b.dialAgent(ctx, w.id, "", false) })
	if _, err := w.client().Status(ctx, connect.NewRequest(&agentv1.StatusRequest{})); err != nil {
		p.destroy(w)
		return nil, fmt.Errorf("warm pod %s: agent: %w", spec.ID, err)
	}
	return w, nil
}

func (w *warmPod) client() agentv1connect.AgentServiceClient {
	return agentv1connect.NewAgentServiceClient(w.hc, "http://sandbox-agent", connect.WithGRPC(),
		connect.WithReadMaxBytes(agent.MaxMessageBytes), connect.WithSendMaxBytes(agent.MaxMessageBytes))
}

// ReserveWarm implements runtime.WarmReserver: a ready warm Pod of spec's key, taken out
// of the pool for the Create that follows under its ID.
func (b *Backend) ReserveWarm(spec *runtime.Spec) (string, bool) {
	p := b.warm
	if p == nil {
		return "", false
	}
	key, ok := warmKey(spec)
	if !ok {
		return "", false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.sets[key]
	if s == nil || p.closed {
		return "", false
	}
	for len(s.ready) > 0 {
		w := s.ready[0]
		s.ready = s.ready[1:]
		if w.dead() {
			p.stats.Dropped++
			go p.destroy(w)
			continue
		}
		w.reservedAt = p.now()
		p.reserved[w.id] = w
		return w.id, true
	}
	return "", false
}

// ReleaseWarm implements runtime.WarmReserver: reservation id is ready again (no Create
// came for it), or destroyed when its set no longer wants it or it is dead.
func (b *Backend) ReleaseWarm(id string) {
	p := b.warm
	if p == nil {
		return
	}
	p.mu.Lock()
	w := p.reserved[id]
	delete(p.reserved, id)
	var s *warmSet
	if w != nil {
		s = p.sets[w.key]
	}
	keep := w != nil && s != nil && !p.closed && !w.dead() && len(s.ready) < s.want
	if keep {
		s.ready = append(s.ready, w)
	}
	p.mu.Unlock()
	if w != nil && !keep {
		go p.destroy(w)
	}
	p.kick()
}

// WarmHeld implements runtime.WarmHolder: the spec of every warm Pod kept (ready, being
// made or reserved), whose requests it holds on a node.
func (b *Backend) WarmHeld() []runtime.Spec {
	p := b.warm
	if p == nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []runtime.Spec
	for _, s := range p.sets {
		for range len(s.ready) + s.starting {
			out = append(out, s.spec)
		}
	}
	for _, w := range p.reserved {
		if s := p.sets[w.key]; s != nil {
			out = append(out, s.spec)
		}
	}
	return out
}

// WarmStats is how the warm pool stands (tests, benchmarks).
func (b *Backend) WarmStats() WarmStats {
	p := b.warm
	if p == nil {
		return WarmStats{}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.stats
	for _, s := range p.sets {
		st.Ready += len(s.ready)
		st.Want += s.want
	}
	return st
}

// enterCreate is called by every Create: a refill's is let through; any other holds
// refills back until it returns (the returned func).
func (b *Backend) enterCreate(ctx context.Context) func() {
	p := b.warm
	if p == nil || isWarmCreate(ctx) {
		return func() {}
	}
	p.mu.Lock()
	p.busy++
	p.mu.Unlock()
	return func() {
		p.mu.Lock()
		p.busy--
		p.lastEnd = p.now()
		p.mu.Unlock()
		time.AfterFunc(warmSettle, p.kick)
	}
}

// claimWarm is the start of Create: when spec.ID is a reserved warm Pod, it is claimed
// (claimed true, and Create returns info, err). A warm Pod that is gone, or that spec
// does not match, is destroyed first and Create goes on cold (claimed false).
func (b *Backend) claimWarm(ctx context.Context, spec *runtime.Spec) (info runtime.Info, claimed bool, err error) {
	p := b.warm
	if p == nil || isWarmCreate(ctx) {
		return runtime.Info{}, false, nil
	}
	p.mu.Lock()
	w := p.reserved[spec.ID]
	delete(p.reserved, spec.ID)
	p.mu.Unlock()
	if w == nil {
		return runtime.Info{}, false, nil
	}
	key, ok := warmKey(spec)
	if ok && key == w.key && !w.dead() {
		t0 := time.Now()
		info, err = b.claim(ctx, spec, w)
		if err == nil {
			p.mu.Lock()
			p.stats.Claims++
			p.stats.LastClaim, p.stats.LastClaimEnd = time.Since(t0), time.Now()
			p.mu.Unlock()
			return info, true, nil
		}
		if errors.Is(err, errWarmStartUnknown) || ctx.Err() != nil {
			// No cold create: the main command may run already, or the caller is gone.
			// The Create fails: its Pod goes (in the background, bounded), never started
			// again.
			p.mu.Lock()
			p.stats.Fallback++
			p.mu.Unlock()
			go p.destroy(w)
			if ctx.Err() != nil {
				err = ctx.Err()
			}
			return runtime.Info{}, true, fmt.Errorf("sandbox %s: claim a warm pod: %w", spec.ID, err)
		}
		b.log.Warn("claim a warm pod: creating the sandbox cold", "sandbox", spec.ID, "err", err)
	}
	p.mu.Lock()
	p.stats.Fallback++
	p.mu.Unlock()
	w.close()
	// The cold path makes the same names again: the warm Pod goes first.
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	if err := b.Destroy(dctx, spec.ID); err != nil {
		// The Create fails: the Pod is tried again in the background (nothing started
		// in it: it was in standby, or the spec did not match).
		go p.destroy(w)
		return runtime.Info{}, true, fmt.Errorf("sandbox %s: remove the unusable warm pod: %w", spec.ID, err)
	}
	return runtime.Info{}, false, nil
}

// claim hands the warm Pod w to spec: the real spec into its Secret (what Recover
// reads) and the caller's labels onto the Pod, in parallel; then the agent's Start with
// the main command's config over the kept connection.
func (b *Backend) claim(ctx context.Context, spec *runtime.Spec, w *warmPod) (runtime.Info, error) {
	s := w.s
	imageUser := ""
	if imageUserNeeded(spec.Security) {
		ic, err := b.cfg.ImageConfig(ctx, spec.Image, spec.PullCredentials)
		if err != nil {
			return runtime.Info{}, errImageUser(spec.Image, err)
		}
		imageUser = ic.User
	}
	_, runAs := securityFor(spec.Security, imageUser)
	argv, err := b.argv(ctx, spec)
	if err != nil {
		return runtime.Info{}, err
	}
	acfg := agentconfig.Config{
		Argv:         argv,
		Env:          agentconfig.MergeEnv(nil, spec.Env),
		WorkingDir:   spec.WorkingDir,
		RestartLimit: spec.RestartLimit,
		Hostname:     runtime.Hostname(spec.ID),
		User:         runAs,
	}
	for _, f := range spec.Files {
		acfg.Files = append(acfg.Files, agentconfig.File{Path: f.Path, Content: f.Content, Mode: f.Mode})
	}
	startCfg, err := json.Marshal(&acfg)
	if err != nil {
		return runtime.Info{}, err
	}
	persisted := *spec
	persisted.PullCredentials = nil
	persisted.RuntimeClass = s.class
	specJSON, err := json.Marshal(&persisted)
	if err != nil {
		return runtime.Info{}, err
	}
	lbls := b.labels(spec)
	var user any // null removes the label
	if v := lbls[LabelUser]; v != "" {
		user = v
	}
	meta := map[string]any{"labels": map[string]any{LabelWarm: nil, LabelUser: user}}
	secPatch, err := json.Marshal(map[string]any{"metadata": meta, "data": map[string]string{secretSpec: base64.StdEncoding.EncodeToString(specJSON)}})
	if err != nil {
		return runtime.Info{}, err
	}
	// The claim's time: the sandbox's start (infoOf), also after a runner restart.
	claimedAt := time.Now().UTC()
	podPatch, err := json.Marshal(map[string]any{"metadata": map[string]any{
		"labels":      meta["labels"],
		"annotations": map[string]string{annotationWarmClaimed: claimedAt.Format(time.RFC3339Nano)},
	}})
	if err != nil {
		return runtime.Info{}, err
	}
	b.mu.Lock()
	uid := s.uid
	ip := s.helloIP
	if s.pod != nil && s.pod.Status.PodIP != "" {
		ip = s.pod.Status.PodIP
	}
	b.mu.Unlock()
	// A verified connection for the sandbox's first command, made beside the claim (the
	// warm Pod's kept one carries the pool's HTTP/2 session: it cannot be handed over).
	spare := b.claimSpare(ctx, s, ip)
	defer spare.drop()
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		_, err := b.cfg.Client.CoreV1().Secrets(b.cfg.Namespace).Patch(gctx, secretName(spec.ID), types.MergePatchType, secPatch, metav1.PatchOptions{})
		if err != nil {
			return fmt.Errorf("record the spec: %w", err)
		}
		return nil
	})
	g.Go(func() error {
		// The UID precondition: never relabel a Pod that is not the warm one.
		pp, err := podPatchWithUID(podPatch, uid)
		if err != nil {
			return err
		}
		_, err = b.cfg.Client.CoreV1().Pods(b.cfg.Namespace).Patch(gctx, podName(spec.ID), types.MergePatchType, pp, metav1.PatchOptions{})
		if err != nil {
			if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
				return fmt.Errorf("relabel the pod: the warm pod is gone: %w", err)
			}
			return fmt.Errorf("relabel the pod: %w", err)
		}
		return nil
	})
	if user != nil {
		// The NetworkPolicy and pull Secret (never labelled LabelWarm) get the caller.
		userPatch, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]any{LabelUser: user}}})
		if err != nil {
			return runtime.Info{}, err
		}
		g.Go(func() error {
			_, err := b.cfg.Client.NetworkingV1().NetworkPolicies(b.cfg.Namespace).Patch(gctx, networkPolicyName(spec.ID), types.MergePatchType, userPatch, metav1.PatchOptions{})
			if err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("label the network policy: %w", err)
			}
			return nil
		})
		g.Go(func() error {
			_, err := b.cfg.Client.CoreV1().Secrets(b.cfg.Namespace).Patch(gctx, pullSecretName(spec.ID), types.MergePatchType, userPatch, metav1.PatchOptions{})
			if err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("label the pull secret: %w", err)
			}
			return nil
		})
	}
	g.Go(func() error {
		// The kept connection still answers (a half-dead one would hold the Start for
		// warmStartWait): else the claim goes cold before anything started.
		sctx, cancel := context.WithTimeout(gctx, warmStatusWait)
		defer cancel()
		st, err := w.client().Status(sctx, connect.NewRequest(&agentv1.StatusRequest{}))
		if err != nil {
			return fmt.Errorf("the warm pod's agent does not answer: %w", err)
		}
		if st.Msg.GetState() != agentv1.MainState_MAIN_STATE_STANDBY {
			return fmt.Errorf("the warm pod's agent is %v, not in standby", st.Msg.GetState())
		}
		return nil
	})
	if err := g.Wait(); err != nil {
		return runtime.Info{}, err
	}
	b.mu.Lock()
	s.spec = persisted
	b.mu.Unlock()
	// Host-name egress rules: the workload's first query is answered only once the Pod's
	// address is in the egress registry (a warm Pod can be ready before the informer
	// reports its IP). Nothing started yet: a failure here goes cold.
	if err := b.waitEgress(ctx, s); err != nil {
		return runtime.Info{}, err
	}
	sctx, cancel := context.WithTimeout(ctx, warmStartWait)
	defer cancel()
	if _, err := w.client().Start(sctx, connect.NewRequest(&agentv1.StartRequest{Config: startCfg})); err != nil {
		// The Start may have reached the agent: a cold create after it would run the
		// main command twice. Its state decides.
		switch st := b.warmMainState(ctx, w); st {
		case agentv1.MainState_MAIN_STATE_STANDBY:
			return runtime.Info{}, fmt.Errorf("start the main command: %w", err)
		case agentv1.MainState_MAIN_STATE_UNSPECIFIED:
			return runtime.Info{}, fmt.Errorf("%w: %w", errWarmStartUnknown, err)
		default:
			b.log.Warn("claim a warm pod: Start failed but the main command started", "sandbox", spec.ID, "state", st, "err", err)
		}
	}
	w.close()
	spare.keep()
	b.startLogs(s)
	info := b.info(s)
	info.StartedAt = claimedAt // the main command's, not the warm Pod's
	return info, nil
}

// errWarmStartUnknown: a claim's Start failed and whether the main command started is
// not known: the Create fails (a cold create could run it twice).
var errWarmStartUnknown = errors.New("the warm pod's main command may have started")

// warmMainState is the agent's main state after a failed Start: over the kept
// connection, else a new one; UNSPECIFIED when neither answers.
func (b *Backend) warmMainState(ctx context.Context, w *warmPod) agentv1.MainState {
	ctx = context.WithoutCancel(ctx)
	clients := []agentv1connect.AgentServiceClient{w.client()}
	if w.dial == nil {
		w.dial = func(ctx context.Context) (net.Conn, error) { return b.dialAgent(ctx, w.id, "", false) }
	}
	fresh := agent.NewHTTPClient(w.dial)
	defer fresh.CloseIdleConnections()
	clients = append(clients, agentv1connect.NewAgentServiceClient(fresh, "http://sandbox-agent", connect.WithGRPC(),
		connect.WithReadMaxBytes(agent.MaxMessageBytes), connect.WithSendMaxBytes(agent.MaxMessageBytes)))
	for _, c := range clients {
		sctx, cancel := context.WithTimeout(ctx, 2*warmStatusWait)
		st, err := c.Status(sctx, connect.NewRequest(&agentv1.StatusRequest{}))
		cancel()
		if err == nil && st.Msg.GetState() != agentv1.MainState_MAIN_STATE_UNSPECIFIED {
			return st.Msg.GetState()
		}
	}
	return agentv1.MainState_MAIN_STATE_UNSPECIFIED
}

// podPatchWithUID adds metadata.uid to a merge patch: the API server refuses it (409)
// when the Pod of that name is another one.
func podPatchWithUID(patch []byte, uid types.UID) ([]byte, error) {
	if uid == "" {
		return patch, nil
	}
	var m map[string]any
	if err := json.Unmarshal(patch, &m); err != nil {
		return nil, err
	}
	md, _ := m["metadata"].(map[string]any)
	if md == nil {
		md = map[string]any{}
		m["metadata"] = md
	}
	md["uid"] = string(uid)
	return json.Marshal(m)
}

// unclaimedWarm: pod and its Secret are a warm Pod nobody claimed (Recover destroys
// it). A claim relabels both; either relabelled means a claim began.
func unclaimedWarm(pod *corev1.Pod, sec *corev1.Secret) bool {
	return pod.Labels[LabelWarm] != "" && sec != nil && sec.Labels[LabelWarm] != "" && pod.Annotations[annotationWarmClaimed] == ""
}

// warmClaimBegun: pod was claimed from a warm pool (its main command may not have been
// started when the runner stopped).
func warmClaimBegun(pod *corev1.Pod) bool {
	return pod.Labels[LabelWarm] != "" || pod.Annotations[annotationWarmClaimed] != ""
}

// warmLabel is the LabelWarm value of a refill's Create (a prefix of its key); "" for
// any other Create.
func warmLabel(ctx context.Context) string {
	k, _ := ctx.Value(warmCtxKey{}).(string)
	return cmp.Or(k[:min(len(k), 40)], "")
}

// warmClaimedAt is the time of pod's claim from the warm pool (its annotationWarmClaimed;
// false: not claimed, or a claim recorded without its time).
func warmClaimedAt(pod *corev1.Pod) (time.Time, bool) {
	v := pod.Annotations[annotationWarmClaimed]
	if v == "" {
		return time.Time{}, false
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return time.Time{}, false
	}
	return t.UTC(), true
}
