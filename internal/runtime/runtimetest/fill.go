package runtimetest

import (
	"reflect"
	"testing"
)

// Reflection helpers for guards in the manner of Tailscale's ipn/prefs_test.go: fill a
// value (a runtime.Spec, a runner.CreateRequest) everywhere, change it everywhere, and
// name by path what differs, so that a field added later fails a test until whoever
// adds it says what a clone or a conversion does with it. A path names a field as
// Go spells it: "Security.RunAsUser", "Files[].Content" (in a slice's elements),
// "Env{}" (in a map's keys and values).

// FillAll sets v and everything reachable from it to non-zero values, deterministically:
// strings "s", numbers 7, bools true, one element in every slice and map, every pointer
// set. It fails t on a kind it cannot fill (and on an unexported field), so that a new
// kind of field is taught here rather than left out.
func FillAll(t testing.TB, v reflect.Value, path string) {
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
		FillAll(t, v.Elem(), path)
	case reflect.Slice:
		v.Set(reflect.MakeSlice(v.Type(), 1, 1))
		FillAll(t, v.Index(0), path+"[]")
	case reflect.Map:
		v.Set(reflect.MakeMap(v.Type()))
		k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
		FillAll(t, k, path+"{}")
		FillAll(t, e, path+"{}")
		v.SetMapIndex(k, e)
	case reflect.Struct:
		for i := range v.NumField() {
			f := v.Type().Field(i)
			if !f.IsExported() {
				t.Fatalf("%s: unexported field %s: teach FillAll and MutateAll about it", path, f.Name)
			}
			FillAll(t, v.Field(i), Join(path, f.Name))
		}
	default:
		t.Fatalf("%s: cannot fill a %s: teach FillAll and MutateAll about it", path, v.Type())
	}
}

// MutateAll changes v and everything reachable from it in place: through pointers, in
// slices' and maps' elements, and adds to maps, so whatever v shares with another value
// changes there too. Paths in skip are left alone.
func MutateAll(t testing.TB, v reflect.Value, path string, skip map[string]bool) {
	t.Helper()
	if skip[path] {
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
			MutateAll(t, v.Elem(), path, skip)
		}
	case reflect.Slice:
		for i := range v.Len() {
			MutateAll(t, v.Index(i), path+"[]", skip)
		}
	case reflect.Map:
		for _, k := range v.MapKeys() {
			e := reflect.New(v.Type().Elem()).Elem()
			e.Set(v.MapIndex(k))
			MutateAll(t, e, path+"{}", skip)
			v.SetMapIndex(k, e)
		}
		k := reflect.New(v.Type().Key()).Elem()
		FillAll(t, k, path+"{}")
		MutateAll(t, k, path+"{}", skip)
		v.SetMapIndex(k, reflect.New(v.Type().Elem()).Elem())
	case reflect.Struct:
		for i := range v.NumField() {
			MutateAll(t, v.Field(i), Join(path, v.Type().Field(i).Name), skip)
		}
	default:
		t.Fatalf("%s: cannot mutate a %s", path, v.Type())
	}
}

// Diff lists the paths at which a and b (of one type) differ: the deepest path that
// still lines up (a nil against a set pointer, slices of different lengths and maps
// are named as a whole).
func Diff(a, b reflect.Value, path string) []string {
	switch a.Kind() {
	case reflect.Pointer:
		if a.IsNil() || b.IsNil() {
			break
		}
		return Diff(a.Elem(), b.Elem(), path)
	case reflect.Slice:
		if a.Len() != b.Len() {
			break
		}
		var out []string
		for i := range a.Len() {
			out = append(out, Diff(a.Index(i), b.Index(i), path+"[]")...)
		}
		return out
	case reflect.Struct:
		var out []string
		for i := range a.NumField() {
			out = append(out, Diff(a.Field(i), b.Field(i), Join(path, a.Type().Field(i).Name))...)
		}
		return out
	}
	if reflect.DeepEqual(a.Interface(), b.Interface()) {
		return nil
	}
	return []string{path}
}

// Leaves lists the paths of every field of a value of type t that holds no further
// fields (strings, numbers, bools, and maps and slices of them), in field order.
func Leaves(t reflect.Type, path string) []string {
	switch t.Kind() {
	case reflect.Pointer:
		return Leaves(t.Elem(), path)
	case reflect.Slice:
		if t.Elem().Kind() == reflect.Struct || t.Elem().Kind() == reflect.Pointer {
			return Leaves(t.Elem(), path+"[]")
		}
	case reflect.Struct:
		var out []string
		for i := range t.NumField() {
			out = append(out, Leaves(t.Field(i).Type, Join(path, t.Field(i).Name))...)
		}
		return out
	}
	return []string{path}
}

// Set lists the leaf paths (as Leaves names them) at which v holds a non-zero value.
func Set(v reflect.Value, path string) []string {
	switch v.Kind() {
	case reflect.Pointer:
		if v.IsNil() {
			return nil
		}
		return Set(v.Elem(), path)
	case reflect.Slice:
		if k := v.Type().Elem().Kind(); k == reflect.Struct || k == reflect.Pointer {
			var out []string
			for i := range v.Len() {
				out = append(out, Set(v.Index(i), path+"[]")...)
			}
			return out
		}
	case reflect.Struct:
		var out []string
		for i := range v.NumField() {
			out = append(out, Set(v.Field(i), Join(path, v.Type().Field(i).Name))...)
		}
		return out
	}
	if v.IsZero() || (v.Kind() == reflect.Slice || v.Kind() == reflect.Map) && v.Len() == 0 {
		return nil
	}
	return []string{path}
}

// Join is path's field named field.
func Join(path, field string) string {
	if path == "" {
		return field
	}
	return path + "." + field
}

// Aliased lists the paths at which a and b (of one type) share memory: the same
// pointer, or slices or maps with the same backing store (non-empty ones; nil and empty
// share nothing).
func Aliased(a, b reflect.Value, path string) []string {
	switch a.Kind() {
	case reflect.Pointer:
		if a.IsNil() || b.IsNil() {
			return nil
		}
		if a.Pointer() == b.Pointer() {
			return []string{path}
		}
		return Aliased(a.Elem(), b.Elem(), path)
	case reflect.Slice:
		if a.Len() == 0 || b.Len() == 0 {
			return nil
		}
		if a.Pointer() == b.Pointer() {
			return []string{path}
		}
		var out []string
		for i := range min(a.Len(), b.Len()) {
			out = append(out, Aliased(a.Index(i), b.Index(i), path+"[]")...)
		}
		return out
	case reflect.Map:
		if a.Len() == 0 || b.Len() == 0 {
			return nil
		}
		if a.Pointer() == b.Pointer() {
			return []string{path}
		}
		var out []string
		for _, k := range a.MapKeys() {
			if e := b.MapIndex(k); e.IsValid() {
				out = append(out, Aliased(a.MapIndex(k), e, path+"{}")...)
			}
		}
		return out
	case reflect.Struct:
		var out []string
		for i := range a.NumField() {
			out = append(out, Aliased(a.Field(i), b.Field(i), Join(path, a.Type().Field(i).Name))...)
		}
		return out
	}
	return nil
}
