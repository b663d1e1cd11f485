// Package dir is the embedded blob store: a directory (under the data dir) holding one
// file per object. Writes are atomic (a temp file, fsync, rename, fsync of the directory);
// every path under the root is opened with openat2(RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS),
// so a symlink or ".." planted under the root is refused rather than followed; each file
// starts with a header recording the content's size and sha256, which Get checks.
//
// Layout under root: objects/ holds the objects, tmp/ the files being written (renamed
// into objects/ when whole; Open removes leftovers of a crash). A key's
// components map to names with a suffix, ".d" for a directory and ".o" for the object, so
// the keys "a" and "a/b" (a file and a directory in a naive layout) both exist: a.o and
// a.d/b.o. Keys cannot start a component with '.', so no name collides with tmp files.
package dir

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"iter"
	"os"
	"path"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/internal/blob"
)

const (
	magic     = "SBXBLOB1"
	headerLen = len(magic) + 8 + 32 // magic, big-endian size, sha256
	dirSuffix = ".d"
	objSuffix = ".o"
)

// Store is a blob.Store in a directory.
type Store struct {
	root string
	fd   int // O_PATH of root, the anchor of every openat2
	tmp  int // O_PATH of root/tmp
}

var _ blob.Store = (*Store)(nil)

// Open opens (creating with mode 0700) the store rooted at root, an absolute path that
// the caller owns (it is trusted; what is under it is not). One process opens a root.
func Open(root string) (*Store, error) {
	if !path.IsAbs(root) {
		return nil, fmt.Errorf("blob dir: root %q is not absolute", root)
	}
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, fmt.Errorf("blob dir: %w", err)
	}
	fd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("blob dir: open %s: %w", root, err)
	}
	s := &Store{root: root, fd: fd}
	for _, d := range []string{"objects", "tmp"} {
		if err := unix.Mkdirat(fd, d, 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
			_ = unix.Close(fd)
			return nil, fmt.Errorf("blob dir: mkdir %s/%s: %w", root, d, err)
		}
	}
	if s.tmp, err = s.openBeneath("tmp", unix.O_PATH|unix.O_DIRECTORY, 0); err != nil {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("blob dir: open %s/tmp: %w", root, err)
	}
	s.sweepTmp()
	return s, nil
}

// sweepTmp removes what a crashed Put left in tmp/: the store owns its root, so no Put
// of another process is in flight when it opens.
func (s *Store) sweepTmp() {
	fd, err := s.openBeneath("tmp", unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return
	}
	f := os.NewFile(uintptr(fd), "tmp")
	defer f.Close()
	names, _ := f.Readdirnames(-1)
	for _, n := range names {
		_ = unix.Unlinkat(s.tmp, n, 0)
	}
}

// Close releases the root's descriptors.
func (s *Store) Close() error {
	_ = unix.Close(s.tmp)
	return unix.Close(s.fd)
}

// objPath maps a valid key to its path relative to root.
func objPath(key string) (dir, name string) {
	comps := strings.Split(key, "/")
	for i := range comps[:len(comps)-1] {
		comps[i] += dirSuffix
	}
	dir = path.Join(append([]string{"objects"}, comps[:len(comps)-1]...)...)
	return dir, comps[len(comps)-1] + objSuffix
}

