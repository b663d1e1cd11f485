package local

import (
	"math/rand/v2"
	"testing"
)

// TestComplementPatterns: the allow rules withoutIoctls makes match every request but
// the refused ones, whatever the bits above 32.
func TestComplementPatterns(t *testing.T) {
	pats := complementPatterns(btrfsSubvolumeIoctls, 31, 0)
	match := func(x uint64) bool {
		for _, p := range pats {
			if x&p[0] == p[1] {
				return true
			}
		}
		return false
	}
	refused := map[uint32]bool{}
	for _, v := range btrfsSubvolumeIoctls {
		refused[v] = true
		for _, hi := range []uint64{0, 1 << 32, 0xffffffff << 32} {
			if match(hi | uint64(v)) {
				t.Errorf("%#x matches an allow rule", hi|uint64(v))
			}
		}
		for _, d := range []uint32{1, 2, 0x100, 0x80000000} {
			if x := v ^ d; !refused[x] && !match(uint64(x)) && !isRefused(x) {
				t.Errorf("%#x (a neighbour of a refused request) matches no allow rule", x)
			}
		}
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 100000 {
		x := r.Uint64()
		if want := !isRefused(uint32(x)); match(x) != want {
			t.Fatalf("%#x: allowed %v, want %v", x, match(x), want)
		}
	}
	for _, x := range []uint64{0x5401 /* TCGETS */, 0x541b /* FIONREAD */, 0x40049409 /* FICLONE */} {
		if !match(x) {
			t.Errorf("%#x is refused", x)
		}
	}
	if len(pats) > 64 {
		t.Errorf("%d allow rules for ioctl", len(pats))
	}
}

func isRefused(x uint32) bool {
	for _, v := range btrfsSubvolumeIoctls {
		if v == x {
			return true
		}
	}
	return false
}
