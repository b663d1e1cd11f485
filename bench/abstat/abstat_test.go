package abstat

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

func TestMedian(t *testing.T) {
	for _, c := range []struct {
		in   []float64
		want float64
	}{{[]float64{3, 1, 2}, 2}, {[]float64{4, 1, 3, 2}, 2.5}, {[]float64{7}, 7}} {
		if got := Median(c.in); got != c.want {
			t.Errorf("Median(%v) = %v, want %v", c.in, got, c.want)
		}
	}
	if !math.IsNaN(Median(nil)) {
		t.Error("Median(nil) is not NaN")
	}
	in := []float64{3, 1, 2}
	Median(in)
	if in[0] != 3 {
		t.Error("Median sorted its input")
	}
}

func TestRatios(t *testing.T) {
	var r Rounds
	ms := func(x float64) time.Duration { return time.Duration(x * float64(time.Millisecond)) }
	for _, x := range []float64{2, 2.2, 2.4} {
		r.Add(0, true, ms(x))
	}
	for _, x := range []float64{2, 1.8, 2.2} {
		r.Add(0, false, ms(x))
	}
	r.Add(1, true, ms(3)) // a round with one mode only is left out
	r.Add(2, true, ms(3))
	r.Add(2, false, ms(2))
	got := r.Ratios()
	if len(got) != 2 || math.Abs(got[0]-1.1) > 1e-9 || math.Abs(got[1]-1.5) > 1e-9 {
		t.Fatalf("Ratios = %v, want [1.1 1.5]", got)
	}
	if d := r.Diffs(); len(d) != 2 || math.Abs(d[0]-0.2) > 1e-9 || math.Abs(d[1]-1) > 1e-9 {
		t.Errorf("Diffs = %v, want [0.2 1]", d)
	}
	if n := len(r.All(true)); n != 5 {
		t.Errorf("All(A) has %d samples, want 5", n)
	}
}

// noisy is n ratios around center with a relative spread (log-normal, like timings).
func noisy(n int, center, spread float64, seed uint64) []float64 {
	rng := rand.New(rand.NewPCG(seed, 1))
	out := make([]float64, n)
	for i := range out {
		out[i] = center * math.Exp(spread*rng.NormFloat64())
	}
	return out
}

func TestBootstrapVerdicts(t *testing.T) {
	for _, c := range []struct {
		name    string
		ratios  []float64
		verdict string
	}{
		{"clearly under", noisy(50, 1.00, 0.03, 1), "MET"},
		{"clearly over", noisy(50, 1.10, 0.03, 2), "NOT MET"},
		{"at the target, noisy", noisy(50, 1.03, 0.10, 3), "UNDECIDED"},
		{"no rounds", nil, "UNDECIDED"},
	} {
		r := Bootstrap(c.ratios, 0.95, 1.03, 4000, 7)
		if got := r.Verdict(); got != c.verdict {
			t.Errorf("%s: verdict %s, want %s (%s)", c.name, got, c.verdict, r)
		}
		if !strings.Contains(r.String(), r.Verdict()) {
			t.Errorf("%s: %q lacks the verdict", c.name, r)
		}
	}
}

// The interval covers the true median about as often as its level says (here: at least
// 88% of 200 experiments for a 95% interval; a percentile bootstrap of a median of 40 is
// a little narrow), and is the same for the same input.
func TestBootstrapCoverage(t *testing.T) {
	covered := 0
	const experiments = 200
	for e := range experiments {
		r := Bootstrap(noisy(40, 1.02, 0.05, uint64(100+e)), 0.95, 1.03, 1000, uint64(e))
		if r.Lo <= 1.02 && 1.02 <= r.Hi {
			covered++
		}
	}
	if covered < experiments*88/100 {
		t.Errorf("the 95%% interval covered the true median in %d of %d experiments", covered, experiments)
	}
	x := noisy(30, 1, 0.05, 9)
	if a, b := Bootstrap(x, 0.95, 1.03, 500, 3), Bootstrap(x, 0.95, 1.03, 500, 3); a != b {
		t.Errorf("the same input gave %v and %v", a, b)
	}
}

