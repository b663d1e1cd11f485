package fsarchive

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// copyBufSize is the chunk files are copied in (and ctx checked between).
const copyBufSize = 256 << 10

// xattrPrefix is the PAX record prefix of xattrs (archive/tar's and GNU tar's).
const xattrPrefix = "SCHILY.xattr."

type writer struct {
	ctx   context.Context
	tw    *tar.Writer
	ids   IDMap
	opts  WriteOptions
	stats runtime.ArchiveStats
	// pending are the headers of directories archived only if something below them is
	// (SkipUnlessContent), outermost first; writeHeader writes them before its entry.
	pending []*tar.Header
	buf     []byte // file data
	dents   []byte // getdents
	xlist   []byte // flistxattr
	xval    []byte // fgetxattr
}

func write(ctx context.Context, root *os.File, w io.Writer, opts WriteOptions) (runtime.ArchiveStats, error) {
	fd, err := dupDir(root)
	if err != nil {
		return runtime.ArchiveStats{}, err
	}
	defer unix.Close(fd)
	// The window is MaxWindow exactly (SpeedDefault's own is 8 MiB too), so every
	// archive Write makes is one Extract accepts. Without WithConcurrentBlocks the
	// output does not depend on the concurrency.
	enc, err := zstd.NewWriter(w, zstd.WithEncoderLevel(zstd.SpeedDefault), zstd.WithWindowSize(MaxWindow))
	if err != nil {
		return runtime.ArchiveStats{}, fmt.Errorf("fsarchive: zstd: %w", err)
	}
	// On failure nothing more reaches w (no end of frame making a partial archive look
	// whole); the encoder's resources are released.
	abort := func() {
		enc.Reset(io.Discard)
		_ = enc.Close()
	}
	wr := &writer{
		ctx:   ctx,
		tw:    tar.NewWriter(enc),
		ids:   opts.IDs,
		opts:  opts,
		buf:   make([]byte, copyBufSize),
		dents: make([]byte, 64<<10),
		xlist: make([]byte, 64<<10), // XATTR_LIST_MAX
		xval:  make([]byte, MaxXattrValue),
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		abort()
		return wr.stats, fmt.Errorf("fsarchive: root: %w", err)
	}
	if err := wr.dir(fd, "", &st, false); err != nil {
		abort()
		return wr.stats, err
	}
	if err := wr.tw.Close(); err != nil {
		abort()
		return wr.stats, fmt.Errorf("fsarchive: %w", err)
	}
	if err := enc.Close(); err != nil {
		return wr.stats, fmt.Errorf("fsarchive: zstd: %w", err)
	}
	return wr.stats, nil
}

// header is the tar header of an entry, its owner as the sandbox sees it.
func (wr *writer) header(name string, typ byte, st *unix.Stat_t) *tar.Header {
	mode := int64(st.Mode & 0o7777 &^ (unix.S_ISUID | unix.S_ISGID))
	if typ != tar.TypeDir {
		mode &^= unix.S_ISVTX
	}
	return &tar.Header{
		Typeflag: typ,
		Name:     name,
		Mode:     mode,
		Uid:      int(wr.ids.toSandbox(st.Uid)),
		Gid:      int(wr.ids.toSandbox(st.Gid)),
		ModTime:  time.Unix(st.Mtim.Sec, st.Mtim.Nsec),
		Format:   tar.FormatPAX,
	}
}

