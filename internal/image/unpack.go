package image

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"sync"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"
)

// unpackVerified decompresses (gzip, zstd or none, detected by magic bytes) and
// unpacks a layer blob into dir, verifying the uncompressed digest against diffID.
// The compressed digest is verified by the registry reader when it reaches EOF,
// so the blob is read to the end.
func unpackVerified(ctx context.Context, blob io.Reader, diffID v1.Hash, dir string) error {
	br := bufio.NewReaderSize(blob, 1<<16)
	magic, _ := br.Peek(4)
	var r io.Reader = br
	switch {
	case len(magic) >= 2 && magic[0] == 0x1f && magic[1] == 0x8b:
		zr, err := gzip.NewReader(br)
		if err != nil {
			return fmt.Errorf("gzip: %w", err)
		}
		defer func() { _ = zr.Close() }()
		r = zr
	case len(magic) == 4 && bytes.Equal(magic, []byte{0x28, 0xb5, 0x2f, 0xfd}):
		zr, err := zstd.NewReader(br)
		if err != nil {
			return fmt.Errorf("zstd: %w", err)
		}
		defer zr.Close()
		r = zr
	}
	h := sha256.New()
	tee := io.TeeReader(r, h)
	if err := unpack(ctx, tee, dir); err != nil {
		return err
	}
	// trailing tar padding counts toward the diffID
	if _, err := io.Copy(h, r); err != nil {
		return fmt.Errorf("read layer: %w", err)
	}
	if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != diffID.String() {
		return fmt.Errorf("%w: layer diffID mismatch: got %s, want %s", ErrUnsafeLayer, got, diffID)
	}
	if _, err := io.Copy(io.Discard, br); err != nil { // verifies the compressed digest
		return fmt.Errorf("read layer: %w", err)
	}
	return nil
}

var copyBufs = sync.Pool{New: func() any { b := make([]byte, 256<<10); return &b }}

// unpack extracts an uncompressed layer tar from r into dir, which must exist.
//
// Rules:
//   - Entry names are cleaned; a leading "/" is dropped (absolute names are made
//     relative to the layer, as tar does). A name that still escapes ("../x",
//     "a/../../x") is rejected with ErrUnsafeLayer, failing the whole layer.
//   - No symlink is ever followed: every parent component is opened with
//     O_NOFOLLOW|O_DIRECTORY relative to the layer root, so an entry below a
//     symlink (even one pointing inside the layer) is rejected.
//   - Hard link targets are resolved the same way and must exist in this layer.
//     Symlink targets are stored verbatim (they are resolved inside the container).
//   - OCI whiteouts become overlayfs whiteouts: ".wh.x" -> char device 0/0 "x",
//     ".wh..wh..opq" -> xattr trusted.overlay.opaque="y" on the directory.
//   - Modes, uid/gid, mtimes and user.* / security.capability xattrs are applied;
//     directory metadata last. Character and block devices are skipped (the
//     runtime provides /dev); FIFOs are created.
func unpack(ctx context.Context, r io.Reader, dir string) error {
	rootfd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open layer dir: %w", err)
	}
	x := &extractor{root: rootfd, chown: os.Geteuid() == 0}
	defer unix.Close(rootfd)
	defer x.close()
	tr := tar.NewReader(r)
	for n := 0; ; n++ {
		if n%64 == 0 && ctx.Err() != nil {
			return ctx.Err()
		}
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("read layer tar: %w", err)
		}
		if err := x.entry(hdr, tr); err != nil {
			return fmt.Errorf("layer entry %q: %w", hdr.Name, err)
		}
	}
	return x.finish()
}

type dirMeta struct {
	name string
	hdr  *tar.Header
}

type extractor struct {
	root    int
	chown   bool
	dirs    []dirMeta
	fds     map[string]int // cached directory fds by layer-relative path
	retired []int
}

func unsafeErr(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrUnsafeLayer, fmt.Sprintf(format, a...))
}

