package runtime_test

import (
	"reflect"
	"testing"

	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/runtimetest"
)

// sharedByClone are the parts of a Spec that Spec.Clone shares on purpose (by path, as
// runtimetest.FillAll and MutateAll name them).
var sharedByClone = map[string]bool{
	// Never modified in place; up to runtime.MaxFilesBytes per spec.
	"Container.Files[].Content":        true,
	"Sidecars[].Files[].Content":       true,
	"InitContainers[].Files[].Content": true,
}

// TestSpecClone, in the manner of Tailscale's ipn/prefs_test.go: a Spec with every field
// set, recursively (pointers, slices, maps, nested structs), is cloned, the clone is
// changed everywhere, and the original must not change. A field added to Spec (or to
// what it holds) that Clone shares fails here, as does a kind of field this test cannot
// fill yet.
func TestSpecClone(t *testing.T) {
	var orig, want runtime.Spec
	runtimetest.FillAll(t, reflect.ValueOf(&orig).Elem(), "")
	runtimetest.FillAll(t, reflect.ValueOf(&want).Elem(), "")
	if !reflect.DeepEqual(orig, want) {
		t.Fatal("FillAll is not deterministic")
	}
	c := orig.Clone()
	if !reflect.DeepEqual(c, want) {
		t.Fatalf("the clone differs from the original:\n%+v\n%+v", c, want)
	}
	leaves := map[string]bool{}
	for _, p := range runtimetest.Leaves(reflect.TypeFor[runtime.Spec](), "") {
		leaves[p] = true
	}
	for p := range sharedByClone {
		if !leaves[p] {
			t.Errorf("sharedByClone lists %s, which is no field of Spec: delete it", p)
		}
	}
	// No pointer, slice or map of the clone is the original's, but the shared ones.
	for _, p := range runtimetest.Aliased(reflect.ValueOf(orig), reflect.ValueOf(c), "") {
		if !sharedByClone[p] {
			t.Errorf("the clone's %s is the original's: Clone shares it", p)
		}
	}
	runtimetest.MutateAll(t, reflect.ValueOf(&c).Elem(), "", sharedByClone)
	if reflect.DeepEqual(c, want) {
		t.Fatal("MutateAll changed nothing")
	}
	for _, p := range runtimetest.Diff(reflect.ValueOf(orig), reflect.ValueOf(want), "") {
		t.Errorf("changing the clone changed the original's %s: Clone shares it", p)
	}
	for _, nilSpec := range []runtime.Spec{{}, {Container: runtime.Container{Security: &runtime.Security{}}, Network: &runtime.Network{}, Pod: &runtime.PodSettings{}}} {
		if got := nilSpec.Clone(); !reflect.DeepEqual(got, nilSpec) {
			t.Errorf("Clone of %+v is %+v: nil and empty must stay as they are", nilSpec, got)
		}
	}
}
