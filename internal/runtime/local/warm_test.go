package local

import (
	"context"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

func setWarm(t *testing.T, b *Backend, targets ...runtime.WarmTarget) {
	t.Helper()
	if err := b.SetWarmPools(context.Background(), targets); err != nil {
		t.Fatal(err)
	}
}

// A warm target keeps its containers ready before any Create of the image, past the idle
// time, refilled after a claim; within MaxTargeted; an untargeted set returns to the idle
// rules.
func TestPoolWarmTargets(t *testing.T) {
	const idle = 500 * time.Millisecond
	e := poolEnvCfg(t, PoolConfig{Size: 0, Idle: idle, MaxTargeted: 3}) // no pool for plain creates
	bb := runtime.Spec{Container: runtime.Container{Image: "busybox", Command: "sleep", Args: []string{"inf"}}}

	// Not poolable here: left out (pull credentials; a volume).
	creds := bb
	creds.PullCredentials = &runtime.Credentials{Username: "u", Password: "p"}
	vol := bb
	vol.Volumes = []runtime.Volume{{Name: "v", Medium: runtime.MediumMemory}}
	setWarm(t, e.b, runtime.WarmTarget{Key: "a/creds", Spec: creds, Size: 2}, runtime.WarmTarget{Key: "a/vol", Spec: vol, Size: 2})
	if st := e.b.PoolStats(); st.Targeted != 0 {
		t.Fatalf("unpoolable targets kept: %+v", st)
	}

	setWarm(t, e.b, runtime.WarmTarget{Key: "a/bb", Spec: bb, Size: 2})
	waitPoolReady(t, e.b, 2) // no Create of busybox yet: the pull happens for the target
	if st := e.b.PoolStats(); st.Targeted != 2 || st.Refills != 2 || st.Claims != 0 {
		t.Fatalf("stats %+v", st)
	}
	time.Sleep(3 * idle) // targeted: exempt from idle expiry
	if st := e.b.PoolStats(); st.Ready != 2 || st.Dropped != 0 {
		t.Fatalf("targeted set expired: %+v", st)
	}

	// A create of the target's spec claims; the pool refills to the target.
	s := bb
	s.ID = "warm-claim"
	e.create(s)
	if st := e.b.PoolStats(); st.Claims != 1 {
		t.Fatalf("create not served from the warm target: %+v", st)
	}
	waitPoolReady(t, e.b, 2)
	if err := e.b.Destroy(context.Background(), "warm-claim"); err != nil {
		t.Fatal(err)
	}

	// MaxTargeted bounds the total (targets in key order).
	setWarm(t, e.b, runtime.WarmTarget{Key: "b", Spec: bb, Size: 16}, runtime.WarmTarget{Key: "a", Spec: bb, Size: 1})
	if st := e.b.PoolStats(); st.Targeted != 3 {
		t.Fatalf("bounded targets: %+v", st)
	}
	waitPoolReady(t, e.b, 3)

	// Untargeted: back to the idle rules (Size 0 here: dropped after idle).
	setWarm(t, e.b)
	deadline := time.Now().Add(15 * time.Second)
	for e.b.PoolStats().Ready > 0 || len(poolDirs(e.state)) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("untargeted set kept: %+v %v", e.b.PoolStats(), poolDirs(e.state))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if st := e.b.PoolStats(); st.Targeted != 0 {
		t.Fatalf("stats %+v", st)
	}
}
