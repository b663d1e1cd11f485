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

func (a *Agent) readFile(path string, maxBytes int64) ([]byte, error) {
	p, err := a.resolvePath(path)
	if err != nil {
		return nil, invalidPath(path, err)
	}
	if maxBytes < 0 {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("max_bytes must not be negative"))
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
		return nil, fileError("read", path, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fileError("read", path, err)
	}
	switch {
	case fi.IsDir():
		return nil, isDirError("read", path)
	case !fi.Mode().IsRegular():
		return nil, notRegular("read", path, fi.Mode())
	}
	if fi.Size() > limit {
		return nil, tooLarge(path, fi.Size(), limit)
	}
	// Size is a hint (procfs reports 0, a file may grow): read to EOF, bounded.
	buf := make([]byte, 0, fi.Size()+1)
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

func (a *Agent) writeFile(path string, content []byte, mode uint32) error {
	p, err := a.resolvePath(path)
	if err != nil {
		return invalidPath(path, err)
	}
	if runtime.Reserved(p) {
		return invalidPath(path, fmt.Errorf("%s is reserved for the sandbox's agent", runtime.AgentDir))
	}
	m := os.FileMode(mode & 0o7777)
	if m == 0 {
		m = 0o644
	}
	if fi, err := os.Stat(p); err == nil && fi.IsDir() {
		return isDirError("write", path)
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return fileError("write", path, err)
	}
	if err := writeFileAtomic(p, content, m, a.user.cred); err != nil {
		return fileError("write", path, err)
	}
	return nil
}
