package runner

import (
	"slices"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// usageWindow is the shortest window a CPU rate is computed over: reads closer together
// than this answer the rate of the last window.
const usageWindow = time.Second

// usage reads sandbox id's resource usage from the backend (nil when it cannot tell)
// and turns its CPU time into a rate: over the window since the previous sample of e
// once that is at least usageWindow old, else the last rate; at the first sample, the
// average since started.
func (r *Runner) usage(e *entry, id string, started time.Time) *Usage {
	b, ok := r.backend.(runtime.UsageReader)
	if !ok {
		return nil
	}
	u, err := b.Usage(id)
	if err != nil {
		return nil
	}
	now := time.Now()
	if !u.At.IsZero() {
		now = u.At // the sample's own time (a cached sample is not a new window)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case e.usageAt.IsZero() || u.CPUUsec < e.usageUsec:
		// The first sample (or the counter went back: a restored sandbox's new cgroup).
		if el := now.Sub(started); !started.IsZero() && el > 0 {
			e.usageRate = rate(u.CPUUsec, el)
		}
		e.usageAt, e.usageUsec = now, u.CPUUsec
	case now.Sub(e.usageAt) >= usageWindow:
		e.usageRate = rate(u.CPUUsec-e.usageUsec, now.Sub(e.usageAt))
		e.usageAt, e.usageUsec = now, u.CPUUsec
	}
	return &Usage{CPUMillicores: e.usageRate, Usage: u}
}

// rate is usec of CPU time over wall time el in millicores.
func rate(usec int64, el time.Duration) int64 {
	if el.Microseconds() <= 0 || usec <= 0 {
		return 0
	}
	return int64(float64(usec) * 1000 / float64(el.Microseconds()))
}

// SandboxUsage is one running sandbox's cgroup usage, for the per-sandbox metrics.
type SandboxUsage struct {
	ID, Org string
	runtime.Usage
}

// Usages reads the usage of at most limit running sandboxes (oldest first) from the
// backend: the same numbers GetSandbox's status.resource_usage carries. Sandboxes whose
// usage the backend cannot tell are left out; nil when it never can.
func (r *Runner) Usages(limit int) []SandboxUsage {
	b, ok := r.backend.(runtime.UsageReader)
	if !ok {
		return nil
	}
	// The running sandboxes, oldest first, without List's status refresh (a scrape must
	// not make the runner ask the backend about every container).
	type running struct {
		id, org string
		at      time.Time
	}
	var rs []running
	r.mu.Lock()
	for _, e := range r.sandboxes {
		if e.sb.State == StateRunning {
			rs = append(rs, running{e.sb.ID, e.sb.Spec.Meta[runtime.MetaOrg], e.sb.CreatedAt})
		}
	}
	r.mu.Unlock()
	slices.SortFunc(rs, func(a, b running) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		return strings.Compare(a.id, b.id)
	})
	var out []SandboxUsage
	for _, sb := range rs {
		if len(out) >= limit {
			break
		}
		u, err := b.Usage(sb.id)
		if err != nil {
			continue
		}
		out = append(out, SandboxUsage{ID: sb.id, Org: sb.org, Usage: u})
	}
	return out
}
