// Package abstat is the statistics of an A/B benchmark whose two modes are interleaved in
// rounds on one machine (ABBA order within a round): per round the ratio of the two modes'
// medians, the median of those ratios, and its bootstrap confidence interval, so that one
// run says whether a target ratio is met and how sure that is.
//
// Why per round: a shared machine's load moves over seconds, and it moves both modes of a
// round alike, so a round's ratio cancels it; the rounds' ratios are then close to
// independent draws, which is what the bootstrap resamples.
package abstat

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"
)

// Median of d (the mean of the two middle values for an even count); NaN when empty.
func Median(d []float64) float64 {
	if len(d) == 0 {
		return math.NaN()
	}
	s := slices.Clone(d)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// MedianDur is Median of d in milliseconds.
func MedianDur(d []time.Duration) float64 {
	f := make([]float64, len(d))
	for i, x := range d {
		f[i] = float64(x) / float64(time.Millisecond)
	}
	return Median(f)
}

// Rounds holds the samples of the two modes, round by round.
type Rounds struct {
	A, B [][]time.Duration // A[i], B[i]: round i's samples of each mode
}

// Add appends a sample of mode A (a) or B (!a) to round i (rounds are made as needed).
func (r *Rounds) Add(i int, a bool, d time.Duration) {
	for len(r.A) <= i {
		r.A, r.B = append(r.A, nil), append(r.B, nil)
	}
	if a {
		r.A[i] = append(r.A[i], d)
	} else {
		r.B[i] = append(r.B[i], d)
	}
}

// Ratios are the rounds' median(A)/median(B); rounds lacking either mode are left out.
func (r *Rounds) Ratios() []float64 {
	var out []float64
	for i := range r.A {
		if len(r.A[i]) == 0 || i >= len(r.B) || len(r.B[i]) == 0 {
			continue
		}
		out = append(out, MedianDur(r.A[i])/MedianDur(r.B[i]))
	}
	return out
}

// Diffs are the rounds' median(A)−median(B) in milliseconds; rounds lacking either mode
// are left out.
func (r *Rounds) Diffs() []float64 {
	var out []float64
	for i := range r.A {
		if len(r.A[i]) == 0 || i >= len(r.B) || len(r.B[i]) == 0 {
			continue
		}
		out = append(out, MedianDur(r.A[i])-MedianDur(r.B[i]))
	}
	return out
}

// All is every sample of mode A (a) or B (!a).
func (r *Rounds) All(a bool) []time.Duration {
	src := r.B
	if a {
		src = r.A
	}
	var out []time.Duration
	for _, x := range src {
		out = append(out, x...)
	}
	return out
}

// Result is the verdict on "median round ratio ≤ Target".
type Result struct {
	Rounds  int     // ratios used
	Median  float64 // the median of the rounds' ratios
	Lo, Hi  float64 // its two-sided bootstrap percentile interval at Level
	Level   float64 // e.g. 0.95
	Target  float64 // e.g. 1.03
	PBelow  float64 // share of the bootstrap medians ≤ Target: how sure "met" is
	Resamps int
	Pooled  bool // Median is the pooled p50 ratio (PooledBootstrap), not a median of round ratios
	Pairs   int  // Median is the median ratio of this many neighbouring pairs (PairedBootstrap)
}

// Bootstrap resamples ratios (with replacement, resamples times, seeded: the same input
// gives the same interval) and returns the median's percentile interval at level and the
// share of resamples ≤ target.
func Bootstrap(ratios []float64, level, target float64, resamples int, seed uint64) Result {
	res := Result{Rounds: len(ratios), Median: Median(ratios), Level: level, Target: target, Resamps: resamples,
		Lo: math.NaN(), Hi: math.NaN(), PBelow: math.NaN()}
	if len(ratios) == 0 || resamples <= 0 {
		return res
	}
	buf := make([]float64, len(ratios))
	res.resample(seed, func(rng *rand.Rand) float64 {
		for i := range buf {
			buf[i] = ratios[rng.IntN(len(ratios))]
		}
		return Median(buf)
	})
	return res
}

// resample sets r's interval (Lo, Hi at r.Level) and PBelow (the share ≤ r.Target)
// from r.Resamps values of stat, each drawn with one seeded generator: the same input
// gives the same interval.
func (r *Result) resample(seed uint64, stat func(rng *rand.Rand) float64) {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	stats := make([]float64, r.Resamps)
	below := 0
	for k := range stats {
		stats[k] = stat(rng)
		if stats[k] <= r.Target {
			below++
		}
	}
	slices.Sort(stats)
	at := func(q float64) float64 {
		return stats[min(len(stats)-1, max(0, int(math.Floor(q*float64(len(stats))))))]
	}
	alpha := (1 - r.Level) / 2
	r.Lo, r.Hi, r.PBelow = at(alpha), at(1-alpha), float64(below)/float64(r.Resamps)
}

// PooledBootstrap is Bootstrap of the ratio median(all A)/median(all B) — the p50 ratio
// over every sample — resampling whole rounds (with replacement, so that a round's
// samples, which share its moment of the machine, stay together).
func PooledBootstrap(r *Rounds, level, target float64, resamples int, seed uint64) Result {
	var rounds []int
	for i := range r.A {
		if len(r.A[i]) > 0 && i < len(r.B) && len(r.B[i]) > 0 {
			rounds = append(rounds, i)
		}
	}
	ratio := func(pick func(k int) int) float64 {
		var a, b []time.Duration
		for k := range rounds {
			i := rounds[pick(k)]
			a, b = append(a, r.A[i]...), append(b, r.B[i]...)
		}
		return MedianDur(a) / MedianDur(b)
	}
	res := Result{Rounds: len(rounds), Median: math.NaN(), Level: level, Target: target, Resamps: resamples,
		Lo: math.NaN(), Hi: math.NaN(), PBelow: math.NaN()}
	if len(rounds) == 0 || resamples <= 0 {
		return res
	}
	res.Median = ratio(func(k int) int { return k })
	res.resample(seed, func(rng *rand.Rand) float64 {
		return ratio(func(int) int { return rng.IntN(len(rounds)) })
	})
	res.Pooled = true
	return res
}

// PairedBootstrap is Bootstrap of the median ratio of neighbouring samples: within a
// round, the j-th sample of A and the j-th of B, which ABBA order takes one right after
// the other (A B B A: the first A with the first B, the second B with the second A), make
// a pair, and its ratio A/B shares that moment of the machine — a finer pairing than a
// round's. The median is of every pair's ratio; whole rounds are resampled (with
// replacement), so that pairs of one round stay together.
func PairedBootstrap(r *Rounds, level, target float64, resamples int, seed uint64) Result {
	var pairs [][]float64 // per round with pairs
	n := 0
	for i := range r.A {
		if i >= len(r.B) {
			break
		}
		var p []float64
		for j := range min(len(r.A[i]), len(r.B[i])) {
			p = append(p, float64(r.A[i][j])/float64(r.B[i][j]))
		}
		if len(p) > 0 {
			pairs, n = append(pairs, p), n+len(p)
		}
	}
	res := Result{Rounds: len(pairs), Pairs: n, Median: math.NaN(), Level: level, Target: target, Resamps: resamples,
		Lo: math.NaN(), Hi: math.NaN(), PBelow: math.NaN()}
	if n == 0 || resamples <= 0 {
		return res
	}
	all := make([]float64, 0, n)
	for _, p := range pairs {
		all = append(all, p...)
	}
	res.Median = Median(all)
	res.resample(seed, func(rng *rand.Rand) float64 {
		all = all[:0]
		for range pairs {
			all = append(all, pairs[rng.IntN(len(pairs))]...)
		}
		return Median(all)
	})
	return res
}

// Verdict is one of "MET", "NOT MET" or "UNDECIDED": the whole interval at or below the
// target, the whole interval above it, or the target inside it.
func (r Result) Verdict() string {
	switch {
	case math.IsNaN(r.Hi):
		return "UNDECIDED"
	case r.Hi <= r.Target:
		return "MET"
	case r.Lo > r.Target:
		return "NOT MET"
	}
	return "UNDECIDED"
}

// String is the line a benchmark prints.
func (r Result) String() string {
	what := fmt.Sprintf("median of %d round ratios", r.Rounds)
	if r.Pooled {
		what = fmt.Sprintf("p50 ratio of all samples (%d rounds)", r.Rounds)
	}
	if r.Pairs > 0 {
		what = fmt.Sprintf("median ratio of %d neighbouring pairs (%d rounds)", r.Pairs, r.Rounds)
	}
	s := fmt.Sprintf("%s ×%.3f, %.0f%% CI [%.3f, %.3f] (bootstrap over rounds, %d resamples): target ≤ %.2f %s",
		what, r.Median, 100*r.Level, r.Lo, r.Hi, r.Resamps, r.Target, r.Verdict())
	switch r.Verdict() {
	case "MET":
		s += fmt.Sprintf(" (the CI's upper bound is below it; %.1f%% of resamples ≤ %.2f)", 100*r.PBelow, r.Target)
	case "NOT MET":
		s += fmt.Sprintf(" (the CI's lower bound is above it; %.1f%% of resamples ≤ %.2f)", 100*r.PBelow, r.Target)
	default:
		s += fmt.Sprintf(" (the target is inside the CI: %.1f%% of resamples ≤ %.2f; more rounds narrow it)", 100*r.PBelow, r.Target)
	}
	return s
}
