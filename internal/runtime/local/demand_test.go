package local

import (
	"math"
	"slices"
	"testing"
	"time"
)

var demandT0 = time.Date(2026, 12, 6, 4, 0, 0, 0, time.UTC)

func TestDemandBurstWindow(t *testing.T) {
	var d demand
	for i := range 50 { // a burst of 50 within a second
		d.note(demandT0.Add(time.Duration(i)*20*time.Millisecond), 128)
	}
	if got := d.at(demandT0.Add(time.Second)); got != 50 {
		t.Fatalf("demand after a burst of 50: %v", got)
	}
	// Creates further apart than the window are no burst: the peak stays, the window
	// holds only the last.
	for i := 1; i <= 3; i++ {
		d.note(demandT0.Add(time.Duration(i)*(demandWindow+time.Second)), 128)
	}
	if len(d.recent) != 1 {
		t.Fatalf("window holds %d creates, want 1", len(d.recent))
	}
	if got := d.at(demandT0.Add(demandHold)); got != 50 {
		t.Fatalf("demand within the hold: %v, want 50", got)
	}
}

func TestDemandDecay(t *testing.T) {
	var d demand
	for range 40 {
		d.note(demandT0, 128)
	}
	for _, c := range []struct {
		after time.Duration
		want  float64
	}{
		{0, 40},
		{demandHold, 40},
		{demandHold + demandHalfLife, 20},
		{demandHold + 3*demandHalfLife, 5},
	} {
		if got := d.at(demandT0.Add(c.after)); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("demand %v after the burst: %v, want %v", c.after, got, c.want)
		}
	}
	// A smaller burst than the decayed peak leaves it; a larger one replaces it.
	later := demandT0.Add(demandHold + demandHalfLife) // decayed to 20
	for range 10 {
		d.note(later, 128)
	}
	if got := d.at(later); math.Abs(got-20) > 1e-9 {
		t.Errorf("demand after a smaller burst: %v, want 20 (decayed peak)", got)
	}
	for range 20 {
		d.note(later, 128)
	}
	if got := d.at(later.Add(demandHold)); got != 30 {
		t.Errorf("demand after a burst of 30: %v, want 30 held", got)
	}
}

func TestDemandLimit(t *testing.T) {
	var d demand
	for range 500 {
		d.note(demandT0, 64)
	}
	if got := d.at(demandT0); got != 64 || len(d.recent) != 64 {
		t.Fatalf("demand %v (window %d), want bounded at 64", got, len(d.recent))
	}
}

func TestSizeFor(t *testing.T) {
	for _, c := range []struct {
		d                 float64
		size, limit, want int
	}{
		{0, 4, 128, 4},
		{2.4, 1, 128, 2},
		{49.6, 4, 128, 50},
		{500, 4, 128, 128},
		{500, 4, 2, 4}, // a limit below size is size
	} {
		if got := sizeFor(c.d, c.size, c.limit); got != c.want {
			t.Errorf("sizeFor(%v, %d, %d) = %d, want %d", c.d, c.size, c.limit, got, c.want)
		}
	}
}

func TestShareDemand(t *testing.T) {
	for _, c := range []struct {
		name         string
		wants        []int
		base, budget int
		want         []int
	}{
		{"all fit", []int{50, 10, 4}, 4, 128, []int{50, 10, 4}},
		{"max-min", []int{100, 10, 4}, 4, 60, []int{46, 10, 4}},
		{"equal", []int{50, 50, 50}, 2, 100, []int{34, 33, 33}},
		{"base regardless", []int{10, 10}, 4, 2, []int{4, 4}},
		{"no budget", []int{10, 1}, 4, 0, []int{4, 1}},
		{"none", nil, 4, 100, []int{}},
	} {
		got := shareDemand(c.wants, c.base, c.budget)
		if !slices.Equal(got, c.want) {
			t.Errorf("%s: shareDemand(%v, %d, %d) = %v, want %v", c.name, c.wants, c.base, c.budget, got, c.want)
		}
	}
}

