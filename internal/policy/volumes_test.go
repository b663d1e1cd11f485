package policy

import (
	"slices"
	"strings"
	"testing"
)

func TestVolumeStorageClasses(t *testing.T) {
	p, err := Parse([]byte(`{"base": {"volume_storage_class": "fast"}, "constraints": {"volumes": {"allowed_storage_classes": ["fast", "slow.example.com"]}}}`))
	if err != nil {
		t.Fatal(err)
	}
	if vs := Validate(p); len(vs) != 0 {
		t.Fatalf("valid policy: %v", vs)
	}
	class, allowed := p.VolumeStorageClasses()
	if class != "fast" || !slices.Equal(allowed, []string{"fast", "slow.example.com"}) {
		t.Fatalf("got %q %v", class, allowed)
	}
	// Absent list: any class; [] allows none.
	if _, a := (&Policy{}).VolumeStorageClasses(); a != nil {
		t.Fatalf("absent list: %v", a)
	}
	p, _ = Parse([]byte(`{"constraints": {"volumes": {"allowed_storage_classes": []}}}`))
	if _, a := p.VolumeStorageClasses(); a == nil || len(a) != 0 {
		t.Fatalf("empty list: %#v", a)
	}
	if _, err := Parse([]byte(`{"constraints": {"volumes": {"allowed_storage_class": ["x"]}}}`)); err == nil {
		t.Fatal("unknown field accepted")
	}
	for doc, field := range map[string]string{
		`{"base": {"volume_storage_class": "Fast_Class"}}`:                                                               "policy.base.volume_storage_class",
		`{"constraints": {"volumes": {"allowed_storage_classes": ["ok", ""]}}}`:                                          "policy.constraints.volumes.allowed_storage_classes[1]",
		`{"constraints": {"volumes": {"allowed_storage_classes": ["a/b"]}}}`:                                             "policy.constraints.volumes.allowed_storage_classes[0]",
		`{"base": {"volume_storage_class": "other"}, "constraints": {"volumes": {"allowed_storage_classes": ["fast"]}}}`: "policy.base.volume_storage_class",
		`{"base": {"volume_storage_class": "` + strings.Repeat("a", 254) + `"}}`:                                         "policy.base.volume_storage_class",
	} {
		p, err := Parse([]byte(doc))
		if err != nil {
			t.Fatal(err)
		}
		vs := Validate(p)
		if len(vs) != 1 || vs[0].Field != field {
			t.Errorf("%s: got %v, want one violation on %s", doc, vs, field)
		}
	}
}

// TestVolumeMaxSize: constraints.volumes.max_size is a memory quantity, positive; the
// bound in bytes, 0 without one.
func TestVolumeMaxSize(t *testing.T) {
	p, err := Parse([]byte(`{"constraints": {"volumes": {"max_size": "50Gi"}}}`))
	if err != nil {
		t.Fatal(err)
	}
	if vs := Validate(p); len(vs) != 0 {
		t.Fatalf("valid policy: %v", vs)
	}
	if n := p.VolumeMaxSize(); n != 50<<30 {
		t.Fatalf("max size %d", n)
	}
	if n := (&Policy{}).VolumeMaxSize(); n != 0 {
		t.Fatalf("no bound: %d", n)
	}
	if n := (*Policy)(nil).VolumeMaxSize(); n != 0 {
		t.Fatalf("nil policy: %d", n)
	}
	if _, err := Parse([]byte(`{"constraints": {"volumes": {"max_size_gb": 5}}}`)); err == nil {
		t.Fatal("unknown field accepted")
	}
	for _, q := range []string{`"lots"`, `"0"`, `"-1Gi"`, `"1.5.5Gi"`} {
		p, err := Parse([]byte(`{"constraints": {"volumes": {"max_size": ` + q + `}}}`))
		if err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		vs := Validate(p)
		if len(vs) != 1 || vs[0].Field != "policy.constraints.volumes.max_size" {
			t.Errorf("%s: got %v, want one violation on policy.constraints.volumes.max_size", q, vs)
		}
		if p.VolumeMaxSize() != 0 {
			t.Errorf("%s: an invalid bound counts", q)
		}
	}
}
