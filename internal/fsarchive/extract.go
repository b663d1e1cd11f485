package fsarchive

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"maps"
	"math"
	"os"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// maxTrailing bounds what may follow the tar stream's end inside the zstd stream
// (zero padding, as GNU tar writes up to its record size).
const maxTrailing = 1 << 20

// srcReader records how the caller's reader ended, to tell its failures (a digest
// mismatch, a network error) from a corrupt archive.
type srcReader struct {
	r   io.Reader
	err error // a failure of r (not io.EOF)
	eof bool
}

func (s *srcReader) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	if errors.Is(err, io.EOF) {
		s.eof = true
	} else if err != nil && s.err == nil {
		s.err = err
	}
	return n, err
}

// dirState is an open directory of the depth-first walk: its mode and mtime apply when
// its subtree is complete.
type dirState struct {
	name  string // "." for the root
	mode  uint32
	mtime time.Time
	fd    int // open only for the innermost directory, else -1
	// names: Check's record of the entries made in this directory (hashes of their
	// names, a random seed), to refuse a repeated path as Extract does (EEXIST).
	names map[uint64]struct{}
}

type extractor struct {
	// checkOnly: Check reads the archive and makes nothing (rootfd is -1).
	checkOnly bool
	ctx       context.Context
	src       *srcReader
	tr        *tar.Reader
	rootfd    int
	limits    runtime.ArchiveLimits
	ids       IDMap
	// fixed: ExtractOptions.Existing with their parents, never changed: no entry but a
	// directory may be at such a path, whether or not the directory was made.
	// existing: the same, each removed once the archive's directory has filled it (a
	// second entry there is a repeated path).
	fixed, existing map[string]bool
	chown           bool
	started         bool
	stack           []dirState
	stats           runtime.ArchiveStats
	buf             []byte
	zero            []byte
}

func extractWith(ctx context.Context, r io.Reader, root *os.File, limits runtime.ArchiveLimits, ids IDMap, existing map[string]bool) (runtime.ArchiveStats, error) {
	rootfd := -1
	if root != nil {
		var err error
		if rootfd, err = dupDir(root); err != nil {
			return runtime.ArchiveStats{}, err
		}
		defer unix.Close(rootfd)
		if existing != nil {
			if err := onlyExisting(rootfd, "", existing); err != nil {
				return runtime.ArchiveStats{}, err
			}
		}
	}
	src := &srcReader{r: r}
	// The window is bounded (an archive asking for more is refused), so is the memory.
	// Synchronous decoding: no goroutine reads r behind Extract's back or after it
	// returns.
	dec, err := zstd.NewReader(src,
		zstd.WithDecoderMaxWindow(MaxWindow),
		zstd.WithDecoderMaxMemory(MaxWindow),
		zstd.WithDecoderConcurrency(1))
	if err != nil {
		return runtime.ArchiveStats{}, fmt.Errorf("fsarchive: zstd: %w", err)
	}
	defer dec.Close()
	ex := &extractor{
		checkOnly: root == nil,
		ctx:       ctx,
		src:       src,
		tr:        tar.NewReader(dec),
		rootfd:    rootfd,
		limits:    limits,
		ids:       ids,
		fixed:     maps.Clone(existing),
		existing:  existing,
		chown:     os.Geteuid() == 0,
		buf:       make([]byte, copyBufSize),
		zero:      make([]byte, copyBufSize),
	}
	err = ex.run(dec)
	for _, d := range ex.stack {
		if !ex.checkOnly && d.fd >= 0 && d.fd != rootfd {
			unix.Close(d.fd)
		}
	}
	return ex.stats, err
}

