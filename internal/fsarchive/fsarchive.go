// Package fsarchive is the format of file-system snapshots: a scratch volume's tree as a
// POSIX (PAX) tar stream compressed with zstd. Entries are directories, regular files
// (sparse-aware where cheap) and symlinks, with mode bits, uid/gid (as seen inside the
// sandbox), mtime and user.* xattrs; device nodes, fifos and sockets are skipped (a
// scratch volume's consumer recreates them). Paths are relative, clean and never leave
// the root; hard links are stored as copies.
//
// Write reads a tree the sandbox may still be able to change (or that it shaped to
// attack the host): it walks by file descriptor from the root (openat with O_NOFOLLOW,
// never a path string re-resolved), so a symlink is archived as a symlink and never
// followed. Extract writes into a fresh directory with the same discipline: every entry
// is created relative to its parent's descriptor, no symlink is followed, entries that
// would leave the root or repeat a path are refused, and the limits are enforced on the
// stream as it is read.
package fsarchive

import (
	"context"
	"errors"
	"io"
	"os"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// Errors of Extract. Each wraps ErrInvalid.
var (
	// ErrInvalid: the archive is malformed or holds something refused (a path leaving
	// the root, a repeated path, an entry of an unknown type).
	ErrInvalid = errors.New("invalid snapshot archive")
	// ErrTooLarge: the archive holds more than its limits allow.
	ErrTooLarge = errors.New("snapshot archive exceeds its limits")
)

// IDMap maps the tree's owners between the host and the sandbox: a sandbox in a user
// namespace sees host id HostBase+n as n (n < Size). The zero value maps nothing (ids are
// stored and restored as they are).
type IDMap struct {
	HostBase uint32
	Size     uint32
}

// Write archives the tree under root (an open directory) to w and returns what it
// wrote. It reads the tree by descriptor and never follows a symlink. Owners are stored
// as the sandbox sees them (ids outside ids' range are stored as 65534, nobody).
func Write(ctx context.Context, root *os.File, w io.Writer, ids IDMap) (runtime.ArchiveStats, error) {
	return runtime.ArchiveStats{}, errors.New("fsarchive: Write not implemented yet")
}

// Extract unpacks the archive read from r into root (an open, empty directory),
// enforcing limits as it reads. Owners are mapped into ids (ids outside its range become
// its nobody) when the caller may set them (root), else files belong to the caller. No
// setuid/setgid bit survives. On error, what was extracted so far stays in root for the
// caller to remove.
func Extract(ctx context.Context, r io.Reader, root *os.File, limits runtime.ArchiveLimits, ids IDMap) (runtime.ArchiveStats, error) {
	return runtime.ArchiveStats{}, errors.New("fsarchive: Extract not implemented yet")
}
