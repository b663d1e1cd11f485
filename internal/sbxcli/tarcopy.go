package sbxcli

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	sandbox "github.com/sandboxd/sandboxd/sdk/go"
)

// copyLimits bound what a copy from a sandbox writes on this machine.
type copyLimits struct {
	bytes int64 // file content
	files int   // entries of any kind
}

// Shell scripts run in the sandbox; paths arrive as arguments, never in the script.
const (
	// tarOut SRC-DIR NAME: NAME (./x, or . for the root) as a tar stream on stdout.
	tarOutScript = `cd "$1" && exec tar -c -f - "$2"`
	// tarIn DST NAME dir|file MODE: the tar stream on stdin becomes DST, or DST/NAME when
	// DST is a directory (cp -r): a directory's contents, or a file's single entry.
	tarInScript = `set -e
dst=$1
if [ -d "$dst" ]; then dst=$dst/$2; fi
if [ "$3" = dir ]; then
	mkdir -p "$dst"
	cd "$dst"
	exec tar -x -o -f -
fi
mkdir -p "$(dirname "$dst")"
tar -x -O -f - > "$dst"
chmod "$4" "$dst"`
)

// remotePath keeps a sandbox path from reading as an option (-x becomes ./-x).
func remotePath(p string) string {
	if p == "" {
		return "."
	}
	if path.IsAbs(p) || strings.HasPrefix(p, "./") || p == "." {
		return p
	}
	return "./" + p
}

// download copies the sandbox's src (a file or a directory) to the local dst.
func (a *app) download(ctx context.Context, sb *sandbox.Sandbox, src, dst string, lim copyLimits) error {
	src = path.Clean(remotePath(src))
	dir, name := path.Dir(src), "./"+path.Base(src)
	if path.Base(src) == "/" {
		dir, name = "/", "."
	}
	pr, pw := io.Pipe()
	stderr := &capped{max: 64 << 10}
	type result struct {
		skipped []string
		err     error
	}
	done := make(chan result, 1)
	go func() {
		skipped, err := untar(pr, dst, path.Clean(name), lim)
		if err == nil || errors.Is(err, errEmptyArchive) {
			// What follows the end of the archive (padding) is drained, a little of it.
			if _, derr := io.CopyN(io.Discard, pr, 1<<20); derr == nil {
				err = errors.New("more than 1 MiB after the end of the archive")
			} else if !errors.Is(derr, io.EOF) {
				err = derr
			}
		}
		if err != nil {
			err = fmt.Errorf("copy from sandbox: %w", err)
		}
		pr.CloseWithError(err) // a failed extraction ends the command in the sandbox
		done <- result{skipped, err}
	}()
	code, err := sb.Exec(ctx, []string{"/bin/sh", "-c", tarOutScript, "sh", dir, name}, sandbox.ExecOptions{Stdout: pw, Stderr: stderr})
	_ = pw.Close()
	res := <-done
	switch {
	case res.err != nil && !errors.Is(res.err, errEmptyArchive):
		return res.err
	case err != nil:
		return err
	case code != 0:
		return fmt.Errorf("tar in the sandbox exited %d: %s", code, strings.TrimSpace(stderr.String()))
	case res.err != nil:
		return res.err
	}
	return a.reportSkipped(res.skipped)
}

func (a *app) reportSkipped(skipped []string) error {
	for _, s := range skipped {
		_, _ = fmt.Fprintf(a.stderr, "sbx: skipped %s\n", s)
	}
	if n := len(skipped); n > 0 {
		return fmt.Errorf("%d %s not copied (see above)", n, plural(n, "entry", "entries"))
	}
	return nil
}

var errEmptyArchive = errors.New("the sandbox sent no files")

// untar writes the archive of `tar -c TOP` (TOP is ./NAME or .) read from r, which a
// sandbox produced and is untrusted, to the local dst with cp -r semantics: a dst that
// is a directory receives NAME inside it, otherwise dst becomes the copy. Every entry
// must lie under TOP (no absolute paths, no ..); nothing is written outside the copy
// (os.Root) or through a symbolic link, symbolic links are made only when they resolve
// inside the copy, devices, FIFOs and sockets are skipped, modes lose setuid, setgid and
// sticky, and lim bounds entries and bytes. It returns what it skipped, described.
func untar(r io.Reader, dst, top string, lim copyLimits) (skipped []string, err error) {
	tr := tar.NewReader(r)
	x := extractor{lim: lim, top: top}
	defer func() {
		if x.root != nil {
			_ = x.root.Close()
		}
	}()
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			if x.entries == 0 {
				return nil, errEmptyArchive
			}
			return x.skipped, nil
		}
		if err != nil {
			return x.skipped, err
		}
		if h.Typeflag == tar.TypeXGlobalHeader {
			continue // PAX defaults for what follows; archive/tar applies them
		}
		if x.entries++; x.entries > lim.files {
			return x.skipped, fmt.Errorf("more than %d entries (--max-files)", lim.files)
		}
		rel, err := entryPath(h.Name, top)
		if err != nil {
			return x.skipped, err
		}
		if x.entries == 1 {
			err = x.first(h, tr, dst, path.Base(top), rel)
		} else {
			err = x.entry(h, tr, rel)
		}
		if err != nil {
			return x.skipped, err
		}
	}
}