func (ex *extractor) run(dec io.Reader) error {
	for {
		if err := ex.ctx.Err(); err != nil {
			return err
		}
		hdr, err := ex.tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			if hdr != nil && errors.Is(err, tar.ErrInsecurePath) {
				why := checkPath(strings.TrimSuffix(hdr.Name, "/"))
				if why == nil {
					why = errors.New("path leaves the root")
				}
				return invalid(hdr.Name, "%v", why)
			}
			return ex.streamErr(err)
		}
		if err := ex.entry(hdr); err != nil {
			return err
		}
	}
	if !ex.started {
		return fmt.Errorf("%w: no root entry %q", ErrInvalid, "./")
	}
	for len(ex.stack) > 0 && !ex.checkOnly {
		if err := ex.pop(); err != nil {
			return err
		}
	}
	// Read to the end: the zstd frame's checksum and the caller's reader (which may
	// check a digest at its end) get their say.
	// What follows the tar stream's end may only be zero padding.
	for trailing := 0; ; {
		n, err := dec.Read(ex.buf)
		if !bytes.Equal(ex.buf[:n], ex.zero[:n]) {
			return fmt.Errorf("%w: data after the end of the tar stream", ErrInvalid)
		}
		if trailing += n; trailing > maxTrailing {
			return fmt.Errorf("%w: more than %d bytes after the end of the tar stream", ErrInvalid, maxTrailing)
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return ex.streamErr(err)
		}
	}
	if !ex.src.eof {
		var one [1]byte
		n, err := io.ReadFull(ex.src, one[:])
		if n > 0 {
			return fmt.Errorf("%w: data after the end of the zstd stream", ErrInvalid)
		}
		if !errors.Is(err, io.EOF) {
			return ex.streamErr(err)
		}
	}
	return nil
}

// streamErr is the error of a failed read of the archive: the caller's reader's own
// failure as it is, else a corrupt (or truncated) archive.
func (ex *extractor) streamErr(err error) error {
	if ex.src.err != nil {
		return fmt.Errorf("fsarchive: reading the archive: %w", ex.src.err)
	}
	if cerr := ex.ctx.Err(); cerr != nil {
		return cerr
	}
	if errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("%w: truncated: %w", ErrInvalid, err)
	}
	return fmt.Errorf("%w: %w", ErrInvalid, err)
}

func invalid(name, format string, args ...any) error {
	return fmt.Errorf("%w: entry %q: %s", ErrInvalid, clip(name), fmt.Sprintf(format, args...))
}

func notDir(name, what string) error {
	return fmt.Errorf("%w: entry %q: %s where a directory is needed (a sub_path mount's)", ErrNotDir, clip(name), what)
}

// CheckExisting checks ExtractOptions.Existing as ExtractWith does, before anything is
// opened: at most MaxExisting paths, each clean, relative, not the root ("."), at most
// MaxPath bytes, components at most MaxName. The error wraps ErrBadOptions.
func CheckExisting(dirs []string) error {
	if len(dirs) > MaxExisting {
		return fmt.Errorf("%w: more than %d existing directories", ErrBadOptions, MaxExisting)
	}
	for _, d := range dirs {
		if d == "." {
			return fmt.Errorf("%w: existing directory %q: the root itself", ErrBadOptions, d)
		}
		if err := checkPath(d); err != nil {
			return fmt.Errorf("%w: existing directory %q: %w", ErrBadOptions, clip(d), err)
		}
	}
	return nil
}

// existingSet is ExtractOptions.Existing with every parent, checked.
func existingSet(dirs []string) (map[string]bool, error) {
	if err := CheckExisting(dirs); err != nil {
		return nil, err
	}
	if len(dirs) == 0 {
		return nil, nil
	}
	set := map[string]bool{}
	for _, d := range dirs {
		for p := d; p != "." && p != ""; p = path.Dir(p) {
			set[p] = true
		}
	}
	return set, nil
}

// onlyExisting checks that the directory fd (at rel below the root, "" the root) holds
// only directories of existing, each checked in turn (never following a symlink).
func onlyExisting(fd int, rel string, existing map[string]bool) error {
	// A descriptor of its own (not a dup: the offset of fd's readdir stays as it was).
	dfd, err := unix.Openat(fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("fsarchive: %w", err)
	}
	f := os.NewFile(uintptr(dfd), rel)
	defer f.Close()
	for {
		names, err := f.Readdirnames(64)
		for _, n := range names {
			p := path.Join(rel, n)
			if !existing[p] {
				return fmt.Errorf("%w: it holds %q", ErrNotEmpty, clip(p))
			}
			cfd, err := unix.Openat(fd, n, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
					return fmt.Errorf("%w: %q is not a directory", ErrNotEmpty, clip(p))
				}
				return fmt.Errorf("fsarchive: %q: %w", clip(p), err)
			}
			err = onlyExisting(cfd, p, existing)
			unix.Close(cfd)
			if err != nil {
				return err
			}
		}
		if errors.Is(err, io.EOF) || (err == nil && len(names) == 0) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("fsarchive: read %q: %w", rel, err)
		}
	}
}

