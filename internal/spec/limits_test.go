package spec

import (
	"fmt"
	"regexp"
	"strings"
	"testing"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
)

func fields(vs []apierr.Violation) string {
	var out []string
	for _, v := range vs {
		out = append(out, v.Field)
	}
	return strings.Join(out, ",")
}

func TestTagViolations(t *testing.T) {
	many := func(n int) []string {
		var ts []string
		for i := range n {
			ts = append(ts, fmt.Sprintf("t%d", i))
		}
		return ts
	}
	for _, tc := range []struct {
		name string
		tags []string
		want string
	}{
		{"none", nil, ""},
		{"good", []string{"a", "conformance-0123456789ab", "A.b_c-9", strings.Repeat("x", MaxTagLen)}, ""},
		{"too long", []string{strings.Repeat("x", MaxTagLen+1)}, "t[0]"},
		{"empty", []string{"ok", ""}, "t[1]"},
		{"bad end", []string{"a-", "a.", "a_"}, "t[0],t[1],t[2]"},
		{"bad characters", []string{"a b", "a/b", "é", "a\nb"}, "t[0],t[1],t[2],t[3]"},
		{"at the count bound", many(MaxTags), ""},
		{"over the count bound", many(MaxTags + 1), "t"},
	} {
		if got := fields(tagViolations("t", tc.tags)); got != tc.want {
			t.Errorf("%s: violations %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestAnnotationViolations(t *testing.T) {
	many := func(n int) map[string]string {
		m := map[string]string{}
		for i := range n {
			m[fmt.Sprintf("k%d", i)] = "v"
		}
		return m
	}
	name63 := strings.Repeat("n", 63)
	prefix253 := strings.Repeat(strings.Repeat("p", 62)+".", 4)[:252] + "p"
	for _, tc := range []struct {
		name string
		ann  map[string]string
		want string
	}{
		{"none", nil, ""},
		{"good", map[string]string{"a": "", "example.com/team": "ml", "A_b.c-d": "x", name63: "", prefix253 + "/" + name63: ""}, ""},
		{"name too long", map[string]string{name63 + "n": ""}, "a"},
		{"prefix too long", map[string]string{"p" + prefix253 + "/x": ""}, "a"},
		{"empty key", map[string]string{"": "x"}, "a"},
		{"empty name", map[string]string{"example.com/": "x"}, "a"},
		{"bad prefix", map[string]string{"Example.com/x": "", "/x": "", "a/b/c": ""}, "a,a,a"},
		{"bad name", map[string]string{"-x": "", "x-": "", "a b": ""}, "a,a,a"},
		{"at the count bound", many(MaxAnnotations), ""},
		{"over the count bound", many(MaxAnnotations + 1), "a"},
		{"at the size bound", map[string]string{"k": strings.Repeat("v", MaxAnnotationsBytes-1)}, ""},
		{"over the size bound", map[string]string{"k": strings.Repeat("v", MaxAnnotationsBytes)}, "a"},
	} {
		if got := fields(annotationViolations("a", tc.ann)); got != tc.want {
			t.Errorf("%s: violations %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestContainerNameViolations(t *testing.T) {
	cs := func(names ...string) []*sandboxv1.Container {
		var out []*sandboxv1.Container
		for _, n := range names {
			out = append(out, &sandboxv1.Container{Name: n})
		}
		return out
	}
	for _, tc := range []struct {
		names []string
		want  string
	}{
		{[]string{""}, ""},
		{[]string{"main"}, ""},
		{[]string{"main", "side-car-2"}, ""},
		{[]string{strings.Repeat("a", 63)}, ""},
		{[]string{strings.Repeat("a", 64)}, "c[0].name"},
		{[]string{"Main"}, "c[0].name"},
		{[]string{"ok", "a_b", "-a", "a.b", "a\x00"}, "c[1].name,c[2].name,c[3].name,c[4].name"},
		{[]string{"x", "x"}, "c[1].name"},
	} {
		if got := fields(containerNameViolations("c", cs(tc.names...))); got != tc.want {
			t.Errorf("%q: violations %q, want %q", tc.names, got, tc.want)
		}
	}
}

// TestCreateNamesLimitFields: the wire checks are part of ToCreateRequest, with the
// request's field names.
func TestCreateNamesLimitFields(t *testing.T) {
	spec := &sandboxv1.SandboxSpec{
		Containers:  []*sandboxv1.Container{{Name: "Bad_Name", Image: "busybox"}},
		Tags:        []string{strings.Repeat("t", MaxTagLen+1)},
		Annotations: map[string]string{"bad key": ""},
	}
	_, err := ToCreateRequest(spec)
	got := fields(apierr.Violations(err))
	if want := "sandbox.spec.containers[0].name,sandbox.spec.tags[0],sandbox.spec.annotations"; got != want {
		t.Errorf("violations %q, want %q (err %v)", got, want, err)
	}
}

var referenceTag = regexp.MustCompile(`^[A-Za-z0-9._-]*[A-Za-z0-9]$`)

// FuzzCheckTag: exactly the documented tags pass.
func FuzzCheckTag(f *testing.F) {
	for _, s := range []string{"a", "", "a-", "conformance-abc", strings.Repeat("x", 60), "é", "a b", "A.b_c-9"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		want := len(s) <= 59 && referenceTag.MatchString(s)
		if got := checkTag(s) == nil; got != want {
			t.Fatalf("checkTag(%q) ok = %v, want %v", s, got, want)
		}
	})
}

// FuzzCheckAnnotationKey: whatever passes is a Kubernetes qualified name.
func FuzzCheckAnnotationKey(f *testing.F) {
	for _, s := range []string{"a", "", "example.com/x", "/x", "x/", "a/b/c", "A.b", strings.Repeat("n", 64), "-a", "x.y/z_1"} {
		f.Add(s)
	}
	name := regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$`)
	f.Fuzz(func(t *testing.T, k string) {
		if checkAnnotationKey(k) != nil {
			return
		}
		prefix, n, has := strings.Cut(k, "/")
		if !has {
			n, prefix = k, ""
		}
		if !name.MatchString(n) || (has && (prefix == "" || len(prefix) > 253 || strings.ToLower(prefix) != prefix || strings.Contains(n, "/"))) {
			t.Fatalf("accepted %q", k)
		}
	})
}
