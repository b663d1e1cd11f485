// Package health keeps the placing process's record of failed sandbox creates per runner,
// and from it each runner's health: healthy, degraded (placed last), quarantined (not
// placed for a cooldown that doubles with each quarantine, bounded) and, once the
// cooldown ends, probing (half-open: one create is admitted; its success heals the
// runner, its failure quarantines it again).
//
// Only failures the caller did not cause count (the caller classifies: Failure); a
// success heals the runner for everyone, whichever organization it came from.
//
// One tenant cannot degrade a shared runner for others: failures are counted per
// (runner, organization), and a runner's own state — the one every organization sees —
// follows the MinOrgs-th largest of its organizations' consecutive-failure counts: with
// MinOrgs 2, it is degraded only once two organizations each saw DegradedAfter failures
// in a row there, quarantined once two saw QuarantineAfter. An organization alone sees
// the runner as its own count says (degraded or quarantined for it only). A tenant can at
// most prolong a quarantine other tenants' failures caused, by failing its one probe
// create (each failed probe doubles the cooldown, up to MaxCooldown).
//
// A Tracker is safe for concurrent use; its clock is injected (tests use a fake one).
package health

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
)

// State is a runner's health, from best to worst.
type State int

// States, in placement order: a lower one is placed first; Quarantined is not placed.
const (
	Healthy State = iota
	Degraded
	Probing // half-open: the cooldown ended, one probe create may go
	Quarantined
)

// States lists every State (for metrics).
var States = []State{Healthy, Degraded, Probing, Quarantined}

func (s State) String() string {
	switch s {
	case Healthy:
		return "healthy"
	case Degraded:
		return "degraded"
	case Probing:
		return "probing"
	case Quarantined:
		return "quarantined"
	}
	return "unknown"
}

// Outcome is what one create's result means for its runner's health.
type Outcome int

const (
	// Ignored: says nothing about the runner (the caller's input, a cancelled call).
	Ignored Outcome = iota
	// Success: the sandbox started on the runner.
	Success
	// Failure: the runner failed it (backend error, unreachable, internal error).
	Failure
)

// Defaults of Config.
const (
	DefaultDegradedAfter   = 3
	DefaultQuarantineAfter = 6
	DefaultCooldown        = 30 * time.Second
	DefaultMaxCooldown     = 10 * time.Minute
	DefaultMinOrgs         = 2
	DefaultProbeTimeout    = 90 * time.Second
	DefaultDecayAfter      = 10 * time.Minute
	DefaultCreateTimeout   = 90 * time.Second
	// MaxCreateTimeout bounds CreateTimeout (a sanity bound).
	MaxCreateTimeout = time.Hour
	// MaxOrgsPerRunner bounds the organizations tracked per runner: beyond it, the one
	// with the fewest failures is forgotten.
	MaxOrgsPerRunner = 256
	// maxThreshold bounds the thresholds (a sanity bound).
	maxThreshold = 1000
)

// Config holds the thresholds. Its zero value means the defaults (WithDefaults).
type Config struct {
	// DegradedAfter consecutive counted failures mark a runner degraded (placed last).
	DegradedAfter int
	// QuarantineAfter consecutive counted failures quarantine it (not placed) for Cooldown,
	// doubled at each quarantine since it last healed, up to MaxCooldown.
	QuarantineAfter       int
	Cooldown, MaxCooldown time.Duration
	// MinOrgs organizations must each reach a threshold before the runner's state changes
	// for every organization (1: any organization's failures count for all).
	MinOrgs int
	// ProbeTimeout: a probe create whose outcome is not known after this long no longer
	// holds the half-open slot (the gateway watches a probe itself for at most 60 s first).
	ProbeTimeout time.Duration
	// DecayAfter: an organization's count on a runner whose last counted failure is this
	// old or older is forgotten (reset to 0), so a degraded runner that stopped failing (or
	// is no longer tried) becomes healthy again. Quarantines end by their probe instead.
	DecayAfter time.Duration
	// CreateTimeout bounds one create request to a runner, apart from its caller's
	// deadline: a runner that has not answered by then failed the create (counted), also
	// when the caller went away before (the placing process keeps judging the attempt).
	CreateTimeout time.Duration
	// Disabled turns health tracking off: every runner stays healthy.
	Disabled bool
}

