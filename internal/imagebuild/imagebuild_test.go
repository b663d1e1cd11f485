package imagebuild

import (
	"context"
	"io"
	"log"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

func TestOptionsCheck(t *testing.T) {
	ok := Options{Dockerfile: "docker/Dockerfile.dev", BuildArgs: map[string]string{"VERSION": "1.2", "_x": ""}, Target: "build-stage.1"}
	if vs := ok.Check(); len(vs) != 0 {
		t.Fatalf("valid options: %v", vs)
	}
	many := map[string]string{}
	for i := 0; i <= MaxBuildArgs; i++ {
		many["A"+strings.Repeat("x", i)] = "v"
	}
	for _, c := range []struct {
		o     Options
		field string
	}{
		{Options{Dockerfile: "/etc/passwd"}, "dockerfile"},
		{Options{Dockerfile: "../Dockerfile"}, "dockerfile"},
		{Options{Dockerfile: "a/../../b"}, "dockerfile"},
		{Options{Dockerfile: "."}, "dockerfile"},
		{Options{Dockerfile: "a\x00b"}, "dockerfile"},
		{Options{Dockerfile: strings.Repeat("a", MaxPathBytes+1)}, "dockerfile"},
		{Options{BuildArgs: many}, "build_args"},
		{Options{BuildArgs: map[string]string{"1A": "x"}}, "build_args"},
		{Options{BuildArgs: map[string]string{"A B": "x"}}, "build_args"},
		{Options{BuildArgs: map[string]string{"A": strings.Repeat("v", MaxBuildArgBytes)}}, "build_args"},
		{Options{BuildArgs: map[string]string{"A": "a\x00"}}, "build_args"},
		{Options{Target: "-x"}, "target_stage"},
		{Options{Target: "a b"}, "target_stage"},
	} {
		vs := c.o.Check()
		if len(vs) == 0 || vs[0].Field != c.field {
			t.Errorf("%+v: violations %v, want one of %s", c.o, vs, c.field)
		}
	}
}

// The build options reach Buildah as separate arguments after the script's own, in a
// stable order, never through the shell.
func TestArgv(t *testing.T) {
	o := Options{BuildArgs: map[string]string{"B": "2; rm -rf /", "A": "$(x)"}, Target: "final", NoCache: true}
	a := o.argv()
	want := []string{"sh", "-c", script, "build", "Dockerfile", "--build-arg=A=$(x)", "--build-arg=B=2; rm -rf /", "--target=final", "--no-cache"}
	if !reflect.DeepEqual(a, want) {
		t.Errorf("argv %q, want %q", a[3:], want[3:])
	}
	if got := (Options{Dockerfile: "./sub//Dockerfile"}).argv()[4]; got != "sub/Dockerfile" {
		t.Errorf("dockerfile %q, want it cleaned", got)
	}
}

func TestLines(t *testing.T) {
	var got []string
	l := &lines{emit: func(s string) { got = append(got, s) }}
	l.write([]byte("one\ntw"))
	l.write([]byte("o\n\nthree"))
	l.write([]byte(strings.Repeat("x", MaxLine+10) + "\nfour\n"))
	l.write([]byte(strings.Repeat("y", MaxLine-1)))
	l.write([]byte("yy" + strings.Repeat("z", MaxLine) + "\nfive"))
	l.flush()
	want := []string{"one", "two", "", "three" + strings.Repeat("x", MaxLine-5), "four", strings.Repeat("y", MaxLine), "five"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("lines (%d):\n%q\nwant (%d):\n%q", len(got), got, len(want), want)
	}
}

// LayoutImage takes a layout with one image, and refuses one with none or two.
func TestLayoutImage(t *testing.T) {
	img, err := random.Image(1024, 2)
	if err != nil {
		t.Fatal(err)
	}
	one := t.TempDir()
	lp, err := layout.Write(one, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := lp.AppendImage(img); err != nil {
		t.Fatal(err)
	}
	got, err := LayoutImage(one)
	if err != nil {
		t.Fatal(err)
	}
	if d1, _ := got.Digest(); d1 != mustDigest(t, img) {
		t.Errorf("digest %s, want %s", d1, mustDigest(t, img))
	}
	if err := lp.AppendImage(img); err != nil {
		t.Fatal(err)
	}
	if _, err := LayoutImage(one); err == nil || !strings.Contains(err.Error(), "2 manifests") {
		t.Errorf("two manifests: %v", err)
	}
	none := t.TempDir()
	if _, err := layout.Write(none, empty.Index); err != nil {
		t.Fatal(err)
	}
	if _, err := LayoutImage(none); err == nil {
		t.Error("an empty layout was taken")
	}
	if _, err := LayoutImage(t.TempDir()); err == nil {
		t.Error("a directory without a layout was taken")
	}
}

func TestPush(t *testing.T) {
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	img, err := random.Image(512, 1)
	if err != nil {
		t.Fatal(err)
	}
	d, err := Push(context.Background(), img, host+"/org-1/app:v1", "u", "p", true)
	if err != nil {
		t.Fatal(err)
	}
	if d != mustDigest(t, img).String() {
		t.Errorf("pushed digest %s, want %s", d, mustDigest(t, img))
	}
	ref, _ := name.ParseReference(host+"/org-1/app@"+d, name.Insecure)
	if _, err := remote.Head(ref); err != nil {
		t.Errorf("the registry has no %s: %v", ref, err)
	}
	if _, err := Push(context.Background(), img, "not a ref", "", "", true); err == nil {
		t.Error("a bad reference was pushed to")
	}
}

func mustDigest(t *testing.T, img v1.Image) v1.Hash {
	t.Helper()
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d
}
