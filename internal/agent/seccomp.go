package agent

import (
	"fmt"
	"io"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// maxSeccompInsns is the kernel's limit of a classic BPF program (BPF_MAXINSNS).
const maxSeccompInsns = 4096

// InstallSeccompFilter installs the seccomp filter in path (a classic BPF program, the
// host's read-only file: see internal/runtime/local/seccompcache.go) on every thread of
// the process (SECCOMP_FILTER_FLAG_TSYNC), so everything the agent starts afterwards
// runs under it. The OCI runtime has set no_new_privs. Any error means the sandbox
// must not run: the caller exits.
func InstallSeccompFilter(path string) error {
	f, err := os.Open(path)
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