// WithDefaults fills zero fields with the defaults.
func (c Config) WithDefaults() Config {
	if c.DegradedAfter == 0 {
		c.DegradedAfter = DefaultDegradedAfter
	}
	if c.QuarantineAfter == 0 {
		c.QuarantineAfter = max(DefaultQuarantineAfter, c.DegradedAfter)
	}
	if c.Cooldown == 0 {
		c.Cooldown = DefaultCooldown
	}
	if c.MaxCooldown == 0 {
		c.MaxCooldown = max(DefaultMaxCooldown, c.Cooldown)
	}
	if c.MinOrgs == 0 {
		c.MinOrgs = DefaultMinOrgs
	}
	if c.ProbeTimeout == 0 {
		c.ProbeTimeout = DefaultProbeTimeout
	}
	if c.DecayAfter == 0 {
		c.DecayAfter = DefaultDecayAfter
	}
	if c.CreateTimeout == 0 {
		c.CreateTimeout = DefaultCreateTimeout
	}
	return c
}

// Validate checks c (zero fields are the defaults).
func (c Config) Validate() error {
	d := c.WithDefaults()
	var errs []error
	if c.DegradedAfter < 0 || c.DegradedAfter > maxThreshold {
		errs = append(errs, fmt.Errorf("degraded-after %d: want 1..%d", c.DegradedAfter, maxThreshold))
	}
	if c.QuarantineAfter < 0 || c.QuarantineAfter > maxThreshold {
		errs = append(errs, fmt.Errorf("quarantine-after %d: want 1..%d", c.QuarantineAfter, maxThreshold))
	} else if d.QuarantineAfter < d.DegradedAfter {
		errs = append(errs, fmt.Errorf("quarantine-after %d is below degraded-after %d", d.QuarantineAfter, d.DegradedAfter))
	}
	if c.Cooldown < 0 || c.MaxCooldown < 0 || c.ProbeTimeout < 0 || c.DecayAfter < 0 {
		errs = append(errs, errors.New("cooldowns, the probe timeout and the decay window must not be negative"))
	} else if d.MaxCooldown < d.Cooldown {
		errs = append(errs, fmt.Errorf("max cooldown %s is below the cooldown %s", d.MaxCooldown, d.Cooldown))
	}
	if c.CreateTimeout < 0 || c.CreateTimeout > MaxCreateTimeout {
		errs = append(errs, fmt.Errorf("create timeout %s: want 0 (the default, %s) up to %s", c.CreateTimeout, DefaultCreateTimeout, MaxCreateTimeout))
	}
	if c.MinOrgs < 0 || c.MinOrgs > MaxOrgsPerRunner {
		errs = append(errs, fmt.Errorf("min-orgs %d: want 1..%d", c.MinOrgs, MaxOrgsPerRunner))
	}
	return errors.Join(errs...)
}

// cooldown is the quarantine length after trips quarantines since the last heal.
func (c Config) cooldown(trips int) time.Duration {
	d := c.Cooldown
	for i := 1; i < trips && d < c.MaxCooldown; i++ {
		d *= 2
	}
	return min(d, c.MaxCooldown)
}

// View is a runner's health as one organization (or everyone) sees it.
type View struct {
	State State
	// Reason says why (empty when healthy): counts and failure kinds, never another
	// organization's identity or messages.
	Reason string
	// Until is the end of a quarantine's cooldown (zero otherwise).
	Until time.Time
	// Own: the state is the organization's own record, not the runner's for everyone.
	Own bool
}

// Transition is a change of state caused by a report, for logs and metrics. Org is ""
// for the runner's state for everyone.
type Transition struct {
	Runner, Org string
	From, To    State
	Reason      string
}