// cleanName returns the layer-relative clean path ("." for the root).
func cleanName(n string) (string, error) {
	if strings.IndexByte(n, 0) >= 0 {
		return "", unsafeErr("NUL in name")
	}
	n = strings.TrimLeft(n, "/")
	if n == "" {
		return ".", nil
	}
	c := path.Clean(n)
	if c == ".." || strings.HasPrefix(c, "../") {
		return "", unsafeErr("path %q escapes the layer", n)
	}
	return c, nil
}

// openDir opens the directory rel (clean, relative) without following symlinks,
// creating missing components (0755, root) when create is set. Directory fds are
// cached (most entries share their parent with the previous one); the cache owns
// them, callers must not close them.
func (x *extractor) openDir(rel string, create bool) (int, error) {
	if rel == "." || rel == "" {
		return x.root, nil
	}
	if fd, ok := x.fds[rel]; ok {
		return fd, nil
	}
	cur, start := x.root, 0
	// start from the longest cached ancestor
	for i := len(rel) - 1; i > 0; i-- {
		if rel[i] == '/' {
			if fd, ok := x.fds[rel[:i]]; ok {
				cur, start = fd, i+1
				break
			}
		}
	}
	for start <= len(rel) {
		end := strings.IndexByte(rel[start:], '/')
		if end < 0 {
			end = len(rel)
		} else {
			end += start
		}
		comp := rel[start:end]
		fd, err := unix.Openat(cur, comp, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err == unix.ENOENT && create {
			if err = unix.Mkdirat(cur, comp, 0o755); err == nil || err == unix.EEXIST {
				fd, err = unix.Openat(cur, comp, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			}
		}
		if err != nil {
			if err == unix.ELOOP || err == unix.ENOTDIR {
				return -1, unsafeErr("%q: a parent is a symlink or not a directory (symlinks are never followed)", rel)
			}
			return -1, fmt.Errorf("open %q: %w", rel, err)
		}
		x.cache(rel[:end], fd)
		cur = fd
		start = end + 1
	}
	return cur, nil
}

const maxCachedDirs = 128

func (x *extractor) cache(rel string, fd int) {
	if x.fds == nil {
		x.fds = map[string]int{}
	}
	if len(x.fds) >= maxCachedDirs {
		x.invalidate()
		x.fds = map[string]int{}
	}
	x.fds[rel] = fd
}

// invalidate drops the dir cache (after a directory was removed or replaced). The
// fds may still be in use by the current entry, so they are closed at the end.
func (x *extractor) invalidate() {
	for _, fd := range x.fds {
		x.retired = append(x.retired, fd)
	}
	x.fds = nil
}

func (x *extractor) close() {
	x.invalidate()
	for _, fd := range x.retired {
		unix.Close(fd)
	}
	x.retired = nil
}

func (x *extractor) closeDir(int) {}

// remove removes name in pfd recursively; the dir cache is dropped if a directory went away.
func (x *extractor) remove(pfd int, name string) error {
	removedDir, err := removeAllAt(pfd, name)
	if removedDir {
		x.invalidate()
	}
	return err
}

func splitName(c string) (dir, base string) {
	d, b := path.Split(c)
	d = strings.TrimSuffix(d, "/")
	if d == "" {
		d = "."
	}
	return d, b
}

func (x *extractor) entry(hdr *tar.Header, tr io.Reader) error {
	c, err := cleanName(hdr.Name)
	if err != nil {
		return err
	}
	switch hdr.Typeflag {
	case tar.TypeXGlobalHeader, tar.TypeXHeader, tar.TypeGNULongName, tar.TypeGNULongLink:
		return nil
	}
	if c == "." {
		if hdr.Typeflag != tar.TypeDir {
			return unsafeErr("non-directory entry for the layer root")
		}
		x.dirs = append(x.dirs, dirMeta{name: ".", hdr: hdr})
		return nil
	}
	dir, base := splitName(c)

	// whiteouts
	if strings.HasPrefix(base, ".wh.") {
		pfd, err := x.openDir(dir, true)
		if err != nil {
			return err
		}
		defer x.closeDir(pfd)
		if base == ".wh..wh..opq" {
			if err := unix.Fsetxattr(pfd, "trusted.overlay.opaque", []byte("y"), 0); err != nil {
				return fmt.Errorf("opaque xattr: %w", err)
			}
			return nil
		}
		if strings.HasPrefix(base, ".wh..wh.") { // aufs metadata (.wh..wh.plnk etc.)
			return nil
		}
		target := strings.TrimPrefix(base, ".wh.")
		if target == "" || target == "." || target == ".." {
			return unsafeErr("bad whiteout %q", hdr.Name)
		}
		if err := x.remove(pfd, target); err != nil {
			return err
		}
		if err := unix.Mknodat(pfd, target, unix.S_IFCHR, 0); err != nil {
			return fmt.Errorf("whiteout %q: %w", target, err)
		}
		return nil
	}

	pfd, err := x.openDir(dir, true)
	if err != nil {
		return err
	}
	defer x.closeDir(pfd)
	mode := uint32(hdr.Mode) & 0o7777

	switch hdr.Typeflag {
	case tar.TypeDir:
		var st unix.Stat_t
		if err := unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err == nil && st.Mode&unix.S_IFMT != unix.S_IFDIR {
			if err := x.remove(pfd, base); err != nil {
				return err
			}
		}
		if err := unix.Mkdirat(pfd, base, 0o755); err != nil && err != unix.EEXIST {
			return fmt.Errorf("mkdir: %w", err)
		}
		x.dirs = append(x.dirs, dirMeta{name: c, hdr: hdr})
		return nil

	case tar.TypeReg, tar.TypeGNUSparse: // tar.Reader turns TypeRegA into TypeReg
		if err := x.remove(pfd, base); err != nil {
			return err
		}
		fd, err := unix.Openat(pfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return fmt.Errorf("create: %w", err)
		}
		f := os.NewFile(uintptr(fd), c)
		bp := copyBufs.Get().(*[]byte)
		_, err = io.CopyBuffer(struct{ io.Writer }{f}, tr, *bp)
		copyBufs.Put(bp)
		if err == nil {
			err = x.meta(fd, hdr, mode)
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
		return x.times(pfd, base, hdr)

	case tar.TypeSymlink:
		if err := x.remove(pfd, base); err != nil {
			return err
		}
		if err := unix.Symlinkat(hdr.Linkname, pfd, base); err != nil {
			return fmt.Errorf("symlink: %w", err)
		}
		if x.chown {
			if err := unix.Fchownat(pfd, base, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				return fmt.Errorf("lchown: %w", err)
			}
		}
		return x.times(pfd, base, hdr)

	case tar.TypeLink:
		tc, err := cleanName(hdr.Linkname)
		if err != nil {
			return fmt.Errorf("hard link target: %w", err)
		}
		if tc == "." || tc == c {
			return unsafeErr("bad hard link target %q", hdr.Linkname)
		}
		tdir, tbase := splitName(tc)
		tfd, err := x.openDir(tdir, false)
		if err != nil {
			return fmt.Errorf("hard link target %q: %w", hdr.Linkname, err)
		}
		defer x.closeDir(tfd)
		var st unix.Stat_t
		if err := unix.Fstatat(tfd, tbase, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("hard link target %q: %w", hdr.Linkname, err)
		}
		if st.Mode&unix.S_IFMT == unix.S_IFDIR {
			return unsafeErr("hard link to directory %q", hdr.Linkname)
		}
		if err := x.remove(pfd, base); err != nil {
			return err
		}
		if err := unix.Linkat(tfd, tbase, pfd, base, 0); err != nil {
			return fmt.Errorf("link: %w", err)
		}
		return nil

	case tar.TypeFifo:
		if err := x.remove(pfd, base); err != nil {
			return err
		}
		if err := unix.Mknodat(pfd, base, unix.S_IFIFO|0o600, 0); err != nil {
			return fmt.Errorf("mkfifo: %w", err)
		}
		fd, err := unix.Openat(pfd, base, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open fifo: %w", err)
		}
		err = x.meta(fd, hdr, mode)
		unix.Close(fd)
		if err != nil {
			return err
		}
		return x.times(pfd, base, hdr)

	case tar.TypeChar, tar.TypeBlock:
		return nil // the runtime provides /dev; device nodes in images are not trusted
	default:
		return nil // unknown types are ignored
	}
}

// meta applies owner, mode and xattrs to an open fd (chown before chmod: chown clears set-id bits).
func (x *extractor) meta(fd int, hdr *tar.Header, mode uint32) error {
	if x.chown {
		if err := unix.Fchown(fd, hdr.Uid, hdr.Gid); err != nil {
			return fmt.Errorf("chown: %w", err)
		}
	}
	if err := unix.Fchmod(fd, mode); err != nil {
		return fmt.Errorf("chmod: %w", err)
	}
	for k, v := range hdr.PAXRecords {
		key, ok := strings.CutPrefix(k, "SCHILY.xattr.")
		if !ok || !(strings.HasPrefix(key, "user.") || key == "security.capability") {
			continue // trusted.* (e.g. trusted.overlay.*) and other namespaces are never taken from images
		}
		if err := unix.Fsetxattr(fd, key, []byte(v), 0); err != nil && err != unix.ENOTSUP && err != unix.EPERM {
			return fmt.Errorf("xattr %s: %w", key, err)
		}
	}
	return nil
}

func (x *extractor) times(pfd int, base string, hdr *tar.Header) error {
	at := hdr.AccessTime
	if at.IsZero() {
		at = hdr.ModTime
	}
	ts := []unix.Timespec{unix.NsecToTimespec(at.UnixNano()), unix.NsecToTimespec(hdr.ModTime.UnixNano())}
	if err := unix.UtimesNanoAt(pfd, base, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("utimes: %w", err)
	}
	return nil
}

// finish applies directory metadata after all entries are written (writing into a
// directory changes its mtime; a read-only mode would not stop root anyway).
func (x *extractor) finish() error {
	for _, d := range x.dirs {
		fd, err := x.openDir(d.name, false)
		if err != nil {
			if errors.Is(err, ErrUnsafeLayer) || errors.Is(err, unix.ENOENT) {
				continue // replaced or whited out later in the same layer
			}
			return err
		}
		err = x.meta(fd, d.hdr, uint32(d.hdr.Mode)&0o7777)
		if err == nil {
			at := d.hdr.AccessTime
			if at.IsZero() {
				at = d.hdr.ModTime
			}
			err = unix.Futimes(fd, []unix.Timeval{unix.NsecToTimeval(at.UnixNano()), unix.NsecToTimeval(d.hdr.ModTime.UnixNano())})
		}
		x.closeDir(fd)
		if err != nil {
			return fmt.Errorf("directory %q: %w", d.name, err)
		}
	}
	return nil
}

// removeAllAt removes name in the directory pfd, recursively, never following
// symlinks. It reports whether a directory was removed.
func removeAllAt(pfd int, name string) (bool, error) {
	err := unix.Unlinkat(pfd, name, 0)
	if err == nil || errors.Is(err, unix.ENOENT) {
		return false, nil
	}
	if !errors.Is(err, unix.EISDIR) && !errors.Is(err, unix.EPERM) {
		return false, fmt.Errorf("remove %q: %w", name, err)
	}
	fd, err := unix.Openat(pfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return false, fmt.Errorf("remove %q: %w", name, err)
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return true, fmt.Errorf("remove %q: %w", name, err)
	}
	for _, n := range names {
		if _, err := removeAllAt(fd, n); err != nil {
			return true, err
		}
	}
	if err := unix.Unlinkat(pfd, name, unix.AT_REMOVEDIR); err != nil && err != unix.ENOENT {
		return true, fmt.Errorf("remove %q: %w", name, err)
	}
	return true, nil
}
