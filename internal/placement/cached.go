package placement

import "slices"

// CachedMaxLoad is the load (Candidate.Load, after placement) above which a runner's
// cached snapshots no longer put it first: a download is cheaper than piling every fork
// of one snapshot onto one nearly full runner.
const CachedMaxLoad = 0.8

// PreferCached orders Place's candidates for a sandbox that restores the snapshot
// archives of digests (sha256 of each archive, as runners report them in
// Capacity.CachedSnapshots): a runner that has more of them cached comes before one that
// has fewer, as long as its load stays at or below CachedMaxLoad; otherwise, and among
// runners with as many cached, Place's order (least loaded first) stays. It only
// reorders: every candidate already accepts the sandbox and has room for it, so the
// preference never overrides a policy or capacity. runners is Place's Request.Runners
// (Candidate.Index points into it). It is pure and stable, and a no-op without digests.
func PreferCached(cands []Candidate, runners []Runner, digests []string) {
	if len(digests) == 0 || len(cands) < 2 {
		return
	}
	hits := make(map[int]int, len(cands))
	for _, c := range cands {
		if c.Index < 0 || c.Index >= len(runners) || c.Load > CachedMaxLoad {
			continue
		}
		n := 0
		for _, d := range digests {
			if d != "" && slices.Contains(runners[c.Index].CachedSnapshots, d) {
				n++
			}
		}
		hits[c.Index] = n
	}
	slices.SortStableFunc(cands, func(a, b Candidate) int {
		if a.healthRank != b.healthRank {
			return a.healthRank - b.healthRank // a cache never puts a degraded runner first
		}
		return hits[b.Index] - hits[a.Index]
	})
}