// breaker is one failure record: the runner's for everyone, or one organization's.
type breaker struct {
	fails  int       // consecutive counted failures (the runner's: the MinOrgs-th org's)
	trips  int       // quarantines since the last heal (>0: quarantined or probing)
	until  time.Time // end of the current cooldown
	probe  time.Time // when the half-open probe was admitted (zero: none out)
	last   string    // the last counted failure's kind
	lastAt time.Time // when the last counted failure was reported
	orgsIn int       // the runner's: organizations behind fails
}

func (b *breaker) state(now time.Time, c Config) State {
	switch {
	case b.trips > 0 && now.Before(b.until):
		return Quarantined
	case b.trips > 0:
		return Probing
	case b.fails >= c.DegradedAfter:
		return Degraded
	}
	return Healthy
}

// probeOut: a probe holds the half-open slot.
func (b *breaker) probeOut(now time.Time, c Config) bool {
	return !b.probe.IsZero() && now.Sub(b.probe) < c.ProbeTimeout
}

// fail counts one failure (global: fails set by the caller first); it quarantines
// when the threshold is reached, or again when a probe failed.
func (b *breaker) fail(now time.Time, c Config, probe bool) {
	switch st := b.state(now, c); {
	case st == Probing && (probe || b.fails >= c.QuarantineAfter):
		b.trips++
		b.until, b.probe = now.Add(c.cooldown(b.trips)), time.Time{}
	case st != Quarantined && st != Probing && b.fails >= c.QuarantineAfter:
		b.trips = 1
		b.until, b.probe = now.Add(c.cooldown(1)), time.Time{}
	}
}

type runnerRec struct {
	all  breaker
	orgs map[string]*breaker
}

// Tracker keeps the health of runners.
type Tracker struct {
	cfg    Config
	now    func() time.Time
	notify func(Transition)

	mu      sync.Mutex
	runners map[string]*runnerRec
}

// New returns a Tracker with cfg (defaults filled; validate it first), clock now (nil:
// time.Now) and notify (nil: none), called after each report that changed a state,
// outside the Tracker's lock.
func New(cfg Config, now func() time.Time, notify func(Transition)) *Tracker {
	if now == nil {
		now = time.Now
	}
	return &Tracker{cfg: cfg.WithDefaults(), now: now, notify: notify, runners: map[string]*runnerRec{}}
}

// Config is the tracker's configuration (defaults filled).
func (t *Tracker) Config() Config {
	if t == nil {
		return Config{}.WithDefaults()
	}
	return t.cfg
}

func (t *Tracker) rec(runner string) *runnerRec {
	r := t.runners[runner]
	if r == nil {
		r = &runnerRec{orgs: map[string]*breaker{}}
		t.runners[runner] = r
	}
	return r
}

// View is runner's health as organization org sees it: the worse of the runner's state
// for everyone and org's own record. A probing runner whose probe is out is reported
// quarantined (nothing more is admitted until the probe answers).
func (t *Tracker) View(runner, org string) View {
	if t == nil || t.cfg.Disabled {
		return View{}
	}
	t.mu.Lock()
	now := t.now()
	r := t.runners[runner]
	if r == nil {
		t.mu.Unlock()
		return View{}
	}
	changed := t.decay(runner, r, now)
	defer t.emit(changed)
	defer t.mu.Unlock()
	v := t.viewOf(&r.all, now, false)
	if b := r.orgs[org]; b != nil {
		if o := t.viewOf(b, now, true); o.State > v.State {
			v = o
		}
	}
	return v
}

// Global is runner's health for everyone.
func (t *Tracker) Global(runner string) View {
	return t.View(runner, "\x00none")
}

