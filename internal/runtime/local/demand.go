package local

import (
	"math"
	"time"
)

// The warm pool's sizing by demand (pool.go): how many Creates of a set came within a
// short window (a burst), remembered for a while and then forgotten gradually.
const (
	// demandWindow is the span whose Creates count as one burst.
	demandWindow = 5 * time.Second
	// demandHold is how long the largest burst seen is kept at its full size.
	demandHold = 2 * time.Minute
	// demandHalfLife is how fast it decays after demandHold.
	demandHalfLife = time.Minute
)

// demand is one set's recent demand.
type demand struct {
	recent []time.Time // Creates within demandWindow of the last one, oldest first
	peak   float64     // the largest burst, as of peakAt
	peakAt time.Time
}

// note counts one Create at now; limit bounds what is remembered (the most a set is kept
// at: a larger burst is no different).
func (d *demand) note(now time.Time, limit int) {
	cut := now.Add(-demandWindow)
	i := 0
	for i < len(d.recent) && !d.recent[i].After(cut) {
		i++
	}
	d.recent = append(d.recent[:0], d.recent[i:]...)
	if len(d.recent) < max(limit, 1) {
		d.recent = append(d.recent, now)
	}
	if n := float64(len(d.recent)); n >= d.at(now) {
		d.peak, d.peakAt = n, now
	}
}

// at is the demand at now: the largest burst seen, held for demandHold, then halving
// every demandHalfLife.
func (d *demand) at(now time.Time) float64 {
	age := now.Sub(d.peakAt) - demandHold
	if age <= 0 || d.peak == 0 {
		return d.peak
	}
	return d.peak * math.Exp2(-age.Seconds()/demandHalfLife.Seconds())
}

// sizeFor is the size a set with demand d asks for: d rounded, within [size, limit].
func sizeFor(d float64, size, limit int) int {
	return min(max(int(math.Round(d)), size), max(limit, size))
}

// shareDemand shares budget containers among sets wanting wants (each at least base):
// every set has min(want, base) regardless (the pool's fixed size, kept as before); the
// rest of the budget beyond what those take goes one container at a time round robin
// to the sets that want more (max-min fairness: a set asking for 100 cannot take it all
// while another asking for 10 gets none). It returns each set's size, by index.
func shareDemand(wants []int, base, budget int) []int {
	out := make([]int, len(wants))
	left := budget
	for i, w := range wants {
		out[i] = min(w, max(base, 0))
		left -= out[i]
	}
	for left > 0 {
		hungry := 0
		for i, w := range wants {
			if out[i] < w {
				hungry++
			}
		}
		if hungry == 0 {
			break
		}
		// Each hungry set gets an equal slice of what is left (at least one container,
		// in index order), capped at what it wants.
		each := max(left/hungry, 1)
		for i, w := range wants {
			if left == 0 {
				break
			}
			if out[i] < w {
				n := min(each, w-out[i], left)
				out[i] += n
				left -= n
			}
		}
	}
	return out
}
