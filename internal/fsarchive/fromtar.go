package fsarchive

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/klauspost/compress/zstd"
)

// A build context as a caller sends it (CreateSandboxFromFile.build_contexts): a tar
// archive of the context directory, plain or gzip-compressed (told by its first bytes).
// ReadTar reads it into memory, within TarLimits, and Tree.Archive writes it in this
// package's format (what the builder's agent extracts). Nothing touches a file system.
//
// Taken: regular files, directories and symlinks (the link as it is, never followed),
// their permission bits (setuid and setgid dropped; the sticky bit kept on directories)
// and mtimes. Owners become 0:0; xattrs and other PAX records are dropped; a PAX global
// header (git archive writes one) is skipped. Names are cleaned ("./a", "a//b" and "a/"
// are "a") and must stay inside the root: an absolute name or a ".." element is refused,
// as are a name used twice, an entry below a file or a symlink, and names longer than
// MaxPath (a component MaxName) or deeper than TarLimits.MaxDepth. Directories an entry
// needs and the tar does not hold are made (mode 0755, mtime 0). Refused outright:
// hard links, device nodes, fifos, sparse files and any other entry type.

// Defaults of TarLimits.
const (
	DefaultTarMaxBytes   = 64 << 20
	DefaultTarMaxEntries = 100000
	DefaultTarMaxDepth   = 128
)

// TarLimits bound ReadTar. A zero field takes its default.
type TarLimits struct {
	// MaxBytes bounds what the tree holds: the content of its files plus the bytes of
	// its names and link targets (default DefaultTarMaxBytes).
	MaxBytes int64
	// MaxEntries bounds the entries (those the tar holds, directories made for them and
	// skipped headers; default DefaultTarMaxEntries).
	MaxEntries int64
	// MaxStream bounds the bytes of the tar stream read, after gzip (a gzip bomb ends
	// there); default MaxBytes + 2 KiB per entry allowed + 1 MiB.
	MaxStream int64
	// MaxDepth bounds the components of a name (default DefaultTarMaxDepth).
	MaxDepth int
}

func (l TarLimits) withDefaults() TarLimits {
	if l.MaxBytes <= 0 {
		l.MaxBytes = DefaultTarMaxBytes
	}
	if l.MaxEntries <= 0 {
		l.MaxEntries = DefaultTarMaxEntries
	}
	if l.MaxStream <= 0 {
		l.MaxStream = l.MaxBytes + 2048*l.MaxEntries + 1<<20
	}
	if l.MaxDepth <= 0 {
		l.MaxDepth = DefaultTarMaxDepth
	}
	return l
}

// TarError is why ReadTar refused its input: Entry names the tar entry ("" for the
// stream as a whole). It wraps ErrInvalid, or ErrTooLarge for a limit.
type TarError struct {
	Entry, Reason string
	TooLarge      bool
}

func (e *TarError) Error() string {
	if e.Entry == "" {
		return e.Reason
	}
	return fmt.Sprintf("entry %q: %s", clip(e.Entry), e.Reason)
}

func (e *TarError) Unwrap() error {
	if e.TooLarge {
		return ErrTooLarge
	}
	return ErrInvalid
}

func tarInvalid(entry, format string, args ...any) error {
	return &TarError{Entry: entry, Reason: fmt.Sprintf(format, args...)}
}

func tarTooLarge(entry, format string, args ...any) error {
	return &TarError{Entry: entry, Reason: fmt.Sprintf(format, args...), TooLarge: true}
}

// treeNode is one entry of a Tree.
type treeNode struct {
	typ      byte // tar.TypeDir, tar.TypeReg or tar.TypeSymlink
	mode     int64
	mtime    time.Time
	data     []byte
	link     string
	implicit bool // a directory made for what is below it
}

// Tree is a build context read by ReadTar: paths (clean, relative, "/"-separated) to
// their entries; the root is implicit.
type Tree struct {
	nodes    map[string]*treeNode
	rootMode int64
	rootTime time.Time
	lim      TarLimits
	held     int64
	entries  int64
}