// openBeneath opens rel (relative to root) never following a symlink or leaving root.
func (s *Store) openBeneath(rel string, flags uint64, mode uint64) (int, error) {
	return unix.Openat2(s.fd, rel, &unix.OpenHow{
		Flags:   flags | unix.O_CLOEXEC | unix.O_NOFOLLOW,
		Mode:    mode,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
}

// mkdirs creates dir (relative to root) component by component beneath root and
// returns an fd of it.
func (s *Store) mkdirs(dir string) (int, error) {
	fd, err := s.openBeneath(".", unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return -1, err
	}
	for _, c := range strings.Split(dir, "/") {
		if err := unix.Mkdirat(fd, c, 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
			unix.Close(fd)
			return -1, err
		}
		next, err := unix.Openat2(fd, c, &unix.OpenHow{
			Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC | unix.O_NOFOLLOW,
			Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
		})
		unix.Close(fd)
		if err != nil {
			return -1, err
		}
		fd = next
	}
	return fd, nil
}

type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// Put implements blob.Store.
func (s *Store) Put(ctx context.Context, key string, r io.Reader, size int64) (blob.Info, error) {
	if err := blob.ValidateKey(key); err != nil {
		return blob.Info{}, err
	}
	dir, name := objPath(key)
	var rnd [12]byte
	_, _ = rand.Read(rnd[:])
	tmpName := hex.EncodeToString(rnd[:]) + ".tmp"
	tfd, err := unix.Openat2(s.tmp, tmpName, &unix.OpenHow{
		Flags:   unix.O_CREAT | unix.O_EXCL | unix.O_RDWR | unix.O_CLOEXEC | unix.O_NOFOLLOW,
		Mode:    0o600,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return blob.Info{}, fmt.Errorf("blob dir: temp file: %w", err)
	}
	f := os.NewFile(uintptr(tfd), tmpName)
	defer f.Close()
	renamed := false
	defer func() {
		if !renamed {
			_ = unix.Unlinkat(s.tmp, tmpName, 0)
		}
	}()
	if _, err := f.Write(make([]byte, headerLen)); err != nil {
		return blob.Info{}, fmt.Errorf("blob dir: put %s: %w", key, err)
	}
	sr := blob.NewSizedReader(ctxReader{ctx, r}, size)
	if _, err := io.Copy(f, sr); err != nil {
		return blob.Info{}, fmt.Errorf("blob dir: put %s: %w", key, err)
	}
	sum, _ := hex.DecodeString(sr.Sum())
	hdr := make([]byte, 0, headerLen)
	hdr = append(hdr, magic...)
	hdr = binary.BigEndian.AppendUint64(hdr, uint64(sr.N()))
	hdr = append(hdr, sum...)
	if _, err := f.WriteAt(hdr, 0); err != nil {
		return blob.Info{}, fmt.Errorf("blob dir: put %s: %w", key, err)
	}
	if err := f.Sync(); err != nil {
		return blob.Info{}, fmt.Errorf("blob dir: put %s: fsync: %w", key, err)
	}
	dfd, err := s.mkdirs(dir)
	if err != nil {
		return blob.Info{}, fmt.Errorf("blob dir: put %s: %w", key, err)
	}
	defer unix.Close(dfd)
	if err := unix.Renameat(s.tmp, tmpName, dfd, name); err != nil {
		return blob.Info{}, fmt.Errorf("blob dir: put %s: rename: %w", key, err)
	}
	renamed = true
	if err := syncFD(s, dir); err != nil {
		return blob.Info{}, fmt.Errorf("blob dir: put %s: fsync dir: %w", key, err)
	}
	st, err := f.Stat()
	if err != nil {
		return blob.Info{}, err
	}
	return blob.Info{Key: key, Size: sr.N(), SHA256: sr.Sum(), ModTime: st.ModTime()}, nil
}

func syncFD(s *Store, dir string) error {
	fd, err := s.openBeneath(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Fsync(fd)
}

// open opens key's file and reads its header.
func (s *Store) open(key string) (*os.File, blob.Info, error) {
	if err := blob.ValidateKey(key); err != nil {
		return nil, blob.Info{}, err
	}
	dir, name := objPath(key)
	fd, err := s.openBeneath(dir+"/"+name, unix.O_RDONLY, 0)
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) {
		return nil, blob.Info{}, fmt.Errorf("%w: %s", blob.ErrNotFound, key)
	}
	if err != nil {
		return nil, blob.Info{}, fmt.Errorf("blob dir: open %s: %w", key, err)
	}
	f := os.NewFile(uintptr(fd), key)
	info, err := readHeader(f, key)
	if err != nil {
		f.Close()
		return nil, blob.Info{}, err
	}
	return f, info, nil
}

func readHeader(f *os.File, key string) (blob.Info, error) {
	st, err := f.Stat()
	if err != nil {
		return blob.Info{}, err
	}
	if !st.Mode().IsRegular() {
		return blob.Info{}, fmt.Errorf("%w: %s is not a regular file", blob.ErrCorrupt, key)
	}
	var hdr [headerLen]byte
	if _, err := io.ReadFull(f, hdr[:]); err != nil || string(hdr[:len(magic)]) != magic {
		return blob.Info{}, fmt.Errorf("%w: %s: bad header", blob.ErrCorrupt, key)
	}
	size := int64(binary.BigEndian.Uint64(hdr[len(magic):]))
	return blob.Info{Key: key, Size: size, SHA256: hex.EncodeToString(hdr[len(magic)+8:]), ModTime: st.ModTime()}, nil
}

// Get implements blob.Store.
func (s *Store) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	f, info, err := s.open(key)
	if err != nil {
		return nil, err
	}
	return blob.VerifyReader(f, info.Size, info.SHA256), nil
}

// Stat implements blob.Store. It reads the header only; the content is checked on Get.
func (s *Store) Stat(ctx context.Context, key string) (blob.Info, error) {
	f, info, err := s.open(key)
	if err != nil {
		return blob.Info{}, err
	}
	f.Close()
	return info, nil
}

// Delete implements blob.Store. Empty directories stay (a concurrent Put may be using them).
func (s *Store) Delete(ctx context.Context, key string) error {
	if err := blob.ValidateKey(key); err != nil {
		return err
	}
	dir, name := objPath(key)
	dfd, err := s.openBeneath(dir, unix.O_PATH|unix.O_DIRECTORY, 0)
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) {
		return fmt.Errorf("%w: %s", blob.ErrNotFound, key)
	}
	if err != nil {
		return fmt.Errorf("blob dir: delete %s: %w", key, err)
	}
	defer unix.Close(dfd)
	if err := unix.Unlinkat(dfd, name, 0); errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("%w: %s", blob.ErrNotFound, key)
	} else if err != nil {
		return fmt.Errorf("blob dir: delete %s: %w", key, err)
	}
	return nil
}