// dir archives the directory open as fd (stat st) at name ("" for the root) and its
// content, names sorted; lazy: only if some of its content is archived.
func (wr *writer) dir(fd int, name string, st *unix.Stat_t, lazy bool) error {
	if err := wr.ctx.Err(); err != nil {
		return err
	}
	hname := name + "/"
	if name == "" {
		hname = "./"
	}
	hdr := wr.header(hname, tar.TypeDir, st)
	if err := wr.xattrs(fd, name, hdr); err != nil {
		return err
	}
	if lazy {
		wr.pending = append(wr.pending, hdr)
		defer func() {
			// Nothing below it was archived: it stays out.
			if n := len(wr.pending); n > 0 && wr.pending[n-1] == hdr {
				wr.pending = wr.pending[:n-1]
			}
		}()
	} else if err := wr.writeHeader(hdr); err != nil {
		return err
	}
	names, err := wr.readNames(fd)
	if err != nil {
		return fmt.Errorf("fsarchive: reading directory %q: %w", hname, err)
	}
	slices.Sort(names)
	for _, n := range names {
		if err := wr.ctx.Err(); err != nil {
			return err
		}
		child := n
		if name != "" {
			child = name + "/" + n
		}
		if len(child)+1 > MaxPath { // +1: a directory's trailing slash
			return fmt.Errorf("fsarchive: path %q...: longer than %d bytes", child[:64], MaxPath)
		}
		if err := wr.entry(fd, n, child); err != nil {
			return err
		}
	}
	return nil
}

// entry archives the entry n of the directory open as dirfd, at path child.
func (wr *writer) entry(dirfd int, n, child string) error {
	var st unix.Stat_t
	if err := unix.Fstatat(dirfd, n, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			wr.stats.Skipped++ // removed since the directory was read
			return nil
		}
		return fmt.Errorf("fsarchive: %q: %w", child, err)
	}
	lazy := false
	if wr.opts.Filter != nil {
		isDir := st.Mode&unix.S_IFMT == unix.S_IFDIR
		d, err := wr.opts.Filter(child, isDir)
		if err != nil {
			return fmt.Errorf("fsarchive: %q: %w", child, err)
		}
		switch {
		case d == Skip, d == SkipUnlessContent && !isDir:
			return nil
		case d == SkipUnlessContent:
			lazy = true
		case d != Keep:
			return fmt.Errorf("fsarchive: %q: the filter's decision %d is none of Keep, Skip, SkipUnlessContent", child, d)
		}
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		cfd, err := wr.open(dirfd, n, child, unix.O_DIRECTORY)
		if err != nil || cfd < 0 {
			return err
		}
		defer unix.Close(cfd)
		if err := unix.Fstat(cfd, &st); err != nil {
			return fmt.Errorf("fsarchive: %q: %w", child, err)
		}
		return wr.dir(cfd, child, &st, lazy)
	case unix.S_IFREG:
		ffd, err := wr.open(dirfd, n, child, 0)
		if err != nil || ffd < 0 {
			return err
		}
		defer unix.Close(ffd)
		if err := unix.Fstat(ffd, &st); err != nil {
			return fmt.Errorf("fsarchive: %q: %w", child, err)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFREG {
			return fmt.Errorf("fsarchive: %q: changed type while archived", child)
		}
		return wr.file(ffd, child, &st)
	case unix.S_IFLNK:
		return wr.symlink(dirfd, n, child, &st)
	default: // device node, fifo, socket
		wr.stats.Skipped++
		return nil
	}
}

// open opens the entry n of dirfd without following a symlink, without blocking (a
// file swapped for a fifo) and without taking a terminal. A vanished entry is fd -1, nil.
func (wr *writer) open(dirfd int, n, child string, flags int) (int, error) {
	for {
		fd, err := unix.Openat(dirfd, n, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC|flags, 0)
		switch {
		case err == nil:
			return fd, nil
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.ENOENT):
			wr.stats.Skipped++
			return -1, nil
		case errors.Is(err, unix.ELOOP), errors.Is(err, unix.ENOTDIR):
			return -1, fmt.Errorf("fsarchive: %q: changed type while archived", child)
		default:
			return -1, fmt.Errorf("fsarchive: %q: %w", child, err)
		}
	}
}

