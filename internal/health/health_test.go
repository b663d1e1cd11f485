package health

import (
	"strings"
	"testing"
	"time"
)

type clock struct{ t time.Time }

func (c *clock) now() time.Time      { return c.t }
func (c *clock) add(d time.Duration) { c.t = c.t.Add(d) }
func newClock() *clock               { return &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)} }
func fail(t *Tracker, runner, org string) {
	k, _ := t.Begin(runner, org)
	t.Report(k, Failure, "CWSANDBOX_RUNNER_UNAVAILABLE")
}

func TestConfigValidate(t *testing.T) {
	if err := (Config{}).Validate(); err != nil {
		t.Fatalf("zero config: %v", err)
	}
	d := Config{}.WithDefaults()
	if d.DegradedAfter != 3 || d.QuarantineAfter != 6 || d.Cooldown != 30*time.Second || d.MaxCooldown != 10*time.Minute || d.MinOrgs != 2 || d.CreateTimeout != 90*time.Second {
		t.Fatalf("defaults: %+v", d)
	}
	for name, c := range map[string]Config{
		"negative":                    {DegradedAfter: -1},
		"quarantine<degraded":         {DegradedAfter: 5, QuarantineAfter: 4},
		"max<cooldown":                {Cooldown: time.Minute, MaxCooldown: time.Second},
		"negative cooldown":           {Cooldown: -time.Second},
		"min orgs beyond bound":       {MinOrgs: MaxOrgsPerRunner + 1},
		"negative create timeout":     {CreateTimeout: -time.Second},
		"create timeout beyond bound": {CreateTimeout: MaxCreateTimeout + time.Second},
	} {
		if err := c.Validate(); err == nil {
			t.Errorf("%s: %+v validated", name, c)
		}
	}
}

func TestCooldownDoublesBounded(t *testing.T) {
	c := Config{Cooldown: 30 * time.Second, MaxCooldown: 10 * time.Minute}.WithDefaults()
	want := []time.Duration{30 * time.Second, time.Minute, 2 * time.Minute, 4 * time.Minute, 8 * time.Minute, 10 * time.Minute, 10 * time.Minute}
	for i, w := range want {
		if got := c.cooldown(i + 1); got != w {
			t.Errorf("cooldown(%d) = %s, want %s", i+1, got, w)
		}
	}
}

// One organization (MinOrgs 1): degraded after 3, quarantined after 6, probing after the
// cooldown with one probe admitted, a failed probe doubles the cooldown, a success heals.
func TestStateMachine(t *testing.T) {
	clk := newClock()
	var trs []Transition
	tr := New(Config{MinOrgs: 1}, clk.now, func(x Transition) {
		if x.Org == "" {
			trs = append(trs, x)
		}
	})
	for i := 1; i <= 6; i++ {
		fail(tr, "r1", "a")
		want := Healthy
		switch {
		case i >= 6:
			want = Quarantined
		case i >= 3:
			want = Degraded
		}
		if got := tr.Global("r1").State; got != want {
			t.Fatalf("after %d failures: %s, want %s", i, got, want)
		}
	}
	if len(trs) != 2 || trs[0].To != Degraded || trs[1].To != Quarantined {
		t.Fatalf("transitions %+v", trs)
	}
	if v := tr.View("r1", "b"); v.State != Quarantined || !strings.Contains(v.Reason, "quarantined until") || v.Until != clk.t.Add(30*time.Second) {
		t.Fatalf("view %+v", v)
	}
	if _, ok := tr.Begin("r1", "b"); ok {
		t.Fatal("quarantined runner admitted a create")
	}
	clk.add(30 * time.Second)
	if got := tr.Global("r1").State; got != Probing {
		t.Fatalf("after the cooldown: %s", got)
	}
	probe, ok := tr.Begin("r1", "b")
	if !ok || !probe.Probe() {
		t.Fatalf("probe not admitted: %+v %v", probe, ok)
	}
	if _, ok := tr.Begin("r1", "c"); ok {
		t.Fatal("a second create admitted while the probe is out")
	}
	if v := tr.View("r1", "c"); v.State != Quarantined {
		t.Fatalf("view while the probe is out: %+v", v)
	}
	tr.Report(probe, Failure, "StartError")
	if v := tr.Global("r1"); v.State != Quarantined || v.Until != clk.t.Add(time.Minute) {
		t.Fatalf("after a failed probe: %+v (want 1m cooldown)", v)
	}
	clk.add(time.Minute)
	probe, ok = tr.Begin("r1", "b")
	if !ok || !probe.Probe() {
		t.Fatal("second probe not admitted")
	}
	// An ignored outcome (the caller's fault) frees the slot without changing anything.
	tr.Report(probe, Ignored, "")
	if got := tr.Global("r1").State; got != Probing {
		t.Fatalf("after an ignored probe: %s", got)
	}
	probe, _ = tr.Begin("r1", "b")
	tr.Report(probe, Success, "")
	if v := tr.Global("r1"); v.State != Healthy || v.Reason != "" {
		t.Fatalf("after a successful probe: %+v", v)
	}
	if last := trs[len(trs)-1]; last.To != Healthy {
		t.Fatalf("last transition %+v", last)
	}
	// Healed: the count starts again (and the cooldown from its base).
	for range 6 {
		fail(tr, "r1", "a")
	}
	if v := tr.Global("r1"); v.Until != clk.t.Add(30*time.Second) {
		t.Fatalf("cooldown after a heal: %+v", v)
	}
}