// FromTar is ReadTar then Archive.
func FromTar(r io.Reader, lim TarLimits) ([]byte, error) {
	t, err := ReadTar(r, lim)
	if err != nil {
		return nil, err
	}
	return t.Archive()
}

// ReadTar reads a tar archive (plain or gzip) from r into a Tree, within lim. Its errors
// are *TarError, but for r's own failures (returned wrapped as they are).
func ReadTar(r io.Reader, lim TarLimits) (*Tree, error) {
	lim = lim.withDefaults()
	t := &Tree{nodes: map[string]*treeNode{}, rootMode: 0o755, rootTime: time.Unix(0, 0), lim: lim}
	src := &srcReader{r: r}
	br := bufio.NewReader(src)
	magic, _ := br.Peek(6)
	var stream io.Reader = br
	switch {
	case bytes.HasPrefix(magic, []byte{0x1f, 0x8b}):
		zr, err := gzip.NewReader(br)
		if err != nil {
			if src.err != nil {
				return nil, fmt.Errorf("fsarchive: reading the tar: %w", src.err)
			}
			return nil, tarInvalid("", "not a gzip stream: %v", err)
		}
		defer func() { _ = zr.Close() }()
		stream = zr
	case bytes.HasPrefix(magic, []byte{0x28, 0xb5, 0x2f, 0xfd}):
		return nil, tarInvalid("", "a zstd-compressed archive: send a tar, plain or gzip-compressed")
	case bytes.HasPrefix(magic, []byte("BZh")):
		return nil, tarInvalid("", "a bzip2-compressed archive: send a tar, plain or gzip-compressed")
	case bytes.HasPrefix(magic, []byte{0xfd, '7', 'z', 'X', 'Z', 0}):
		return nil, tarInvalid("", "an xz-compressed archive: send a tar, plain or gzip-compressed")
	case len(magic) == 0:
		if src.err != nil {
			return nil, fmt.Errorf("fsarchive: reading the tar: %w", src.err)
		}
		return nil, tarInvalid("", "empty: want a tar archive of the context (plain or gzip)")
	}
	cr := &countReader{r: stream, left: lim.MaxStream}
	tr := tar.NewReader(cr)
	// streamErr is the error of a failed read: the caller's reader's, the stream bound,
	// or a corrupt archive.
	streamErr := func(entry string, err error) error {
		switch {
		case src.err != nil:
			return fmt.Errorf("fsarchive: reading the tar: %w", src.err)
		case cr.over:
			return tarTooLarge(entry, "the tar stream is longer than %d bytes (after decompression)", lim.MaxStream)
		case errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF):
			return tarInvalid(entry, "truncated archive")
		}
		return tarInvalid(entry, "not a valid tar archive: %v", err)
	}
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			if hdr != nil && errors.Is(err, tar.ErrInsecurePath) {
				// GODEBUG=tarinsecurepath=0: the checks below name why.
				if _, cerr := t.cleanName(hdr.Name); cerr != nil {
					return nil, cerr
				}
				return nil, tarInvalid(hdr.Name, "path leaves the root")
			}
			return nil, streamErr("", err)
		}
		if err := t.add(hdr, tr, streamErr); err != nil {
			return nil, err
		}
	}
	// Read to the end, within the bound: gzip checks its CRC there.
	if _, err := io.Copy(io.Discard, cr); err != nil {
		return nil, streamErr("", err)
	}
	if t.entries == 0 {
		return nil, tarInvalid("", "not a tar archive (no entries): want a tar of the context, plain or gzip")
	}
	return t, nil
}

// countReader fails once more than left bytes were read.
type countReader struct {
	r    io.Reader
	left int64
	over bool
}

var errStreamBound = errors.New("stream bound reached")

func (c *countReader) Read(p []byte) (int, error) {
	if c.left <= 0 {
		// One byte more tells a stream of exactly the bound from a longer one.
		var one [1]byte
		n, err := c.r.Read(one[:])
		if n > 0 {
			c.over = true
			return 0, errStreamBound
		}
		return 0, err
	}
	if int64(len(p)) > c.left {
		p = p[:c.left]
	}
	n, err := c.r.Read(p)
	c.left -= int64(n)
	return n, err
}