type extractor struct {
	lim     copyLimits
	top     string   // the archive's top entry (./NAME or .)
	root    *os.Root // the copied directory; nil for a single file
	done    bool     // a single file was written: nothing may follow
	entries int
	written int64
	skipped []string
}

// first handles the archive's first entry, the copied file or directory itself.
func (x *extractor) first(h *tar.Header, r io.Reader, dst, name, rel string) error {
	if rel != "." {
		return fmt.Errorf("entry %q: the archive does not start with the copied path", h.Name)
	}
	target := dst
	if fi, err := os.Stat(dst); err == nil && fi.IsDir() && name != "." {
		target = filepath.Join(dst, name)
	}
	switch h.Typeflag {
	case tar.TypeDir:
		if err := os.MkdirAll(target, 0o755); err != nil {
			return err
		}
		root, err := os.OpenRoot(target)
		if err != nil {
			return err
		}
		x.root = root
		return nil
	case tar.TypeReg:
		if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
			return err
		}
		f, err := os.OpenFile(target, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, perm(h))
		if err != nil {
			return err
		}
		x.done = true
		return x.write(f, r, h)
	}
	return fmt.Errorf("%s is neither a file nor a directory", name)
}

// entry writes one entry below the copied directory.
func (x *extractor) entry(h *tar.Header, r io.Reader, rel string) error {
	if x.done || rel == "." {
		return fmt.Errorf("entry %q: unexpected after the copied path", h.Name)
	}
	if link, err := x.throughLink(rel); err != nil || link != "" {
		if err != nil {
			return err
		}
		x.skip(rel, "its parent "+link+" is a symbolic link")
		return nil
	}
	if dir := path.Dir(rel); dir != "." { // as tar does, for archives without them
		if err := x.root.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	switch h.Typeflag {
	case tar.TypeDir:
		return x.root.MkdirAll(rel, perm(h)|0o700) // writable, so its entries can follow
	case tar.TypeReg:
		// What is at rel is replaced, never written through (a symbolic or hard link).
		if fi, err := x.root.Lstat(rel); err == nil && !fi.IsDir() {
			if err := x.root.Remove(rel); err != nil {
				return err
			}
		}
		f, err := x.root.OpenFile(rel, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, perm(h))
		if err != nil {
			return err
		}
		return x.write(f, r, h)
	case tar.TypeSymlink:
		if !linkInside(rel, h.Linkname) {
			x.skip(rel, "symbolic link to "+strconv.Quote(h.Linkname)+" (points outside the copy)")
			return nil
		}
		_ = x.root.Remove(rel)
		return x.root.Symlink(h.Linkname, rel)
	case tar.TypeLink:
		old, err := entryPath(h.Linkname, x.top)
		if err != nil {
			return fmt.Errorf("hard link %q: %w", h.Name, err)
		}
		_ = x.root.Remove(rel)
		return x.root.Link(old, rel) // both inside the root; os.Root refuses anything else
	}
	x.skip(rel, fmt.Sprintf("%s (not a file, directory or link)", kindOf(h.Typeflag)))
	return nil
}

func (x *extractor) skip(rel, why string) {
	x.skipped = append(x.skipped, strconv.Quote(rel)+": "+why)
}

// write copies one file's content, within the byte budget, and closes f.
func (x *extractor) write(f *os.File, r io.Reader, h *tar.Header) error {
	left := x.lim.bytes - x.written
	if h.Size > left {
		_ = f.Close()
		return fmt.Errorf("%q: more than %s in all (--max-size)", h.Name, humanBytes(x.lim.bytes))
	}
	n, err := io.Copy(f, io.LimitReader(r, left))
	x.written += n
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// throughLink returns the first proper parent of rel that is a symbolic link ("" for
// none): entries are never placed through one, so a link's target is judged from where
// it really is.
func (x *extractor) throughLink(rel string) (string, error) {
	dir := path.Dir(rel)
	if dir == "." {
		return "", nil
	}
	parts := strings.Split(dir, "/")
	for i := range parts {
		p := strings.Join(parts[:i+1], "/")
		fi, err := x.root.Lstat(p)
		if errors.Is(err, fs.ErrNotExist) {
			return "", nil
		}
		if err != nil {
			return "", err
		}
		if fi.Mode()&fs.ModeSymlink != 0 {
			return p, nil
		}
	}
	return "", nil
}

// entryPath turns an archive entry name into a path relative to the copy: it must be
// relative, without .. components, and under top ("" or "." take any name).
func entryPath(name, top string) (string, error) {
	if name == "" || path.IsAbs(name) || strings.ContainsRune(name, 0) {
		return "", fmt.Errorf("entry %q: not a relative path", name)
	}
	for _, c := range strings.Split(name, "/") {
		if c == ".." {
			return "", fmt.Errorf("entry %q: .. in the path", name)
		}
	}
	clean := path.Clean(name)
	switch {
	case top == "" || top == ".":
		return clean, nil
	case clean == top:
		return ".", nil
	case strings.HasPrefix(clean, top+"/"):
		return clean[len(top)+1:], nil
	}
	return "", fmt.Errorf("entry %q: outside the copied path %q", name, top)
}

// linkInside reports whether a symbolic link at rel (whose parents are directories)
// with target stays inside the copy however the links it passes through resolve: the
// target must be relative, may climb (..) only at its start and no higher than rel's
// directory, and then only descend. Every link made obeys this, so following any chain
// of them from inside the copy stays inside.
func linkInside(rel, target string) bool {
	if target == "" || path.IsAbs(target) || strings.ContainsRune(target, 0) {
		return false
	}
	depth := strings.Count(rel, "/") // directories above rel inside the copy
	climbing := true
	for _, c := range strings.Split(target, "/") {
		switch {
		case c == "" || c == ".":
		case c == "..":
			if !climbing || depth == 0 {
				return false
			}
			depth--
		default:
			climbing = false
		}
	}
	return true
}

// perm is an entry's permission bits, without setuid, setgid and sticky.
func perm(h *tar.Header) fs.FileMode { return fs.FileMode(h.Mode) & fs.ModePerm }

func kindOf(t byte) string {
	switch t {
	case tar.TypeChar:
		return "character device"
	case tar.TypeBlock:
		return "block device"
	case tar.TypeFifo:
		return "FIFO"
	}
	return fmt.Sprintf("entry of type %q", t)
}

// upload copies the local src (a file or a directory) into the sandbox at dst.
func (a *app) upload(ctx context.Context, sb *sandbox.Sandbox, src, dst string) error {
	fi, err := os.Stat(src)
	if err != nil {
		return err
	}
	kind := "file"
	if fi.IsDir() {
		kind = "dir"
	}
	pr, pw := io.Pipe()
	type result struct {
		skipped []string
		err     error
	}
	done := make(chan result, 1)
	go func() {
		skipped, err := writeTar(pw, src, fi)
		pw.CloseWithError(err)
		done <- result{skipped, err}
	}()
	stderr := &capped{max: 64 << 10}
	name := filepath.Base(filepath.Clean(src))
	code, err := sb.Exec(ctx, []string{"/bin/sh", "-c", tarInScript, "sh", remotePath(dst), name, kind, fmt.Sprintf("%o", fi.Mode().Perm())},
		sandbox.ExecOptions{Stdin: pr, Stderr: stderr})
	_ = pr.Close() // ends writeTar if the command stopped reading
	res := <-done
	if res.err != nil && !errors.Is(res.err, io.ErrClosedPipe) {
		return fmt.Errorf("copy to sandbox: %w", res.err)
	}
	if err != nil {
		return err
	}
	if code != 0 {
		return fmt.Errorf("tar in the sandbox exited %d: %s", code, strings.TrimSpace(stderr.String()))
	}
	return a.reportSkipped(res.skipped)
}

// writeTar writes src as a tar stream: a file as one entry, a directory as its
// contents (./…) without following symbolic links; what is neither a file, a directory
// nor a link is left out and returned.
func writeTar(w io.Writer, src string, fi fs.FileInfo) (skipped []string, err error) {
	tw := tar.NewWriter(w)
	add := func(p, name string, fi fs.FileInfo) error {
		link := ""
		switch {
		case fi.Mode().IsRegular(), fi.IsDir():
		case fi.Mode()&fs.ModeSymlink != 0:
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		default:
			skipped = append(skipped, strconv.Quote(p)+": not a file, directory or link")
			return nil
		}
		h, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return err
		}
		h.Name, h.Uid, h.Gid, h.Uname, h.Gname = name, 0, 0, "", ""
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if !fi.Mode().IsRegular() {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.Copy(tw, io.LimitReader(f, h.Size))
		return err
	}
	if !fi.IsDir() {
		err = add(src, filepath.Base(src), fi)
	} else {
		err = filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, err := filepath.Rel(src, p)
			if err != nil || rel == "." {
				return err
			}
			info, err := d.Info()
			if err != nil {
				return err
			}
			return add(p, "./"+filepath.ToSlash(rel), info)
		})
	}
	if err != nil {
		return skipped, err
	}
	return skipped, tw.Close()
}

// capped keeps the first max bytes written to it (a command's stderr for errors).
type capped struct {
	max int
	buf bytes.Buffer
}

func (c *capped) Write(p []byte) (int, error) {
	if room := c.max - c.buf.Len(); room > 0 {
		c.buf.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func (c *capped) String() string { return c.buf.String() }