// List implements blob.Store. It walks the directory of prefix's complete components
// (never following symlinks), then sorts: the mapped names do not sort as keys do.
func (s *Store) List(ctx context.Context, prefix string) iter.Seq2[blob.Info, error] {
	return func(yield func(blob.Info, error) bool) {
		if err := blob.ValidatePrefix(prefix); err != nil {
			yield(blob.Info{}, err)
			return
		}
		var keys []string
		base := ""
		if i := strings.LastIndexByte(prefix, '/'); i >= 0 {
			base = prefix[:i]
		}
		if err := s.walk(ctx, base, prefix, &keys); err != nil {
			yield(blob.Info{}, err)
			return
		}
		slices.Sort(keys)
		for _, k := range keys {
			info, err := s.Stat(ctx, k)
			if errors.Is(err, blob.ErrNotFound) {
				continue // deleted since the walk
			}
			if !yield(info, err) || err != nil {
				return
			}
		}
	}
}

// walk collects into keys the keys under the key directory base that start with prefix.
func (s *Store) walk(ctx context.Context, base, prefix string, keys *[]string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	rel := "objects"
	if base != "" {
		d, _ := objPath(base + "/x")
		rel = d
	}
	fd, err := s.openBeneath(rel, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("blob dir: list %s: %w", base, err)
	}
	f := os.NewFile(uintptr(fd), rel)
	ents, err := f.ReadDir(-1)
	f.Close()
	if err != nil {
		return fmt.Errorf("blob dir: list %s: %w", base, err)
	}
	join := func(n string) string {
		if base == "" {
			return n
		}
		return base + "/" + n
	}
	for _, e := range ents {
		n := e.Name()
		switch {
		case e.Type() == fs.ModeDir && strings.HasSuffix(n, dirSuffix):
			k := join(strings.TrimSuffix(n, dirSuffix))
			// Descend when the directory's keys can match: prefix within k/ or k/ within prefix.
			if strings.HasPrefix(k+"/", prefix) || strings.HasPrefix(prefix, k+"/") {
				if err := s.walk(ctx, k, prefix, keys); err != nil {
					return err
				}
			}
		case e.Type().IsRegular() && strings.HasSuffix(n, objSuffix):
			k := join(strings.TrimSuffix(n, objSuffix))
			if strings.HasPrefix(k, prefix) && blob.ValidateKey(k) == nil {
				*keys = append(*keys, k)
			}
		}
	}
	return nil
}
