package image

import (
	"archive/tar"
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/testenv"
)

// FuzzUnpack feeds layers described by a tiny line language, one entry per line:
// "<type> <name> [<link>]" with type d (dir), f (file), l (symlink), h (hard link),
// w (whiteout file ".wh.<name>"), o (opaque marker in dir <name>).
// Whatever the input, nothing may be created or changed outside the target dir.
func FuzzUnpack(f *testing.F) {
	for _, s := range []string{
		"d a\nf a/b\nl a/c /etc\nh a/d a/b",
		"f ../x",
		"f /etc/passwd",
		"h x ../../etc/passwd",
		"l evil ../../outside\nf evil/x",
		"l evil ../../outside\nd evil/y",
		"l evil /\nh evil2 evil/outside/keep",
		"l e ..\nf e/e/outside/pwn",
		"d a\nw a/b\no a",
		"f a\nf a/b",
		"d x\nl x ../../outside\nf x/y",
		"w ..\nw .\no ..",
		"f .\nd .",
		"h a a",
		"l a/b/c ../../../../outside\nf a/b/c/d",
	} {
		f.Add(s)
	}
	testenv.RequireRoot(f, "unpacking layers: chown, device nodes, xattrs")
	f.Fuzz(func(t *testing.T, prog string) {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for i, line := range strings.Split(prog, "\n") {
			if i > 64 {
				break
			}
			fs := strings.Fields(line)
			if len(fs) < 2 {
				continue
			}
			h := &tar.Header{Name: fs[1], Mode: 0o644}
			if len(fs) > 2 {
				h.Linkname = fs[2]
			}
			switch fs[0] {
			case "d":
				h.Typeflag, h.Mode = tar.TypeDir, 0o755
			case "f":
				h.Typeflag, h.Size = tar.TypeReg, 3
			case "l":
				h.Typeflag = tar.TypeSymlink
			case "h":
				h.Typeflag = tar.TypeLink
			case "w":
				h.Typeflag, h.Name = tar.TypeReg, filepath.Join(filepath.Dir(fs[1]), ".wh."+filepath.Base(fs[1]))
			case "o":
				h.Typeflag, h.Name = tar.TypeReg, fs[1]+"/.wh..wh..opq"
			default:
				continue
			}
			if tw.WriteHeader(h) != nil {
				continue
			}
			if h.Typeflag == tar.TypeReg && h.Size == 3 {
				tw.Write([]byte("pwn"))
			}
		}
		tw.Close()

		base := t.TempDir()
		os.MkdirAll(filepath.Join(base, "outside"), 0o755)
		os.WriteFile(filepath.Join(base, "outside", "keep"), []byte("keep"), 0o644)
		dir := filepath.Join(base, "layer", "sub")
		os.MkdirAll(dir, 0o755)
		_ = unpack(context.Background(), bytes.NewReader(buf.Bytes()), dir) // errors are fine; escapes are not
		assertOutsideUntouched(t, base, dir)
	})
}
