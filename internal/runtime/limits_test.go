package runtime

import (
	"fmt"
	"path"
	"strings"
	"testing"
)

type rec struct{ fields []string }

func (r *rec) add(field, format string, args ...any) {
	if fmt.Sprintf(format, args...) == "" {
		panic("violation without a description")
	}
	r.fields = append(r.fields, field)
}

func (r *rec) String() string { return strings.Join(r.fields, ",") }

func TestCheckArgs(t *testing.T) {
	big := strings.Repeat("a", MaxArgBytes)
	many := func(n int) []string { return make([]string, n) }
	for _, tc := range []struct {
		name          string
		args          []string
		already, abyt int
		want          string
	}{
		{"none", nil, 0, 0, ""},
		{"plain", []string{"sh", "-c", "echo hi"}, 0, 0, ""},
		{"NUL", []string{"ok", "a\x00b"}, 0, 0, "f[1]"},
		{"one at the bound", []string{big}, 0, 0, ""},
		{"one over the bound", []string{big + "a"}, 0, 0, "f[0]"},
		{"count at the bound", many(MaxArgs), 0, 0, ""},
		{"count over the bound", many(MaxArgs + 1), 0, 0, "f"},
		{"count with the command over", many(MaxArgs), 1, 0, "f"},
		{"total at the bound", []string{big, big, big, big, strings.Repeat("b", MaxArgsBytes-4*MaxArgBytes)}, 0, 0, ""},
		{"total over the bound", []string{big, big, big, big, strings.Repeat("b", MaxArgsBytes-4*MaxArgBytes+1)}, 0, 0, "f"},
		{"total with the command over", []string{big, big, big, big, strings.Repeat("b", MaxArgsBytes-4*MaxArgBytes)}, 1, 1, "f"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var r rec
			CheckArgs("f", tc.args, tc.already, tc.abyt, r.add)
			if r.String() != tc.want {
				t.Errorf("violations %q, want %q", r.String(), tc.want)
			}
		})
	}
}

func TestCheckEnv(t *testing.T) {
	many := func(n int) map[string]string {
		m := map[string]string{}
		for i := range n {
			m[fmt.Sprintf("K%d", i)] = "v"
		}
		return m
	}
	key := strings.Repeat("K", MaxEnvKeyLen)
	val := strings.Repeat("v", MaxEnvBytes-1)
	for _, tc := range []struct {
		name string
		env  map[string]string
		want string
	}{
		{"none", nil, ""},
		{"plain", map[string]string{"PATH": "/bin", "EMPTY": ""}, ""},
		{"empty name", map[string]string{"": "x"}, "e"},
		{"= in name", map[string]string{"A=B": "x"}, "e"},
		{"NUL in name", map[string]string{"A\x00": "x"}, "e"},
		{"NUL in value", map[string]string{"A": "x\x00y"}, "e[A]"},
		{"name at the bound", map[string]string{key: "x"}, ""},
		{"name over the bound", map[string]string{key + "K": "x"}, "e"},
		{"variable at the bound", map[string]string{"A": val}, ""},
		{"variable over the bound", map[string]string{"A": val + "v"}, "e[A]"},
		{"count at the bound", many(MaxEnvVars), ""},
		{"count over the bound", many(MaxEnvVars + 1), "e"},
		{"total at the bound", map[string]string{"A": val, "B": val, "C": val, "D": val, "E": strings.Repeat("d", MaxEnvsBytes-4*MaxEnvBytes-1)}, ""},
		{"total over the bound", map[string]string{"A": val, "B": val, "C": val, "D": val, "E": strings.Repeat("d", MaxEnvsBytes-4*MaxEnvBytes)}, "e"},
		{"in name order", map[string]string{"Z": "\x00", "A": "\x00", "=": ""}, "e,e[A],e[Z]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var r rec
			CheckEnv("e", tc.env, r.add)
			if r.String() != tc.want {
				t.Errorf("violations %q, want %q", r.String(), tc.want)
			}
		})
	}
}

func TestReserved(t *testing.T) {
	for p, want := range map[string]bool{
		"/.sandboxd": true, "/.sandboxd/": true, "/.sandboxd/run/agent.sock": true, "//.sandboxd/x": true,
		"/x/../.sandboxd/run": true, "/./.sandboxd": true, ".sandboxd/run": true,
		"/": false, "/.sandboxdx": false, "/x/.sandboxd": false, "/tmp/a": false, "/.sandbox": false,
	} {
		if got := Reserved(p); got != want {
			t.Errorf("Reserved(%q) = %v, want %v", p, got, want)
		}
	}
}

func TestCheckFilePath(t *testing.T) {
	for _, tc := range []struct {
		p  string
		ok bool
	}{
		{"/workspace/a.js", true},
		{"/" + strings.Repeat("a", 255), true},
		{"/" + strings.Repeat("a", 256), false},
		{strings.Repeat("/abc", MaxFilePath/4), true},
		{strings.Repeat("/abc", MaxFilePath/4) + "d", false},
		{"/.sandboxd/run/agent.sock", false},
		{"/.sandboxd", false},
		{"/.sandboxd-not/x", true},
	} {
		if err := CheckFilePath(tc.p); (err == nil) != tc.ok {
			t.Errorf("CheckFilePath(%.40q…) = %v, want ok %v", tc.p, err, tc.ok)
		}
	}
}

// FuzzCheckEnv: whatever CheckEnv accepts is a valid execve environment within bounds.
func FuzzCheckEnv(f *testing.F) {
	for _, s := range [][2]string{{"A", "b"}, {"", "x"}, {"A=B", "c"}, {"A", "x\x00"}, {"\x00", ""}, {strings.Repeat("k", 300), "v"}} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, k, v string) {
		var r rec
		CheckEnv("e", map[string]string{k: v}, r.add)
		if len(r.fields) > 0 {
			return
		}
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) || len(k) > MaxEnvKeyLen || len(k)+len(v) > MaxEnvBytes {
			t.Fatalf("accepted %q=%q", k, v)
		}
	})
}

// FuzzCheckArgs: whatever CheckArgs accepts is NUL-free and within bounds.
func FuzzCheckArgs(f *testing.F) {
	for _, s := range [][2]string{{"sh", "-c"}, {"a\x00", ""}, {"", ""}, {strings.Repeat("x", MaxArgBytes+1), "y"}} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		var r rec
		CheckArgs("f", []string{a, b}, 0, 0, r.add)
		if len(r.fields) > 0 {
			return
		}
		for _, s := range []string{a, b} {
			if strings.ContainsRune(s, 0) || len(s) > MaxArgBytes {
				t.Fatalf("accepted %q", s)
			}
		}
	})
}

// FuzzCheckFilePath: nothing accepted resolves into the agent's directory.
func FuzzCheckFilePath(f *testing.F) {
	for _, s := range []string{"/a", "/.sandboxd", "/.sandboxd/run/agent.sock", "//.sandboxd//x", "/a/../.sandboxd", "/.sandboxdx", strings.Repeat("/a", 600)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		if CheckFilePath(p) != nil {
			return
		}
		if len(p) > MaxFilePath || strings.Split(path.Clean("/"+p), "/")[1] == ".sandboxd" {
			t.Fatalf("accepted %q", p)
		}
	})
}