// PooledBootstrap: the pooled p50 ratio of rounds whose samples are A = 1.1 × B, with
// each round at its own level of load (×1 to ×3): the ratio is 1.1 and the interval
// excludes 1.03; with A = B it is met.
func TestPooledBootstrap(t *testing.T) {
	for _, c := range []struct {
		factor  float64
		verdict string
	}{{1.10, "NOT MET"}, {1.00, "MET"}} {
		var r Rounds
		rng := rand.New(rand.NewPCG(5, 6))
		for i := range 40 {
			load := 1 + 2*rng.Float64()
			for range 30 {
				base := 2 * load * math.Exp(0.05*rng.NormFloat64())
				r.Add(i, true, time.Duration(c.factor*base*float64(time.Millisecond)))
				r.Add(i, false, time.Duration(2*load*math.Exp(0.05*rng.NormFloat64())*float64(time.Millisecond)))
			}
		}
		res := PooledBootstrap(&r, 0.95, 1.03, 500, 1)
		if math.Abs(res.Median-c.factor) > 0.03 || res.Verdict() != c.verdict || !res.Pooled {
			t.Errorf("factor %.2f: %s", c.factor, res)
		}
	}
	if res := PooledBootstrap(&Rounds{}, 0.95, 1.03, 100, 1); res.Verdict() != "UNDECIDED" {
		t.Errorf("no rounds: %s", res)
	}
}

// PairedBootstrap: samples whose load moves call by call (a pair's two calls share their
// moment, the calls of a round do not), A = factor × B: the median pair ratio is the
// factor, with an interval narrower than the round ratios' on the same samples, and the
// verdicts follow. The j-th A pairs with the j-th B.
func TestPairedBootstrap(t *testing.T) {
	for _, c := range []struct {
		factor  float64
		verdict string
	}{{1.05, "NOT MET"}, {1.00, "MET"}} {
		var r Rounds
		rng := rand.New(rand.NewPCG(7, 8))
		for i := range 30 {
			for range 10 {
				load := 2 * math.Exp(0.4*rng.NormFloat64()) // this pair's moment
				r.Add(i, true, time.Duration(c.factor*load*math.Exp(0.02*rng.NormFloat64())*float64(time.Millisecond)))
				r.Add(i, false, time.Duration(load*math.Exp(0.02*rng.NormFloat64())*float64(time.Millisecond)))
			}
		}
		res := PairedBootstrap(&r, 0.95, 1.03, 500, 1)
		rounds := Bootstrap(r.Ratios(), 0.95, 1.03, 500, 1)
		if math.Abs(res.Median-c.factor) > 0.01 || res.Verdict() != c.verdict || res.Pairs != 300 || res.Rounds != 30 {
			t.Errorf("factor %.2f: %s", c.factor, res)
		}
		if res.Hi-res.Lo >= (rounds.Hi-rounds.Lo)/3 {
			t.Errorf("factor %.2f: paired interval [%.3f, %.3f] not narrower than the rounds' [%.3f, %.3f]", c.factor, res.Lo, res.Hi, rounds.Lo, rounds.Hi)
		}
	}
	var r Rounds // pairs by position: A's samples 1, 2 with B's 2, 4
	r.Add(0, true, 1)
	r.Add(0, false, 2)
	r.Add(0, false, 4)
	r.Add(0, true, 2)
	if res := PairedBootstrap(&r, 0.95, 1.03, 10, 1); res.Median != 0.5 || res.Pairs != 2 {
		t.Errorf("pairs (1, 2), (2, 4): %s", res)
	}
	if res := PairedBootstrap(&Rounds{}, 0.95, 1.03, 100, 1); res.Verdict() != "UNDECIDED" {
		t.Errorf("no rounds: %s", res)
	}
}