func tooLarge(name, format string, args ...any) error {
	return fmt.Errorf("%w: entry %q: %s", ErrTooLarge, clip(name), fmt.Sprintf(format, args...))
}

// clip keeps an error message readable when a hostile name is huge.
func clip(name string) string {
	if len(name) > 256 {
		return name[:256] + "..."
	}
	return name
}

// checkPath refuses a path that is not relative, clean and bounded.
func checkPath(name string) error {
	switch {
	case name == "":
		return errors.New("empty path")
	case len(name) > MaxPath:
		return fmt.Errorf("path longer than %d bytes", MaxPath)
	case strings.IndexByte(name, 0) >= 0:
		return errors.New("NUL in path")
	case name[0] == '/':
		return errors.New("absolute path")
	}
	for c := range strings.SplitSeq(name, "/") {
		if c == ".." {
			return errors.New("path leaves the root (..)")
		}
		if len(c) > MaxName {
			return fmt.Errorf("path component longer than %d bytes", MaxName)
		}
	}
	if path.Clean(name) != name {
		return errors.New("path not clean")
	}
	return nil
}

// xattr is one user.* xattr of an entry.
type xattr struct{ key, value string }

// checkRecords refuses PAX records the format does not have and returns the xattrs.
func checkRecords(hdr *tar.Header) ([]xattr, error) {
	var xs []xattr
	total := 0
	for k, v := range hdr.PAXRecords {
		switch k {
		case "path", "linkpath", "size", "uid", "gid", "mtime":
			continue // applied through hdr
		case "atime", "ctime", "uname", "gname":
			continue // not part of the format: ignored (other tar writers add them)
		}
		key, ok := strings.CutPrefix(k, xattrPrefix)
		if !ok || !strings.HasPrefix(key, "user.") {
			return nil, fmt.Errorf("PAX record %q not supported", clip(k))
		}
		if len(key) == len("user.") || len(key) > MaxName || strings.IndexByte(key, 0) >= 0 {
			return nil, fmt.Errorf("bad xattr name %q", clip(key))
		}
		if len(v) > MaxXattrValue {
			return nil, fmt.Errorf("xattr %q longer than %d bytes", key, MaxXattrValue)
		}
		total += len(key) + len(v)
		xs = append(xs, xattr{key, v})
		if len(xs) > MaxXattrs || total > MaxXattrBytes {
			return nil, fmt.Errorf("xattrs beyond %d entries or %d bytes", MaxXattrs, MaxXattrBytes)
		}
	}
	slices.SortFunc(xs, func(a, b xattr) int { return strings.Compare(a.key, b.key) })
	return xs, nil
}

func (ex *extractor) entry(hdr *tar.Header) error {
	name, xs, err := checkEntry(hdr)
	if err != nil {
		return err
	}
	ex.stats.Files++
	if ex.limits.MaxFiles > 0 && ex.stats.Files > ex.limits.MaxFiles {
		return tooLarge(hdr.Name, "more than %d entries", ex.limits.MaxFiles)
	}
	if hdr.Typeflag == tar.TypeReg && ex.limits.MaxBytes > 0 && hdr.Size > ex.limits.MaxBytes-ex.stats.Bytes {
		return tooLarge(hdr.Name, "files of more than %d bytes in all", ex.limits.MaxBytes)
	}
	if ex.checkOnly {
		return ex.check(name, hdr, xs)
	}
	return ex.place(name, hdr, xs)
}

