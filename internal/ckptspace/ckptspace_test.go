package ckptspace

import (
	"errors"
	"testing"
)

func TestAdmit(t *testing.T) {
	const G = 1 << 30
	l := Limits{QuotaBytes: 10 * G, MinFreeBytes: 2 * G}
	for _, c := range []struct {
		name                           string
		used, inFlight, free, estimate int64
		want                           Verdict
	}{
		{"room", 4 * G, 0, 100 * G, 6 * G, Fits},
		{"over quota by a byte", 4 * G, 0, 100 * G, 6*G + 1, OverQuota},
		{"in flight counted in used", 9 * G, 9 * G, 100 * G, 2 * G, OverQuota},
		{"free exactly min", 0, 0, 5 * G, 3 * G, Fits},
		{"under min free", 0, 0, 5 * G, 3*G + 1, UnderMinFree},
		{"in flight not yet in free", 1 * G, 1 * G, 5 * G, 3 * G, UnderMinFree},
		{"huge estimate saturates", 0, 0, 100 * G, 1<<63 - 1, OverQuota},
	} {
		if got := l.Admit(c.used, c.inFlight, c.free, c.estimate); got != c.want {
			t.Errorf("%s: Admit = %v, want %v", c.name, got, c.want)
		}
	}
	// No quota: only the free space bounds; MinFreeBytes 0 still wants the estimate to fit.
	if got := (Limits{}).Admit(1<<62, 0, 10, 11); got != UnderMinFree {
		t.Errorf("no limits, estimate over free: %v", got)
	}
	if got := (Limits{}).Admit(1<<62, 0, 10, 10); got != Fits {
		t.Errorf("no limits, estimate = free: %v", got)
	}
	if (Limits{QuotaBytes: -1}).Validate() == nil || (Limits{MinFreeBytes: -1}).Validate() == nil || (Limits{}).Validate() != nil {
		t.Error("Validate")
	}
}

// TestGateInFlight: concurrent reservations together stay within the quota and the free
// space; a released one (a failed checkpoint) gives its room back, once.
func TestGateInFlight(t *testing.T) {
	var images int64 = 2 << 20 // complete images the caller counts
	free := int64(100 << 20)
	g := &Gate{Limits: Limits{QuotaBytes: 10 << 20, MinFreeBytes: 1 << 20}, Free: func() (int64, error) { return free, nil }}
	used := func() int64 { return images }
	r1, v, err := g.Reserve(used, 5<<20)
	if err != nil || v != Fits {
		t.Fatalf("first: %v %v", v, err)
	}
	if _, v, _ := g.Reserve(used, 4<<20); v != OverQuota { // 2+5+4 > 10
		t.Fatalf("second while the first is in flight: %v, want OverQuota", v)
	}
	r2, v, _ := g.Reserve(used, 3<<20) // 2+5+3 = 10
	if v != Fits {
		t.Fatalf("third: %v", v)
	}
	if g.InFlight() != 8<<20 {
		t.Errorf("in flight %d", g.InFlight())
	}
	r1() // failed: released
	r1() // twice: no effect
	if g.InFlight() != 3<<20 {
		t.Errorf("in flight after release %d", g.InFlight())
	}
	// r2 completed: the caller counts its image, then releases.
	images += 3 << 20
	r2()
	if _, v, _ := g.Reserve(used, 6<<20); v != OverQuota { // 5+6 > 10
		t.Errorf("over the quota with the images counted: %v", v)
	}
	// Free space: in-flight estimates are not in statfs yet.
	g.QuotaBytes, free = 100<<20, 8<<20
	r3, v, _ := g.Reserve(used, 4<<20) // 8-4 >= 1
	if v != Fits {
		t.Fatalf("r3: %v", v)
	}
	if _, v, _ := g.Reserve(used, 4<<20); v != UnderMinFree { // 8-4-4 < 1
		t.Errorf("under min free with one in flight: %v", v)
	}
	r3()
	g.Free = func() (int64, error) { return 0, errors.New("statfs") }
	if r, _, err := g.Reserve(used, 1); err == nil || r != nil {
		t.Error("a free-space error admitted")
	}
}
