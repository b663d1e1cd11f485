package agent

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/fsarchive"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// Snapshots of a directory in the container (a scratch volume's mount), for backends
// whose volumes the runner cannot reach from the host (Kubernetes emptyDirs). The
// runner is the only caller: runnerapi refuses to relay these calls, and the public data
// RPCs (internal/relay) never make them.

// archiveChunk is the size of the archive's messages.
const archiveChunk = 256 << 10

// openArchiveDir opens the directory at p (absolute, its last element not a symlink).
func openArchiveDir(p string) (*os.File, error) {
	if err := ValidatePath(p); err != nil {
		return nil, invalidPath(p, err)
	}
	if !filepath.IsAbs(p) {
		return nil, invalidPath(p, errors.New("path is not absolute"))
	}
	p = filepath.Clean(p)
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP) {
			return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("%s is not a directory", p))
		}
		return nil, fileError("open", p, &os.PathError{Op: "open", Path: p, Err: err})
	}
	return os.NewFile(uintptr(fd), p), nil
}

// streamWriter sends what is written as ArchivePathResponse data messages.
type streamWriter struct {
	st *connect.ServerStream[agentv1.ArchivePathResponse]
}

func (w streamWriter) Write(p []byte) (int, error) {
	for off := 0; off < len(p); off += archiveChunk {
		end := min(off+archiveChunk, len(p))
		if err := w.st.Send(&agentv1.ArchivePathResponse{Data: p[off:end]}); err != nil {
			return off, err
		}
	}
	return len(p), nil
}

func statsMsg(s runtime.ArchiveStats) *agentv1.ArchiveStats {
	return &agentv1.ArchiveStats{Files: s.Files, Bytes: s.Bytes, Skipped: s.Skipped}
}

// ArchivePath streams the tree at the request's path as an fsarchive archive, owners as
// the container sees them (fsarchive.IDMap zero). The tree is read live.
func (s *service) ArchivePath(ctx context.Context, req *connect.Request[agentv1.ArchivePathRequest], st *connect.ServerStream[agentv1.ArchivePathResponse]) error {
	dir, err := openArchiveDir(req.Msg.GetPath())
	if err != nil {
		return err
	}
	defer dir.Close()
	bw := bufio.NewWriterSize(streamWriter{st: st}, archiveChunk)
	stats, err := fsarchive.Write(ctx, dir, bw, fsarchive.IDMap{})
	if err == nil {
		err = bw.Flush()
	}
	if err != nil {
		if ctx.Err() != nil {
			return connect.NewError(connect.CodeCanceled, ctx.Err())
		}
		return connect.NewError(connect.CodeInternal, fmt.Errorf("archive %s: %w", dir.Name(), err))
	}
	return st.Send(&agentv1.ArchivePathResponse{Stats: statsMsg(stats)})
}

// streamReader reads the data of ExtractPathRequest messages, starting with first's.
type streamReader struct {
	st  *connect.ClientStream[agentv1.ExtractPathRequest]
	buf []byte
}

func (r *streamReader) Read(p []byte) (int, error) {
	for len(r.buf) == 0 {
		if !r.st.Receive() {
			if err := r.st.Err(); err != nil {
				return 0, err
			}
			return 0, io.EOF
		}
		r.buf = r.st.Msg().GetData()
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	return n, nil
}

// ExtractPath unpacks the archive the stream carries into the empty directory the first
// message names, within its limits (fsarchive.Extract: nothing leaves the directory, no
// symlink is followed). It works in standby: the runner fills a restored volume before
// it starts the main command. What a refused archive left is removed.
func (s *service) ExtractPath(ctx context.Context, st *connect.ClientStream[agentv1.ExtractPathRequest]) (*connect.Response[agentv1.ExtractPathResponse], error) {
	if !st.Receive() {
		if err := st.Err(); err != nil {
			return nil, err
		}
		return nil, invalidArg("no request")
	}
	first := st.Msg()
	if first.GetMaxBytes() < 0 || first.GetMaxFiles() < 0 {
		return nil, invalidArg("limits must not be negative")
	}
	// The sub_dirs are checked as fsarchive checks them (one check, one limit), before
	// anything is opened: bad options never reach the fill (nor the clearing after it).
	subDirs := first.GetSubDirs()
	if err := fsarchive.CheckExisting(subDirs); err != nil {
		return nil, invalidArg("sub_dirs: %s", clipName(err.Error()))
	}
	dir, err := openArchiveDir(first.GetPath())
	if err != nil {
		return nil, err
	}
	defer dir.Close()
	if len(subDirs) == 0 {
		if names, err := dir.Readdirnames(1); len(names) > 0 {
			return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("%s is not empty", dir.Name()))
		} else if err != nil && !errors.Is(err, io.EOF) {
			return nil, fileError("read", dir.Name(), err)
		}
	}
	limits := runtime.ArchiveLimits{MaxBytes: first.GetMaxBytes(), MaxFiles: first.GetMaxFiles()}
	// The sub_dirs (the kubelet's sub_path directories, made before the fill) may be
	// there and are filled in place; nothing else may (fsarchive.ErrNotEmpty, checked
	// before anything is made), and the archive may not put a file or symlink on them
	// (fsarchive.ErrNotDir).
	stats, err := fsarchive.ExtractWith(ctx, &streamReader{st: st, buf: first.GetData()}, dir, limits, fsarchive.ExtractOptions{Existing: subDirs})
	if errors.Is(err, fsarchive.ErrNotEmpty) {
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("%s: %w", dir.Name(), err))
	}
	if errors.Is(err, fsarchive.ErrBadOptions) {
		// Checked above; never clear the directory for it.
		return nil, invalidArg("sub_dirs: %s", clipName(err.Error()))
	}
	if err != nil {
		clearDir(dir)
		switch {
		case errors.Is(err, fsarchive.ErrNotDir):
			// The volume's content's fault (the runner blames the spec), told apart from
			// "not empty" (FAILED_PRECONDITION without a reason: what older agents say).
			return nil, apierr.New(apierr.VolumeSubPathNotDirectory, err.Error(), nil)
		case errors.Is(err, fsarchive.ErrTooLarge):
			return nil, connect.NewError(connect.CodeResourceExhausted, err)
		case errors.Is(err, fsarchive.ErrInvalid):
			return nil, connect.NewError(connect.CodeInvalidArgument, err)
		case ctx.Err() != nil:
			return nil, connect.NewError(connect.CodeCanceled, ctx.Err())
		}
		var ce *connect.Error
		if errors.As(err, &ce) {
			return nil, err
		}
		return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("extract into %s: %w", dir.Name(), err))
	}
	return connect.NewResponse(&agentv1.ExtractPathResponse{Stats: statsMsg(stats)}), nil
}

// clipName keeps an error message readable when a name is huge.
func clipName(s string) string {
	if len(s) > 256 {
		return s[:256] + "..."
	}
	return s
}

// clearDir removes what dir holds (by name below the open directory, so a symlink the
// archive made is removed, never followed).
func clearDir(dir *os.File) {
	if _, err := dir.Seek(0, io.SeekStart); err != nil {
		return
	}
	names, _ := dir.Readdirnames(-1)
	for _, n := range names {
		_ = os.RemoveAll(filepath.Join(fmt.Sprintf("/proc/self/fd/%d", dir.Fd()), n))
	}
}
