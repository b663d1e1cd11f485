package gateway

import (
	"context"
	"fmt"
	"time"

	"github.com/sandboxd/sandboxd/internal/runner"
)

// Defaults of StartWaitOptions.
const (
	// DefaultStartWait is how long a GetSandbox of a young starting sandbox waits for its
	// state to change.
	DefaultStartWait = 500 * time.Millisecond
	// DefaultStartWaiters bounds the GetSandbox calls waiting at once on one gateway.
	DefaultStartWaiters = 1024
	// DefaultStartWaitersPerOrg bounds those of one organization.
	DefaultStartWaitersPerOrg = 64
	// startWaitYoung: only a sandbox created less than this long ago is waited for (an
	// image pull of minutes is polled as before).
	startWaitYoung = 30 * time.Second
	// startWaitSlack is how much longer than its wait an AwaitStart call to the runner may
	// take (the round trip) before the gateway answers without it.
	startWaitSlack = time.Second
)

// StartWaitOptions configure how a GetSandbox of a young sandbox that is still CREATING
// or PENDING waits, bounded, for its state to change before answering, so that a
// client's first status poll after a create sees RUNNING (docs/api.md, "GetSandbox of a
// starting sandbox"). To a client the wait is latency: the answer is the one a later
// poll would have given.
type StartWaitOptions struct {
	// Max is the longest one call waits (0: DefaultStartWait; negative: never wait;
	// at most runner.MaxAwaitStart). A call also waits at most half of what is left of
	// its deadline.
	Max time.Duration
	// MaxWaiters and MaxWaitersPerOrg bound the calls waiting at once on this gateway
	// and per organization (0: the defaults); beyond them a call answers at once.
	MaxWaiters, MaxWaitersPerOrg int
}

// Validate checks o without changing it.
func (o StartWaitOptions) Validate() error {
	if o.Max > runner.MaxAwaitStart {
		return fmt.Errorf("start wait %v: at most %v", o.Max, runner.MaxAwaitStart)
	}
	if o.MaxWaiters < 0 || o.MaxWaitersPerOrg < 0 {
		return fmt.Errorf("start waiters %d, per organization %d: must not be negative", o.MaxWaiters, o.MaxWaitersPerOrg)
	}
	return nil
}

func (o StartWaitOptions) withDefaults() StartWaitOptions {
	if o.Max == 0 {
		o.Max = DefaultStartWait
	}
	if o.MaxWaiters == 0 {
		o.MaxWaiters = DefaultStartWaiters
	}
	if o.MaxWaitersPerOrg == 0 {
		o.MaxWaitersPerOrg = DefaultStartWaitersPerOrg
	}
	return o
}

// slots are the waiting places o allows.
func (o StartWaitOptions) slots() *orgSlots { return newOrgSlots(o.MaxWaiters, o.MaxWaitersPerOrg) }

// wait is how long a call with ctx may wait: Max, at most half of what is left of
// ctx's deadline; 0: not at all.
func (o StartWaitOptions) wait(ctx context.Context) time.Duration {
	d := o.Max
	if dl, ok := ctx.Deadline(); ok {
		d = min(d, time.Until(dl)/2)
	}
	return max(d, 0)
}

// awaitStart is sb (what rec's runner r answered just now) or, when sb is a young
// sandbox still starting, what r answers once its state has changed or the bounded wait
// (StartWaitOptions.wait) is over. Beyond the waiter caps, or on a runner that cannot wait,
// it is sb at once.
func (s *Server) awaitStart(ctx context.Context, org string, rec *record, r runner.Handle, sb runner.Sandbox) runner.Sandbox {
	if sb.State != runner.StateCreating && sb.State != runner.StatePending || time.Since(sb.CreatedAt) > startWaitYoung {
		return sb
	}
	ah, ok := r.(runner.AwaitHandle)
	wait := s.startWait.wait(ctx)
	if !ok || wait <= 0 || !s.startWaiters.acquire(org) {
		return sb
	}
	defer s.startWaiters.release(org)
	// The runner caps its wait, but an unreachable runner would hold the call (and its
	// place) until the caller's deadline: the call is bounded here too.
	actx, cancel := context.WithTimeout(ctx, wait+startWaitSlack)
	defer cancel()
	got, err := ah.AwaitStart(actx, rec.id, wait)
	if err != nil || got.Reason == runner.ReasonMoved {
		return sb // answered as before the wait; the next poll finds out
	}
	s.index.setLast(ctx, rec, got)
	return got
}
