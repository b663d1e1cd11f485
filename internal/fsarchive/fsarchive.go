// Package fsarchive is the format of file-system snapshots: a scratch volume's tree as a
// POSIX (PAX) tar stream compressed with zstd. Entries are directories, regular files
// and symlinks, with mode bits, uid/gid (as seen inside the sandbox), mtime and user.*
// xattrs; device nodes, fifos and sockets are skipped (counted in ArchiveStats.Skipped:
// a scratch volume's consumer recreates them). Paths are relative, clean and never leave
// the root; hard links are stored as copies.
//
// # Format
//
// One zstd stream (window at most MaxWindow, so the decoder's memory is bounded) holding
// a PAX tar stream. The first entry is the root directory "./"; every other directory
// is named "dir/" and comes before its content, in depth-first order with the names of a
// directory sorted bytewise, so the same tree gives the same archive bytes (mtimes, owners
// and modes are part of it). A directory's mode and mtime apply once its subtree is
// complete. Modes carry the permission bits and the sticky bit of directories (never
// setuid/setgid). mtimes have nanosecond precision (PAX "mtime"); atime and ctime are not
// stored. xattrs are PAX "SCHILY.xattr.user.*" records (at most MaxXattrs per entry, each
// value at most MaxXattrValue bytes, MaxXattrBytes in all). Sparse files are stored with
// their holes as zeros (zstd compresses them to almost nothing; Extract punches them back
// as holes by not writing all-zero blocks).
//
// Write reads a tree the sandbox may still be able to change (or that it shaped to
// attack the host): it walks by file descriptor from the root (openat with O_NOFOLLOW,
// never a path string re-resolved), so a symlink is archived as a symlink and never
// followed. Extract writes into a fresh directory with the same discipline: every entry
// is created relative to its parent's descriptor (opened with openat2
// RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS), no symlink is followed, entries that would leave
// the root, repeat a path or come out of depth-first order are refused, and the limits
// are enforced on the stream as it is read.
package fsarchive

