package agent

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"connectrpc.com/connect"

	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// maxFileBytes is the largest file ReadFile returns (it must fit one message).
const maxFileBytes = MaxMessageBytes - 1<<20

// ValidatePath checks a path from a request: non-empty, no NUL byte, no ".." element.
func ValidatePath(p string) error {
	switch {
	case p == "":
		return errors.New("path is empty")
	case strings.IndexByte(p, 0) >= 0:
		return errors.New("path contains a NUL byte")
	}
	for _, el := range strings.Split(p, "/") {
		if el == ".." {
			return errors.New(`path contains a ".." element`)
		}
	}
	return nil
}

// resolvePath validates p and makes it absolute against the sandbox working dir.
func (a *Agent) resolvePath(p string) (string, error) {
	if err := ValidatePath(p); err != nil {
		return "", err
	}
	if !filepath.IsAbs(p) {
		p = filepath.Join(a.workDir, p)
	}
	return filepath.Clean(p), nil
}

func invalidPath(path string, err error) *connect.Error {
	return apierr.WithViolations(apierr.New(apierr.InvalidPath,
		fmt.Sprintf("invalid path %q: %v", path, err), map[string]string{"filepath": path}),
		[]apierr.Violation{{Field: "path", Description: err.Error()}})
}

// fileError maps an I/O error on path to a connect error with ErrorInfo. ENOTDIR (a
// parent is not a directory) counts as not found; EROFS (a read-only mount) and EBUSY or
// ETXTBSY (a mount point such as /etc/hosts, a running binary) as permission denied;
// ENXIO (open of a socket) as not a regular file; ENAMETOOLONG as an invalid path.
func fileError(op, path string, err error) *connect.Error {
	meta := map[string]string{"filepath": path}
	cause := unwrapPathErr(err)
	msg := fmt.Sprintf("%s %s: %v", op, path, cause)
	switch {
	case errors.Is(err, fs.ErrNotExist), errors.Is(err, syscall.ENOTDIR):
		return apierr.New(apierr.FileNotFound, msg, meta)
	case errors.Is(err, syscall.EISDIR):
		return apierr.New(apierr.FileIsDirectory, msg, meta)
	case errors.Is(err, fs.ErrPermission), errors.Is(err, syscall.EROFS), errors.Is(err, syscall.EBUSY), errors.Is(err, syscall.ETXTBSY):
		return apierr.New(apierr.FilePermissionDenied, msg, meta)
	case errors.Is(err, syscall.ENXIO):
		return apierr.New(apierr.FileNotRegular, msg+" (not a regular file)", meta)
	case errors.Is(err, syscall.ENAMETOOLONG):
		return invalidPath(path, cause)
	}
	return apierr.New(apierr.FileIOFailed, msg, meta)
}

func isDirError(op, path string) *connect.Error {
	return fileError(op, path, &fs.PathError{Op: op, Path: path, Err: syscall.EISDIR})
}

func notRegular(op, path string, m fs.FileMode) *connect.Error {
	kind := "special file"
	switch {
	case m&fs.ModeNamedPipe != 0:
		kind = "FIFO"
	case m&fs.ModeSocket != 0:
		kind = "socket"
	case m&fs.ModeDevice != 0:
		kind = "device"
	}
	return apierr.New(apierr.FileNotRegular,
		fmt.Sprintf("%s %s: a %s, not a regular file", op, path, kind), map[string]string{"filepath": path})
}

func tooLarge(path string, size, limit int64) *connect.Error {
	return apierr.New(apierr.FileTooLarge,
		fmt.Sprintf("read %s: file is %d bytes, over the limit of %d", path, size, limit),
		map[string]string{"filepath": path, "size_bytes": strconv.FormatInt(size, 10), "max_size_bytes": strconv.FormatInt(limit, 10)})
}

// openForRead opens path for reading a regular file: the file, its size when opened and
// the byte limit of the read (the agent's and maxBytes, the smaller). A file over the
// limit is CWSANDBOX_FILE_TOO_LARGE.
func (a *Agent) openForRead(path string, maxBytes int64) (*os.File, int64, int64, error) {
	p, err := a.resolvePath(path)
	if err != nil {
		return nil, 0, 0, invalidPath(path, err)
	}
	if maxBytes < 0 {
		return nil, 0, 0, connect.NewError(connect.CodeInvalidArgument, errors.New("max_bytes must not be negative"))
	}
	limit := int64(maxFileBytes)
	if maxBytes > 0 && maxBytes < limit {
		limit = maxBytes
	}
	// O_NONBLOCK: opening a FIFO (or a device) must not wait for a writer; the type is
	// checked on what was opened (fstat), never stat-then-open, so a FIFO swapped in
	// between is refused too. For regular files and directories the flag changes nothing.
	f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
	if err != nil {
		return nil, 0, 0, fileError("read", path, err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, 0, fileError("read", path, err)
	}
	switch {
	case fi.IsDir():
		f.Close()
		return nil, 0, 0, isDirError("read", path)
	case !fi.Mode().IsRegular():
		f.Close()
		return nil, 0, 0, notRegular("read", path, fi.Mode())
	}
	if fi.Size() > limit {
		f.Close()
		return nil, 0, 0, tooLarge(path, fi.Size(), limit)
	}
	return f, fi.Size(), limit, nil
}

func (a *Agent) readFile(path string, maxBytes int64) ([]byte, error) {
	f, size, limit, err := a.openForRead(path, maxBytes)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	// Size is a hint (procfs reports 0, a file may grow): read to EOF, bounded.
	buf := make([]byte, 0, size+1)
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := f.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if int64(len(buf)) > limit {
			return nil, tooLarge(path, int64(len(buf)), limit)
		}
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return nil, fileError("read", path, err)
		}
	}
}