// TestPoolSizing drives the pool's sizing (no containers: its goroutine is not run)
// with an injected clock.
func TestPoolSizing(t *testing.T) {
	now := demandT0
	p := makePool(nil, PoolConfig{Size: 2, Max: 64, MemoryBytes: 100 * PooledContainerBytes, Refills: 4, now: func() time.Time { return now }})
	b := &Backend{pool: p}
	a, c, d := poolKey{image: "a", class: "runc"}, poolKey{image: "c", class: "runc"}, poolKey{image: "d", class: "runc"}
	burst := func(k poolKey, n int) {
		for range n {
			p.createStarted(k, true)
			p.createEnded()
		}
	}
	burst(a, 50)
	if st := b.PoolStats(); st.Want != 50 || len(st.Sets) != 1 || st.Sets[0].Want != 50 {
		t.Fatalf("after a burst of 50: %+v", st)
	}
	burst(a, 100) // clamped at Max
	if w := p.want(a); w != 64 {
		t.Fatalf("after a burst of 150: want %d, want Max 64", w)
	}
	burst(c, 50)
	burst(d, 50)
	if got := []int{p.want(a), p.want(c), p.want(d)}; !slices.Equal(got, []int{34, 33, 33}) {
		t.Fatalf("budget of 100 over three bursts: %v", got)
	}
	// Refills: none while a Create is in flight; then up to Refills, round robin.
	p.createStarted(a, true)
	if jobs := p.next(); len(jobs) != 0 {
		t.Fatalf("refills started during a Create: %v", jobs)
	}
	p.createEnded()
	perSet := map[poolKey]int{}
	for _, k := range p.next() {
		perSet[k]++
	}
	if perSet[a] < 1 || perSet[c] < 1 || perSet[d] < 1 || perSet[a]+perSet[c]+perSet[d] != 4 {
		t.Fatalf("refills started: %v, want 4 spread over the three sets", perSet)
	}
	if jobs := p.next(); len(jobs) != 0 {
		t.Fatalf("more than Refills at once: %v", jobs)
	}
	// Demand decays back to Size.
	now = now.Add(demandHold + 10*demandHalfLife)
	p.mu.Lock()
	p.resizeLocked(now)
	p.mu.Unlock()
	if got := []int{p.want(a), p.want(c), p.want(d)}; !slices.Equal(got, []int{2, 2, 2}) {
		t.Fatalf("after the demand decayed: %v, want Size", got)
	}
	// A target still keeps its set at the target.
	p.setTargets(map[poolKey]int{a: 5}, nil)
	if w := p.want(a); w != 5 {
		t.Fatalf("targeted set: want %d, want 5", w)
	}
}

// TestPoolSizingTargetsOnly: a pool of warm targets only (Size 0, a runner's) keeps
// nothing for demand.
func TestPoolSizingTargetsOnly(t *testing.T) {
	p := makePool(nil, PoolConfig{MaxTargeted: 8})
	k := poolKey{image: "a", class: "runc"}
	p.setTargets(map[poolKey]int{k: 2}, nil)
	for range 20 {
		p.createStarted(k, true)
		p.createEnded()
	}
	if w := p.want(k); w != 2 {
		t.Fatalf("want %d after a burst of 20, want the target 2", w)
	}
}

// TestRecentClaims: PoolStats.RecentClaims holds the whole time of each of the last
// claims, oldest first, and no more than recentClaims of them.
func TestRecentClaims(t *testing.T) {
	p := makePool(nil, PoolConfig{})
	b := &Backend{pool: p}
	for i := 1; i <= 3; i++ {
		p.claimed(ClaimTimes{Pull: time.Duration(i) * time.Millisecond, Start: time.Millisecond})
	}
	st := b.PoolStats()
	if want := []time.Duration{2 * time.Millisecond, 3 * time.Millisecond, 4 * time.Millisecond}; !slices.Equal(st.RecentClaims, want) {
		t.Errorf("recent claims %v, want %v", st.RecentClaims, want)
	}
	for i := range recentClaims + 10 {
		p.claimed(ClaimTimes{Setup: time.Duration(i)})
	}
	st = b.PoolStats()
	if len(st.RecentClaims) != recentClaims || st.RecentClaims[0] != 10 || st.RecentClaims[recentClaims-1] != recentClaims+9 {
		t.Errorf("after %d claims: %d recent, first %v, last %v; want the last %d in order", st.Claims, len(st.RecentClaims), st.RecentClaims[0], st.RecentClaims[len(st.RecentClaims)-1], recentClaims)
	}
}
