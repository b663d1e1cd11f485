// Package span records where the time of one operation goes: named steps carried in a
// context, which the layer that made the record logs in one line (the gateway's
// ResumeSandbox and ForkSandbox, the runner's Resume and Fork, with the local backend's
// steps inside). It is for measuring (the pause benchmark parses these lines), never
// for control: a context without a record records nothing.
package span

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"
)

// maxSteps bounds one record (concurrent forks add their steps to one record).
const maxSteps = 512

// Record is the steps of one operation, in the order they ended.
type Record struct {
	mu    sync.Mutex
	start time.Time
	steps []step
}

type step struct {
	name string
	d    time.Duration
}

type key struct{}

// New returns ctx carrying a new record (a record of the caller's is not added to: each
// layer logs its own).
func New(ctx context.Context) (context.Context, *Record) {
	r := &Record{start: time.Now()}
	return context.WithValue(ctx, key{}, r), r
}

// From is ctx's record, nil if none.
func From(ctx context.Context) *Record {
	r, _ := ctx.Value(key{}).(*Record)
	return r
}

// Add records step name of d (nil-safe).
func (r *Record) Add(name string, d time.Duration) {
	if r == nil {
		return
	}
	r.mu.Lock()
	if len(r.steps) < maxSteps {
		r.steps = append(r.steps, step{name, d})
	}
	r.mu.Unlock()
}

// Mark records step name as the time since *t in ctx's record, and sets *t to now.
func Mark(ctx context.Context, name string, t *time.Time) {
	now := time.Now()
	From(ctx).Add(name, now.Sub(*t))
	*t = now
}

// String is the steps as name=duration, space-separated, in the order each name first
// ended; a name recorded more than once (concurrent forks) shows its sum and count as
// name=sum/count. The total since New comes last.
func (r *Record) String() string {
	if r == nil {
		return ""
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	var order []string
	sum := map[string]time.Duration{}
	n := map[string]int{}
	for _, s := range r.steps {
		if n[s.name] == 0 {
			order = append(order, s.name)
		}
		sum[s.name] += s.d
		n[s.name]++
	}
	var b strings.Builder
	for _, name := range order {
		fmt.Fprintf(&b, "%s=%s", strings.ReplaceAll(name, " ", "_"), ms(sum[name]))
		if n[name] > 1 {
			fmt.Fprintf(&b, "/%d", n[name])
		}
		b.WriteByte(' ')
	}
	fmt.Fprintf(&b, "total=%s", ms(time.Since(r.start)))
	return b.String()
}

func ms(d time.Duration) string {
	return fmt.Sprintf("%.2fms", float64(d)/float64(time.Millisecond))
}