// A probe whose outcome never arrives stops holding the slot after ProbeTimeout.
func TestProbeTimeout(t *testing.T) {
	clk := newClock()
	tr := New(Config{MinOrgs: 1, ProbeTimeout: time.Minute}, clk.now, nil)
	for range 6 {
		fail(tr, "r1", "a")
	}
	clk.add(30 * time.Second)
	if _, ok := tr.Begin("r1", "a"); !ok {
		t.Fatal("probe not admitted")
	}
	if _, ok := tr.Begin("r1", "a"); ok {
		t.Fatal("second probe admitted")
	}
	clk.add(time.Minute)
	if _, ok := tr.Begin("r1", "a"); !ok {
		t.Fatal("lost probe still holds the slot")
	}
}

// A success anywhere resets the count: failures must be consecutive.
func TestSuccessResets(t *testing.T) {
	clk := newClock()
	tr := New(Config{MinOrgs: 1}, clk.now, nil)
	for range 2 {
		fail(tr, "r1", "a")
	}
	k, _ := tr.Begin("r1", "b")
	tr.Report(k, Success, "")
	for range 2 {
		fail(tr, "r1", "a")
	}
	if got := tr.Global("r1").State; got != Healthy {
		t.Fatalf("non-consecutive failures: %s", got)
	}
	// Ignored outcomes neither count nor reset.
	k, _ = tr.Begin("r1", "a")
	tr.Report(k, Ignored, "")
	fail(tr, "r1", "a")
	if got := tr.Global("r1").State; got != Degraded {
		t.Fatalf("3 failures around an ignored one: %s", got)
	}
	if got := tr.Global("r2").State; got != Healthy {
		t.Fatalf("other runner: %s", got)
	}
}

// One organization's failures degrade and quarantine the runner for it alone; the runner
// changes for everyone only when a second organization fails there as often.
func TestOneOrgCannotDegradeForOthers(t *testing.T) {
	clk := newClock()
	tr := New(Config{}, clk.now, nil) // MinOrgs 2
	for range 50 {
		fail(tr, "r1", "attacker")
	}
	if v := tr.View("r1", "victim"); v.State != Healthy {
		t.Fatalf("victim sees %+v", v)
	}
	if v := tr.Global("r1"); v.State != Healthy {
		t.Fatalf("runner for everyone: %+v", v)
	}
	if v := tr.View("r1", "attacker"); v.State != Quarantined || !v.Own || !strings.Contains(v.Reason, "of your organization") {
		t.Fatalf("attacker sees %+v", v)
	}
	if _, ok := tr.Begin("r1", "victim"); !ok {
		t.Fatal("victim's create refused")
	}
	// One real failure of another organization does not tip it either.
	fail(tr, "r1", "victim")
	if v := tr.View("r1", "third"); v.State != Healthy {
		t.Fatalf("after one victim failure: %+v", v)
	}
	// The victim's own failures corroborate: 3 each → degraded for everyone, 6 → quarantined.
	fail(tr, "r1", "victim")
	fail(tr, "r1", "victim")
	if v := tr.View("r1", "third"); v.State != Degraded || v.Own || !strings.Contains(v.Reason, "from 2 organizations") {
		t.Fatalf("after 3 victim failures: %+v", v)
	}
	for range 3 {
		fail(tr, "r1", "victim")
	}
	if v := tr.View("r1", "third"); v.State != Quarantined {
		t.Fatalf("after 6 victim failures: %+v", v)
	}
	if v := tr.View("r1", "third"); strings.Contains(v.Reason, "attacker") || strings.Contains(v.Reason, "victim") {
		t.Fatalf("reason names an organization: %q", v.Reason)
	}
}