// cleanName is name cleaned (root: ""), or why it is refused.
func (t *Tree) cleanName(name string) (string, error) {
	if strings.IndexByte(name, 0) >= 0 {
		return "", tarInvalid(name, "NUL in the name")
	}
	if strings.HasPrefix(name, "/") {
		return "", tarInvalid(name, "absolute path")
	}
	for c := range strings.SplitSeq(name, "/") {
		if c == ".." {
			return "", tarInvalid(name, "path leaves the root (a \"..\" element)")
		}
	}
	n := path.Clean(name)
	if n == "." {
		return "", nil
	}
	if len(n) > MaxPath {
		return "", tarInvalid(name, "path longer than %d bytes", MaxPath)
	}
	depth := 0
	for c := range strings.SplitSeq(n, "/") {
		depth++
		if len(c) > MaxName {
			return "", tarInvalid(name, "path component longer than %d bytes", MaxName)
		}
	}
	if depth > t.lim.MaxDepth {
		return "", tarInvalid(name, "deeper than %d levels", t.lim.MaxDepth)
	}
	return n, nil
}

func (t *Tree) count(name string) error {
	t.entries++
	if t.entries > t.lim.MaxEntries {
		return tarTooLarge(name, "more than %d entries", t.lim.MaxEntries)
	}
	return nil
}

func (t *Tree) hold(name string, n int64) error {
	if n > t.lim.MaxBytes-t.held {
		return tarTooLarge(name, "more than %d bytes of files, names and link targets in all", t.lim.MaxBytes)
	}
	t.held += n
	return nil
}

// add takes one tar entry.
func (t *Tree) add(hdr *tar.Header, body io.Reader, streamErr func(string, error) error) error {
	raw := hdr.Name
	if err := t.count(raw); err != nil {
		return err
	}
	switch hdr.Typeflag {
	case tar.TypeReg, tar.TypeDir, tar.TypeSymlink:
	case tar.TypeXGlobalHeader:
		return nil // global PAX records (git archive's commit id): not a file
	case tar.TypeLink:
		return tarInvalid(raw, "a hard link (to %q): hard links are refused; archive the file itself (GNU tar --hard-dereference)", clip(hdr.Linkname))
	case tar.TypeChar, tar.TypeBlock:
		return tarInvalid(raw, "a device node: only files, directories and symlinks are taken")
	case tar.TypeFifo:
		return tarInvalid(raw, "a fifo: only files, directories and symlinks are taken")
	case tar.TypeGNUSparse:
		return tarInvalid(raw, "a sparse file: write the tar without --sparse")
	default:
		return tarInvalid(raw, "entry type %q: only files, directories and symlinks are taken", hdr.Typeflag)
	}
	name, err := t.cleanName(raw)
	if err != nil {
		return err
	}
	mode := hdr.Mode & 0o777
	if name == "" {
		if hdr.Typeflag != tar.TypeDir {
			return tarInvalid(raw, "names the root and is not a directory")
		}
		t.rootMode, t.rootTime = mode|hdr.Mode&0o1000, hdr.ModTime
		return nil
	}
	if err := t.hold(raw, int64(len(name))); err != nil {
		return err
	}
	// Its parents: directories (made when the tar has none yet).
	for i := 0; i < len(name); i++ {
		if name[i] != '/' {
			continue
		}
		p := name[:i]
		switch n := t.nodes[p]; {
		case n == nil:
			if err := t.count(raw); err != nil {
				return err
			}
			if err := t.hold(raw, int64(len(p))); err != nil {
				return err
			}
			t.nodes[p] = &treeNode{typ: tar.TypeDir, mode: 0o755, mtime: time.Unix(0, 0), implicit: true}
		case n.typ != tar.TypeDir:
			return tarInvalid(raw, "below %q, which is not a directory", p)
		}
	}
	node := &treeNode{typ: hdr.Typeflag, mode: mode, mtime: hdr.ModTime}
	if old := t.nodes[name]; old != nil {
		if !old.implicit || hdr.Typeflag != tar.TypeDir {
			return tarInvalid(raw, "a second entry for %q", name)
		}
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		node.mode |= hdr.Mode & 0o1000 // sticky
	case tar.TypeSymlink:
		switch l := hdr.Linkname; {
		case l == "":
			return tarInvalid(raw, "a symlink without a target")
		case len(l) > MaxLink:
			return tarInvalid(raw, "a symlink target longer than %d bytes", MaxLink)
		case strings.IndexByte(l, 0) >= 0:
			return tarInvalid(raw, "NUL in the symlink target")
		}
		if err := t.hold(raw, int64(len(hdr.Linkname))); err != nil {
			return err
		}
		node.link = hdr.Linkname
	case tar.TypeReg:
		if hdr.Size < 0 {
			return tarInvalid(raw, "negative size")
		}
		if err := t.hold(raw, hdr.Size); err != nil {
			return err
		}
		node.data = make([]byte, hdr.Size)
		if _, err := io.ReadFull(body, node.data); err != nil {
			return streamErr(raw, err)
		}
	}
	t.nodes[name] = node
	return nil
}

