package placement

import "sync"

// Reservations holds the resources of placements in flight: reserved when a runner is
// chosen, released when the runner has answered (its reported usage then includes the
// sandbox, or the create failed). Safe for concurrent use; the zero value is ready.
type Reservations struct {
	mu       sync.Mutex
	byRunner map[string]reservation
}

type reservation struct {
	res Resources
	n   int
}

// Reserve holds need on runnerID until release is called (release is idempotent).
func (rs *Reservations) Reserve(runnerID string, need Resources) (release func()) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	rs.addLocked(runnerID, need, 1)
	return rs.releaser(runnerID, need)
}

// Claim reserves c's need on its runner if it still fits there given the reservations
// made since c was placed; ok is false (and nothing is held) when it does not.
func (rs *Reservations) Claim(c Candidate) (release func(), ok bool) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	h := rs.byRunner[c.RunnerID]
	if c.misfit(h.res, h.n) != "" {
		return func() {}, false
	}
	rs.addLocked(c.RunnerID, c.Need, 1)
	return rs.releaser(c.RunnerID, c.Need), true
}

// Held returns what is reserved on runnerID and for how many sandboxes (nothing on a
// nil Reservations).
func (rs *Reservations) Held(runnerID string) (Resources, int) {
	if rs == nil {
		return Resources{}, 0
	}
	rs.mu.Lock()
	defer rs.mu.Unlock()
	h := rs.byRunner[runnerID]
	return h.res, h.n
}

func (rs *Reservations) addLocked(runnerID string, need Resources, n int) {
	if rs.byRunner == nil {
		rs.byRunner = map[string]reservation{}
	}
	h := rs.byRunner[runnerID]
	h.res, h.n = h.res.add(need), h.n+n
	if h.n == 0 {
		delete(rs.byRunner, runnerID)
		return
	}
	rs.byRunner[runnerID] = h
}

func (rs *Reservations) releaser(runnerID string, need Resources) func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			rs.mu.Lock()
			defer rs.mu.Unlock()
			rs.addLocked(runnerID, Resources{}.sub(need), -1)
		})
	}
}

// ClaimUpTo reserves as many of n sandboxes of c's need each (at least 1, at most n) as
// fit on its runner, in one step, and returns how many, their release, and why all n do
// not fit ("" when they do). It holds nothing (k 0) when not even one fits.
func (rs *Reservations) ClaimUpTo(c Candidate, n int) (k int, release func(), why string) {
	if n < 1 {
		n = 1
	}
	rs.mu.Lock()
	defer rs.mu.Unlock()
	h := rs.byRunner[c.RunnerID]
	misfit := func(k int) string {
		total := Resources{c.Need.MilliCPU * int64(k), c.Need.MemoryBytes * int64(k), c.Need.GPUs * int64(k)}
		return c.room.Misfit(total, h.res, h.n+k-1)
	}
	why = misfit(n)
	if why == "" {
		k = n
	} else {
		// Room only shrinks as k grows: the largest k that fits, by bisection.
		lo, hi := 0, n // misfit(lo) == "" (or lo 0), misfit(hi) != ""
		for hi-lo > 1 {
			if mid := (lo + hi) / 2; misfit(mid) == "" {
				lo = mid
			} else {
				hi = mid
			}
		}
		k = lo
	}
	if k == 0 {
		return 0, func() {}, why
	}
	total := Resources{c.Need.MilliCPU * int64(k), c.Need.MemoryBytes * int64(k), c.Need.GPUs * int64(k)}
	rs.addLocked(c.RunnerID, total, k)
	var once sync.Once
	return k, func() {
		once.Do(func() {
			rs.mu.Lock()
			defer rs.mu.Unlock()
			rs.addLocked(c.RunnerID, Resources{}.sub(total), -k)
		})
	}, why
}

// ClaimN reserves n sandboxes of c's need each on its runner (a fork of n sandboxes) if
// all of them fit there given its room when c was placed and the reservations made
// since; otherwise nothing is held and why says what is missing.
func (rs *Reservations) ClaimN(c Candidate, n int) (release func(), why string) {
	if n < 1 {
		n = 1
	}
	total := Resources{c.Need.MilliCPU * int64(n), c.Need.MemoryBytes * int64(n), c.Need.GPUs * int64(n)}
	rs.mu.Lock()
	defer rs.mu.Unlock()
	h := rs.byRunner[c.RunnerID]
	if why := c.room.Misfit(total, h.res, h.n+n-1); why != "" {
		return func() {}, why
	}
	rs.addLocked(c.RunnerID, total, n)
	var once sync.Once
	return func() {
		once.Do(func() {
			rs.mu.Lock()
			defer rs.mu.Unlock()
			rs.addLocked(c.RunnerID, Resources{}.sub(total), -n)
		})
	}, ""
}