// The organizations tracked per runner are bounded.
func TestOrgsBounded(t *testing.T) {
	tr := New(Config{}, newClock().now, nil)
	for i := range MaxOrgsPerRunner + 50 {
		fail(tr, "r1", strings.Repeat("x", i%7)+string(rune('a'+i%26))+string(rune(i)))
	}
	if n := len(tr.runners["r1"].orgs); n > MaxOrgsPerRunner {
		t.Fatalf("%d organizations tracked", n)
	}
}

func TestDisabled(t *testing.T) {
	tr := New(Config{Disabled: true, MinOrgs: 1}, newClock().now, nil)
	for range 10 {
		fail(tr, "r1", "a")
	}
	if v := tr.Global("r1"); v.State != Healthy {
		t.Fatalf("disabled: %+v", v)
	}
	var nilT *Tracker
	if _, ok := nilT.Begin("r", "o"); !ok || nilT.View("r", "o").State != Healthy {
		t.Fatal("nil tracker")
	}
}

// A degraded runner whose failures stop becomes healthy again once its last counted
// failure is older than DecayAfter; a failure within the window keeps the count; a
// quarantine is not decayed (its probe ends it).
func TestDecay(t *testing.T) {
	clk := newClock()
	var trs []Transition
	tr := New(Config{MinOrgs: 1, DecayAfter: 10 * time.Minute}, clk.now, func(x Transition) { trs = append(trs, x) })
	for range 3 {
		fail(tr, "r1", "a")
	}
	if v := tr.Global("r1"); v.State != Degraded {
		t.Fatalf("after 3 failures: %+v", v)
	}
	clk.add(9 * time.Minute)
	fail(tr, "r1", "a") // within the window: counted on top
	if v := tr.Global("r1"); v.State != Degraded || !strings.Contains(v.Reason, "4 failed creates") {
		t.Fatalf("after a 4th failure within the window: %+v", v)
	}
	clk.add(9 * time.Minute) // 18 min after the first, 9 after the last
	if v := tr.View("r1", "a"); v.State != Degraded {
		t.Fatalf("9 min after the last failure: %+v", v)
	}
	trs = nil
	clk.add(time.Minute)
	if v := tr.View("r1", "a"); v.State != Healthy {
		t.Fatalf("10 min after the last failure: %+v", v)
	}
	if got := tr.Runners()["r1"]; got != Healthy {
		t.Fatalf("metrics view: %s", got)
	}
	if len(trs) != 2 || trs[0].To != Healthy || !strings.Contains(trs[0].Reason, "decayed") {
		t.Fatalf("decay transitions: %+v", trs)
	}
	// Counting starts again from 0: two more failures do not degrade it.
	fail(tr, "r1", "a")
	fail(tr, "r1", "a")
	if v := tr.Global("r1"); v.State != Healthy {
		t.Fatalf("2 failures after the decay: %+v", v)
	}

	// A quarantine does not decay: it ends by its probe.
	for range 6 {
		fail(tr, "r2", "a")
	}
	clk.add(time.Hour)
	if v := tr.Global("r2"); v.State != Probing {
		t.Fatalf("an hour after a quarantine: %+v, want probing", v)
	}

	// Decay per organization: with MinOrgs 2, one organization's old failures decay and
	// the runner is no longer degraded for everyone, though the other's are recent.
	tr2 := New(Config{}, clk.now, nil)
	for range 3 {
		fail(tr2, "r3", "a")
	}
	clk.add(8 * time.Minute)
	for range 3 {
		fail(tr2, "r3", "b")
	}
	if v := tr2.Global("r3"); v.State != Degraded {
		t.Fatalf("two organizations' failures: %+v", v)
	}
	clk.add(3 * time.Minute) // a's are 11 min old, b's 3
	if v := tr2.Global("r3"); v.State != Healthy {
		t.Fatalf("after a's failures decayed: %+v", v)
	}
	if v := tr2.View("r3", "b"); v.State != Degraded || !v.Own {
		t.Fatalf("b's own view: %+v", v)
	}
}