// Lookup tells what name (a clean relative path) is in t: tar.TypeReg, tar.TypeDir,
// tar.TypeSymlink, or 0 when t has no such entry.
func (t *Tree) Lookup(name string) byte {
	if n := t.nodes[name]; n != nil {
		return n.typ
	}
	return 0
}

// AddFile adds a regular file at the root (mode 0644, mtime 0); name is one path
// component not in t. The limits of ReadTar apply.
func (t *Tree) AddFile(name string, data []byte) error {
	if name == "" || name == "." || name == ".." || strings.ContainsAny(name, "/\x00") || len(name) > MaxName {
		return tarInvalid(name, "a file name is one path component")
	}
	if t.nodes[name] != nil {
		return tarInvalid(name, "is in the context already")
	}
	if err := t.count(name); err != nil {
		return err
	}
	if err := t.hold(name, int64(len(name)+len(data))); err != nil {
		return err
	}
	t.nodes[name] = &treeNode{typ: tar.TypeReg, mode: 0o644, mtime: time.Unix(0, 0), data: data}
	return nil
}

// Archive writes t in this package's format: the root first, then depth-first with the
// names of a directory sorted bytewise, owners 0:0. Equal trees give equal bytes.
func (t *Tree) Archive() ([]byte, error) {
	names := make([]string, 0, len(t.nodes))
	for n := range t.nodes {
		names = append(names, n)
	}
	// Depth-first with each directory's names sorted is the order of the names compared
	// element by element.
	slices.SortFunc(names, func(a, b string) int {
		for {
			ha, ra, _ := strings.Cut(a, "/")
			hb, rb, _ := strings.Cut(b, "/")
			if c := strings.Compare(ha, hb); c != 0 {
				return c
			}
			a, b = ra, rb
			if a == "" || b == "" {
				return strings.Compare(a, b) // the parent first
			}
		}
	})
	var buf bytes.Buffer
	enc, err := zstd.NewWriter(&buf, zstd.WithEncoderLevel(zstd.SpeedDefault), zstd.WithWindowSize(MaxWindow), zstd.WithEncoderConcurrency(1))
	if err != nil {
		return nil, fmt.Errorf("fsarchive: zstd: %w", err)
	}
	tw := tar.NewWriter(enc)
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: "./", Mode: t.rootMode, ModTime: t.rootTime, Format: tar.FormatPAX}); err != nil {
		return nil, fmt.Errorf("fsarchive: %w", err)
	}
	for _, name := range names {
		n := t.nodes[name]
		h := &tar.Header{Typeflag: n.typ, Name: name, Mode: n.mode, ModTime: n.mtime, Format: tar.FormatPAX}
		switch n.typ {
		case tar.TypeDir:
			h.Name += "/"
		case tar.TypeSymlink:
			h.Linkname = n.link
		case tar.TypeReg:
			h.Size = int64(len(n.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("fsarchive: %q: %w", clip(name), err)
		}
		if _, err := tw.Write(n.data); err != nil {
			return nil, fmt.Errorf("fsarchive: %q: %w", clip(name), err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("fsarchive: %w", err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("fsarchive: zstd: %w", err)
	}
	return buf.Bytes(), nil
}
