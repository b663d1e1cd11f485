package local

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// A sealed copy of the runc binary, made once per process and binary.
//
// `runc init`, the process that becomes a container's init, is runc itself, and a
// container must not be able to reach the host's runc binary through
// /proc/<pid>/exe and overwrite it (CVE-2019-5736). So runc (1.1) starts every
// `runc init` by checking what it runs from: anything but a sealed memfd makes it
// bind-mount its binary read-only in a temporary place (a mkstemp, three mount
// calls and an unmount in the host's mount namespace) or copy it into a fresh memfd,
// and exec itself again from there, on every create and exec. Run from a memfd sealed
// against writes, growth, shrinking and further seals (runc's RUNC_MEMFD_SEALS), runc
// skips all that: runc documents a sealed memfd as safe to share (its memfd-bind tool
// makes one for all containers), since nothing can write to it. The backend makes one
// such copy and runs runc from it (through /proc/<backend pid>/fd/<n>, which a child
// resolves in the backend's descriptor table, whatever descriptors the child itself
// gets, reached through a symlink <StateDir>/.oci/.exe-<class>/runc so that the
// process is still named runc); runc's argv[0] stays the binary's path. The copy costs the binary's size in
// memory once (~9 MiB) and saves ~2-3 ms of CPU per create. A backend made after
// the binary's file changed (an upgrade) gets a new copy; anything failing leaves runc
// run from its path, as before.

// runcSeals are runc's RUNC_MEMFD_SEALS: only a memfd with exactly these is taken as
// already cloned.
const runcSeals = unix.F_SEAL_SEAL | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_WRITE

type sealedKey struct {
	path      string
	dev, ino  uint64
	size      int64
	mtimeNsec int64
}

var sealedCopies struct {
	mu sync.Mutex
	m  map[sealedKey]*os.File
}

// usesSealedCopy says whether binary (a runtime class's) is run from a sealed copy:
// runc's and crun's (gVisor's runsc and others do not clone themselves). crun (1.8)
// clones itself the same way as runc 1.1, and on every command, not only the
// container's init: a constructor (libcrun's ensure_cloned_binary) takes anything but a
// memfd sealed with exactly runc's seals for unsafe, bind-mounts /proc/self/exe
// read-only on a mkstemp file in /tmp (or copies it to a memfd) and fexecve()s itself
// from there, before it parses its arguments: `crun state` pays it as `crun run` does.
func usesSealedCopy(binary string) bool {
	b := filepath.Base(binary)
	return b == "runc" || b == OCICrun
}

// sealedExe returns the path to exec for binary: its sealed copy, made on first use
// (and again when the file changed), checked to run (`--version`).
func sealedExe(binary string) (string, error) {
	st, err := os.Stat(binary)
	if err != nil {
		return "", err
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok {
		return "", errors.New("no stat")
	}
	key := sealedKey{path: binary, dev: sys.Dev, ino: sys.Ino, size: st.Size(), mtimeNsec: st.ModTime().UnixNano()}
	sealedCopies.mu.Lock()
	defer sealedCopies.mu.Unlock()
	if f, ok := sealedCopies.m[key]; ok {
		return fdPath(f), nil
	}
	f, err := sealedCopy(binary)
	if err != nil {
		return "", err
	}
	exe := fdPath(f)
	cmd := exec.Command(exe, "--version")
	cmd.Args[0] = binary
	if out, err := cmd.CombinedOutput(); err != nil {
		f.Close()
		return "", fmt.Errorf("run the sealed copy of %s: %w: %s", binary, err, out)
	}
	if sealedCopies.m == nil {
		sealedCopies.m = map[sealedKey]*os.File{}
	}
	// An older version's copy stays open: a backend may still run it, and a closed
	// descriptor's number could name another file.
	sealedCopies.m[key] = f
	return exe, nil
}

// linkExe makes dir/name a symlink to exe (a sealed copy's /proc path) and returns it:
// executed through it, the process's name (comm) is name, not a descriptor's number.
func linkExe(dir, name, exe string) (string, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	link := filepath.Join(dir, name)
	tmp := link + ".tmp"
	_ = os.Remove(tmp)
	if err := os.Symlink(exe, tmp); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, link); err != nil {
		_ = os.Remove(tmp)
		return "", err
	}
	return link, nil
}

func fdPath(f *os.File) string {
	return "/proc/" + strconv.Itoa(os.Getpid()) + "/fd/" + strconv.Itoa(int(f.Fd()))
}

// sealedCopy copies binary into a new memfd and seals it with runcSeals.
func sealedCopy(binary string) (*os.File, error) {
	src, err := os.Open(binary)
	if err != nil {
		return nil, err
	}
	defer src.Close()
	// MFD_EXEC (Linux 6.3+) keeps the memfd executable under vm.memfd_noexec=1; older
	// kernels refuse the flag, and their memfds are executable anyway.
	name := filepath.Base(binary)
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING|unix.MFD_EXEC)
	if errors.Is(err, unix.EINVAL) {
		fd, err = unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	}
	if err != nil {
		return nil, fmt.Errorf("memfd_create: %w", err)
	}
	f := os.NewFile(uintptr(fd), "memfd:"+name)
	if _, err := io.Copy(f, src); err != nil {
		f.Close()
		return nil, fmt.Errorf("copy %s: %w", binary, err)
	}
	if err := unix.Fchmod(fd, 0o555); err != nil {
		f.Close()
		return nil, err
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, runcSeals); err != nil {
		f.Close()
		return nil, fmt.Errorf("seal the copy of %s: %w", binary, err)
	}
	return f, nil
}