func (t *Tracker) viewOf(b *breaker, now time.Time, own bool) View {
	st := b.state(now, t.cfg)
	v := View{State: st, Own: own}
	if st == Probing && b.probeOut(now, t.cfg) {
		v.State = Quarantined
	}
	who := "from " + plural(b.orgsIn, "organization")
	if own {
		who = "of your organization"
	}
	switch v.State {
	case Healthy:
		return View{Own: own}
	case Degraded:
		v.Reason = fmt.Sprintf("degraded: %s in a row %s (last: %s); placed after healthy runners", plural(b.fails, "failed create"), who, b.last)
	case Probing:
		v.Reason = fmt.Sprintf("probing: quarantine ended; the next create tests it (%s in a row %s, last: %s)", plural(b.fails, "failed create"), who, b.last)
	case Quarantined:
		v.Until = b.until
		if st == Probing {
			v.Reason = fmt.Sprintf("quarantined: a probe create is testing it (%s in a row %s, last: %s)", plural(b.fails, "failed create"), who, b.last)
		} else {
			v.Reason = fmt.Sprintf("quarantined until %s: %s in a row %s (last: %s)", b.until.UTC().Format(time.RFC3339), plural(b.fails, "failed create"), who, b.last)
		}
	}
	return v
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

// Ticket is one admitted create: Report its outcome with it.
type Ticket struct {
	Runner, Org string
	// probeAll and probeOrg: the create holds the runner's (or org's) half-open slot.
	probeAll, probeOrg bool
}

// Probe reports whether the create is a half-open probe.
func (k Ticket) Probe() bool { return k.probeAll || k.probeOrg }

// Begin admits a create by org on runner, or refuses it (ok false) while the runner is
// quarantined for org or its probe is out. A probing runner's first create takes the
// probe slot.
func (t *Tracker) Begin(runner, org string) (Ticket, bool) {
	k := Ticket{Runner: runner, Org: org}
	if t == nil || t.cfg.Disabled {
		return k, true
	}
	t.mu.Lock()
	now := t.now()
	r := t.runners[runner]
	if r == nil {
		t.mu.Unlock()
		return k, true
	}
	changed := t.decay(runner, r, now)
	defer t.emit(changed)
	defer t.mu.Unlock()
	b := r.orgs[org]
	if t.viewOf(&r.all, now, false).State == Quarantined || (b != nil && t.viewOf(b, now, true).State == Quarantined) {
		return k, false
	}
	if r.all.state(now, t.cfg) == Probing {
		r.all.probe, k.probeAll = now, true
	}
	if b != nil && b.state(now, t.cfg) == Probing {
		b.probe, k.probeOrg = now, true
	}
	return k, true
}

// Report records the outcome of ticket k's create; kind names a Failure (e.g. a
// CWSANDBOX_* reason or a runner state reason; no caller text).
func (t *Tracker) Report(k Ticket, o Outcome, kind string) {
	if t == nil || t.cfg.Disabled {
		return
	}
	t.mu.Lock()
	now := t.now()
	r := t.rec(k.Runner)
	changed := t.decay(k.Runner, r, now)
	before := t.states(r, now)
	if k.probeAll {
		r.all.probe = time.Time{}
	}
	if b := r.orgs[k.Org]; b != nil && k.probeOrg {
		b.probe = time.Time{}
	}
	switch o {
	case Success:
		r.all = breaker{}
		clear(r.orgs)
	case Failure:
		b := r.orgs[k.Org]
		if b == nil {
			t.evict(r)
			b = &breaker{}
			r.orgs[k.Org] = b
		}
		b.fails++
		b.last, b.lastAt = kind, now
		b.fail(now, t.cfg, k.probeOrg)
		r.all.fails, r.all.orgsIn = t.corroborated(r)
		r.all.last = kind
		r.all.fail(now, t.cfg, k.probeAll)
	}
	changed = append(changed, t.diff(k.Runner, r, before, now, "")...)
	t.mu.Unlock()
	t.emit(changed)
}

// diff lists the transitions of r since its states before; reason, when set, replaces
// the states' own reasons.
func (t *Tracker) diff(runner string, r *runnerRec, before map[string]State, now time.Time, reason string) []Transition {
	var changed []Transition
	after := t.states(r, now)
	for key, to := range after {
		if from := before[key]; from != to {
			tr := Transition{Runner: runner, Org: key, From: from, To: to, Reason: reason}
			switch b := r.orgs[key]; {
			case reason != "":
			case key == "":
				tr.Reason = t.viewOf(&r.all, now, false).Reason
			case b != nil:
				tr.Reason = t.viewOf(b, now, true).Reason
			}
			changed = append(changed, tr)
		}
	}
	for key, from := range before {
		if _, ok := after[key]; !ok && from != Healthy {
			changed = append(changed, Transition{Runner: runner, Org: key, From: from, To: Healthy, Reason: reason})
		}
	}
	return changed
}

// emit notifies the transitions (outside the lock), in a stable order.
func (t *Tracker) emit(changed []Transition) {
	if t.notify == nil || len(changed) == 0 {
		return
	}
	slices.SortFunc(changed, func(a, b Transition) int {
		switch {
		case a.Org < b.Org:
			return -1
		case a.Org > b.Org:
			return 1
		}
		return 0
	})
	for _, tr := range changed {
		t.notify(tr)
	}
}

// decay forgets r's organization counts whose last counted failure is DecayAfter old or
// older (not quarantined or probing ones: their probe ends them) and recomputes the
// runner's count from the rest (unless the runner is quarantined or probing). It returns
// the transitions this caused.
func (t *Tracker) decay(runner string, r *runnerRec, now time.Time) []Transition {
	cutoff := now.Add(-t.cfg.DecayAfter)
	var stale []string
	for org, b := range r.orgs {
		if b.trips == 0 && !b.lastAt.After(cutoff) {
			stale = append(stale, org)
		}
	}
	if len(stale) == 0 {
		return nil
	}
	before := t.states(r, now)
	for _, org := range stale {
		delete(r.orgs, org)
	}
	if r.all.trips == 0 {
		r.all.fails, r.all.orgsIn = t.corroborated(r)
		if r.all.fails == 0 {
			r.all.last = ""
		}
	}
	return t.diff(runner, r, before, now, "decayed: no counted failure for "+t.cfg.DecayAfter.String())
}

// states are r's states ("" the runner's, then its organizations').
func (t *Tracker) states(r *runnerRec, now time.Time) map[string]State {
	m := map[string]State{"": r.all.state(now, t.cfg)}
	for org, b := range r.orgs {
		m[org] = b.state(now, t.cfg)
	}
	return m
}

// corroborated is the runner's failure count for everyone: the MinOrgs-th largest of its
// organizations' counts, and how many organizations have at least that many.
func (t *Tracker) corroborated(r *runnerRec) (int, int) {
	counts := make([]int, 0, len(r.orgs))
	for _, b := range r.orgs {
		if b.fails > 0 {
			counts = append(counts, b.fails)
		}
	}
	if len(counts) < t.cfg.MinOrgs {
		return 0, 0
	}
	slices.Sort(counts)
	slices.Reverse(counts)
	n := counts[t.cfg.MinOrgs-1]
	k := 0
	for _, c := range counts {
		if c >= n {
			k++
		}
	}
	return n, k
}

// evict makes room for one more organization in r.
func (t *Tracker) evict(r *runnerRec) {
	if len(r.orgs) < MaxOrgsPerRunner {
		return
	}
	var (
		victim string
		least  = -1
	)
	for org, b := range r.orgs {
		if least < 0 || b.fails < least || (b.fails == least && org < victim) {
			victim, least = org, b.fails
		}
	}
	delete(r.orgs, victim)
}

// Runners lists the tracked runners' states for everyone (for metrics).
func (t *Tracker) Runners() map[string]State {
	out := map[string]State{}
	if t == nil || t.cfg.Disabled {
		return out
	}
	t.mu.Lock()
	now := t.now()
	var changed []Transition
	for id, r := range t.runners {
		changed = append(changed, t.decay(id, r, now)...)
		out[id] = r.all.state(now, t.cfg)
	}
	t.mu.Unlock()
	t.emit(changed)
	return out
}
