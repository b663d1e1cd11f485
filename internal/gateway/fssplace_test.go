package gateway

import (
	"context"
	"testing"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/runner"
)

// cachingRunner is an acceptingRunner whose capacity reports cached snapshot archives.
type cachingRunner struct {
	acceptingRunner
	cached []string
}

func (r *cachingRunner) Capacity(ctx context.Context) (runner.Capacity, error) {
	c, err := r.acceptingRunner.Capacity(ctx)
	c.CachedSnapshots = r.cached
	return c, err
}

// TestPlaceRestoringPrefersTheCache: the runners' CachedSnapshots reach placement, so a
// sandbox restoring digest d1 goes first to the runner that has it, whatever the order
// of the runners; without digests every candidate stays.
func TestPlaceRestoringPrefersTheCache(t *testing.T) {
	for _, cachedFirst := range []bool{true, false} {
		plain := &cachingRunner{acceptingRunner: acceptingRunner{id: "plain"}}
		warm := &cachingRunner{acceptingRunner: acceptingRunner{id: "warm"}, cached: []string{"d0", "d1"}}
		rs := []runner.Handle{plain, warm}
		if cachedFirst {
			rs = []runner.Handle{warm, plain}
		}
		s := newTestGateway(t, t.TempDir(), rs...)
		spec := &sandboxv1.SandboxSpec{Containers: []*sandboxv1.Container{{Name: "main", Image: "busybox", Resources: &sandboxv1.Resources{Cpu: "1", Memory: "1Gi"}}}}
		for range 5 { // ties are broken randomly: the cache must win every time
			cands, err := s.placeRestoring(asOrg(t.Context()), spec, nil, []string{"d1"}, nil, nil, nil)
			if err != nil || len(cands) != 2 || cands[0].RunnerID != "warm" {
				t.Fatalf("candidates %+v, %v; want warm first", cands, err)
			}
		}
		if cands, err := s.place(asOrg(t.Context()), spec, nil, nil, nil, nil); err != nil || len(cands) != 2 {
			t.Fatalf("place: %+v, %v", cands, err)
		}
	}
}
