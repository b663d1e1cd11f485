package local

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/sandboxd/sandboxd/internal/fsarchive"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// TestForkFromCheckpointHostileParts: an exported checkpoint's parts are sandbox-made
// (and pass through storage): parts crafted to write outside the staging dir — a ../
// path, an absolute path, a file through a symlink planted to a host dir, a hard link to
// a host file — are refused before any sandbox is made, not one byte lands outside, and
// nothing of the import is left.
func TestForkFromCheckpointHostileParts(t *testing.T) {
	e := exportEnv(t)
	ctx := context.Background()
	outside := t.TempDir()
	if err := os.WriteFile(filepath.Join(outside, "victim"), []byte("host"), 0o644); err != nil {
		t.Fatal(err)
	}
	dir := func() tarEntry {
		return tarEntry{hdr: tar.Header{Typeflag: tar.TypeDir, Name: "./", Mode: 0o755}}
	}
	file := func(name, body string) tarEntry {
		return tarEntry{hdr: tar.Header{Typeflag: tar.TypeReg, Name: name}, body: body}
	}
	empty := zstdTar(t, dir())
	attacks := map[string][]byte{
		"dotdot": zstdTar(t, dir(), file("../../../../../../.."+outside+"/dotdot", "pwned")),
		"abs":    zstdTar(t, dir(), file(outside+"/abs", "pwned")),
		"symlink": zstdTar(t, dir(),
			tarEntry{hdr: tar.Header{Typeflag: tar.TypeSymlink, Name: "out", Linkname: outside}},
			file("out/symlink", "pwned")),
		"symlinkdir": zstdTar(t, dir(),
			tarEntry{hdr: tar.Header{Typeflag: tar.TypeSymlink, Name: "out", Linkname: outside}},
			tarEntry{hdr: tar.Header{Typeflag: tar.TypeDir, Name: "out/", Mode: 0o755}},
			file("out/symlinkdir", "pwned")),
		"hardlink": zstdTar(t, dir(),
			tarEntry{hdr: tar.Header{Typeflag: tar.TypeLink, Name: "victim", Linkname: outside + "/victim"}}),
	}
	sp := volSpec("hp", GVisorClass, []runtime.Volume{{Name: "data", SizeBytes: 64 << 20}}, "sleep 1000")
	sp.Image = "busybox@sha256:b0b0"
	cp := runtime.CheckpointExport{Platform: e.b.CheckpointPlatform(GVisorClass), Class: GVisorClass, Parts: []string{"image", "run", "volume-0"}}
	for _, part := range cp.Parts {
		for name, attack := range attacks {
			t.Run(part+"/"+name, func(t *testing.T) {
				open := func(_ context.Context, p string) (io.ReadCloser, error) {
					if p == part {
						return io.NopCloser(bytes.NewReader(attack)), nil
					}
					return io.NopCloser(bytes.NewReader(empty)), nil
				}
				f := sp.Clone()
				_, errs := e.b.ForkFromCheckpoint(ctx, cp, open, []*runtime.Spec{&f})
				if !errors.Is(errs[0], fsarchive.ErrInvalid) {
					t.Errorf("%v, want fsarchive.ErrInvalid", errs[0])
				} else {
					t.Log(errs[0])
				}
				ents, _ := os.ReadDir(outside)
				if len(ents) != 1 {
					t.Errorf("written outside the staging dir: %v", ents)
				}
				if b, _ := os.ReadFile(filepath.Join(outside, "victim")); string(b) != "host" {
					t.Errorf("the host file now holds %q", b)
				}
				checkNoImportLeft(t, e)
				if _, err := os.Lstat(e.b.dir(f.ID)); err == nil {
					t.Error("the refused fork's dir is left")
				}
			})
		}
	}
}