func (wr *writer) file(fd int, name string, st *unix.Stat_t) error {
	if wr.opts.MaxBytes > 0 && st.Size > wr.opts.MaxBytes-wr.stats.Bytes {
		return fmt.Errorf("fsarchive: %q: the files exceed %d bytes: %w", name, wr.opts.MaxBytes, ErrTooLarge)
	}
	hdr := wr.header(name, tar.TypeReg, st)
	hdr.Size = st.Size
	if err := wr.xattrs(fd, name, hdr); err != nil {
		return err
	}
	if err := wr.writeHeader(hdr); err != nil {
		return err
	}
	// Exactly Size bytes: a file that grows is cut at its size when opened, one that
	// shrinks fails the archive. Holes read as zeros.
	left := st.Size
	for left > 0 {
		if err := wr.ctx.Err(); err != nil {
			return err
		}
		b := wr.buf
		if int64(len(b)) > left {
			b = b[:left]
		}
		n, err := readFull(fd, b)
		if err != nil {
			return fmt.Errorf("fsarchive: reading %q: %w", name, err)
		}
		if n < len(b) {
			return fmt.Errorf("fsarchive: %q shrank while archived", name)
		}
		if _, err := wr.tw.Write(b); err != nil {
			return fmt.Errorf("fsarchive: %w", err)
		}
		left -= int64(n)
	}
	wr.stats.Bytes += st.Size
	return nil
}

func (wr *writer) symlink(dirfd int, n, name string, st *unix.Stat_t) error {
	b := wr.buf[:MaxLink+1]
	m, err := unix.Readlinkat(dirfd, n, b)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			wr.stats.Skipped++
			return nil
		}
		if errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("fsarchive: %q: changed type while archived", name)
		}
		return fmt.Errorf("fsarchive: %q: %w", name, err)
	}
	if m > MaxLink || m == 0 {
		return fmt.Errorf("fsarchive: %q: symlink target of %d bytes", name, m)
	}
	hdr := wr.header(name, tar.TypeSymlink, st)
	hdr.Linkname = string(b[:m])
	return wr.writeHeader(hdr)
}

// xattrs adds fd's user.* xattrs to hdr (others are not part of the format).
func (wr *writer) xattrs(fd int, name string, hdr *tar.Header) error {
	n, err := unix.Flistxattr(fd, wr.xlist)
	if errors.Is(err, unix.ENOTSUP) || errors.Is(err, unix.EOPNOTSUPP) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("fsarchive: %q: listing xattrs: %w", name, err)
	}
	count, total := 0, 0
	for _, k := range bytes.Split(wr.xlist[:n], []byte{0}) {
		key := string(k)
		if !strings.HasPrefix(key, "user.") {
			continue
		}
		v, err := unix.Fgetxattr(fd, key, wr.xval)
		if errors.Is(err, unix.ENODATA) {
			continue // removed since listed
		}
		if err != nil {
			return fmt.Errorf("fsarchive: %q: xattr %q: %w", name, key, err)
		}
		count++
		total += len(key) + v
		if count > MaxXattrs || total > MaxXattrBytes {
			return fmt.Errorf("fsarchive: %q: xattrs beyond %d entries or %d bytes", name, MaxXattrs, MaxXattrBytes)
		}
		if hdr.PAXRecords == nil {
			hdr.PAXRecords = map[string]string{}
		}
		hdr.PAXRecords[xattrPrefix+key] = string(wr.xval[:v])
	}
	return nil
}

func (wr *writer) writeHeader(hdr *tar.Header) error {
	if len(wr.pending) > 0 {
		pending := wr.pending
		wr.pending = nil
		for _, p := range pending {
			if err := wr.writeHeader(p); err != nil {
				return err
			}
		}
	}
	if wr.opts.MaxEntries > 0 && wr.stats.Files >= wr.opts.MaxEntries {
		return fmt.Errorf("fsarchive: %q: more than %d entries: %w", hdr.Name, wr.opts.MaxEntries, ErrTooLarge)
	}
	if err := wr.tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("fsarchive: %q: %w", hdr.Name, err)
	}
	wr.stats.Files++
	return nil
}

// readNames lists the directory open as fd ("." and ".." left out).
func (wr *writer) readNames(fd int) ([]string, error) {
	var names []string
	for {
		if err := wr.ctx.Err(); err != nil {
			return nil, err
		}
		n, err := unix.Getdents(fd, wr.dents)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if n <= 0 {
			return names, nil
		}
		_, _, names = unix.ParseDirent(wr.dents[:n], -1, names)
	}
}
