package progress

import "testing"

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
