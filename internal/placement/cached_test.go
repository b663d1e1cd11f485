package placement

import (
	"math/rand/v2"
	"slices"
	"testing"
)

func cached(r Runner, digests ...string) Runner { r.CachedSnapshots = digests; return r }

// TestPreferCached: among the runners that accept the sandbox and have room, one that has
// the restored snapshots cached comes first, before a less loaded one; more cached beats
// fewer; a nearly full runner gets no preference; a runner the policy rejects or that is
// full is never a candidate, cached or not.
func TestPreferCached(t *testing.T) {
	free := mustPolicy(t, `{}`)
	strict := mustPolicy(t, `{"constraints": {"resources": {"max_cpu": "1", "max_memory": "1Gi"}}}`)
	place := func(t *testing.T, runners []Runner, digests ...string) []string {
		t.Helper()
		cands, err := Place(Request{Spec: spec("2", "1Gi"), Runners: runners, Rand: rand.New(rand.NewPCG(1, 2))})
		if err != nil {
			t.Fatal(err)
		}
		PreferCached(cands, runners, digests)
		return ids(cands)
	}
	idle := rn("idle", free)
	busy := used(rn("busy", free), 1000, gi, 1)       // load 0.75 after placement
	busier := used(rn("busier", free), 1500, 2*gi, 2) // load 0.875 after placement
	rejects := rn("rejects", strict)                  // its policy caps CPU at 1
	full := used(rn("full", free), 3000, gi, 1)       // no room for 2 CPUs

	for _, tc := range []struct {
		name    string
		runners []Runner
		digests []string
		want    []string
	}{
		{"no restore: least loaded", []Runner{cached(busy, "d1"), idle}, nil, []string{"idle", "busy"}},
		{"nothing cached: least loaded", []Runner{busy, idle}, []string{"d1"}, []string{"idle", "busy"}},
		{"cached first", []Runner{cached(busy, "d1"), idle}, []string{"d1"}, []string{"busy", "idle"}},
		{"other digest: least loaded", []Runner{cached(busy, "d2"), idle}, []string{"d1"}, []string{"idle", "busy"}},
		{"more cached first", []Runner{cached(idle, "d1"), cached(busy, "d1", "d2")}, []string{"d1", "d2"}, []string{"busy", "idle"}},
		{"equally cached: least loaded", []Runner{cached(busy, "d1"), cached(idle, "d1")}, []string{"d1"}, []string{"idle", "busy"}},
		{"nearly full: no preference", []Runner{cached(busier, "d1"), idle}, []string{"d1"}, []string{"idle", "busier"}},
		{"policy and room first", []Runner{cached(rejects, "d1"), cached(full, "d1"), idle}, []string{"d1"}, []string{"idle"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := place(t, tc.runners, tc.digests...); !slices.Equal(got, tc.want) {
				t.Errorf("order %v, want %v", got, tc.want)
			}
		})
	}
}
