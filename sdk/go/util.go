package sandbox

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"sort"
	"time"
)

// pollBackoff is the status poll interval of the official client: 0.2 s, ×1.5 per
// poll, at most 2 s.
type pollBackoff struct{ d time.Duration }

const (
	pollFirst = 200 * time.Millisecond
	pollMax   = 2 * time.Second
)

func newPollBackoff() *pollBackoff { return &pollBackoff{} }

func (b *pollBackoff) next() time.Duration {
	if b.d == 0 {
		b.d = pollFirst
	} else {
		b.d = min(b.d*3/2, pollMax)
	}
	return b.d
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func isRetryable(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.retryable()
}

// retry calls fn until it succeeds, fails for good, or budget is spent, waiting
// between attempts with jittered exponential backoff or the server's RetryInfo delay
// (at most 10 s).
func retry(ctx context.Context, budget time.Duration, fn func(context.Context) error) error {
	deadline := time.Now().Add(budget)
	delay := 250 * time.Millisecond
	for {
		err := fn(ctx)
		if err == nil || !isRetryable(err) || ctx.Err() != nil {
			return err
		}
		wait := retryDelay(err, delay)
		if time.Now().Add(wait).After(deadline) {
			return err
		}
		if serr := sleep(ctx, wait); serr != nil {
			return err
		}
		delay = min(delay*2, 4*time.Second)
	}
}

// retryDelay is the server's RetryInfo delay (capped) or base with ±20 % jitter.
func retryDelay(err error, base time.Duration) time.Duration {
	var e *Error
	if errors.As(err, &e) && e.RetryDelay > 0 {
		return min(e.RetryDelay, maxRetryDelay)
	}
	return time.Duration(float64(base) * (0.8 + 0.4*mrand.Float64()))
}

// newUUID returns a random (version 4) UUID.
func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