// check is place for Check: the same refusals (locate, enter), on a stack of directory
// names (no descriptors) and a set of the names made in each directory being walked.
func (ex *extractor) check(name string, hdr *tar.Header, xs []xattr) error {
	root, err := ex.locate(name, hdr)
	if err != nil {
		return err
	}
	if root {
		ex.stack = append(ex.stack, dirState{name: ".", fd: -1, names: map[uint64]struct{}{}})
		return nil
	}
	parent, base := entryParent(name)
	top, err := ex.enter(parent, hdr.Name)
	if err != nil {
		return err
	}
	h := maphash.String(nameSeed, base)
	if _, ok := top.names[h]; ok {
		return invalid(hdr.Name, "repeated path")
	}
	top.names[h] = struct{}{}
	switch hdr.Typeflag {
	case tar.TypeDir:
		ex.stack = append(ex.stack, dirState{name: name, fd: -1, names: map[uint64]struct{}{}})
	case tar.TypeReg:
		ex.stats.Bytes += hdr.Size
	case tar.TypeSymlink:
		return checkSymlink(hdr, xs)
	}
	return nil
}

// nameSeed seeds check's name hashes (random: an archive cannot aim at a collision).
var nameSeed = maphash.MakeSeed()

// checkSymlink refuses a symlink entry Extract would not make.
func checkSymlink(hdr *tar.Header, xs []xattr) error {
	target := hdr.Linkname
	switch {
	case target == "":
		return invalid(hdr.Name, "empty symlink target")
	case len(target) > MaxLink:
		return invalid(hdr.Name, "symlink target longer than %d bytes", MaxLink)
	case strings.IndexByte(target, 0) >= 0:
		return invalid(hdr.Name, "NUL in symlink target")
	case len(xs) > 0:
		return invalid(hdr.Name, "xattrs on a symlink")
	}
	return nil
}

// checkEntry checks what one header may say on its own (type, path, records, link,
// size, owner) and returns its clean name and xattrs.
func checkEntry(hdr *tar.Header) (string, []xattr, error) {
	name := hdr.Name
	switch hdr.Typeflag {
	case tar.TypeReg, tar.TypeSymlink:
	case tar.TypeDir:
		name = strings.TrimSuffix(name, "/")
	case tar.TypeLink:
		return "", nil, invalid(hdr.Name, "hard links are not supported")
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		return "", nil, invalid(hdr.Name, "device nodes and fifos are not supported")
	default:
		return "", nil, invalid(hdr.Name, "entry type %q not supported", hdr.Typeflag)
	}
	if name != "." {
		if err := checkPath(name); err != nil {
			return "", nil, invalid(hdr.Name, "%v", err)
		}
	}
	xs, err := checkRecords(hdr)
	if err != nil {
		return "", nil, invalid(hdr.Name, "%v", err)
	}
	if hdr.Typeflag != tar.TypeSymlink && hdr.Linkname != "" {
		return "", nil, invalid(hdr.Name, "link target on a non-link")
	}
	if hdr.Typeflag != tar.TypeReg && hdr.Size != 0 {
		return "", nil, invalid(hdr.Name, "size on a non-file")
	}
	if hdr.Uid < 0 || hdr.Uid > math.MaxUint32 || hdr.Gid < 0 || hdr.Gid > math.MaxUint32 {
		return "", nil, invalid(hdr.Name, "owner out of range")
	}
	return name, xs, nil
}

// place makes the checked entry name under its parent.
func (ex *extractor) place(name string, hdr *tar.Header, xs []xattr) error {
	root, err := ex.locate(name, hdr)
	if err != nil {
		return err
	}
	if root {
		if err := ex.attrs(ex.rootfd, hdr, xs); err != nil {
			return err
		}
		ex.stack = append(ex.stack, dirState{name: ".", mode: dirMode(hdr), mtime: hdr.ModTime, fd: ex.rootfd})
		return nil
	}
	parent, base := entryParent(name)
	pfd, err := ex.parent(parent, hdr.Name)
	if err != nil {
		return err
	}
	// A sub_path directory (or one on the way) must stay a directory, whether its maker
	// made it or not: a file or symlink there is refused before anything is made.
	if hdr.Typeflag != tar.TypeDir && ex.fixed[name] {
		what := "a symlink"
		if hdr.Typeflag == tar.TypeReg {
			what = "a regular file"
		}
		return notDir(hdr.Name, what)
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		return ex.dir(pfd, base, name, hdr, xs)
	case tar.TypeReg:
		return ex.file(pfd, base, hdr, xs)
	default:
		return ex.symlink(pfd, base, hdr, xs)
	}
}

