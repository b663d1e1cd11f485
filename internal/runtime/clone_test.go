package runtime

import (
	"reflect"
	"testing"
)

// sharedByClone are the parts of a Spec that Spec.Clone shares on purpose (by path, as
// fillAll and mutateAll name them).
var sharedByClone = map[string]bool{
	"Files[].Content": true, // never modified in place; up to MaxFilesBytes per spec
}

// TestSpecClone, in the manner of Tailscale's ipn/prefs_test.go: a Spec with every field
// set, recursively (pointers, slices, maps, nested structs), is cloned, the clone is
// changed everywhere, and the original must not change. A field added to Spec (or to
// what it holds) that Clone shares fails here, as does a kind of field this test cannot
// fill yet.
func TestSpecClone(t *testing.T) {
	var orig, want Spec
	fillAll(t, reflect.ValueOf(&orig).Elem(), "")
	fillAll(t, reflect.ValueOf(&want).Elem(), "")
	if !reflect.DeepEqual(orig, want) {
		t.Fatal("fillAll is not deterministic")
	}
	c := orig.Clone()
	if !reflect.DeepEqual(c, want) {
		t.Fatalf("the clone differs from the original:\n%+v\n%+v", c, want)
	}
	mutateAll(t, reflect.ValueOf(&c).Elem(), "")
	if reflect.DeepEqual(c, want) {
		t.Fatal("mutateAll changed nothing")
	}
	for _, p := range diff(reflect.ValueOf(orig), reflect.ValueOf(want), "") {
		t.Errorf("changing the clone changed the original's %s: Clone shares it", p)
	}
	for _, nilSpec := range []Spec{{}, {Security: &Security{}, Network: &Network{}, Pod: &PodSettings{}}} {
		if got := nilSpec.Clone(); !reflect.DeepEqual(got, nilSpec) {
			t.Errorf("Clone of %+v is %+v: nil and empty must stay as they are", nilSpec, got)
		}
	}
}

// fillAll sets v and everything reachable from it to non-zero values, deterministically.
func fillAll(t *testing.T, v reflect.Value, path string) {
	t.Helper()
	switch v.Kind() {
	case reflect.String:
		v.SetString("s")
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(7)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(7)
	case reflect.Float32, reflect.Float64:
		v.SetFloat(1.5)
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		fillAll(t, v.Elem(), path)
	case reflect.Slice:
		v.Set(reflect.MakeSlice(v.Type(), 1, 1))
		fillAll(t, v.Index(0), path+"[]")
	case reflect.Map:
		v.Set(reflect.MakeMap(v.Type()))
		k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
		fillAll(t, k, path+"{}")
		fillAll(t, e, path+"{}")
		v.SetMapIndex(k, e)
	case reflect.Struct:
		for i := range v.NumField() {
			f := v.Type().Field(i)
			if !f.IsExported() {
				t.Fatalf("%s: unexported field %s: teach fillAll and mutateAll about it", path, f.Name)
			}
			fillAll(t, v.Field(i), join(path, f.Name))
		}
	default:
		t.Fatalf("%s: cannot fill a %s: teach fillAll and mutateAll about it", path, v.Type())
	}
}

// mutateAll changes v and everything reachable from it in place: through pointers, in
// slices' and maps' elements, and adds to maps, so whatever v shares with another value
// changes there too. Paths in sharedByClone are left alone.
func mutateAll(t *testing.T, v reflect.Value, path string) {
	t.Helper()
	if sharedByClone[path] {
		return
	}
	switch v.Kind() {
	case reflect.String:
		v.SetString(v.String() + "!")
	case reflect.Bool:
		v.SetBool(!v.Bool())
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(v.Int() + 1)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(v.Uint() + 1)
	case reflect.Float32, reflect.Float64:
		v.SetFloat(v.Float() + 1)
	case reflect.Pointer:
		if !v.IsNil() {
			mutateAll(t, v.Elem(), path)
		}
	case reflect.Slice:
		for i := range v.Len() {
			mutateAll(t, v.Index(i), path+"[]")
		}
	case reflect.Map:
		for _, k := range v.MapKeys() {
			e := reflect.New(v.Type().Elem()).Elem()
			e.Set(v.MapIndex(k))
			mutateAll(t, e, path+"{}")
			v.SetMapIndex(k, e)
		}
		k := reflect.New(v.Type().Key()).Elem()
		fillAll(t, k, path+"{}")
		mutateAll(t, k, path+"{}")
		v.SetMapIndex(k, reflect.New(v.Type().Elem()).Elem())
	case reflect.Struct:
		for i := range v.NumField() {
			mutateAll(t, v.Field(i), join(path, v.Type().Field(i).Name))
		}
	default:
		t.Fatalf("%s: cannot mutate a %s", path, v.Type())
	}
}

// diff lists the paths at which a and b (of one type) differ.
func diff(a, b reflect.Value, path string) []string {
	switch a.Kind() {
	case reflect.Pointer:
		if a.IsNil() || b.IsNil() {
			break
		}
		return diff(a.Elem(), b.Elem(), path)
	case reflect.Slice:
		if a.Len() != b.Len() {
			break
		}
		var out []string
		for i := range a.Len() {
			out = append(out, diff(a.Index(i), b.Index(i), path+"[]")...)
		}
		return out
	case reflect.Struct:
		var out []string
		for i := range a.NumField() {
			out = append(out, diff(a.Field(i), b.Field(i), join(path, a.Type().Field(i).Name))...)
		}
		return out
	}
	if reflect.DeepEqual(a.Interface(), b.Interface()) {
		return nil
	}
	return []string{path}
}

func join(path, field string) string {
	if path == "" {
		return field
	}
	return path + "." + field
}