// FileChunkBytes is the most content a message of ReadFileStream or WriteFileStream
// carries.
const FileChunkBytes = 1 << 20

// chunkPool holds the FileChunkBytes buffers of ReadFileStream.
var chunkPool = sync.Pool{New: func() any { b := make([]byte, FileChunkBytes); return &b }}

// readFileStream reads path as readFile does, in chunks of at most FileChunkBytes from
// one pooled buffer: send gets each chunk (valid until it returns) and, with the first,
// the file's size when opened; an empty file is one empty chunk.
func (a *Agent) readFileStream(path string, maxBytes int64, send func(b []byte, size int64) error) error {
	f, size, limit, err := a.openForRead(path, maxBytes)
	if err != nil {
		return err
	}
	defer f.Close()
	bp := chunkPool.Get().(*[]byte)
	defer chunkPool.Put(bp)
	buf := *bp
	var total int64
	first := true
	for {
		n, rerr := io.ReadFull(f, buf)
		total += int64(n)
		if total > limit {
			return tooLarge(path, total, limit)
		}
		if rerr != nil && rerr != io.EOF && rerr != io.ErrUnexpectedEOF {
			return fileError("read", path, rerr)
		}
		if n > 0 || first {
			if err := send(buf[:n], size); err != nil {
				return err
			}
			first, size = false, 0
		}
		if rerr != nil {
			return nil
		}
	}
}

// writeTarget checks path for a write and makes its parent directories: the absolute
// path to write.
func (a *Agent) writeTarget(path string) (string, error) {
	p, err := a.resolvePath(path)
	if err != nil {
		return "", invalidPath(path, err)
	}
	if runtime.Reserved(p) {
		return "", invalidPath(path, fmt.Errorf("%s is reserved for the sandbox's agent", runtime.AgentDir))
	}
	if fi, err := os.Stat(p); err == nil && fi.IsDir() {
		return "", isDirError("write", path)
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return "", fileError("write", path, err)
	}
	return p, nil
}

func fileMode(mode uint32) os.FileMode {
	if m := os.FileMode(mode & 0o7777); m != 0 {
		return m
	}
	return 0o644
}

func (a *Agent) writeFile(path string, content []byte, mode uint32) error {
	p, err := a.writeTarget(path)
	if err != nil {
		return err
	}
	if err := writeFileAtomic(p, content, fileMode(mode), a.user.cred); err != nil {
		return fileError("write", path, err)
	}
	return nil
}

// errShortStream: a WriteFileStream ended before its declared size.
var errShortStream = errors.New("the stream ended before size bytes arrived")

// writeFileStream writes size bytes to path as writeFile does: first, then what next
// returns (io.EOF at the end of the stream), each chunk written as it arrives; more or
// fewer than size bytes is INVALID_ARGUMENT and leaves the file as it was.
func (a *Agent) writeFileStream(path string, mode uint32, size int64, first []byte, next func() ([]byte, error)) error {
	if size < 0 || size > maxFileBytes {
		return apierr.Invalid(apierr.InvalidRequest, fmt.Sprintf("size %d is out of range [0, %d]", size, maxFileBytes),
			[]apierr.Violation{{Field: "size", Description: fmt.Sprintf("must be in [0, %d]", maxFileBytes)}})
	}
	p, err := a.writeTarget(path)
	if err != nil {
		return err
	}
	var sizeErr error
	err = writeFileAtomicFunc(p, fileMode(mode), a.user.cred, func(f *os.File) error {
		var got int64
		for b := first; ; {
			got += int64(len(b))
			if got > size {
				sizeErr = fmt.Errorf("more than the declared size of %d bytes", size)
				return sizeErr
			}
			if _, err := f.Write(b); err != nil {
				return err
			}
			var err error
			if b, err = next(); errors.Is(err, io.EOF) {
				if got != size {
					sizeErr = fmt.Errorf("%w: %d of %d", errShortStream, got, size)
					return sizeErr
				}
				return nil
			} else if err != nil {
				sizeErr = err // the caller's: passed through
				return err
			}
		}
	})
	switch {
	case err == nil:
		return nil
	case sizeErr != nil && errors.Is(err, sizeErr):
		if ce := new(connect.Error); errors.As(err, &ce) {
			return err
		}
		return apierr.Invalid(apierr.InvalidRequest, fmt.Sprintf("write %s: %v", path, err),
			[]apierr.Violation{{Field: "content", Description: err.Error()}})
	}
	return fileError("write", path, err)
}
