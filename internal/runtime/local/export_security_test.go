package local

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
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

// TestForkFromCheckpointHostileGroupParts: a group's export adds parts (group: group.json,
// member-<k>: a sidecar's agent state), as sandbox-made as the others: archives crafted
// to write outside the staging dir are refused; a group.json that is a link (to a host
// file holding a valid document), names other containers, is oversized, is not a
// document or records an ended sidecar's exit out of bounds is refused before any sandbox is made; nothing lands outside, nothing of the
// import is left, no fork dir.
func TestForkFromCheckpointHostileGroupParts(t *testing.T) {
	e := exportEnv(t)
	ctx := context.Background()
	outside := t.TempDir()
	victim := filepath.Join(outside, "victim")
	good := `{"members":[{"name":"side","digest":"sha256:b0b0"}]}`
	if err := os.WriteFile(victim, []byte(good), 0o644); err != nil {
		t.Fatal(err)
	}
	dir := tarEntry{hdr: tar.Header{Typeflag: tar.TypeDir, Name: "./", Mode: 0o755}}
	file := func(name, body string) tarEntry {
		return tarEntry{hdr: tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644}, body: body}
	}
	empty := zstdTar(t, dir)
	groupOK := zstdTar(t, dir, file(fileGroupExport, good))
	escapes := map[string][]byte{
		"dotdot":   zstdTar(t, dir, file("../../../../../../.."+outside+"/dotdot", "pwned")),
		"abs":      zstdTar(t, dir, file(outside+"/abs", "pwned")),
		"symlink":  zstdTar(t, dir, tarEntry{hdr: tar.Header{Typeflag: tar.TypeSymlink, Name: "out", Linkname: outside}}, file("out/symlink", "pwned")),
		"hardlink": zstdTar(t, dir, tarEntry{hdr: tar.Header{Typeflag: tar.TypeLink, Name: "victim", Linkname: victim}}),
	}
	groupJSON := map[string][]byte{
		"group.json a link to a host file": zstdTar(t, dir, tarEntry{hdr: tar.Header{Typeflag: tar.TypeSymlink, Name: fileGroupExport, Linkname: victim}}),
		"group.json a dir":                 zstdTar(t, dir, tarEntry{hdr: tar.Header{Typeflag: tar.TypeDir, Name: fileGroupExport + "/", Mode: 0o755}}),
		"another sidecar":                  zstdTar(t, dir, file(fileGroupExport, `{"members":[{"name":"evil","digest":"sha256:b0b0"}]}`)),
		"two sidecars":                     zstdTar(t, dir, file(fileGroupExport, `{"members":[{"name":"side","digest":"sha256:b0b0"},{"name":"x","digest":"sha256:b0b0"}]}`)),
		"oversized":                        zstdTar(t, dir, file(fileGroupExport, `{"members":[`+strings.Repeat(" ", 2*maxGroupJSON)+`]}`)),
		"not a document":                   zstdTar(t, dir, file(fileGroupExport, "\x00\x01")),
		// A sidecar that had ended: its recorded exit is what the import records.
		"ended sidecar, exit code 4096":  zstdTar(t, dir, file(fileGroupExport, `{"members":[{"name":"side","digest":"sha256:b0b0","ended":{"exitCode":4096,"restarts":0,"reason":"Error","message":"","finishedAt":"2026-12-04T22:00:00Z"}}]}`)),
		"ended sidecar, terminal escape": zstdTar(t, dir, file(fileGroupExport, `{"members":[{"name":"side","digest":"sha256:b0b0","ended":{"exitCode":1,"restarts":0,"reason":"Error","message":"\u001b]52;c;cHduZWQ=\u0007","finishedAt":"2026-12-04T22:00:00Z"}}]}`)),
		"ended sidecar, far future":      zstdTar(t, dir, file(fileGroupExport, `{"members":[{"name":"side","digest":"sha256:b0b0","ended":{"exitCode":1,"restarts":0,"reason":"Error","message":"","finishedAt":"9999-01-01T00:00:00Z"}}]}`)),
		"ended sidecar, 1 MiB message":   zstdTar(t, dir, file(fileGroupExport, `{"members":[{"name":"side","digest":"sha256:b0b0","ended":{"exitCode":1,"restarts":0,"reason":"Error","message":"`+strings.Repeat("m", 1<<20)+`","finishedAt":"2026-12-04T22:00:00Z"}}]}`)),
		"no group.json":                  empty,
	}
	sp := volSpec("hgp", GVisorClass, []runtime.Volume{{Name: "data", SizeBytes: 64 << 20}}, "sleep 1000")
	sp.Image = "busybox@sha256:b0b0"
	sp.Sidecars = []runtime.Container{{Name: "side", Image: "busybox", Command: "sleep", Args: []string{"1000"}}}
	cp := runtime.CheckpointExport{Platform: e.b.CheckpointPlatform(GVisorClass), Class: GVisorClass, Parts: []string{"image", "run", "group", "member-0", "volume-0"}}
	try := func(t *testing.T, part string, attack []byte, want error) {
		t.Helper()
		open := func(_ context.Context, p string) (io.ReadCloser, error) {
			switch {
			case p == part:
				return io.NopCloser(bytes.NewReader(attack)), nil
			case p == partGroup:
				return io.NopCloser(bytes.NewReader(groupOK)), nil
			}
			return io.NopCloser(bytes.NewReader(empty)), nil
		}
		f := sp.Clone()
		_, errs := e.b.ForkFromCheckpoint(ctx, cp, open, []*runtime.Spec{&f})
		if errs[0] == nil || want != nil && !errors.Is(errs[0], want) {
			t.Errorf("%v, want %v", errs[0], want)
		} else {
			t.Log(errs[0])
		}
		if ents, _ := os.ReadDir(outside); len(ents) != 1 {
			t.Errorf("written outside the staging dir: %v", ents)
		}
		if b, _ := os.ReadFile(victim); string(b) != good {
			t.Errorf("the host file now holds %q", b)
		}
		checkNoImportLeft(t, e)
		if _, err := os.Lstat(e.b.dir(f.ID)); err == nil {
			t.Error("the refused fork's dir is left")
		}
	}
	for _, part := range []string{"group", "member-0"} {
		for name, attack := range escapes {
			t.Run(part+"/"+name, func(t *testing.T) { try(t, part, attack, fsarchive.ErrInvalid) })
		}
	}
	for name, attack := range groupJSON {
		t.Run("group/"+name, func(t *testing.T) { try(t, partGroup, attack, nil) })
	}
}
