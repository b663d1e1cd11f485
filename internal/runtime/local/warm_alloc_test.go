package local

import (
	"fmt"
	"testing"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

func TestAllocateWarm(t *testing.T) {
	ts := func(kv ...any) []runtime.WarmTarget {
		var out []runtime.WarmTarget
		for i := 0; i < len(kv); i += 2 {
			out = append(out, runtime.WarmTarget{Key: kv[i].(string), Size: kv[i+1].(int)})
		}
		return out
	}
	for _, c := range []struct {
		targets []runtime.WarmTarget
		budget  int
		want    string
	}{
		{ts("a/1", 2, "b/1", 1), 32, "[2 1]"},
		{ts("a/1", 16, "a/2", 16, "b/1", 2), 6, "[2 2 2]"}, // org b gets its 2 beside a's 16+16
		{ts("b/1", 5, "a/1", 16, "a/2", 16), 7, "[3 2 2]"}, // round robin: a, b, a, b, a, b, a
		{ts("a/1", 20, "a/2", -3), 100, "[16 0]"},          // bounded per target; negative is none
		{ts("a/1", 3, "b/1", 3), 0, "[0 0]"},               // no budget
		{ts("x", 2, "y", 2), 3, "[2 1]"},                   // keys without "/" are their own org
	} {
		if got := fmt.Sprint(allocateWarm(c.targets, c.budget)); got != c.want {
			t.Errorf("allocateWarm(%+v, %d) = %s, want %s", c.targets, c.budget, got, c.want)
		}
	}
}
