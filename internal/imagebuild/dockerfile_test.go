package imagebuild

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
)

func TestBases(t *testing.T) {
	for _, c := range []struct {
		name, df string
		args     map[string]string
		want     []string
	}{
		{"one", "FROM busybox\nRUN true\n", nil, []string{"busybox"}},
		{"stages", "FROM golang:1.22 AS build\nRUN go build\nFROM build AS test\nFROM debian:bookworm\nCOPY --from=build /x /x\nCOPY --from=0 /y /y\n", nil,
			[]string{"golang:1.22", "debian:bookworm"}},
		{"scratch", "FROM scratch\nCOPY x /\n", nil, nil},
		{"copy from an image", "FROM alpine\nCOPY --from=nginx:1 /etc/nginx /etc/nginx\nCOPY --from=nginx:1 /a /a\n", nil, []string{"alpine", "nginx:1"}},
		{"meta args", "ARG TAG=3.11\nARG REG\nFROM ${REG}python:$TAG\n", nil, []string{"python:3.11"}},
		{"meta args overridden", "ARG TAG=3.11\nARG REG\nFROM ${REG}python:$TAG\n", map[string]string{"TAG": "3.12", "REG": "reg.example/"}, []string{"reg.example/python:3.12"}},
		{"stage args do not apply to FROM", "FROM a\nARG TAG=x\nFROM b:$TAG\n", nil, []string{"a", "b:"}},
		{"platform flag, continuation", "FROM --platform=linux/amd64 \\\n  busybox:1 AS x\n", nil, []string{"busybox:1"}},
		{"escape directive", "# escape=`\nFROM busybox`\n:1\n", nil, []string{"busybox:1"}},
		{"case", "from Busybox as B\nfrom b\n", nil, []string{"Busybox"}},
	} {
		got, err := Bases([]byte(c.df), c.args)
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: bases %q, want %q", c.name, got, c.want)
		}
	}
}

func TestBasesRefused(t *testing.T) {
	var many strings.Builder
	for i := 0; i <= MaxBases; i++ {
		fmt.Fprintf(&many, "FROM img%d\n", i)
	}
	for _, c := range []struct{ name, df, want string }{
		{"no FROM", "RUN true\n", "no FROM"},
		{"empty", "", "no instructions"},
		{"too many bases", many.String(), "more than"},
		{"too large", "FROM a\n" + strings.Repeat("#", MaxDockerfileBytes), "at most"},
		{"bad substitution", "ARG A\nFROM ${A:?unset}\n", "FROM"},
	} {
		if _, err := Bases([]byte(c.df), nil); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error with %q", c.name, err, c.want)
		}
	}
}

func FuzzBases(f *testing.F) {
	for _, s := range []string{"FROM busybox\n", "ARG X=1\nFROM a:$X AS b\nCOPY --from=b / /\n", "# escape=`\nFROM a`\nb\n", "FROM\n", "FROM a\nRUN <<EOF\nx\nEOF\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, df []byte) {
		bases, err := Bases(df, map[string]string{"X": "2"})
		if err == nil && len(bases) > MaxBases {
			t.Fatalf("%d bases", len(bases))
		}
	})
}
