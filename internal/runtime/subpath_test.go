package runtime

import (
	"errors"
	"strings"
	"testing"
)

// TestCheckSubPathBounds: a sub_path longer than MaxSubPath bytes or with a component
// longer than MaxSubPathName is refused at validation (every backend: none could make
// it), the bounds themselves are taken.
func TestCheckSubPathBounds(t *testing.T) {
	name := strings.Repeat("n", MaxSubPathName)
	for sp, ok := range map[string]bool{
		"":                                true,
		"a/b":                             true,
		name:                              true,
		name + "x":                        false,
		"a/" + name + "x" + "/b":          false,
		strings.Repeat("a/", 2047) + "ab": true, // 4096 bytes
		strings.Repeat("a/", 2048) + "a":  false,
	} {
		if err := CheckSubPath(sp); (err == nil) != ok {
			t.Errorf("CheckSubPath(%d bytes): %v, want ok=%v", len(sp), err, ok)
		}
		err := ValidateVolumes([]Volume{{Name: "v"}}, []VolumeMount{{Volume: "v", Path: "/v", SubPath: sp}})
		if (err == nil) != ok || (err != nil && !errors.Is(err, ErrInvalidSpec)) {
			t.Errorf("ValidateVolumes(sub_path of %d bytes): %v, want ok=%v", len(sp), err, ok)
		}
	}
}
