package runner

import (
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// usageFake is a backend that only reads usage.
type usageFake struct {
	runtime.Backend
	u   runtime.Usage
	err error
}

func (f *usageFake) Usage(string) (runtime.Usage, error) { return f.u, f.err }

// TestUsageRate: the first read averages since the start; reads within usageWindow
// answer the last rate; a later one the rate over the window since the previous sample;
// a backend that cannot tell gives nil.
func TestUsageRate(t *testing.T) {
	f := &usageFake{u: runtime.Usage{CPUUsec: 2_000_000, MemoryBytes: 64 << 20}}
	r := &Runner{backend: f}
	e := &entry{}
	u := r.usage(e, "x", time.Now().Add(-4*time.Second)) // 2 s of CPU in 4 s
	if u == nil || u.CPUMillicores < 450 || u.CPUMillicores > 500 || u.MemoryBytes != 64<<20 {
		t.Fatalf("first read %+v, want ≈ 500m", u)
	}
	f.u.CPUUsec += 1_000_000
	if u := r.usage(e, "x", time.Time{}); u.CPUMillicores != e.usageRate || u.CPUUsec != 3_000_000 {
		t.Fatalf("read within the window: %+v", u)
	}
	e.usageAt = e.usageAt.Add(-2 * time.Second) // the previous sample 2 s ago: 1 s of CPU since
	if u := r.usage(e, "x", time.Time{}); u.CPUMillicores < 450 || u.CPUMillicores > 510 {
		t.Fatalf("rate over the window: %+v, want ≈ 500m", u)
	}
	f.u.CPUUsec = 10 // the counter went back (a restored sandbox's new cgroup)
	if u := r.usage(e, "x", time.Time{}); u.CPUMillicores < 0 {
		t.Fatalf("after a reset: %+v", u)
	}
	f.err = runtime.ErrNotFound
	if u := r.usage(e, "x", time.Time{}); u != nil {
		t.Fatalf("a backend that cannot tell: %+v", u)
	}
	if u := (&Runner{backend: struct{ runtime.Backend }{}}).usage(&entry{}, "x", time.Now()); u != nil {
		t.Fatalf("a backend without usage: %+v", u)
	}
}

// TestUsageRateSampleTime: a backend that says when its numbers were sampled (the
// kubelet's, cached) gets the rate between samples: the same sample read again keeps the
// last rate rather than reporting an idle window.
func TestUsageRateSampleTime(t *testing.T) {
	t0 := time.Now().Add(-time.Minute)
	f := &usageFake{u: runtime.Usage{CPUUsec: 1_000_000, At: t0}}
	r := &Runner{backend: f}
	e := &entry{}
	if u := r.usage(e, "x", t0.Add(-4*time.Second)); u == nil || u.CPUMillicores != 250 {
		t.Fatalf("first read %+v, want 250m (1 s of CPU in the 4 s before the sample)", u)
	}
	if u := r.usage(e, "x", time.Time{}); u.CPUMillicores != 250 {
		t.Fatalf("the same sample again: %+v, want the last rate 250m", u)
	}
	f.u.CPUUsec, f.u.At = 6_000_000, t0.Add(10*time.Second) // 5 s of CPU in the 10 s between samples
	if u := r.usage(e, "x", time.Time{}); u.CPUMillicores != 500 {
		t.Fatalf("the next sample: %+v, want 500m", u)
	}
}

// TestUsages: running sandboxes only, with their organization, at most limit.
func TestUsages(t *testing.T) {
	f := &usageFake{u: runtime.Usage{CPUUsec: 1_500_000, MemoryBytes: 32 << 20}}
	r := &Runner{backend: f, sandboxes: map[string]*entry{}}
	now := time.Now()
	for i, st := range []State{StateRunning, StateCreating, StateRunning, StateTerminated} {
		id := string(rune('a' + i))
		r.sandboxes[id] = &entry{sb: Sandbox{ID: id, State: st, CreatedAt: now.Add(time.Duration(i) * time.Second),
			Spec: runtime.Spec{Meta: map[string]string{runtime.MetaOrg: "org-" + id}}}}
	}
	got := r.Usages(10)
	if len(got) != 2 || got[0].ID != "a" || got[0].Org != "org-a" || got[1].ID != "c" || got[0].CPUUsec != 1_500_000 || got[1].MemoryBytes != 32<<20 {
		t.Fatalf("Usages = %+v, want a and c", got)
	}
	if got := r.Usages(1); len(got) != 1 {
		t.Fatalf("limit 1: %+v", got)
	}
	if got := (&Runner{backend: struct{ runtime.Backend }{}}).Usages(10); got != nil {
		t.Fatalf("a backend without usage: %+v", got)
	}
}