// locate holds the rules of the root entry, for place and check alike: the archive's
// first entry is the root "." and a directory, and no later entry is the root. It
// reports whether the checked entry name is the root.
func (ex *extractor) locate(name string, hdr *tar.Header) (root bool, err error) {
	first := !ex.started
	ex.started = true
	if name == "." {
		if !first || hdr.Typeflag != tar.TypeDir {
			return false, invalid(hdr.Name, "the root entry must be the first and a directory")
		}
		return true, nil
	}
	if first {
		return false, invalid(hdr.Name, "the first entry must be the root directory %q", "./")
	}
	return false, nil
}

// entryParent splits a checked entry name other than the root into its parent
// directory ("." for an entry of the root) and its base name.
func entryParent(name string) (parent, base string) {
	parent, base = path.Split(name)
	parent = strings.TrimSuffix(parent, "/")
	if parent == "" {
		parent = "."
	}
	return parent, base
}

func dirMode(hdr *tar.Header) uint32 {
	return uint32(hdr.Mode) & (0o777 | unix.S_ISVTX)
}

// enter holds the rule of an entry's parent, for place and check alike: parent must be
// one of the directories being walked (entries come in depth-first order); the
// directories left on the way are complete (pop). It returns parent's state.
func (ex *extractor) enter(parent, name string) (*dirState, error) {
	for len(ex.stack) > 0 && ex.stack[len(ex.stack)-1].name != parent {
		if err := ex.pop(); err != nil {
			return nil, err
		}
	}
	if len(ex.stack) == 0 {
		return nil, invalid(name, "its directory is not in the archive before it (or is not a directory, or the entries are not in depth-first order)")
	}
	return &ex.stack[len(ex.stack)-1], nil
}

// parent returns the descriptor of directory parent (enter).
func (ex *extractor) parent(parent, name string) (int, error) {
	top, err := ex.enter(parent, name)
	if err != nil {
		return -1, err
	}
	if top.fd < 0 {
		fd, err := openBeneath(ex.rootfd, top.name)
		if err != nil {
			return -1, fmt.Errorf("fsarchive: reopening %q: %w", top.name, err)
		}
		top.fd = fd
	}
	return top.fd, nil
}

// pop completes the innermost directory: its mode and mtime, now that its content is
// there (for Check, only leaves it).
func (ex *extractor) pop() error {
	d := ex.stack[len(ex.stack)-1]
	ex.stack = ex.stack[:len(ex.stack)-1]
	if ex.checkOnly {
		return nil // Check made nothing to complete
	}
	fd := d.fd
	if fd < 0 {
		var err error
		if fd, err = openBeneath(ex.rootfd, d.name); err != nil {
			return fmt.Errorf("fsarchive: reopening %q: %w", d.name, err)
		}
	}
	if fd != ex.rootfd {
		defer unix.Close(fd)
	}
	if err := unix.Fchmod(fd, d.mode); err != nil {
		return fmt.Errorf("fsarchive: %q: %w", d.name, err)
	}
	if err := futimens(fd, d.mtime); err != nil {
		return fmt.Errorf("fsarchive: %q: %w", d.name, err)
	}
	return nil
}

func (ex *extractor) dir(pfd int, base, name string, hdr *tar.Header, xs []xattr) error {
	reused := false
	if err := unix.Mkdirat(pfd, base, 0o700); err != nil {
		if !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("fsarchive: %q: %w", hdr.Name, err)
		}
		if !ex.existing[name] {
			return invalid(hdr.Name, "repeated path")
		}
		// An existing directory (ExtractOptions.Existing) the archive's fills, once.
		delete(ex.existing, name)
		reused = true
	}
	fd, err := unix.Openat(pfd, base, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		if reused && (errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR)) {
			return notDir(hdr.Name, "something else")
		}
		return fmt.Errorf("fsarchive: %q: %w", hdr.Name, err)
	}
	if err := ex.attrs(fd, hdr, xs); err != nil {
		unix.Close(fd)
		return err
	}
	// Only the innermost directory stays open (the others are reopened beneath the
	// root when the walk comes back to them), so the descriptors do not grow with depth.
	if top := &ex.stack[len(ex.stack)-1]; top.fd != ex.rootfd {
		unix.Close(top.fd)
		top.fd = -1
	}
	ex.stack = append(ex.stack, dirState{name: name, mode: dirMode(hdr), mtime: hdr.ModTime, fd: fd})
	return nil
}

