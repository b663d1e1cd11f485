package fsarchive

import (
	"errors"
	"fmt"
	"os"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// dupDir duplicates f's descriptor (close-on-exec) so the archive code owns one it may
// close, and checks that it is a directory.
func dupDir(f *os.File) (int, error) {
	if f == nil {
		return -1, errors.New("fsarchive: nil root")
	}
	rc, err := f.SyscallConn()
	if err != nil {
		return -1, fmt.Errorf("fsarchive: root: %w", err)
	}
	fd := -1
	var derr error
	if err := rc.Control(func(s uintptr) {
		fd, derr = unix.FcntlInt(s, unix.F_DUPFD_CLOEXEC, 0)
	}); err != nil {
		return -1, fmt.Errorf("fsarchive: root: %w", err)
	}
	if derr != nil {
		return -1, fmt.Errorf("fsarchive: root: dup: %w", derr)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("fsarchive: root: %w", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		unix.Close(fd)
		return -1, fmt.Errorf("fsarchive: root %s is not a directory", f.Name())
	}
	return fd, nil
}

// futimens sets fd's mtime (atime too, to the same time): utimensat(fd, NULL, ...), which
// x/sys/unix does not wrap.
func futimens(fd int, t time.Time) error {
	ts := [2]unix.Timespec{timespec(t), timespec(t)}
	for {
		_, _, e := unix.Syscall6(unix.SYS_UTIMENSAT, uintptr(fd), 0, uintptr(unsafe.Pointer(&ts[0])), 0, 0, 0)
		if e == unix.EINTR { // a raw Errno, not a wrapped error
			continue
		}
		if e != 0 {
			return e
		}
		return nil
	}
}

func timespec(t time.Time) unix.Timespec {
	return unix.Timespec{Sec: t.Unix(), Nsec: int64(t.Nanosecond())}
}

// openBeneath opens name (relative, clean) under dirfd for reading as a directory,
// refusing any symlink on the way and anything outside dirfd.
func openBeneath(dirfd int, name string) (int, error) {
	for {
		fd, err := unix.Openat2(dirfd, name, &unix.OpenHow{
			Flags:   unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC,
			Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
		})
		if errors.Is(err, unix.EINTR) || errors.Is(err, unix.EAGAIN) {
			continue
		}
		return fd, err
	}
}

// readFull reads len(b) bytes from fd unless it ends first (n < len(b), nil error).
func readFull(fd int, b []byte) (int, error) {
	n := 0
	for n < len(b) {
		m, err := unix.Read(fd, b[n:])
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return n, err
		}
		if m == 0 {
			break
		}
		n += m
	}
	return n, nil
}

// writeFull writes b to fd.
func writeFull(fd int, b []byte) error {
	for len(b) > 0 {
		m, err := unix.Write(fd, b)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return err
		}
		b = b[m:]
	}
	return nil
}
