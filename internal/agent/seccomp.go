package agent

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// maxSeccompInsns is the kernel's limit of a classic BPF program (BPF_MAXINSNS).
const maxSeccompInsns = 4096

// InstallSeccompFilter installs the seccomp filter in path (a classic BPF program, the
// host's read-only file: see internal/runtime/local/seccompcache.go) on every thread of
// the process (SECCOMP_FILTER_FLAG_TSYNC), so everything the agent starts afterwards
// runs under it. The OCI runtime has set no_new_privs. Any error means the sandbox
// must not run: the caller exits. The program must have the SHA-256 sum (hex): a file
// the backend did not mean (one of its other mounts redirected onto the path by a
// symlink in the image) is refused, not installed.
func InstallSeccompFilter(path, sum string) error {
	if len(sum) != 2*sha256.Size {
		return fmt.Errorf("%s: no SHA-256 to check it against", path)
	}
	f, err := openNoSymlinks(path)
	if err != nil {
		return err
	}
	defer f.Close()
	insn := int(unsafe.Sizeof(unix.SockFilter{}))
	b, err := io.ReadAll(io.LimitReader(f, int64(maxSeccompInsns*insn+1)))
	if err != nil {
		return err
	}
	if len(b) == 0 || len(b)%insn != 0 || len(b) > maxSeccompInsns*insn {
		return fmt.Errorf("%s: %d bytes is no BPF program", path, len(b))
	}
	if got := sha256.Sum256(b); hex.EncodeToString(got[:]) != strings.ToLower(sum) {
		return fmt.Errorf("%s: SHA-256 %x, want %s", path, got, sum)
	}
	prog := make([]unix.SockFilter, len(b)/insn)
	copy(unsafe.Slice((*byte)(unsafe.Pointer(&prog[0])), len(b)), b)
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	r, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_TSYNC, uintptr(unsafe.Pointer(&fprog)))
	if errno != 0 {
		return fmt.Errorf("seccomp: %w", errno)
	}
	if r != 0 {
		return fmt.Errorf("seccomp: thread %d could not be synchronized", r)
	}
	return nil
}

// openNoSymlinks opens the regular file at the absolute path, following no symlink in
// any of its components (each opened with O_NOFOLLOW relative to its parent's
// descriptor): the backend makes /.sandboxd itself before anything is mounted under
// it (internal/runtime/local/sandboxddir.go); this is the agent's own check, in depth.
func openNoSymlinks(path string) (*os.File, error) {
	if !strings.HasPrefix(path, "/") {
		return nil, fmt.Errorf("%s: not an absolute path", path)
	}
	var parts []string
	for _, p := range strings.Split(path, "/") {
		switch p {
		case "", ".":
		case "..":
			return nil, fmt.Errorf("%s: a \"..\" component", path)
		default:
			parts = append(parts, p)
		}
	}
	if len(parts) == 0 {
		return nil, fmt.Errorf("%s: no file", path)
	}
	dir, err := unix.Open("/", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open /: %w", err)
	}
	for i, p := range parts {
		last := i == len(parts)-1
		flags := unix.O_PATH | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC
		if last {
			flags = unix.O_RDONLY | unix.O_NOFOLLOW | unix.O_NONBLOCK | unix.O_CLOEXEC
		}
		fd, err := unix.Openat(dir, p, flags, 0)
		unix.Close(dir)
		if err != nil {
			if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
				return nil, fmt.Errorf("open %s: %s is a symlink or no directory: %w", path, p, err)
			}
			return nil, fmt.Errorf("open %s: %w", path, err)
		}
		dir = fd
		if last {
			var st unix.Stat_t
			if err := unix.Fstat(fd, &st); err != nil {
				unix.Close(fd)
				return nil, fmt.Errorf("open %s: %w", path, err)
			}
			if st.Mode&unix.S_IFMT != unix.S_IFREG {
				unix.Close(fd)
				return nil, fmt.Errorf("open %s: not a regular file", path)
			}
		}
	}
	return os.NewFile(uintptr(dir), path), nil
}
