package local

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

func TestPinnedDigest(t *testing.T) {
	for ref, want := range map[string]string{
		"busybox@sha256:b0b0":                     "sha256:b0b0",
		"reg.example/a/b:tag@sha256:0123456789ab": "sha256:0123456789ab",
		"busybox":             "",
		"busybox:1.36":        "",
		"busybox@":            "",
		"busybox@sha256:":     "",
		"busybox@sha512:abcd": "",
	} {
		got, ok := pinnedDigest(ref)
		if got != want || ok != (want != "") {
			t.Errorf("pinnedDigest(%q) = %q, %v; want %q", ref, got, ok, want)
		}
	}
}

func TestImportParts(t *testing.T) {
	sp := &runtime.Spec{Volumes: []runtime.Volume{{Name: "a"}, {Name: "m", Medium: runtime.MediumMemory}, {Name: "c", Medium: runtime.MediumDisk}}}
	if got := strings.Join(importParts(sp), ","); got != "image,run,volume-0,volume-2" {
		t.Errorf("importParts = %s", got)
	}
	if !sameSet([]string{"run", "image"}, []string{"image", "run"}) || sameSet([]string{"run", "run"}, []string{"image", "run"}) {
		t.Error("sameSet")
	}
}

// TestRunscBuild: the build is the version runsc prints, or the binary's sha256 when it
// prints none; runsc is asked once per binary (and again once it is replaced).
func TestRunscBuild(t *testing.T) {
	dir := t.TempDir()
	calls := filepath.Join(dir, "calls")
	write := func(name, version string) string {
		p := filepath.Join(dir, name)
		script := "#!/bin/sh\necho x >> " + calls + "\necho 'runsc version " + version + "'\necho 'spec: 1.2.1'\n"
		if err := os.WriteFile(p, []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	ncalls := func() int {
		b, _ := os.ReadFile(calls)
		return strings.Count(string(b), "x")
	}
	rel := write("runsc-rel", "release-20250101.0")
	for range 3 {
		if v, err := runscBuild(rel); err != nil || v != "release-20250101.0" {
			t.Fatalf("runscBuild = %q, %v", v, err)
		}
	}
	if n := ncalls(); n != 1 {
		t.Errorf("runsc asked %d times, want once", n)
	}
	missing := write("runsc-missing", "VERSION_MISSING")
	v, err := runscBuild(missing)
	if err != nil || !strings.HasPrefix(v, "sha256-") || len(v) != len("sha256-")+24 {
		t.Errorf("runscBuild of a build without a version = %q, %v", v, err)
	}
	odd := write("runsc-odd", "a b/c")
	if v, err := runscBuild(odd); err != nil || !strings.HasPrefix(v, "sha256-") {
		t.Errorf("runscBuild of a version with odd characters = %q, %v", v, err)
	}
	if _, err := runscBuild(filepath.Join(dir, "nope")); err == nil {
		t.Error("runscBuild of a missing binary succeeded")
	}
}

// TestImportLimits: the image is bounded by the sandbox's memory (the host's without a
// limit) plus its disk limit (at least 1 GiB; the state dir's free space without one),
// the agent's state by the disk limit (at least 1 GiB), a volume by its size or the disk
// limit.
func TestImportLimits(t *testing.T) {
	b := &Backend{cfg: Config{StateDir: t.TempDir()}}
	sp := &runtime.Spec{Container: runtime.Container{Resources: runtime.Resources{MemoryBytes: 256 << 20, DiskBytes: 4 << 30}},
		Volumes: []runtime.Volume{{Name: "a", SizeBytes: 64 << 20}, {Name: "b"}}}
	image, run, vols := b.importLimits([]*runtime.Spec{sp}, []error{nil})
	if image.MaxBytes != 256<<20+4<<30 || run.MaxBytes != 4<<30 || image.MaxFiles == 0 || run.MaxFiles == 0 {
		t.Errorf("image %+v, run %+v", image, run)
	}
	if vols["volume-0"].MaxBytes != 64<<20 || vols["volume-1"].MaxBytes != 4<<30 || len(vols) != 2 {
		t.Errorf("volumes %+v", vols)
	}
	small := sp.Clone()
	small.Resources = runtime.Resources{MemoryBytes: 128 << 20, DiskBytes: 256 << 20}
	small.Volumes = nil
	image, run, vols = b.importLimits([]*runtime.Spec{&small, sp}, []error{nil, errors.New("refused")})
	if image.MaxBytes != 128<<20+1<<30 || run.MaxBytes != 1<<30 || len(vols) != 0 {
		t.Errorf("small: image %+v, run %+v, volumes %+v", image, run, vols)
	}
	unlimited := runtime.Spec{}
	image, run, _ = b.importLimits([]*runtime.Spec{&unlimited}, []error{nil})
	if free := freeBytes(b.cfg.StateDir); image.MaxBytes != hostMemory()+max(1<<30, free) || run.MaxBytes != max(1<<30, free) {
		t.Errorf("unlimited: image %+v, run %+v (host memory %d, free %d)", image, run, hostMemory(), free)
	}
}
