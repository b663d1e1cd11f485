package progress

import (
	"testing"
	"time"
)

func TestReplacePull(t *testing.T) {
	tr := NewTracker(PhasePullingImage)
	first, second, other := NewPull("img"), NewPull("img"), NewPull("other")
	tr.AddPull(other)
	tr.ReplacePull(nil, first)
	tr.ReplacePull(first, second) // a mirror failed: the upstream's pull replaces it
	got := tr.Snapshot().Pulls
	if len(got) != 2 || got[0].Image != "other" || got[1].Image != "img" {
		t.Fatalf("pulls %+v, want other then one img", got)
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if tr.pulls[1] != second {
		t.Error("the failed attempt's pull is still shown")
	}
}

// A pull's elapsed time runs while a layer is missing and stops at its last layer.
func TestPullElapsedStopsWhenDone(t *testing.T) {
	p := NewPull("img")
	p.SetLayers([]string{"sha256:aa", "sha256:bb"}, []int64{10, 20})
	p.Complete(0)
	time.Sleep(5 * time.Millisecond)
	if a, b := p.Snapshot().Elapsed, p.Snapshot().Elapsed; a <= 0 || b < a {
		t.Fatalf("under way: elapsed %v then %v, want running", a, b)
	}
	p.Complete(1)
	first := p.Snapshot().Elapsed
	time.Sleep(5 * time.Millisecond)
	p.Complete(1) // again: changes nothing
	if again := p.Snapshot().Elapsed; again != first || first < 5*time.Millisecond {
		t.Fatalf("done: elapsed %v then %v, want fixed at its end", first, again)
	}
}
