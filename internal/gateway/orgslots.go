package gateway

import "sync"

// orgSlots bounds how many of something a caller holds open at once: at most max on the
// gateway and perOrg for one organization (a caller controls how many it opens, and
// each holds a goroutine and a stream to a runner). It serves the start waits of
// GetSandbox (startwait.go) and the WatchSandboxProgress streams (progress.go).
type orgSlots struct {
	max, perOrg int

	mu    sync.Mutex
	total int
	byOrg map[string]int
}

func newOrgSlots(max, perOrg int) *orgSlots {
	return &orgSlots{max: max, perOrg: perOrg, byOrg: map[string]int{}}
}

// acquire takes a slot for org; false when the gateway's or the organization's slots
// are all taken. A true acquire is paired with one release.
func (o *orgSlots) acquire(org string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.total >= o.max || o.byOrg[org] >= o.perOrg {
		return false
	}
	o.total++
	o.byOrg[org]++
	return true
}

func (o *orgSlots) release(org string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.total--
	if o.byOrg[org]--; o.byOrg[org] <= 0 {
		delete(o.byOrg, org)
	}
}

// held is how many slots are taken.
func (o *orgSlots) held() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.total
}