import (
	"context"
	"errors"
	"io"
	"os"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// Errors of Extract: a refused archive's error wraps one of them (and names the entry).
// Errors of the reader given to Extract are returned as they are (wrapped), not as these.
var (
	// ErrInvalid: the archive is malformed or holds something refused (a path leaving
	// the root, a repeated path, an entry of an unknown type, a corrupt stream).
	ErrInvalid = errors.New("invalid snapshot archive")
	// ErrTooLarge: the archive holds more than its limits allow.
	ErrTooLarge = errors.New("snapshot archive exceeds its limits")
	// ErrNotDir (ExtractWith, ExtractOptions.Existing): the archive holds a file or a
	// symlink where root already has a directory that must stay one.
	ErrNotDir = errors.New("snapshot archive holds a non-directory where a directory is needed")
	// ErrNotEmpty (ExtractWith): root holds something besides ExtractOptions.Existing.
	ErrNotEmpty = errors.New("extraction root is not empty")
	// ErrBadOptions (ExtractWith, CheckExisting): the options are not valid; nothing was
	// opened or changed.
	ErrBadOptions = errors.New("invalid extraction options")
)

// Bounds of the format, shared by Write (which fails rather than write more) and Extract
// (which refuses more).
const (
	// MaxWindow is the largest zstd window Extract decodes (Write uses exactly this).
	// The decoder's memory is a small multiple of it.
	MaxWindow = 8 << 20
	// MaxPath bounds an entry's path (bytes); a component is at most MaxName.
	MaxPath = 4096
	MaxName = 255
	// MaxLink bounds a symlink's target (bytes).
	MaxLink = 4095
	// MaxXattrs, MaxXattrValue and MaxXattrBytes bound the user.* xattrs of one entry
	// (count, one value, names and values in all).
	MaxXattrs     = 128
	MaxXattrValue = 64 << 10
	MaxXattrBytes = 256 << 10
)

// nobody is the id stored for (and restored from) an owner outside the IDMap.
const nobody = 65534

// IDMap maps the tree's owners between the host and the sandbox: a sandbox in a user
// namespace sees host id HostBase+n as n (n < Size). The zero value maps nothing (ids are
// stored and restored as they are).
type IDMap struct {
	HostBase uint32
	Size     uint32
}

// toSandbox is how the sandbox sees host id id (nobody when outside the map).
func (m IDMap) toSandbox(id uint32) uint32 {
	if m.Size == 0 {
		return id
	}
	if id >= m.HostBase && uint64(id) < uint64(m.HostBase)+uint64(m.Size) {
		return id - m.HostBase
	}
	return nobody
}

// toHost is the host id of sandbox id id. Outside the map it is the map's nobody, and
// when nobody is outside the map too, ok is false (the entry keeps the caller's owner,
// which the sandbox sees as its overflow id, nobody).
func (m IDMap) toHost(id uint32) (host uint32, ok bool) {
	if m.Size == 0 {
		return id, true
	}
	if id < m.Size {
		return m.HostBase + id, true
	}
	if nobody < m.Size {
		return m.HostBase + nobody, true
	}
	return 0, false
}

// Write archives the tree under root (an open directory) to w and returns what it
// wrote. It reads the tree by descriptor and never follows a symlink. Owners are stored
// as the sandbox sees them (ids outside ids' range are stored as 65534, nobody). Device
// nodes, fifos, sockets and entries that vanish while the tree is read are left out and
// counted in Skipped. It fails on a path longer than MaxPath, a file that shrinks while
// it is read, or xattrs beyond the bounds above; w then holds a partial archive.
func Write(ctx context.Context, root *os.File, w io.Writer, ids IDMap) (runtime.ArchiveStats, error) {
	return write(ctx, root, w, WriteOptions{IDs: ids})
}

// Decision is a WriteOptions.Filter's answer for one entry.
type Decision int

const (
	// Keep archives the entry (a directory with its content, each asked for in turn).
	Keep Decision = iota
	// Skip leaves the entry out, a directory with its whole subtree (not read).
	Skip
	// SkipUnlessContent leaves a directory out unless an entry below it is kept (its
	// content is asked for in turn; the directory is archived before the first kept one).
	// For anything but a directory it is Skip.
	SkipUnlessContent
)

// WriteOptions are WriteWith's. The zero value is Write's behaviour with IDMap{}.
type WriteOptions struct {
	IDs IDMap
	// Filter, when set, decides for every entry below the root (path relative,
	// "/"-separated, without a trailing slash; dir tells a directory, a symlink is never
	// one) whether it is archived. Parents are asked before their content. An error
	// stops the archive.
	Filter func(path string, dir bool) (Decision, error)
	// MaxEntries bounds the entries archived (the root included) and MaxBytes the bytes
	// of regular files: WriteWith fails with an error wrapping ErrTooLarge rather than
	// write more. 0 = no bound.
	MaxEntries int64
	MaxBytes   int64
}

// WriteWith is Write with a filter and bounds (e.g. a build context with its
// .dockerignore applied). The archive is in the same format: Extract reads it.
func WriteWith(ctx context.Context, root *os.File, w io.Writer, opts WriteOptions) (runtime.ArchiveStats, error) {
	return write(ctx, root, w, opts)
}

// Extract unpacks the archive read from r into root (an open, empty directory),
// enforcing limits as it reads. Owners are mapped into ids (ids outside its range become
// its nobody) when the caller may set them (root), else files belong to the caller. No
// setuid/setgid bit survives. It reads r to its end (so a reader that checks a digest at
// the end gets to check it). On error, what was extracted so far stays in root for the
// caller to remove.
func Extract(ctx context.Context, r io.Reader, root *os.File, limits runtime.ArchiveLimits, ids IDMap) (runtime.ArchiveStats, error) {
	if root == nil {
		return runtime.ArchiveStats{}, errors.New("fsarchive: Extract needs a root directory")
	}
	return extractWith(ctx, r, root, limits, ids, nil)
}

// ExtractOptions are ExtractWith's. The zero value is Extract's behaviour with IDMap{}.
type ExtractOptions struct {
	IDs IDMap
	// Existing are directories (clean relative paths, their parents implied) that root
	// may hold before the extraction, made by someone the caller trusts before any
	// sandbox-written content is there (the kubelet's sub_path directories of a
	// Kubernetes volume, made when it creates a container, which mounts that very
	// directory). root must hold nothing else: every entry in it must be one of them (or
	// a parent of one) and a directory, not a symlink, else ErrNotEmpty. Whether or not such
	// a directory was made, the archive may hold only a directory at its path. The archive's
	// directory at such a path fills the existing one (its owner, xattrs, mode and mtime
	// applied as to a directory Extract made); a file or symlink of the archive there is
	// refused with ErrNotDir (the directory stays: what is mounted on it never shows the
	// archive's symlink). Everything else is as Extract: a repeated path, one leaving the
	// root, a symlink on the way, are refused as there. At most MaxExisting paths (CheckExisting).
	Existing []string
}

// MaxExisting bounds ExtractOptions.Existing (and the agent's ExtractPathRequest.sub_dirs,
// and the sub_paths of one volume a Kubernetes runner fills: one limit).
const MaxExisting = 64

// ExtractWith is Extract with options: directories root may already hold.
func ExtractWith(ctx context.Context, r io.Reader, root *os.File, limits runtime.ArchiveLimits, opts ExtractOptions) (runtime.ArchiveStats, error) {
	if root == nil {
		return runtime.ArchiveStats{}, errors.New("fsarchive: ExtractWith needs a root directory")
	}
	existing, err := existingSet(opts.Existing)
	if err != nil {
		return runtime.ArchiveStats{}, err
	}
	return extractWith(ctx, r, root, limits, opts.IDs, existing)
}

// Check reads the archive from r to its end as Extract would, within limits, and makes
// nothing: it refuses every archive Extract would refuse (the format, each entry's type,
// path, records, link, size and owner, a symlink's target and xattrs, the root entry
// first, each entry's parent a directory before it in depth-first order, no repeated
// path, the entries' count and the files' total size, the zstd checksum, and nothing
// after the end; a directory's names are kept as hashes while it is walked, bounded by
// limits.MaxFiles), short of what only the filesystem can refuse. The statistics are
// the archive's own, counted here, not what its writer said (Skipped is 0). For an
// archive the runner did not make itself (the Kubernetes backend's, made in a Pod).
func Check(ctx context.Context, r io.Reader, limits runtime.ArchiveLimits) (runtime.ArchiveStats, error) {
	return extractWith(ctx, r, nil, limits, IDMap{}, nil)
}