func (ex *extractor) file(pfd int, base string, hdr *tar.Header, xs []xattr) error {
	fd, err := unix.Openat(pfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		if errors.Is(err, unix.EEXIST) {
			return invalid(hdr.Name, "repeated path")
		}
		return fmt.Errorf("fsarchive: %q: %w", hdr.Name, err)
	}
	defer unix.Close(fd)
	// All-zero chunks are skipped (holes), the size set at the end.
	left, holes := hdr.Size, false
	for left > 0 {
		if err := ex.ctx.Err(); err != nil {
			return err
		}
		b := ex.buf
		if int64(len(b)) > left {
			b = b[:left]
		}
		if _, err := io.ReadFull(ex.tr, b); err != nil {
			return ex.streamErr(err)
		}
		if bytes.Equal(b, ex.zero[:len(b)]) {
			if _, err := unix.Seek(fd, int64(len(b)), io.SeekCurrent); err != nil {
				return fmt.Errorf("fsarchive: %q: %w", hdr.Name, err)
			}
			holes = true
		} else if err := writeFull(fd, b); err != nil {
			return fmt.Errorf("fsarchive: writing %q: %w", hdr.Name, err)
		}
		left -= int64(len(b))
	}
	ex.stats.Bytes += hdr.Size
	if holes {
		if err := unix.Ftruncate(fd, hdr.Size); err != nil {
			return fmt.Errorf("fsarchive: %q: %w", hdr.Name, err)
		}
	}
	if err := ex.attrs(fd, hdr, xs); err != nil {
		return err
	}
	if err := unix.Fchmod(fd, uint32(hdr.Mode)&0o777); err != nil {
		return fmt.Errorf("fsarchive: %q: %w", hdr.Name, err)
	}
	if err := futimens(fd, hdr.ModTime); err != nil {
		return fmt.Errorf("fsarchive: %q: %w", hdr.Name, err)
	}
	return nil
}

func (ex *extractor) symlink(pfd int, base string, hdr *tar.Header, xs []xattr) error {
	if err := checkSymlink(hdr, xs); err != nil {
		return err
	}
	if err := unix.Symlinkat(hdr.Linkname, pfd, base); err != nil {
		if errors.Is(err, unix.EEXIST) {
			return invalid(hdr.Name, "repeated path")
		}
		return fmt.Errorf("fsarchive: %q: %w", hdr.Name, err)
	}
	if ex.chown {
		uid, gid := ex.owner(hdr)
		if err := unix.Fchownat(pfd, base, uid, gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("fsarchive: %q: %w", hdr.Name, err)
		}
	}
	ts := timespec(hdr.ModTime)
	if err := unix.UtimesNanoAt(pfd, base, []unix.Timespec{ts, ts}, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("fsarchive: %q: %w", hdr.Name, err)
	}
	return nil
}

// owner is the host owner of an entry (-1: left as the caller).
func (ex *extractor) owner(hdr *tar.Header) (uid, gid int) {
	uid, gid = -1, -1
	if u, ok := ex.ids.toHost(uint32(hdr.Uid)); ok {
		uid = int(u)
	}
	if g, ok := ex.ids.toHost(uint32(hdr.Gid)); ok {
		gid = int(g)
	}
	return uid, gid
}

// attrs sets the owner (as root) and the xattrs of the file or directory open as fd.
func (ex *extractor) attrs(fd int, hdr *tar.Header, xs []xattr) error {
	if ex.chown {
		uid, gid := ex.owner(hdr)
		if err := unix.Fchown(fd, uid, gid); err != nil {
			return fmt.Errorf("fsarchive: %q: %w", hdr.Name, err)
		}
	}
	for _, x := range xs {
		if err := unix.Fsetxattr(fd, x.key, []byte(x.value), 0); err != nil {
			return fmt.Errorf("fsarchive: %q: setting xattr %q: %w", hdr.Name, x.key, err)
		}
	}
	return nil
}
