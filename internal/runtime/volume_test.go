package runtime

import (
	"errors"
	"testing"
)

// TestValidateKeptVolumes: a kept volume is a sized disk volume with a name of
// KeepNamePattern, restored from nothing.
func TestValidateKeptVolumes(t *testing.T) {
	ok := Volume{Name: "cache", SizeBytes: 1 << 30, Keep: "bc-0123abcd"}
	if err := ValidateVolumes([]Volume{ok}, []VolumeMount{{Volume: "cache", Path: "/var/lib/containers"}}); err != nil {
		t.Fatal(err)
	}
	for name, v := range map[string]Volume{
		"path":     {Name: "cache", SizeBytes: 1, Keep: "../x"},
		"slash":    {Name: "cache", SizeBytes: 1, Keep: "a/b"},
		"upper":    {Name: "cache", SizeBytes: 1, Keep: "BC"},
		"long":     {Name: "cache", SizeBytes: 1, Keep: "a1234567890123456789012345678901234567890123456789012345678901234"},
		"dash":     {Name: "cache", SizeBytes: 1, Keep: "-a"},
		"unsized":  {Name: "cache", Keep: "bc-a"},
		"memory":   {Name: "cache", SizeBytes: 1, Medium: MediumMemory, Keep: "bc-a"},
		"restored": {Name: "cache", SizeBytes: 1, Keep: "bc-a", RestoreDigest: "ab"},
	} {
		if err := ValidateVolumes([]Volume{v}, nil); !errors.Is(err, ErrInvalidSpec) {
			t.Errorf("%s: %v, want ErrInvalidSpec", name, err)
		}
	}
}
