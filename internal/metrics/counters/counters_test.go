package counters

import (
	"fmt"
	"testing"
)

// TestLabelsBounded: values that are not of the bounded sets become "other" (or the
// default path and op), never a new label value.
func TestLabelsBounded(t *testing.T) {
	before := Values()
	Placement("not a reason", []string{`x"} 1` + "\nevil", "constraints.resources.max_cpu"})
	Placement(ResultOK, nil)
	after := Values()
	for k, want := range map[string]float64{
		`cwsandbox_placement_decisions_total{result="other"}`:                              1,
		`cwsandbox_placement_decisions_total{result="ok"}`:                                 1,
		`cwsandbox_placement_rejections_total{constraint="other"}`:                         1,
		`cwsandbox_placement_rejections_total{constraint="constraints.resources.max_cpu"}`: 1,
	} {
		if got := after[k] - before[k]; got != want {
			t.Errorf("%s grew by %v, want %v", k, got, want)
		}
	}
	if len(after) != len(before)+3 {
		t.Errorf("%d new series, want 3 (an other decision, other and max_cpu rejections)", len(after)-len(before))
	}
	for i := range MaxConstraints + 10 {
		if l := constraintLabel(fmt.Sprintf("c%d", i)); l != fmt.Sprintf("c%d", i) && l != Other {
			t.Fatalf("constraint label %q", l)
		}
	}
	constraintsMu.Lock()
	n := len(constraintsSeen)
	constraintsMu.Unlock()
	if n > MaxConstraints {
		t.Errorf("%d constraint values kept, bound %d", n, MaxConstraints)
	}
}
