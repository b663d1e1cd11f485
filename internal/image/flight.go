package image

import (
	"context"
	"sync"
)

// flight deduplicates concurrent calls with the same key. Unlike x/sync/singleflight
// the shared work runs under its own context that is cancelled only when every
// caller waiting for it has given up, so one impatient caller does not fail the rest.
type flight[T any] struct {
	mu    sync.Mutex
	calls map[string]*call[T]
}

type call[T any] struct {
	done    chan struct{}
	val     T
	err     error
	waiters int
	cancel  context.CancelFunc
}

func (g *flight[T]) do(ctx context.Context, key string, fn func(context.Context) (T, error)) (T, error) {
	g.mu.Lock()
	if g.calls == nil {
		g.calls = map[string]*call[T]{}
	}
	c, ok := g.calls[key]
	if !ok {
		cctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		c = &call[T]{done: make(chan struct{}), cancel: cancel}
		g.calls[key] = c
		go func() {
			defer close(c.done)
			defer cancel()
			c.val, c.err = fn(cctx)
			g.mu.Lock()
			if g.calls[key] == c {
				delete(g.calls, key)
			}
			g.mu.Unlock()
		}()
	}
	c.waiters++
	g.mu.Unlock()

	select {
	case <-c.done:
		return c.val, c.err
	case <-ctx.Done():
		g.mu.Lock()
		c.waiters--
		if c.waiters == 0 {
			c.cancel()
			if g.calls[key] == c {
				delete(g.calls, key)
			}
		}
		g.mu.Unlock()
		var zero T
		return zero, ctx.Err()
	}
}
